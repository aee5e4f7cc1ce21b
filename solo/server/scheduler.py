"""Continuous batching: KV-cache slots, a bounded FIFO queue, chunked prefill, one thread on the runtime.

The scheduler owns `max_batch` KV-cache rows of the engine's runtime. Requests beyond the rows wait in a
FIFO queue of at most `max_queue`. One thread drives the runtime; each loop iteration

1. applies cancellations (a disconnected client's request frees its row before the next step),
2. admits waiting requests into free rows,
3. prefills first (for TTFT): prompt chunks of the requests still being prefilled, at most
   `prefill_chunk` tokens in all, shortest remaining prompt first, except that a whole prompt within one
   chunk always runs; a request whose last chunk ran emits its first token and joins the decode steps;
   then requests that arrived meanwhile are admitted and their short prompts prefilled too (they do not
   wait for the decode step),
4. runs one decode step for every request past its prefill (one `decode_spans` call: a request with a
   speculative draft feeds its last token and the draft, the others their last token), then frees the
   rows of those that finished.

On a runtime with span prefill (`span_prefill_limit`: the native CPU runtime) in "fused" mode, steps 3 and 4
merge while any row decodes (stall-free batching, Agrawal et al., "Sarathi-Serve", OSDI 2024; vLLM's chunked
prefill): the prompts within `span_prefill_positions` (512; 2048 for a dense model at the amx level) ride in
the step's one `decode_spans` call as spans of their own rows, at most `prefill_chunk` prompt tokens per step,
shortest remaining prompt first, cut anywhere (their KV and logits are the same bits for any split); a prompt
whose last piece ran gets its first token from that step. A request admitted at the top of an iteration thus
waits only for the step in progress, and no step grows by more than the budget. Longer prompts keep their
chunk calls on the fixed grid, within what is left of the budget. With no row decoding, the shortest prompt is
prefilled by its own `prefill` call (an idle server's request: the path `Engine.run` takes) and the other
prompts ride in the step after it, instead of one prefill call each before any step.

On a runtime whose steps can pause between runs of layers (`pausable_steps`: the native CPU runtime), a
decode step expected to take at least `PAUSE_MIN_STEP_S` pauses at each run's end when a request is waiting
with a free row: a new request whose prompt is, after the prefix cache, a tail of at most `PAUSE_TAIL_TOKENS`
tokens (a chat turn resent with its history) is admitted, prefilled and given its first token in a call of
its own there, and the step resumes (the same bits). Its TTFT then waits for a run of layers, not for the rest
of the step and a whole batched step of its own; the paused rows wait for that one call. The step's start is
such a point too: a new request's short tail already waiting then gets that call before the step.

On a runtime with block decoding (the CUDA-graph runtime, the monokernel: `iter_blocks`), a lone greedy
request (nothing else running, nothing waiting for a free row, no penalties, logprobs, constraint, logits
processor or draft) decodes a block of up to K tokens per host sync on the device, as `Engine.run` does,
instead of one step per token: the server's lone request runs at `solo run`'s speed. K is the runtime's
block size, halved (a power of two, so few graphs are captured) while blocks take longer than
`BLOCK_TARGET_S`, so a request arriving meanwhile waits for at most about that long; the tokens are the
per-token steps' (the same argmax of the same logits), and the next iteration goes back to per-token steps
once anything else runs.

A request joins at the next step and leaves the moment it finishes (continuous batching, Yu et al.,
"Orca", OSDI 2022). Events reach the asyncio side through `loop.call_soon_threadsafe`, so torch work never
runs on the event loop.

Chunked prefill (vLLM's and SGLang's "chunked prefill", Agrawal et al., "Sarathi-Serve", OSDI 2024): a
long prompt is prefilled `prefill_chunk` tokens per iteration, with a decode step of the running requests
between chunks, so a 2000-token prompt delays every running stream by one chunk at a time instead of by
its whole prefill, and a short prompt that arrives meanwhile is prefilled before the long one's next chunk
(its TTFT waits for one chunk at most). The chunks lie on a fixed grid (`prefill_chunk` tokens from the
first uncached position), so how a prompt is cut never depends on the load: a request computes the same
calls alone or beside others (SGLang's deterministic mode fixes its split sizes for the same reason).
Prompts of at most `prefill_chunk` tokens are prefilled whole, exactly as `Engine.run` does.

Isolation. A request must give the same tokens alone or beside others, and a lone request runs exactly
the calls `Engine.run` makes (prefill, then batch-1 decode steps). Whether a batched decode step keeps
that promise depends on the runtime:

- The eager runtime is not batch-invariant. `F.linear` on [8, hidden] takes a different GEMM path than on
  [1, hidden], and batched attention pads every row to the longest key length, so per-row logits differ
  in the last bits from batch 1 (measured: up to 2e-5 on a 512-wide model), enough to flip a greedy
  near-tie or a sampled token.
- A runtime whose kernels compute each sequence with the same reduction order whatever the batch is
  batch-invariant: one batched call gives every row its batch-1 logits bit for bit. Solo's native CPU
  runtime declares it, but its batched step differs from batch 1 for some mixes of row lengths (found by
  a soak: greedy outputs changed under load), so the start-up probe below tries several random mixes and
  "auto" falls back to "isolated" when any differs.

So `decode_batching` is

- "isolated": every step makes one call per active row (a batch-1 `decode`, or the `verify` of its draft),
  the call a lone run makes: bit-identical to running alone on any runtime. Cost: no batching gain, N
  active requests take about N batch-1 steps per step (they still advance together, and a lone request
  pays nothing). Measured with 8 concurrent streams on 2 CPUs (benchmarks/results/server_load_test_*.md):
  2.5-4x less throughput than "fused".
- "fused": one `decode_spans` call per step over every active row and its draft (the throughput of
  batching; the native CPU runtime runs it as one kernel call that streams the weights once, where a
  verify call per drafted row streamed them once each). Bit-identical to a lone run only on a
  batch-invariant runtime (for drafted rows: `spans_batch_invariant`); a runtime without a fused span
  kernel makes one batched `decode` for the undrafted rows and a `verify` per drafted one.
- "auto" (the default): "fused" when the runtime declares `batch_invariant = True` and a probe at start-up
  confirms it (batched and batch-1 logits of rows with different lengths compared bit for bit), else
  "isolated".

A prompt longer than `prefill_chunk` is prefilled in chunks. On the native CPU runtime a sequence within
`CpuRuntime.span_prefill_positions` (512, or 2048 at the amx level) has the same bits however it is split
(cold, cached prefix + tail, chunks); past that, or on other runtimes, chunks change its arithmetic from one
whole prefill in the last bits (as a prefix-cache hit does); the chunk grid is fixed, so that never depends on
the load. An "isolated" step (one call per request) stops between two of them when a new request is waiting
for a free row: its prefill (and first token) goes first, and the requests not served yet go first in the next
step.

Overload. The queue is bounded (`max_queue`), and optionally by time (`max_queue_wait_s`, `--max-queue-wait`):
a request that would wait longer than that for a row (at the rate rows have been freeing lately, the last
`RELEASE_WINDOW` releases, or by the median time by which enough running requests end, from how long the
recent ones ran past each one's length) is refused at once instead of queued,
so the TTFT of admitted requests stays near the budget while the excess gets 503s (requests of a more
urgent priority count only those of the same or more urgent priority ahead of them). Near the slot-limited
capacity, requests queue for a row whenever Poisson arrivals clump (Erlang C), and that
wait, not compute, is what makes up TTFT's tail (benchmarks/results/load-ttft-*.md). A request that does
not fit is refused at once with `QueueFullError`, which carries an estimate of when a place frees: the
remaining token budget of the running request closest to its end times the measured decode-step time (an
upper bound when that request stops early at EOS, a lower bound when other clients take the place
first). Admitted requests keep their rows: nothing is preempted. Waiting requests leave the queue by
`priority` (lower first, vLLM's convention; FIFO among equals), so interactive traffic sent with a lower
value overtakes batch jobs waiting beside it; running requests are never interrupted for it.

KV memory. Every row is allocated once (`runtime.reserve`); a request holds (prompt + generated) tokens
of its row. `kv_used_bytes()` sums them, and the metrics report it with the capacity.
Prefix caching (`solo.engine.prefix_cache`): a request is placed in the free row whose previous tokens
share the longest prefix with its prompt (or gets a stored snapshot copied in) and prefills only the rest;
a finished request's row keeps its KV for the next one. Speculative decoding (`solo.engine.speculative`):
a request with a draft joins the decode step with its last token and the draft (`propose_draft`, then
`accept_draft` on its rows of the step's logits); drafts come from the request's own tokens (and the
session's, "suffix"), never from its neighbours.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import torch

from solo.engine.prefix_cache import PrefixCache
from solo.engine.request import GenerationEvent, GenerationStats, Request
from solo.engine.speculative import DraftProposer, SessionHistory, SpeculativeConfig, accept_draft, propose_draft
from solo.env import env_choice, env_switch
from solo.errors import InvalidRequestError, KVCacheMemoryError, SoloError
from solo.runtime.base import (
    DecodeRuntime,
    SamplingSpec,
    block_tail,
    decode_spans,
    runtime_block_size,
    runtime_capabilities,
)
from solo.server.kv_memory import runtime_kv_bytes_per_token

logger = logging.getLogger("solo.server")

DEFAULT_PREFILL_CHUNK = 256
"""Tokens of prompt prefilled per scheduler iteration (`--prefill-chunk`); longer prompts are chunked.

