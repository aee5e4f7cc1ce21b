"""`AsyncEngine`: the server's engine client (`solo.engine.client.EngineClient`), continuous batching.

It wraps a loaded `Engine` (model, tokenizer, input processing, prefix cache, speculation settings) and
the `Scheduler` that drives the engine's runtime over `max_batch` KV-cache rows on its own thread. The
routes only see the client interface: `generate` queues prepared requests and returns their event
stream, `abort` / `abort_all` end them, `check_health` / `errored` say whether it can serve. This is the
one place in the server that hands the engine's runtime and caches to the scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from solo.engine.client import EngineCapabilities, EngineDeadError
from solo.engine.engine import Engine
from solo.engine.request import Request
from solo.engine.sampling import SamplingParams
from solo.model.config import ModelConfig
from solo.server.scheduler import DEFAULT_PREFILL_CHUNK, DecodeBatching, Generation, Scheduler, SchedulerMetrics
from solo.tokenizer import Tokenizer


class AsyncEngine:
    """An `Engine` served with continuous batching (implements `solo.engine.client.EngineClient`).

    Args:
        engine: the loaded engine; the scheduler becomes the only user of its runtime.
        max_batch, max_queue, max_seq, decode_batching, metrics, prefill_chunk, max_queue_wait_s: see
            `solo.server.scheduler.Scheduler`.

    Attributes:
        engine: the wrapped engine.
        scheduler: the scheduler (its counters are read by tests and /metrics).

    Raises:
        ValueError: see `Scheduler`.
    """

    def __init__(self, engine: Engine, max_batch: int, max_queue: int, max_seq: int,
                 decode_batching: DecodeBatching = "auto", metrics: SchedulerMetrics | None = None,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, max_queue_wait_s: float | None = None) -> None:
        self.engine = engine
        self.scheduler = Scheduler(engine.runtime, max_batch, max_queue, max_seq, decode_batching, metrics,
                                   prefix_cache=engine.prefix_cache, speculative=engine.speculative_config,
                                   session_history=engine.session_history, prefill_chunk=prefill_chunk,
                                   max_queue_wait_s=max_queue_wait_s)

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Warm the runtime up (`Engine.warm_up`), then start the scheduler thread."""
        self.engine.warm_up()
        self.scheduler.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the scheduler thread (blocking; see `Scheduler.stop`)."""
        self.scheduler.stop(timeout_s)

    # ------------------------------------------------------------------------------- EngineInfo

    @property
    def name(self) -> str:
        """The engine's display name."""
        return self.engine.name

    @property
    def config(self) -> ModelConfig:
        """The model config."""
        return self.engine.config

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer."""
        return self.engine.tokenizer

    @property
    def backend_name(self) -> str:
        """The runtime's short name."""
        return self.engine.backend_name

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return self.engine.device

    @property
    def capabilities(self) -> EngineCapabilities:
        """What the runtime declares and the engine turned on."""
        return self.engine.capabilities

    @property
    def decode_batching(self) -> str:
        """"isolated" or "fused" (see `solo.server.scheduler`)."""
        return self.scheduler.decode_batching

    @property
    def errored(self) -> bool:
        """True once the engine's runtime or the scheduler thread failed."""
        return self.engine.errored or self.scheduler.error is not None

    @property
    def is_running(self) -> bool:
        """True while requests can be served (not failed, the engine not closed)."""
        return not self.errored and self.engine.is_running

    def check_health(self) -> None:
        """Return if healthy.

        Raises:
            EngineDeadError: the runtime or the scheduler thread failed.
        """
        self.engine.check_health()
        if self.scheduler.error is not None:
            raise EngineDeadError(f"the scheduler stopped: {self.scheduler.error!r}")

    def make_request(self, prompt: Any, params: SamplingParams | Mapping[str, Any] | None = None,  # noqa: ANN401
                     fallback_temperature: float = 0.0, start_time: float | None = None,
                     tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,  # noqa: ANN401
                     parallel_tool_calls: bool = True) -> Request:
        """`Engine.make_request`."""
        return self.engine.make_request(prompt, params, fallback_temperature, start_time, tools, tool_choice,
                                        parallel_tool_calls)

    # ----------------------------------------------------------------------------- EngineClient

    def generate(self, requests: Sequence[Request], priority: int = 0) -> Generation:
        """Queue prepared requests (the choices of one API request); call on the event loop that reads them.

        Returns:
            The `Generation`: `events()` streams (choice index, event); `cancel()` aborts.

        Raises:
            QueueFullError, SchedulerStoppedError: see `Scheduler.submit` (503).
        """
        return self.scheduler.submit(requests, asyncio.get_running_loop(), priority)

    def abort(self, stream: Generation) -> None:
        """End a generation's unfinished choices (finish_reason "abort")."""
        stream.cancel()

    def abort_all(self) -> None:
        """End every request in flight now (the shutdown grace period is over)."""
        self.scheduler.abort_all()
