"""One engine interface for the CLI and the server (vLLM's `EngineClient` is the model).

Two engines implement it:

- `solo.engine.engine.Engine`: in-process, one generation at a time, synchronous streams
  (`Engine.generate` yields `GenerationEvent`s; closing the stream aborts it). `solo run`, `solo chat`,
  `solo bench --agent` and the Python API use it.
- `solo.server.async_engine.AsyncEngine`: the server's, continuous batching over several KV-cache rows
  (`solo.server.scheduler`); `generate` queues prepared requests and returns an asynchronous stream of
  events, `abort` ends it.

What both share is `EngineInfo`: the model's name and config, the tokenizer, input processing
(`make_request`), the backend, device and capabilities, and health. Callers ask these instead of reaching
into the runtime: block decoding on the GPU, multi-token verify and KV snapshot/restore are capabilities a
runtime declares (`solo.runtime.base.RuntimeCapabilities`), and an engine reports what it turned on
(`EngineCapabilities`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from solo.engine.request import GenerationEvent, Request
from solo.engine.sampling import SamplingParams
from solo.errors import SoloError
from solo.model.config import ModelConfig
from solo.runtime.base import RuntimeCapabilities
from solo.tokenizer import Tokenizer


class EngineDeadError(SoloError):
    """The engine cannot serve any more (a tensor-parallel rank died, the scheduler thread failed)."""


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do and what it turned on.

    Attributes:
        runtime: the runtime's declared capabilities (verify, KV snapshots, block decoding, batch invariance).
        prefix_cache: prefix caching is on.
        prefix_cache_store: the prefix cache can keep snapshots of evicted rows (the runtime has
            KV snapshots and the bound is above 0); without it only a row's own KV is reused.
        speculative: the speculative mode in use: "off", "ngram" or "suffix".
    """

    runtime: RuntimeCapabilities
    prefix_cache: bool
    prefix_cache_store: bool
    speculative: str


@runtime_checkable
class EngineInfo(Protocol):
    """What the CLI and the server read from any engine."""

    name: str
    config: ModelConfig
    tokenizer: Tokenizer

    @property
    def backend_name(self) -> str:
        """The runtime's short name ("cpu", "eager", "cuda-graph", ...)."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        ...

    @property
    def capabilities(self) -> EngineCapabilities:
        """What the runtime declares and the engine turned on."""
        ...

    @property
    def is_running(self) -> bool:
        """True while the engine can take requests."""
        ...

    @property
    def errored(self) -> bool:
        """True once the engine failed for good (`check_health` then raises)."""
        ...

    def check_health(self) -> None:
        """Return if healthy.

        Raises:
            EngineDeadError: the engine failed; the message says why.
        """
        ...

    def make_request(self, prompt: Any, params: SamplingParams | Mapping[str, Any] | None = None,  # noqa: ANN401
                     fallback_temperature: float = 0.0, start_time: float | None = None,
                     tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,  # noqa: ANN401
                     parallel_tool_calls: bool = True) -> Request:
        """Encode and validate a prompt into a `Request` (see `Engine.make_request`)."""
        ...


class RequestStream(Protocol):
    """The events of one `EngineClient.generate` call (n >= 1 choices).

    Attributes:
        requests: the prepared requests, one per choice (their resolved sampling; their `stats`, which the engine
            fills as they run).
    """

    requests: list[Request]

    def events(self) -> AsyncIterator[tuple[int, GenerationEvent]]:
        """(choice index, event) pairs until every choice has finished; re-raises a failure inside the engine."""
        ...

    def cancel(self) -> None:
        """Stop every unfinished choice (safe to call twice)."""
        ...


@runtime_checkable
class EngineClient(EngineInfo, Protocol):
    """An engine that serves many requests at once, asynchronously (the server's `AsyncEngine`)."""

    def generate(self, requests: Sequence[Request], priority: int = 0) -> RequestStream:
        """Queue prepared requests (the choices of one API request); call on the event loop that reads them.

        Args:
            requests: one `Request` per choice (from `make_request`).
            priority: lower leaves the queue first.

        Raises:
            SoloError subclasses or the scheduler's errors when the engine cannot take them (queue full,
            stopped); see the implementation.
        """
        ...

    def abort(self, stream: RequestStream) -> None:
        """End a stream's unfinished choices (finish_reason "abort")."""
        ...

    def abort_all(self) -> None:
        """End every request in flight (shutdown)."""
        ...