On a 2-core CPU, 256 tokens of the bundled model take tens of milliseconds, so a running stream waits for
one chunk at a time (about a decode step's order of magnitude) rather than for a whole long prompt."""

DecodeBatching = Literal["auto", "isolated", "fused"]
"""How a decode step runs over the active rows (see the module docstring): one batch-1 call per row
("isolated"), one batched call ("fused"), or fused only on a batch-invariant runtime ("auto")."""

SpanPrefill = Literal["step", "before", "off"]
"""Where the CPU runtime's short prompts are prefilled while rows decode (`Scheduler`'s span_prefill)."""

DEFAULT_SPAN_PREFILL: SpanPrefill = "step"
"""The default `SpanPrefill`."""


def span_prefill_from_env() -> SpanPrefill:
    """$SOLO_SPAN_PREFILL (a measurement knob), else `DEFAULT_SPAN_PREFILL`.

    Raises:
        EnvSettingError: a value other than step, before or off.
    """
    return env_choice("SOLO_SPAN_PREFILL", get_args(SpanPrefill), DEFAULT_SPAN_PREFILL)  # type: ignore[return-value]


def pause_steps_from_env() -> bool:
    """Whether fused decode steps may pause for new requests' prompt tails (`Scheduler.pausable_steps`).

    Yes unless SOLO_PAUSE_STEPS is off (a measurement knob).

    Raises:
        EnvSettingError: a value that is not a switch (`solo.env.env_switch`).
    """
    return env_switch("SOLO_PAUSE_STEPS", True)

PAUSE_MIN_STEP_S = 0.025
"""Decode steps expected to take at least this long (seconds) pause between runs of layers for new requests'
prompt tails, on runtimes that can (`Scheduler._serve_arrivals_mid_step`); shorter ones are one call (each
pause point costs a thread-pool start)."""
PAUSE_MAX_CALLS = 3
"""Most calls for new requests one pause makes (those arriving during one are served after it), so a stream of
arrivals cannot hold a step for long."""
PAUSE_TAIL_TOKENS = 16
"""Longest prompt tail (tokens after the prefix cache) served inside a paused step: about a batch-1 step's
cost, which the paused rows wait."""

RELEASE_WINDOW = 64
"""Recent row releases (their times and their requests' lengths) `max_queue_wait_s` admission control predicts
the queue wait from."""

TOKEN_S_WINDOW_S = 10.0
"""Seconds of recent steps whose time per generated token Retry-After's estimate takes."""

TOKEN_S_WINDOW_STEPS = 8192
"""At most this many steps of them (a bound on the memory)."""

SINCE_LAST_STEP_S = 0.5
"""A step starting within this many seconds of the last one's end counts the gap as its rows' time."""

ABORT = "abort"
"""finish_reason of a request ended by the server (shutdown) or by its client going away."""


BLOCK_TARGET_S = 0.02
"""Longest a lone request's block of tokens should take (seconds): a request arriving meanwhile waits for it."""


class QueueFullError(Exception):
    """Every KV-cache slot is busy and the waiting queue is full; the client should retry later.

    Args:
        message: one line for the client.
        retry_after_s: whole seconds until a place is expected to free (the Retry-After header), >= 1.
    """

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SchedulerStoppedError(Exception):
    """The scheduler is shutting down and takes no new requests."""


class SchedulerMetrics(Protocol):
    """What the scheduler reports (implemented by `solo.server.metrics.ServerMetrics`)."""

    def set_load(self, waiting: int, active: int) -> None:
        """Queue depth and active slots, after every change."""
        ...

    def observe_finished(self, stats: GenerationStats, finish_reason: str) -> None:
        """One request finished (or was aborted) with these timings."""
        ...

    def watch_kv_cache(self, used_bytes: Callable[[], int], capacity_bytes: int, bytes_per_token: int) -> None:
        """The KV cache's size, a callable giving the bytes requests hold now, and bytes per token."""
        ...


def runtime_is_batch_invariant(runtime: DecodeRuntime, rows: int = 4, trials: int = 8) -> bool:
    """True when the runtime declares `batch_invariant = True` and a probe agrees.

    The probe prefills `rows` cache rows (from row 0; call before serving) with prompts of different
    lengths, then compares one batched decode step with batch-1 steps of the same rows, bit for bit. It
    does so `trials` times with seeded random lengths (2 to 64 tokens, within the cache) and tokens over
    the rows the previous trial left behind, as the server reuses rows: a kernel whose batched path
    depends on its neighbours' lengths or on stale cache contents fails some of them. A declared but
    failing runtime is logged and treated as not invariant.

    Args:
        runtime: the runtime (its cache must hold `rows` rows of at least 2 tokens).
        rows: sequences in the probe.
        trials: batched steps compared.
    """
    if not getattr(runtime, "batch_invariant", False):
        return False
    rows = min(rows, runtime.rows)
    if rows < 2:
        return True
    vocab = runtime.config.vocab_size
    # Prompts leave room for the decode step's position (a --max-model-len of 2 leaves one token each).
    longest = max(min(2, runtime.max_seq - 1), min(64, runtime.max_seq - 2))
    rng = random.Random(0)
    for trial in range(trials):
        # The first trial keeps the historical shape (lengths 2, 5, 8, ...); the rest are random.
        lengths = [min(longest, 2 + 3 * r) if trial == 0 else rng.randint(min(2, longest), longest)
                   for r in range(rows)]
        last = []
        for r, n in enumerate(lengths):
            ids = torch.tensor([rng.randrange(vocab) for _ in range(n)], dtype=torch.long)
            last.append(int(runtime.prefill(r, ids).argmax()))
        row_ids = torch.arange(rows, dtype=torch.long)
        tokens = torch.tensor(last, dtype=torch.long)
        positions = torch.tensor(lengths, dtype=torch.long)
        batched = runtime.decode(row_ids, tokens, positions)
        for r in range(rows):
            # The same position is rewritten with the batch-1 step's own keys and values before it is read.
            single = runtime.decode(row_ids[r:r + 1], tokens[r:r + 1], positions[r:r + 1])[0]
            if not torch.equal(batched[r], single):
                logger.warning("the %s runtime declares batch invariance but its batched decode differs from batch 1 "
                               "(rows of %s tokens); decoding one row at a time", getattr(runtime, "name", "?"),
                               lengths)
                return False
    return True


def span_prefill_limit(runtime: DecodeRuntime) -> int:
    """Longest prompt (in positions) whose prefill may ride in a decode step's `decode_spans` call; 0: none.

    Needs a runtime whose spans are batch-invariant (`RuntimeCapabilities.spans_batch_invariant`) and whose
    `prefill` of a sequence ending within its `span_prefill_positions` runs through that same kernel (the
    native CPU runtime: `CpuRuntime.span_prefill_positions`, 512 or 2048). Then a prompt's KV and logits are the same
    bits prefilled alone, in pieces of any size, or as spans beside other rows' decode tokens, so prefilling
    it inside a decode step changes no output. Other runtimes: 0 (their prefill is not the decode kernel's
    arithmetic).

    Args:
        runtime: the engine's runtime.
    """
    if not runtime_capabilities(runtime).spans_batch_invariant:
        return 0
    return max(0, int(getattr(runtime, "span_prefill_positions", 0) or 0))


class Generation:
    """The handle on one API request's choices (n >= 1 `Request`s) in the scheduler.

    The scheduler thread hands events to an asyncio queue on the API request's loop (through
    `loop.call_soon_threadsafe`).
    Iterate `events()` on that loop; call `cancel()` when the client goes away.

    Args:
        scheduler: the scheduler that runs it.
        loop: the event loop the consumer awaits on.
        requests: one prepared `Request` per choice.
    """

    def __init__(self, scheduler: Scheduler, loop: asyncio.AbstractEventLoop, requests: Sequence[Request]) -> None:
        self.scheduler = scheduler
        self.requests = list(requests)
        self._loop = loop
        self._queue: asyncio.Queue[tuple[int, GenerationEvent | BaseException]] = asyncio.Queue()
        self._remaining = len(self.requests)
        self._finished: set[int] = set()  # choices whose last event was consumed
        self._abandoned = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the consumer runs on."""
        return self._loop

    def put(self, index: int, item: GenerationEvent | BaseException) -> None:
        """Queue an event (or the exception that ended choice `index`); call on the consumer's loop only."""
        if not self._abandoned:
            self._queue.put_nowait((index, item))

    async def events(self) -> AsyncIterator[tuple[int, GenerationEvent]]:
        """Yield (choice index, event) until every choice has finished.

        Raises:
            Exception: whatever failed while running a choice (a bug or a device error; a 500).
        """
        while self._remaining:
            index, item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.finish_reason is not None:
                self._remaining -= 1
                self._finished.add(index)
            yield index, item

    @property
    def done(self) -> bool:
        """True once every choice's last event has been consumed."""
        return self._remaining == 0

    def cancel(self) -> None:
        """Stop every unfinished choice and free its slot (within one decode step); safe to call twice."""
        if self._remaining:
            self.scheduler.cancel(self)

    def abandon(self) -> None:
        """Give up delivering: a consumer that cannot hand events on (a client that reads nothing).

        Every unfinished choice is cancelled, the undelivered events are dropped and none is kept from now on,
        so memory stays bounded however long the connection stays open; `events()` then yields each choice
        not yet ended an empty last event, finish_reason "abort" (its text has a gap: it is no finished reply).
        Call on the consumer's loop.
        """
        if self._abandoned:
            return
        self.cancel()
        self._abandoned = True
        while not self._queue.empty():
            self._queue.get_nowait()
        for index, request in enumerate(self.requests):
            if index not in self._finished:
                self._queue.put_nowait((index, GenerationEvent(text="", token_ids=[], finish_reason=ABORT,
                                                               stats=request.stats)))


def _put_all(items: list[tuple[Generation, int, GenerationEvent | BaseException]]) -> None:
    # Runs on the event loop: one wake-up delivers every event of a runtime call.
    for generation, index, item in items:
        generation.put(index, item)


@dataclass(eq=False)
class _Sequence:
    # One choice inside the scheduler: its request, where its events go, and its cache row.
    request: Request
    index: int
    generation: Generation
    priority: int = 0
    row: int = -1
    last_token: int = -1
    proposer: DraftProposer | None = None
    prefilled: bool = False  # its prompt went into the row (the row's previous KV was given up)
    prefill_at: int = 0  # next prompt position to prefill (chunked prefill); the row holds those before it
    ready: bool = False  # the whole prompt is prefilled: it decodes

    def prefill_left(self) -> int:
        return len(self.request.prompt_ids) - self.prefill_at


class Scheduler:
    """Runs requests on a runtime's KV-cache rows with continuous batching.

    Args:
        runtime: the engine's decode runtime; this scheduler must be its only user while running.
        max_batch: KV-cache rows, i.e. requests decoded together.
        max_queue: requests that may wait for a row; more are refused with `QueueFullError`.
        max_seq: tokens per row (prompt plus completion of the longest request allowed).
        decode_batching: "auto" (default), "isolated" or "fused"; see the module docstring.
        metrics: where queue depth, active slots and finished-request timings go (optional).
        prefix_cache: reuse of earlier requests' KV (the engine's `PrefixCache`), or None.
        speculative: draft settings for speculative decoding, or None for plain decoding.
        session_history: earlier requests for "suffix" drafts, or None.
        prefill_chunk: prompt tokens prefilled per iteration (see the module docstring); 0 prefills every
            prompt whole at admission.
        max_queue_wait_s: refuse a request whose predicted wait for a row exceeds this many seconds (see
            the module docstring, "Overload"); None: only `max_queue` bounds the queue.
        span_prefill: in "fused" mode on a runtime with span prefill (`span_prefill_limit`), where the
            prompts within its limit are prefilled while rows decode (see the module docstring): "step" inside
            the decode step's call; "before": in one `decode_spans` call of their own just before it; "off":
            one prefill call each, as on other runtimes. None: $SOLO_SPAN_PREFILL, else `DEFAULT_SPAN_PREFILL`.

    Raises:
        ValueError: max_batch < 1, max_queue < 0, max_seq < 2, prefill_chunk < 0 or max_queue_wait_s < 0.
    """

    def __init__(self, runtime: DecodeRuntime, max_batch: int, max_queue: int, max_seq: int,
                 decode_batching: DecodeBatching = "auto", metrics: SchedulerMetrics | None = None,
                 prefix_cache: PrefixCache | None = None, speculative: SpeculativeConfig | None = None,
                 session_history: SessionHistory | None = None,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, max_queue_wait_s: float | None = None,
                 span_prefill: SpanPrefill | None = None) -> None:
        if max_batch < 1 or max_queue < 0 or max_seq < 2 or prefill_chunk < 0 or \
                (max_queue_wait_s is not None and not max_queue_wait_s >= 0):
            raise ValueError(f"need max_batch >= 1, max_queue >= 0, max_seq >= 2, prefill_chunk >= 0, "
                             f"max_queue_wait_s >= 0; got {max_batch}, {max_queue}, {max_seq}, {prefill_chunk}, "
                             f"{max_queue_wait_s}")
        if decode_batching not in ("auto", "isolated", "fused"):
            raise ValueError(f"decode_batching must be 'auto', 'isolated' or 'fused', got {decode_batching!r}")
        self.runtime = runtime
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.max_seq = max_seq
        self.metrics = metrics
        self.prefix_cache = prefix_cache
        self.speculative = speculative
        self.session_history = session_history
        self.prefill_chunk = prefill_chunk
        """Prompt tokens prefilled per iteration (0: whole prompts)."""
        self.max_queue_wait_s = max_queue_wait_s
        """Longest predicted wait for a row a request is queued for (None: no bound but max_queue)."""
        self._releases: deque[float] = deque(maxlen=RELEASE_WINDOW)  # perf_counter() of recent row releases
        self._released_lengths: deque[int] = deque(maxlen=RELEASE_WINDOW)  # their requests' generated tokens
        if prefix_cache is not None:
            prefix_cache.reserve(max_batch, max_seq)
        else:
            runtime.reserve(max_batch, max_seq)
        if decode_batching == "auto":
            decode_batching = "fused" if max_batch > 1 and runtime_is_batch_invariant(runtime) else "isolated"
        self.decode_batching: DecodeBatching = decode_batching
        """The mode in use: "isolated" or "fused" ("auto" resolved)."""
        if span_prefill is None:
            span_prefill = span_prefill_from_env()
        if span_prefill not in get_args(SpanPrefill):
            raise ValueError(f"span_prefill must be 'step', 'before' or 'off' (SOLO_SPAN_PREFILL), "
                             f"got {span_prefill!r}")
        self.span_prefill: SpanPrefill = span_prefill
        """Where prompts within `span_prefill_positions` are prefilled while rows decode (see the Args)."""
        self.span_prefill_positions = span_prefill_limit(runtime) if decode_batching == "fused" and \
            span_prefill != "off" else 0
        """Prompts of at most this many tokens are prefilled inside the decode steps while rows decode (0: never;
        see `span_prefill_limit`)."""
        self.kv_bytes_per_token = runtime_kv_bytes_per_token(runtime)
        """Bytes of KV cache one token of one request takes."""
        self.kv_capacity_bytes = max_batch * max_seq * self.kv_bytes_per_token
        """Bytes of the KV-cache rows this scheduler uses."""
        self.step_s: float | None = None
        """Moving average of one decode step's wall time (all active rows), seconds; None before the first."""
        self._last_step_end = 0.0  # perf_counter() at the end of the last step with running rows (0: none)
        self._token_s_window: deque[tuple[int, int, int]] = deque()
        """The recent whole steps' (wall ns, row-ns, tokens generated): each step's time, that time times its
        rows, and the tokens its rows got (accepted drafts count), for Retry-After's time per token; the last
        `TOKEN_S_WINDOW_S` seconds of them (at most `TOKEN_S_WINDOW_STEPS`). Integers: exact running sums."""
        self._token_s_sums = [0, 0, 0]  # the window's sums, column by column
        self.block_decoding = runtime_capabilities(runtime).block_decoding
        """A lone greedy request decodes in blocks of tokens on the device (see the module docstring)."""
        self.block_size = runtime_block_size(runtime)
        """Most tokens per block (the runtime's block size)."""
        self.block_target_s = BLOCK_TARGET_S
        """Longest a block should take (seconds); K halves while blocks take longer."""
        self.block_token_s: float | None = None
        """Moving average of one token's wall time in a block, seconds (picks K under `block_target_s`)."""
        self.blocks = 0
        """Blocks decoded so far (for tests and debugging)."""
        self._block_sizes_used: set[int] = set()  # a K's first block pays its graph capture: not timed
        self._free_rows = list(range(max_batch - 1, -1, -1))  # pop() hands out row 0 first
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._cancelled: set[Generation] = set()
        self._abort_all = False
        self._stopping = False
        self._cond = threading.Condition()
        self._outbox: list[tuple[Generation, int, GenerationEvent | BaseException]] = []
        self._cut_short = False  # the last isolated step stopped early for a new request
        self._thread = threading.Thread(target=self._run, name="solo-scheduler", daemon=True)
        self.error: BaseException | None = None
        """What stopped the scheduler thread, if a bug did (then every request fails and /health is 503)."""
        self.steps = 0
        """Decode steps run so far (for tests and debugging)."""
        self.prefill_calls = 0
        """Prefill calls (chunks) run so far (for tests and debugging)."""
        self.peak_active = 0
        """Most requests that held a row at once (for tests and load tests)."""
        self.prefill_pieces = 0
        """Prompt pieces prefilled inside decode steps so far (see `span_prefill_positions`)."""
        self.prefill_piece_tokens = 0
        """Prompt tokens prefilled inside decode steps so far."""
        self.pausable_steps = runtime_capabilities(runtime).pausable_steps and decode_batching == "fused" and \
            pause_steps_from_env()
        """Long decode steps pause between runs of layers to serve new requests' short prompt tails (see
        `_serve_arrivals_mid_step`; SOLO_PAUSE_STEPS=0 turns it off, for measurement)."""
        self.pause_min_step_s = PAUSE_MIN_STEP_S
        """Steps expected to take at least this long (seconds, `step_s`) are pausable."""
        self.mid_step_prefills = 0
        """New requests whose prompt tail and first token were served inside a paused step (tests, debugging)."""
        self.step_start_prefills = 0
        """The same, served in a call of their own right before a pausable step (its first pause point)."""
        self._paused_s = 0.0  # time the current step spent paused (not a measure of the step)
        if metrics is not None:
            metrics.watch_kv_cache(self.kv_used_bytes, self.kv_capacity_bytes, self.kv_bytes_per_token)

    # ------------------------------------------------------------------------------------ public API

    def start(self) -> None:
        """Start the scheduler thread (the rows' contents are forgotten: probes and warm-up wrote them)."""
        if self.prefix_cache is not None:
            self.prefix_cache.forget()
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """End every request (finish_reason "abort"), refuse new ones, and join the thread."""
        with self._cond:
            self._stopping = True
            self._abort_all = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def submit(self, requests: Sequence[Request], loop: asyncio.AbstractEventLoop, priority: int = 0) -> Generation:
        """Queue the choices of one API request, all or none.

        Args:
            requests: one prepared `Request` per choice (each with its own seed).
            loop: the event loop that will consume the events.
            priority: lower values leave the queue first (FIFO among equal values); 0 by default.

        Raises:
            QueueFullError: the choices do not fit in the free rows plus the queue's free room; it carries
                the estimated seconds until they would.
            SchedulerStoppedError: the scheduler is stopping.
        """
        generation = Generation(self, loop, requests)
        with self._cond:
            if self._stopping:
                raise SchedulerStoppedError("the server is shutting down; send the request to another instance")
            missing = len(self._waiting) + len(requests) - self.max_queue - len(self._free_rows)
            if missing > 0:
                wait_s = self._estimate_wait_s(missing)
                # Waiting requests first take the free rows (the scheduler thread admits them), then queue.
                starting = min(len(self._waiting), len(self._free_rows))
                raise QueueFullError(
                    f"the server is at capacity ({len(self._running) + starting} running or starting, "
                    f"{len(self._waiting) - starting} queued, queue limit {self.max_queue}"
                    + (f"; this request has {len(requests)} choices" if len(requests) > 1 else "")
                    + f"); a place is expected to free in about {wait_s} s, retry then",
                    retry_after_s=wait_s,
                )
            self._check_queue_wait(len(requests), priority)
            for i, r in enumerate(requests):
                self._enqueue(_Sequence(r, i, generation, priority))
            self._publish_load()
            self._cond.notify()
        return generation

    def _enqueue(self, seq: _Sequence) -> None:
        # Behind every waiting sequence of the same or a more urgent priority (stable, so FIFO by default).
        i = len(self._waiting)
        while i > 0 and self._waiting[i - 1].priority > seq.priority:
            i -= 1
        self._waiting.insert(i, seq)

    def release_rate(self) -> float | None:
        """Rows freed per second over the last `RELEASE_WINDOW` releases (None before 8 releases)."""
        with self._cond:
            return self._release_rate()

    def _release_rate(self) -> float | None:
        # Call with the lock held.
        times = self._releases
        if len(times) < 8 or times[-1] <= times[0]:
            return None
        return (len(times) - 1) / (times[-1] - times[0])

    def _check_queue_wait(self, rows: int, priority: int) -> None:
        # Admission control by time (call with the lock held): refused when the wait until the last of these
        # `rows` gets a row is predicted past max_queue_wait_s (`_predicted_wait_past_limit_s`).
        if self.max_queue_wait_s is None:
            return
        ahead = sum(1 for s in self._waiting if s.priority <= priority) + rows - len(self._free_rows)
        wait_s = self._predicted_wait_past_limit_s(ahead) if ahead > 0 else None
        if wait_s is not None:
            retry_s = max(1, min(3600, math.ceil(wait_s - self.max_queue_wait_s)))
            raise QueueFullError(
                f"the server is at capacity: a slot is expected to free for this request in about {wait_s:.1f} s "
                f"({len(self._running)} running, {len(self._waiting)} waiting), more than the queue-wait limit "
                f"of {self.max_queue_wait_s:g} s; retry in about {retry_s} s", retry_after_s=retry_s)

    def _predicted_wait_past_limit_s(self, ahead: int) -> float | None:
        # Seconds until `ahead` more rows are expected to free where that is past max_queue_wait_s, else None
        # (call with the lock held). Two predictions; the first past the limit counts. The rate rows have been
        # freeing (the last RELEASE_WINDOW releases; none before 8 of them) says how fast a queue drains in the
        # steady state, but not when the rows held now free: after a burst of short requests it predicted a
        # fraction of a second while one long request held the only row for 20 s more. So, where a row's time
        # per token is known, also the median time by which `ahead` of the running requests end
        # (`_chance_of_releases`); where fewer run, by which the first of them ends (a lower bound: a waiting
        # request can start only in a row one of them frees, and then free it again, short); in the steady
        # state that is the shorter one.
        limit_s = self.max_queue_wait_s or 0.0
        rate = self._release_rate()
        if rate is not None and ahead / rate > limit_s:
            return ahead / rate
        row_ns, tokens = self._token_s_sums[1], self._token_s_sums[2]
        if not self._running or tokens <= 0:
            return None
        ahead = ahead if ahead <= len(self._running) else 1
        token_s = row_ns / 1e9 / tokens
        lengths = sorted(self._released_lengths)
        if self._chance_of_releases(ahead, limit_s / token_s, lengths) >= 0.5:
            return None
        # The first time on a geometric grid past the limit by which it is an even chance, by bisection (the
        # chance grows with the time; every request ends by its token budget, so the last point is certain).
        last_s = max(max(1, s.request.max_new_tokens - len(s.request.output_ids)) for s in self._running) * token_s
        first_s = max(limit_s, token_s)
        lo, hi = 0, max(1, math.ceil(math.log(max(last_s, first_s) / first_s, 1.25)))
        while lo < hi:
            mid = (lo + hi) // 2
            if self._chance_of_releases(ahead, first_s * 1.25 ** mid / token_s, lengths) >= 0.5:
                hi = mid
            else:
                lo = mid + 1
        return max(min(first_s * 1.25 ** lo, last_s), limit_s)

    def _chance_of_releases(self, ahead: int, within_tokens: float, lengths: list[int]) -> float:
        # The probability that at least `ahead` running requests end within their next `within_tokens`
        # tokens (call with the lock held; `lengths`: the recently finished requests' generated tokens,
        # sorted). A request that has generated k tokens ends within them with the share of the finished
        # requests longer than k that ended by k + within_tokens (its empirical residual length); where none
        # was longer, as a heavy-tailed length whose median residual is its age: within / (k + within); and
        # certainly where its token budget runs out first. Independent requests: the count's distribution
        # by dynamic programming over them, capped at `ahead`.
        at_least = [1.0] + [0.0] * ahead  # at_least[j]: P(j or more of the requests so far end)
        for s in self._running:
            made = len(s.request.output_ids)
            if within_tokens >= s.request.max_new_tokens - made:
                p = 1.0
            else:
                past = bisect.bisect_right(lengths, made)
                if past < len(lengths):
                    p = (bisect.bisect_right(lengths, made + within_tokens) - past) / (len(lengths) - past)
                else:
                    p = within_tokens / (max(1, made) + within_tokens)
            for j in range(ahead, 0, -1):
                at_least[j] = at_least[j] * (1 - p) + at_least[j - 1] * p
        return at_least[ahead]

    def _note_token_time(self, seconds: float, rows: int, tokens: int) -> None:
        # One whole step for Retry-After: `seconds` of wall time in which `rows` rows got `tokens` tokens.
        window, sums = self._token_s_window, self._token_s_sums
        ns = round(seconds * 1e9)
        entry = (ns, ns * rows, tokens)
        for i in range(3):  # (before the entry shows: the event loop reads the sums without the lock)
            sums[i] += entry[i]
        window.append(entry)
        while len(window) > 1 and (sums[0] - window[0][0] >= TOKEN_S_WINDOW_S * 1e9
                                   or len(window) > TOKEN_S_WINDOW_STEPS):
            old = window.popleft()
            for i in range(3):
                sums[i] -= old[i]

    def _estimate_wait_s(self, rows: int) -> int:
        # Whole seconds until `rows` running requests have used their token budget (call with the lock held):
        # their tokens left times a row's time per token over the last seconds of steps, all their time over
        # all their tokens: a step with accepted drafts gives a row several, and a stalled step (a preempted
        # core) weighs its share of seconds, where a moving average of step times let one stall move
        # Retry-After by tens of seconds. Unknown (nothing decoded yet): 1 s, the shortest.
        row_ns, tokens = self._token_s_sums[1], self._token_s_sums[2]
        if not self._running or tokens <= 0:
            return 1
        token_s = row_ns / 1e9 / tokens
        remaining = sorted(max(0, s.request.max_new_tokens - len(s.request.output_ids)) for s in self._running)
        tokens = remaining[min(rows, len(remaining)) - 1]
        return max(1, min(3600, math.ceil(tokens * token_s)))

    def retry_after_s(self) -> int:
        """Whole seconds until a queue place is expected to free (1 when one is free or nothing is known)."""
        with self._cond:
            missing = len(self._waiting) + 1 - self.max_queue - len(self._free_rows)
            return self._estimate_wait_s(missing) if missing > 0 else 1

    def kv_used_bytes(self) -> int:
        """Bytes of KV cache the running requests hold now: (prompt + generated tokens) x bytes per token."""
        running = list(self._running)  # a snapshot: read from the metrics thread without the lock
        return sum(s.request.next_position for s in running) * self.kv_bytes_per_token

    def cancel(self, generation: Generation) -> None:
        """Drop a generation's waiting choices now and end its running ones before the next step."""
        with self._cond:
            kept = [s for s in self._waiting if s.generation is not generation]
            if len(kept) != len(self._waiting):
                self._waiting = deque(kept)
                self._publish_load()
            self._cancelled.add(generation)
            self._cond.notify()

    def abort_all(self) -> None:
        """End every waiting and running request with finish_reason "abort" (graceful shutdown's deadline)."""
        with self._cond:
            self._abort_all = True
            self._cond.notify()

    @property
    def active(self) -> int:
        """Requests holding a KV-cache row."""
        with self._cond:
            return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests waiting for a row."""
        with self._cond:
            return len(self._waiting)

    # ------------------------------------------------------------------------------ scheduler thread

    def _post(self, seq: _Sequence, item: GenerationEvent | BaseException) -> None:
        self._outbox.append((seq.generation, seq.index, item))

    def _flush(self) -> None:
        # Hand the posted events to their loops: one call_soon_threadsafe (one wake-up) per loop, so a
        # fused step over N requests wakes the event loop once, not N times.
        if not self._outbox:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for entry in self._outbox:
            by_loop.setdefault(entry[0].loop, []).append(entry)
        self._outbox = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    def _publish_load(self) -> None:
        # Called with the lock held.
        if self.metrics is not None:
            self.metrics.set_load(len(self._waiting), len(self._running))

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug in the scheduler itself: fail every request rather than hang it
            logger.exception("the scheduler stopped")
            self.error = exc
            with self._cond:
                self._stopping = True
                seqs = [*self._running, *self._waiting]
                self._running, self._waiting = [], deque()
                self._publish_load()
            self._outbox = [(seq.generation, seq.index, exc) for seq in seqs if not seq.request.finished]
            self._flush()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._running or self._cancelled or self._abort_all or self._stopping):
                    self._cond.wait()
                cancelled, self._cancelled = self._cancelled, set()
                aborted_waiting: list[_Sequence] = []
                if self._abort_all:
                    self._abort_all = False
                    aborted_waiting, self._waiting = list(self._waiting), deque()
                    cancelled |= {s.generation for s in self._running}
                admitted = self._admit()
                self._publish_load()
                stopping = self._stopping
            for seq in aborted_waiting:
                self._end(seq)
            for seq in [s for s in self._running if s.generation in cancelled]:
                self._end(seq)
            self._flush()
            for seq in admitted:
                if seq.request.finished:  # cancelled between admission and now
                    continue
                self._guard([seq], self._begin_prefill, seq)
            if not self._block_iteration() and not self._mixed_iteration():
                self._prefill_chunks()  # prefill first: a new request's first token does not wait for a step
                self._admit_late()
                if self._lone_block_sequence() is None:  # else its tokens come in blocks from the next iteration
                    self._timed_step([s for s in self._running if s.ready and not s.request.finished], [])
            self._release_finished()
            if stopping:
                with self._cond:
                    if not self._running and not self._waiting:
                        return

    def _timed_step(self, active: list[_Sequence], pieces: list[tuple[_Sequence, int]]) -> None:
        # One decode step (with prompt pieces riding in it, see _mixed_iteration), timed for step_s.
        if not active and not pieces:
            return
        start = time.perf_counter()
        self._paused_s = 0.0
        made = sum(len(s.request.output_ids) for s in active)
        self._guard(active + [s for s, _ in pieces], self._decode_step, active, pieces)
        end = time.perf_counter()
        elapsed = end - start - self._paused_s
        made = sum(len(s.request.output_ids) for s in active) - made
        # For Retry-After, the wall time since the previous step ended when rows ran through it: what a row
        # waits per step, the host's work between steps and the calls of pauses and prefills included.
        since = self._last_step_end if active and self._last_step_end >= start - SINCE_LAST_STEP_S else start
        self._last_step_end = end if active else 0.0
        if self._cut_short:  # a partial step: not a measure of a whole one
            self._cut_short = False
        elif active:
            self.step_s = elapsed if self.step_s is None else 0.8 * self.step_s + 0.2 * elapsed
            if made > 0:
                self._note_token_time(end - since, len(active), made)

    def _lone_block_sequence(self) -> _Sequence | None:
        # The request to decode in blocks: alone, past its prefill, greedy, needing nothing per token. Requests
        # waiting with no free row wait for this one to end: blocks end it sooner.
        if not self.block_decoding or len(self._running) != 1 or (self._waiting and self._free_rows):
            return None
        seq = self._running[0]
        request = seq.request
        if (not seq.ready or request.finished or seq.proposer is not None or request.needs_host_logits
                or not request.sampling.greedy):
            return None
        return seq

    def _block_iteration(self) -> bool:
        # A lone greedy request on a block-decoding runtime: one block of K tokens on the device, one host
        # sync (see the module docstring). False (nothing run) unless it is alone and needs nothing per token.
        seq = self._lone_block_sequence()
        if seq is None:
            return False
        request = seq.request
        k = self.block_size
        if self.block_token_s is not None:
            while k > 1 and k * self.block_token_s > self.block_target_s:
                k //= 2
        left = request.max_new_tokens - len(request.output_ids)
        k = block_tail(left, k)  # the tail in powers of two: every K a block uses is one of a few captured graphs
        first_use = k not in self._block_sizes_used
        self._block_sizes_used.add(k)
        self.blocks += 1
        start = time.perf_counter()

        def run_block() -> None:
            blocks = self.runtime.iter_blocks(seq.row, seq.last_token, request.next_position - 1, SamplingSpec(),
                                              frozenset(request.eos_ids), k, k=k)
            made = 0
            try:
                for tokens in blocks:
                    for token in tokens:
                        made += 1
                        self._emit(seq, request.append(token))
                        if request.finished:
                            return
            finally:
                blocks.close()
            if not made:  # the row's reserved length ended before the request's budget
                raise SoloError("decode blocks ended before the request finished: the KV-cache row is full")

        made = len(request.output_ids)
        self._guard([seq], run_block)
        made = len(request.output_ids) - made
        # A whole block is a measure of its tokens' time, except a K's first (its graph capture, compiles).
        if made > 0 and not request.finished and not first_use:
            per_token = (time.perf_counter() - start) / made
            self.block_token_s = per_token if self.block_token_s is None else 0.8 * self.block_token_s + 0.2 * per_token
            self.step_s = per_token if self.step_s is None else 0.8 * self.step_s + 0.2 * per_token
            self._note_token_time(per_token * made, 1, made)
        return True

    def _mixed_iteration(self) -> bool:
        # Stall-free batching (Agrawal et al., "Sarathi-Serve", OSDI 2024; vLLM's chunked prefill): while rows
        # decode, the prompts within `span_prefill_positions` are prefilled inside the decode step's one
        # `decode_spans` call, as spans of their rows beside the decode rows' tokens, at most `prefill_chunk`
        # prompt tokens per step (shortest remaining prompt first; a prompt may be cut anywhere, since its KV
        # and logits are the same bits for any split). A request admitted at the top of this iteration thus
        # waits only for the step in progress, and no step grows by more than the budget. Longer prompts keep
        # their separate chunk calls on the fixed grid, under what is left of the budget. With no row decoding,
        # the shortest prompt's (next chunk's) prefill is a call of its own first, the path Engine.run takes (a
        # lone request pays nothing for this), and the other prompts ride in the step that row's first decode
        # token makes: a burst on an idle server does not wait for one prefill call per request, nor do the
        # steps wait for prompts arriving meanwhile. False (nothing run) when mixing is off or no prompt is
        # within the limit and no row decodes (the long prompts' path).
        if not self.span_prefill_positions:
            return False
        self._admit_arrivals()
        pending = [s for s in self._running if not s.ready and s.prefilled and not s.request.finished]
        pending.sort(key=_Sequence.prefill_left)  # stable: admission order among equals
        budget = self.prefill_chunk or math.inf
        # Pieces ride in the step's one kernel call, whose memory grows with its tokens: at most one prompt's worth
        # even with --prefill-chunk 0 (whole prompts).
        piece_budget = min(budget, self.span_prefill_positions)
        spent = 0
        if not any(s.ready and not s.request.finished for s in self._running):
            short = [s for s in pending if len(s.request.prompt_ids) <= self.span_prefill_positions]
            if not short:
                return False
            seq = short[0]
            spent = self._chunk_tokens(seq)
            self._guard([seq], self._prefill, seq, spent)
            pending.remove(seq)
        pieces: list[tuple[_Sequence, int]] = []
        chunks: list[tuple[_Sequence, int]] = []
        for seq in pending:
            if len(seq.request.prompt_ids) <= self.span_prefill_positions:
                n = min(seq.prefill_left(), piece_budget - spent)
                if n > 0:
                    pieces.append((seq, int(n)))
                    spent += n
            else:
                n = self._chunk_tokens(seq)
                if not spent or spent + n <= budget:
                    chunks.append((seq, n))
                    spent += n
        for seq, n in chunks:  # longer prompts: their own prefill calls, as before
            self._guard([seq], self._prefill, seq, n)
        pieces = [(s, n) for s, n in pieces if not s.request.finished]
        if pieces and self.span_prefill == "before":  # one call for every prompt piece, then the decode step
            self._guard([s for s, _ in pieces], self._decode_step, [], pieces)
            pieces = []
        elif pieces and self._step_pauses([s for s in self._running if s.ready and not s.request.finished]):
            # The step's start is a pause point too: short tails get their first token from a call of their
            # own now, as they would at any later point of the step, instead of riding the whole batched step
            # (and waiting for the calls its pauses make for requests that arrived after them). They then
            # decode in the step.
            tails = [(s, n) for s, n in pieces if n == s.prefill_left() and self._is_pause_tail(s)]
            if tails:
                self.step_start_prefills += len(tails)
                self._guard([s for s, _ in tails], self._span_step, [], tails)
                pieces = [p for p in pieces if p not in tails]
        active = [s for s in self._running if s.ready and not s.request.finished]
        self._timed_step(active, pieces)
        return True

    def _step_pauses(self, seqs: list[_Sequence]) -> bool:
        # A decode step of `seqs` pauses between runs of layers for new requests (see _serve_arrivals_mid_step).
        return bool(self.pausable_steps and seqs and self.step_s is not None and self.step_s >= self.pause_min_step_s)

    def _admit(self) -> list[_Sequence]:
        # Waiting requests into free rows, by priority (call with the lock held).
        admitted = []
        now = time.perf_counter()
        while self._waiting and self._free_rows:
            seq = self._waiting.popleft()
            seq.request.stats.queue_s = now - seq.request.start_time
            if self.prefix_cache is not None:  # the free row holding the longest shared prefix
                seq.row = self.prefix_cache.pick_row(self._free_rows, seq.request.prompt_ids)
                self._free_rows.remove(seq.row)
            else:
                seq.row = self._free_rows.pop()
            admitted.append(seq)
        self._running.extend(admitted)
        self.peak_active = max(self.peak_active, len(self._running))
        return admitted

    def _admit_late(self) -> None:
        # Requests that arrived while this iteration's prefills ran: admitted now, and a prompt within one
        # chunk prefilled before the decode step instead of after it (its TTFT would wait a whole step:
        # 15-35% of the chat workload's requests at 8 req/s on 2 busy cores did). A longer prompt starts
        # with the next iteration's chunks. Each pass admits at least one request, so this ends.
        while late := self._admit_arrivals():
            short = [s for s in late if s.prefilled and not s.request.finished and self._is_short(s)]
            for seq in sorted(short, key=_Sequence.prefill_left):
                self._guard([seq], self._prefill, seq, seq.prefill_left())

    def _admit_arrivals(self, mid_step: bool = False) -> list[_Sequence]:
        # Requests that arrived since the top of the iteration (while it ended cancelled requests or loaded
        # the prefix cache into the admitted rows): admitted now, so their prompts join this step's pieces
        # instead of waiting for it. Returns them ([] when none could be admitted). Pending cancellations
        # send the loop back to its top first, except inside a paused step (`mid_step`), which ends anyway:
        # a cancelled stream only frees its row there, and the free rows are free already.
        with self._cond:
            if self._stopping or self._abort_all or (self._cancelled and not mid_step) or \
                    not (self._waiting and self._free_rows):
                return []
            late = self._admit()
            self._publish_load()
        for seq in late:
            if not seq.request.finished:  # (cancelled between admission and now: see _loop)
                self._guard([seq], self._begin_prefill, seq)
        return late

    def _is_short(self, seq: _Sequence) -> bool:
        # A whole prompt (after its cached part) within one chunk: prefilled in one call, never chunked.
        return seq.prefill_at == seq.request.stats.cached_tokens and \
            (not self.prefill_chunk or seq.prefill_left() <= self.prefill_chunk)

    @staticmethod
    def _is_pause_tail(seq: _Sequence) -> bool:
        # A new request whose whole prompt after the cached part is at most PAUSE_TAIL_TOKENS (not the last
        # piece of a prompt that earlier steps carried): served in a call of its own at a pause point.
        return seq.prefill_at == seq.request.stats.cached_tokens and seq.prefill_left() <= PAUSE_TAIL_TOKENS

    def _guard(self, seqs: list[_Sequence], fn, *args) -> None:  # noqa: ANN001
        # A failure (a bug, a device error) ends only the requests involved; the thread keeps serving.
        try:
            fn(*args)
        except Exception as exc:
            self._fail(seqs, exc)
        finally:
            self._flush()

    def _fail(self, seqs: list[_Sequence], exc: Exception) -> None:
        # (Called in an `except` block: the traceback of a bug goes to the log.)
        if isinstance(exc, KVCacheMemoryError | InvalidRequestError):  # (not a bug: one line, no traceback)
            logger.warning("a request was ended: %s", exc)
        else:
            logger.exception("generation failed")
        for seq in seqs:
            if not seq.request.finished:
                seq.request.abort("error")
                self._post(seq, exc)

    def _row_guard(self, seq: _Sequence, fn, *args):  # noqa: ANN001, ANN202
        # One request's own host work around a shared step (its draft, its token choice, its grammar, its draft's
        # acceptance): a failure there (a grammar that runs dead) ends that request alone, not the step's other
        # rows. Returns fn's result, or None when it failed.
        try:
            return fn(*args)
        except Exception as exc:
            self._fail([seq], exc)
            return None

    def _begin_prefill(self, seq: _Sequence) -> None:
        # The row's earlier KV is given up (or reused by the prefix cache): prefill starts after the cached part.
        request = seq.request
        seq.prefilled = True
        cached = 0 if self.prefix_cache is None else self.prefix_cache.load(seq.row, request.prompt_ids)
        request.stats.cached_tokens = cached
        seq.prefill_at = cached

    def _prefill_chunks(self) -> None:
        # Shortest remaining prompt first (a short turn's TTFT does not wait for a long document), within
        # one chunk's budget of tokens per iteration (the running streams' wait); at least one chunk runs.
        # A whole prompt within one chunk always runs (it never waits for a decode step: at most one per
        # free row); it counts against the budget, so a long prompt's chunk may wait for the next iteration.
        pending = [s for s in self._running if not s.ready and s.prefilled and not s.request.finished]
        if not pending:
            return
        pending.sort(key=_Sequence.prefill_left)  # stable: admission order among equals
        budget = self.prefill_chunk or math.inf
        spent = 0
        for seq in pending:
            n = self._chunk_tokens(seq)
            if spent and spent + n > budget and not self._is_short(seq):
                continue
            spent += n
            self._guard([seq], self._prefill, seq, n)

    def _chunk_tokens(self, seq: _Sequence) -> int:
        # The next chunk on the fixed grid: `prefill_chunk` tokens from the first uncached position.
        left = seq.prefill_left()
        return left if not self.prefill_chunk else min(left, self.prefill_chunk)

    def _prefill(self, seq: _Sequence, n: int) -> None:
        # The same calls Engine.run makes, into this request's row; a prompt longer than a chunk in chunks.
        request = seq.request
        start = seq.prefill_at
        ids = torch.tensor(request.prompt_ids[start:start + n], dtype=torch.long)
        if request.stats.prefill_start_s is None:
            request.stats.prefill_start_s = time.perf_counter() - request.start_time
        self.prefill_calls += 1
        logits = self.runtime.prefill(seq.row, ids, start)
        seq.prefill_at = start + n
        if seq.prefill_left() == 0:
            self._prefill_done(seq, logits)

    def _prefill_done(self, seq: _Sequence, logits: torch.Tensor) -> None:
        # The whole prompt is in the row: the first token from its last position's logits, then decode steps.
        seq.ready = True
        self._advance(seq, logits)
        if self.speculative is not None:
            seq.proposer = DraftProposer(self.speculative, seq.request, self.session_history)

    def _yield_to_new(self, done: list[_Sequence], rest: list[_Sequence]) -> bool:
        # Between two per-request calls of a step: when a new request waits with a free row, stop the step
        # (its prefill and first token go first: its TTFT waits for one call, not N); the requests not
        # served yet go first in the next step. Each request still makes exactly its own calls.
        if not rest or not (self._waiting and self._free_rows):
            return False
        self._cut_short = True
        with self._cond:
            served = set(map(id, done))
            self._running = [s for s in self._running if id(s) not in served] + done
        return True

    def _decode_step(self, seqs: list[_Sequence], pieces: Sequence[tuple[_Sequence, int]] = ()) -> None:
        self.steps += 1
        if self.decode_batching == "fused":
            self._span_step(seqs, pieces)
            return
        for i, seq in enumerate(seqs):
            # One call per request (its draft's verify or a batch-1 decode): bit-identical to Engine.run's step.
            self._span_step([seq])
            if self._yield_to_new(seqs[:i + 1], seqs[i + 1:]):
                return

    def _span_step(self, seqs: list[_Sequence], pieces: Sequence[tuple[_Sequence, int]] = ()) -> None:
        # One `decode_spans` call: a request with a draft feeds its last token and the draft (a verify), the
        # others their last token; each is bit-identical to its lone run's call on a runtime whose spans are
        # batch-invariant (the native CPU runtime), and separate calls elsewhere (`decode_spans_by_calls`).
        # `pieces` (fused steps with span prefill, see _mixed_iteration): (request, n) feeds the next n prompt
        # tokens into its row; a prompt whose last piece ran gets its first token from the piece's last logits.
        proposed = [(seq, self._draft(seq)) for seq in seqs]
        seqs = [seq for seq, draft in proposed if draft is not None]
        drafts = [draft for _, draft in proposed if draft is not None]
        row_ids = [s.row for s in seqs] + [s.row for s, _ in pieces]
        spans = [[s.last_token, *draft] for s, draft in zip(seqs, drafts, strict=True)]
        spans += [s.request.prompt_ids[s.prefill_at:s.prefill_at + n] for s, n in pieces]
        starts = [s.request.next_position - 1 for s in seqs] + [s.prefill_at for s, _ in pieces]
        for seq, n in pieces:
            if seq.request.stats.prefill_start_s is None:
                seq.request.stats.prefill_start_s = time.perf_counter() - seq.request.start_time
            self.prefill_pieces += 1
            self.prefill_piece_tokens += n
        # Only a step with decode rows pauses: the calls made in its pauses carry prompt pieces alone.
        logits = decode_spans(self.runtime, row_ids, spans, starts,
                              between=self._serve_arrivals_mid_step if self._step_pauses(seqs) else None)
        for (seq, n), piece in zip(pieces, logits[len(seqs):], strict=True):
            seq.prefill_at += n
            if seq.prefill_left() == 0:
                self._row_guard(seq, self._prefill_done, seq, piece[-1])
        for seq, draft, rows in zip(seqs, drafts, logits[:len(seqs)], strict=True):
            if draft:
                self._row_guard(seq, self._accept, seq, draft, rows)
            else:
                self._row_guard(seq, self._advance, seq, rows[0])
        self._flush()

    def _draft(self, seq: _Sequence) -> list[int] | None:
        # The row's draft tokens ([] without speculation); None: proposing failed and the request was ended.
        return [] if seq.proposer is None else self._row_guard(seq, propose_draft, seq.request, seq.proposer)

    def _accept(self, seq: _Sequence, draft: list[int], rows: torch.Tensor) -> None:
        for event in accept_draft(seq.request, seq.proposer, draft, rows):
            self._emit(seq, event)

    def _serve_arrivals_mid_step(self) -> None:
        # Between runs of a long step's layers (the runtime pauses it: `pausable_steps`): new requests whose
        # prompt, after the prefix cache, is a tail of at most PAUSE_TAIL_TOKENS get it prefilled and their
        # first token now, in one call of their own, instead of after this step (whose rows wait for that
        # call: about one batch-1 step). A chat turn resent with its history is such a tail: its TTFT is then
        # about its idle TTFT plus a run of layers, not a whole batched step plus its own. Longer prompts are
        # admitted and start with the next iteration.
        start = time.perf_counter()
        for _ in range(PAUSE_MAX_CALLS):  # requests that arrive during a call are served after it
            if not (self._waiting and self._free_rows):  # a racy read: at worst this pause serves no one
                break
            late = self._admit_arrivals(mid_step=True)
            tails = [s for s in late if s.prefilled and not s.request.finished and self._is_pause_tail(s)]
            if not tails:
                break
            self.mid_step_prefills += len(tails)
            self._guard(tails, self._span_step, [], [(s, s.prefill_left()) for s in tails])
        self._paused_s += time.perf_counter() - start

    def _advance(self, seq: _Sequence, logits: torch.Tensor) -> None:
        token, info = seq.request.choose(logits)
        self._emit(seq, seq.request.append(token, info))

    def _emit(self, seq: _Sequence, event: GenerationEvent) -> None:
        seq.last_token = event.token_ids[-1]
        self._post(seq, event)
        if event.finish_reason is not None and self.metrics is not None:
            self.metrics.observe_finished(seq.request.stats, event.finish_reason)

    def _end(self, seq: _Sequence) -> None:
        # Abort one sequence: its consumer gets a last, empty event so a stream can still end cleanly.
        request = seq.request
        if request.finished:
            return
        request.abort(ABORT)
        request.stats.total_s = time.perf_counter() - request.start_time
        self._post(seq, GenerationEvent(text="", token_ids=[], finish_reason=ABORT, stats=request.stats))
        if self.metrics is not None:
            self.metrics.observe_finished(request.stats, ABORT)

    def _release_finished(self) -> None:
        with self._cond:
            done = [s for s in self._running if s.request.finished]
            if not done:
                return
            self._running = [s for s in self._running if not s.request.finished]
            self._free_rows.extend(s.row for s in done)
            now = time.perf_counter()
            self._releases.extend(now for _ in done)
            self._released_lengths.extend(len(s.request.output_ids) for s in done)
            self._publish_load()
        for seq in done:
            request = seq.request
            if self.prefix_cache is not None and seq.prefilled:
                if request.finish_reason == "error":  # the row's KV is unknown after a failed step
                    self.prefix_cache.forget(seq.row)
                elif not seq.ready:  # ended during its prefill: the chunks that ran are in the row
                    self.prefix_cache.finish(seq.row, request.prompt_ids[:seq.prefill_at])
                else:  # every token but the last was fed to the model
                    self.prefix_cache.finish(seq.row, request.prompt_ids + request.output_ids[:-1])
            if self.session_history is not None and request.output_ids:
                self.session_history.add(request.prompt_ids + request.output_ids)
