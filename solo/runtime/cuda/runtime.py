"""`CudaGraphRuntime`: batch-1 decode as replayed CUDA graphs, K tokens per replay.

A decode step (every layer, the LM head) runs over static buffers and a static KV cache, and reads the
token, position and cache row from a device state tensor, so it is captured once as a CUDA graph and
replayed at any position. Two kinds of graph are kept:

- "step": one forward step producing logits, for `decode` (the `DecodeRuntime` protocol, one row): the
  host samples, so it syncs once per token.
- "block": K forward steps, each followed by on-device sampling and the stop-token check
  (`solo.runtime.triton.sampling`), for `decode_block` and `iter_blocks`. The host reads the K tokens
  back once per block: one host synchronisation per K tokens. `iter_blocks` enqueues block n+1 before
  waiting for block n, so the GPU never idles while the host streams tokens out.

After a stop token (or once the token budget is spent) the remaining steps of a block still run but
change nothing: they neither emit tokens nor advance the position (they recompute the same cache slot).

The step comes from the fused Triton kernels ("triton", the default; "triton-pdl" launches them with
Hopper's programmatic dependent launch), from graph-safe torch ops ("torch"), or from those compiled
by torch.compile ("compiled", "compiled-max-autotune"); all are captured the same way. Prefill runs
the eager modules with host-known lengths (no syncs). Decoding several rows at once (the server's
batches) runs the same torch ops without graphs.

Without a GPU (tests), `use_graphs=False` runs the same step functions directly; the Triton step then
needs the Triton interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from solo.errors import SoloError
from solo.model.transformer import KVCache, Transformer
from solo.runtime.base import KVSnapshot, export_cache_kv, import_cache_kv
from solo.runtime.cuda.state import MODE_FILTERED, STATE_DONE, STATE_SIZE, DecodeState, SamplingSpec
from solo.runtime.cuda.torch_step import TorchStep, eager_forward_tokens

log = logging.getLogger(__name__)

STEPS = ("triton", "triton-pdl", "torch", "compiled", "compiled-max-autotune")
"""Ways to build the decode step (see the module docstring)."""

_COMPILE_MODES = {"compiled": "default", "compiled-max-autotune": "max-autotune-no-cudagraphs"}
_SEQ_ROUNDING = 256  # cache lengths grow in these steps, so graphs are not recaptured per request
_GREEDY = SamplingSpec()


def unsupported_reason(model: Transformer) -> str | None:
    """Why `CudaGraphRuntime` cannot run `model` (a one-line reason), or None when it can."""
    if model.device.type != "cuda":
        return "the cuda-graph backend needs the model on a CUDA device"
    if model.config.head_dim % 2:
        return f"head_dim {model.config.head_dim} is odd (RoPE needs pairs)"
    return None


@dataclass
class BlockResult:
    """Tokens of one decode block.

    Attributes:
        tokens: the generated tokens, in order (at most k; fewer after a stop token or at the budget).
        finished: a stop token was generated (it is the last of `tokens`).
    """

    tokens: list[int]
    finished: bool


class CudaGraphRuntime:
    """Batch-1 decode over a static KV cache with whole-step CUDA graphs (see the module docstring).

    Args:
        model: the loaded eager model (on a CUDA device unless `use_graphs=False`).
        step: one of `STEPS`, or "auto" (triton when installed).
        block_size: tokens per block replay (K), 1..max_block.
        use_graphs: capture CUDA graphs (default: on CUDA devices).
        tune: time the Triton kernels' launch configurations before the first capture (default: with
            graphs). Results are cached per GPU type (`solo.runtime.triton.tuning`).
        max_block: the largest K any call may ask for.

    Attributes:
        host_syncs: how many times the host has waited for the device (a prefill or a per-token decode
            counts one, as its caller reads the logits; a block counts one).

    Raises:
        SoloError: an unknown step, "triton-pdl" without Hopper and Triton >= 3.3, graphs asked for off
            CUDA, or a block_size outside [1, max_block].
    """

    name = "cuda-graph"
    # Several rows run batched torch ops (not the per-row graphs), whose results depend on the batch.
    batch_invariant = False
    # verify() runs k positions through batched torch ops, not the decode step's kernels.
    verify_matches_decode = False

    def __init__(self, model: Transformer, step: str = "auto", block_size: int = 16,
                 use_graphs: bool | None = None, tune: bool | None = None, max_block: int = 64) -> None:
        self.model = model
        self.config = model.config
        self.device = model.device
        if step == "auto":
            from solo.runtime.triton import triton_available

            step = "triton" if triton_available() else "torch"
        if step not in STEPS:
            raise SoloError(f"unknown decode step {step!r}; choose one of {', '.join(STEPS)}")
        self.step_kind = step
        self.pdl = False
        if step == "triton-pdl":
            from solo.runtime.triton.common import pdl_supported

            if not pdl_supported():
                raise SoloError("programmatic dependent launch needs a Hopper (or newer) GPU and Triton >= 3.3")
            self.pdl = True
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise SoloError("CUDA graphs need the model on a CUDA device")
        self.tune = self.use_graphs if tune is None else tune
        if not 1 <= block_size <= max_block:
            raise SoloError(f"block_size must be in [1, {max_block}], got {block_size}")
        self.block_size = block_size
        self.host_syncs = 0
        self.rows = 0
        self.max_seq = 0
        self.cache: KVCache | None = None
        self.state = DecodeState(self.config.vocab_size, max_block, self.device)
        self.logits = torch.zeros(self.config.vocab_size, dtype=torch.float32, device=self.device)
        self.sm_count = (torch.cuda.get_device_properties(self.device).multi_processor_count
                         if self.device.type == "cuda" else 132)
        self.tuned: dict[str, object] = {}
        self._step: Callable[[], None] | None = None
        self._step_ready = False
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._sampler_plan = None
        self._host_io: list[torch.Tensor] = []

    # ------------------------------------------------------------------------------------- the cache

    def reserve(self, rows: int, max_seq: int) -> None:
        """Make sure the cache holds `rows` rows of `max_seq` tokens.

        Growing it drops cached sequences and captured graphs. Lengths are rounded up (to a multiple of
        256 tokens, capped at the model's context length) so requests of similar lengths share graphs.
        One extra row, never handed out, is scratch for warm-up runs.
        """
        if self.cache is not None and rows <= self.rows and max_seq <= self.max_seq:
            return
        rows = max(rows, self.rows, 1)
        wanted = max(max_seq, self.max_seq)
        rounded = -(-wanted // _SEQ_ROUNDING) * _SEQ_ROUNDING
        max_seq = max(wanted, min(rounded, self.config.context_length))
        self._graphs.clear()
        self._step, self._step_ready, self.cache = None, False, None
        self.cache = KVCache(self.config, rows + 1, max_seq, self.model.dtype, self.device)
        self.rows, self.max_seq = rows, max_seq
        self._step = self._make_step()

    @property
    def scratch_row(self) -> int:
        """The cache row reserved for warm-up runs."""
        return self.rows

    def _make_step(self) -> Callable[[], None]:
        if self.step_kind.startswith("triton"):
            from solo.runtime.cuda.triton_step import TritonStep

            return TritonStep(self.model, self.cache, self.state.state, self.logits, self.sm_count,
                              pdl=self.pdl)
        return TorchStep(self.model, self.cache, self.state.state, self.logits, _COMPILE_MODES.get(self.step_kind))

    def _require_cache(self) -> None:
        if self.cache is None:
            raise SoloError("reserve() the KV cache before prefill or decode")

    # ---------------------------------------------------------------------------------- graph capture

    def _prepare(self) -> None:
        """Tune the kernels once per cache layout (before any capture)."""
        if self._step_ready:
            return
        if self.tune:
            self.state.park(self.scratch_row)
            self.tuned = self._step.tune() or {}
        self._step_ready = True

    def _runner(self, key: tuple, body: Callable[[], None]) -> Callable[[], None]:
        """A callable that runs `body`: a captured graph's replay on CUDA, `body` itself otherwise.

        Capture parks the state on the scratch row first, so the warm-up run (which compiles the
        kernels) touches no real sequence; the caller writes the real state after this returns.
        """
        self._prepare()
        if not self.use_graphs:
            return body
        graph = self._graphs.get(key)
        if graph is None:
            self.state.park(self.scratch_row)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                body()  # compiles Triton kernels / torch.compile outside the capture
            torch.cuda.current_stream(self.device).wait_stream(side)
            # Each graph gets its own memory pool: no graph's scratch can alias another's.
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                body()
            self._graphs[key] = graph
        return graph.replay

    def _block_body(self, k: int, mode: int) -> Callable[[], None]:
        from solo.runtime.triton import sampling

        if self._sampler_plan is None:
            self._sampler_plan = sampling.SamplerPlan(self.config.vocab_size, self.device)
        st, plan = self.state, self._sampler_plan

        def body() -> None:
            for slot in range(k):
                self._step()
                if mode == MODE_FILTERED:
                    sampling.filter_threshold(self.logits, st.state, st.params, st.threshold)
                sampling.sample_step(self.logits, st.state, st.params, st.threshold, st.stop_mask,
                                     st.out_tokens, slot, mode, plan, pdl=self.pdl)

        return body

    # --------------------------------------------------------------------------- DecodeRuntime protocol

    @torch.inference_mode()
    def prefill(self, row: int, token_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Prompt -> float32 [vocab] logits of its last position (see `DecodeRuntime.prefill`).

        Raises:
            SoloError: no cache reserved, or the row or positions fall outside it.
        """
        self._require_cache()
        ids = token_ids.to(torch.long).view(1, -1)
        seq = ids.shape[1]
        if not 0 <= row < self.rows or start_pos + seq > self.max_seq:
            raise SoloError(f"prefill of {seq} tokens at {start_pos} does not fit row {row} of the cache")
        positions = torch.arange(start_pos, start_pos + seq).view(1, -1)
        rows = torch.tensor([row])
        logits = eager_forward_tokens(self.model, self.cache, self._to_device(ids), self._to_device(positions),
                                      self._to_device(rows), start_pos + seq, last_only=True)
        self.host_syncs += 1
        return logits[0, -1].float()

    @torch.inference_mode()
    def decode(self, rows: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step for a batch -> float32 [batch, vocab] (see `DecodeRuntime.decode`).

        One row replays the step graph; several rows run the graph-safe torch ops without a graph.

        Raises:
            SoloError: no cache reserved, mismatched lengths, or a row, position or token id out of range
                (the kernels would write outside the cache).
        """
        self._require_cache()
        rows, token_ids, positions = rows.view(-1).cpu(), token_ids.view(-1).cpu(), positions.view(-1).cpu()
        if not rows.numel() == token_ids.numel() == positions.numel() or rows.numel() == 0:
            raise SoloError("decode needs one row, token id and position per sequence")
        if (int(rows.min()) < 0 or int(rows.max()) >= self.rows or int(positions.min()) < 0
                or int(positions.max()) >= self.max_seq or int(token_ids.min()) < 0
                or int(token_ids.max()) >= self.config.vocab_size):
            raise SoloError(f"decode rows/positions/token ids out of range ({self.rows} rows x {self.max_seq} "
                            f"positions, vocabulary {self.config.vocab_size})")
        if rows.numel() == 1:
            run = self._runner(("step",), self._step)
            self.state.set_step(int(token_ids[0]), int(positions[0]), int(rows[0]))
            run()
            self.host_syncs += 1
            return self.logits.view(1, -1).clone()
        kv_len = int(positions.max()) + 1
        logits = eager_forward_tokens(self.model, self.cache, self._to_device(token_ids.view(-1, 1)),
                                      self._to_device(positions.view(-1, 1)), self._to_device(rows), kv_len,
                                      last_only=True)
        self.host_syncs += 1
        return logits[:, -1].float()

    # ------------------------------------------------------------------- capabilities (solo.runtime.base)

    @torch.inference_mode()
    def verify(self, row: int, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Score k consecutive tokens of one row: float32 [k, vocab], every position's logits (`VerifyRuntime`).

        One forward of the graph-safe torch ops over the k tokens (no graph: k varies), one host sync.

        Raises:
            SoloError: no cache reserved, k == 0, or the row or positions fall outside the cache.
        """
        self._require_cache()
        ids = token_ids.to(torch.long).view(1, -1)
        k = ids.shape[1]
        if k == 0 or not 0 <= row < self.rows or start_pos < 0 or start_pos + k > self.max_seq:
            raise SoloError(f"verify of {k} tokens at {start_pos} does not fit row {row} of the cache")
        positions = torch.arange(start_pos, start_pos + k).view(1, -1)
        logits = eager_forward_tokens(self.model, self.cache, self._to_device(ids), self._to_device(positions),
                                      self._to_device(torch.tensor([row])), start_pos + k)
        self.host_syncs += 1
        return logits[0].float()

    def export_kv(self, row: int, length: int) -> KVSnapshot:
        """Copy positions 0 .. length - 1 of `row` out of the cache, on the device (`KVSnapshotRuntime`)."""
        self._check_row(row)
        return export_cache_kv(self.cache, row, length)

    def import_kv(self, row: int, snapshot: KVSnapshot, length: int, start: int = 0) -> None:
        """Write a snapshot's positions start .. length - 1 into `row` (`KVSnapshotRuntime`)."""
        self._check_row(row)
        import_cache_kv(self.cache, row, snapshot, length, start)

    def _check_row(self, row: int) -> None:
        self._require_cache()
        if not 0 <= row < self.rows:  # the scratch row is never a request's
            raise SoloError(f"row {row} is outside the cache's {self.rows} rows")

    # ------------------------------------------------------------------------------------ block decode

    def _start_block_run(self, row: int, token: int, position: int, sampling: SamplingSpec | object,
                         stop_ids: frozenset[int], max_tokens: int, k: int) -> tuple[Callable[[], None], int]:
        self._require_cache()
        if not 1 <= k <= self.state.max_block:
            raise SoloError(f"block size must be in [1, {self.state.max_block}], got {k}")
        if not 0 <= row < self.rows:
            raise SoloError(f"row {row} is outside the cache's {self.rows} rows")
        spec = sampling if isinstance(sampling, SamplingSpec) else SamplingSpec.from_resolved(sampling)
        # The step that feeds position p writes cache slot p; the last one fed is position + limit.
        limit = min(max_tokens, self.max_seq - 1 - position)
        run = self._runner(("block", k, spec.mode), self._block_body(k, spec.mode))
        if limit > 0:
            self.state.start(token, position, row, limit, spec, frozenset(stop_ids))
        return run, limit

    @torch.inference_mode()
    def decode_block(self, row: int, token: int, position: int, k: int | None = None,
                     sampling: SamplingSpec | object = _GREEDY, stop_ids: frozenset[int] = frozenset(),
                     max_tokens: int | None = None) -> BlockResult:
        """Generate up to k tokens after `token` in one graph replay and one host sync.

        Args:
            row: cache row holding the sequence.
            token: the last token so far (not yet fed to the model).
            position: its position.
            k: tokens to generate (default: `block_size`).
            sampling: a `SamplingSpec` or a resolved sampling object (`ResolvedSampling`); penalties are
                not supported.
            stop_ids: tokens that end generation (reported as the last token).
            max_tokens: at most this many tokens (default: k).

        Returns:
            The tokens, and whether a stop token ended them. Sampling is seeded by (seed, position), so a
            sequence decoded block by block equals one decoded in one longer block.

        Raises:
            SoloError: no cache reserved, k outside [1, max_block], or a row outside the cache.
            ValueError: `sampling` asks for penalties.
        """
        k = k or self.block_size
        run, limit = self._start_block_run(row, token, position, sampling, stop_ids,
                                           k if max_tokens is None else min(k, max_tokens), k)
        if limit <= 0:
            return BlockResult([], False)
        run()
        self.host_syncs += 1
        io = self.state.io[:STATE_SIZE + k].tolist()
        tokens = [t for t in io[STATE_SIZE:] if t >= 0]
        return BlockResult(tokens, bool(io[STATE_DONE]))

    @torch.inference_mode()
    def iter_blocks(self, row: int, token: int, position: int, sampling: SamplingSpec | object,
                    stop_ids: frozenset[int], max_tokens: int, k: int | None = None) -> Iterator[list[int]]:
        """Stream a generation block by block, one host sync per block, the next block always queued.

        Args:
            row, token, position, sampling, stop_ids: as `decode_block`.
            max_tokens: tokens to generate at most.
            k: tokens per block (default: `block_size`).

        Yields:
            Each block's tokens (non-empty lists); ends after a stop token or `max_tokens` tokens.
            Closing the iterator early is safe: a block still queued completes on the device unseen.
            Generation also stops, short of `max_tokens`, where the reserved cache row ends.

        Raises:
            SoloError, ValueError: as `decode_block` (on the first `next()`).
        """
        k = k or self.block_size
        run, limit = self._start_block_run(row, token, position, sampling, stop_ids, max_tokens, k)
        if limit <= 0:
            return
        width = STATE_SIZE + k
        cuda = self.device.type == "cuda"
        if len(self._host_io) < 2 or self._host_io[0].numel() < width:
            # Pinned, so the device-to-host copy is asynchronous and ordered after the block.
            self._host_io = [torch.empty(self.state.io.numel(), dtype=torch.int64, pin_memory=cuda)
                             for _ in range(2)]
        pending: collections.deque[tuple[torch.Tensor, torch.cuda.Event | None]] = collections.deque()
        launched = 0

        def launch() -> None:
            nonlocal launched
            run()
            host = self._host_io[launched % 2]  # free: at most two blocks are pending
            host[:width].copy_(self.state.io[:width], non_blocking=cuda)
            event = None
            if cuda:
                event = torch.cuda.Event()
                event.record()
            pending.append((host, event))
            launched += 1

        launch()
        produced = 0
        while pending:
            # Keep one block queued behind the one we wait for (only while the budget needs it).
            if launched * k < limit and len(pending) < 2:
                launch()
            host, event = pending.popleft()
            if event is not None:
                event.synchronize()
            self.host_syncs += 1
            io = host[:width].tolist()
            tokens = [t for t in io[STATE_SIZE:] if t >= 0]
            produced += len(tokens)
            if tokens:
                yield tokens
            if io[STATE_DONE] or produced >= limit or not tokens:
                return

    # ------------------------------------------------------------------------------------------ helpers

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def describe(self) -> dict[str, object]:
        """Backend, step kind, block size, graphs captured and tuned launch configurations (for reports)."""
        return {
            "backend": self.name, "step": self.step_kind, "block_size": self.block_size,
            "graphs": sorted(str(k) for k in self._graphs), "max_seq": self.max_seq,
            "tuned": {k: repr(v) for k, v in self.tuned.items()},
        }
