"""`MegakernelRuntime`: batch-1 decode as one persistent kernel launch per N tokens.

Prefill runs the eager modules over the runtime's own static KV cache (host-known lengths, no syncs).
Decoding one row launches the interpreter kernel (kernel.cu) over the scheduled program: `decode`
runs one step and returns its logits; `iter_blocks` runs up to `max_launch_tokens` steps per launch
with the token choice (greedy argmax, or temperature sampling by the Gumbel-max trick, seeded by
(seed, position)) and the stop check on the device, and streams tokens while the kernel runs by
polling a token ring in mapped pinned host memory (the kernel writes each token, fences at system
scope, then bumps the ring's count). Requests with top-k / top-p / min-p decode one step per launch
and sample with torch ops. Several rows at once run the eager modules.

The launch is cooperative (`cuLaunchCooperativeKernel`): the driver then guarantees that every CTA is
resident at once, which the spinning counter waits need (no grid barrier is used).

With `emulate=True` (tests on machines without a GPU) the model stays on the CPU and each launch runs
kernel.cu's own source through the host emulation (`emulate.py`), synchronously, with small CTAs:
everything in this class but the CUDA driver calls is exercised.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Iterator

import torch

from solo.errors import SoloError
from solo.model.transformer import KVCache, Transformer
from solo.runtime.cuda.torch_step import eager_forward_tokens
from solo.runtime.megakernel.graph import (
    MAX_STOP_IDS,
    STATE_ERROR,
    lower_decode_step,
    megakernel_unsupported_reason,
    plan_dims,
)
from solo.runtime.megakernel.nvrtc import (
    KERNEL_NAME,
    NTHREADS,
    TABLE_GLOBAL_SLOTS,
    TABLE_LAYER,
    compile_kernel,
    kernel_unsupported_reason,
    nvrtc_available,
    pointer_table,
    shared_memory_bytes,
    stage_bytes_for,
)
from solo.runtime.megakernel.schedule import Program, schedule
from solo.runtime.megakernel.vm import make_buffers, model_weights, set_state

log = logging.getLogger(__name__)

_SEQ_ROUNDING = 256  # cache lengths grow in these steps (the weights' RoPE tables follow them)
_ATTN_LEN_ESTIMATE = 512  # KV length the schedule's attention costs assume


def unsupported_reason(model: Transformer) -> str | None:
    """Why `MegakernelRuntime` cannot run `model` (a one-line reason), or None when it can."""
    if model.device.type != "cuda" or not torch.cuda.is_available():
        return "the megakernel backend needs a CUDA GPU"
    major, _ = torch.cuda.get_device_capability(model.device)
    if major < 8:
        return "the megakernel backend needs an Ampere (sm_80) or newer GPU"
    if model.dtype != torch.bfloat16:
        return "the megakernel backend runs bfloat16 weights (use --dtype bfloat16)"
    reason = megakernel_unsupported_reason(model.config)
    if reason is None:
        reason = nvrtc_available()
    if reason is None:
        num_sms = torch.cuda.get_device_properties(model.device).multi_processor_count
        stage = _stage_bytes(model.config)
        reason = kernel_unsupported_reason(plan_dims(model.config, _SEQ_ROUNDING, num_sms, 2, stage), stage)
    return reason


def _stage_bytes(config) -> int:
    return stage_bytes_for(config.hidden_size, config.intermediate_size, config.num_heads * config.head_dim)


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    # sm_90a unlocks Hopper-only instructions; the "a" target exists for 9.0 and 10.x.
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


class _Kernel:
    """The compiled interpreter loaded into torch's CUDA context."""

    def __init__(self, cubin: bytes, smem: int) -> None:
        from cuda.bindings import driver as cu

        self.cu = cu
        _check(cu.cuInit(0)[0], "cuInit")
        err, self.module = cu.cuModuleLoadData(cubin)
        _check(err, "cuModuleLoadData")
        err, self.func = cu.cuModuleGetFunction(self.module, KERNEL_NAME.encode())
        _check(err, "cuModuleGetFunction")
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check(cu.cuFuncSetAttribute(self.func, attr, smem)[0], "cuFuncSetAttribute")
        self.smem = smem

    def launch(self, grid: int, args: tuple, stream: torch.cuda.Stream) -> None:
        types = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
        err = self.cu.cuLaunchCooperativeKernel(self.func, grid, 1, 1, NTHREADS, 1, 1, self.smem,
                                                self.cu.CUstream(stream.cuda_stream), (args, types))[0]
        _check(err, "cuLaunchCooperativeKernel")


def _check(err, what: str) -> None:
    if int(err) != 0:
        raise SoloError(f"the megakernel's {what} failed: {err}")


class _EmulatedLauncher:
    """Runs launches through `EmulatedKernel` (same argument tuple as `_Kernel.launch`)."""

    def __init__(self, dims, nthreads: int, stage_bytes: int) -> None:
        from solo.runtime.megakernel.emulate import EmulatedKernel

        self.kernel = EmulatedKernel(dims, nthreads, stage_bytes)

    def launch(self, grid: int, args: tuple, stream: object) -> None:
        smem = shared_memory_bytes(self.kernel.dims, self.kernel.nthreads, self.kernel.stage_bytes)
        if self.kernel.lib.solo_emu_launch(grid, self.kernel.nthreads, smem, *args, 60.0) != 0:
            raise SoloError("the emulated megakernel launch deadlocked")


class _DoneNow:
    """Stands in for a CUDA event when launches are synchronous (emulation)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class MegakernelRuntime:
    """Batch-1 decode by the persistent interpreter kernel (see the module docstring).

    Args:
        model: a bfloat16 dense Llama-family eager model on a CUDA device (on the CPU with `emulate`).
        num_sms: persistent CTAs (default: the GPU's SM count; 2 when emulating).
        max_launch_tokens: the most decode steps one launch runs (`iter_blocks`).
        emulate: run kernel.cu on the CPU through the host emulation (tests; slow).

    Attributes:
        host_syncs: times the host waited for the device (a prefill, a decode, a launch).
        launches: kernel launches so far.
        launch_host_s: host seconds spent preparing and enqueuing launches (the host's share of decode
            besides polling the ring; the issue's target is under 2% of the step time per token).

    Raises:
        SoloError: `unsupported_reason(model)` is not None.
    """

    name = "megakernel"
    batch_invariant = False

    def __init__(self, model: Transformer, num_sms: int | None = None, max_launch_tokens: int = 256,
                 emulate: bool = False) -> None:
        self.emulate = emulate
        if emulate:
            reason = (megakernel_unsupported_reason(model.config)
                      or (None if model.dtype == torch.bfloat16 else "the megakernel runs bfloat16 weights")
                      or (None if model.device.type == "cpu" else "emulation runs on the CPU"))
        else:
            reason = unsupported_reason(model)
        if reason is not None:
            raise SoloError(reason)
        self.model = model
        self.config = model.config
        self.device = model.device
        if emulate:
            self.num_sms, self.nthreads, self.stage_bytes = num_sms or 2, 32, 2048
        else:
            self.nthreads, self.stage_bytes = NTHREADS, _stage_bytes(self.config)
            self.num_sms = num_sms or torch.cuda.get_device_properties(self.device).multi_processor_count
        self.max_launch_tokens = max_launch_tokens
        self.rows = 0
        self.max_seq = 0
        self.cache: KVCache | None = None
        self.host_syncs = 0
        self.launches = 0
        self.launch_host_s = 0.0
        self.program: Program | None = None
        self._table_row = -1
        # Mapped pinned ring: [count, token 0, token 1, ...], written by the kernel, polled by the host.
        self.ring_host = torch.zeros(1 + max_launch_tokens, dtype=torch.int32, pin_memory=not emulate)
        self._ring_view = self.ring_host.numpy()

    # ------------------------------------------------------------------------------------- the cache

    def reserve(self, rows: int, max_seq: int) -> None:
        """Make sure the cache holds `rows` rows of `max_seq` tokens (rounded up to 256; drops the cache)."""
        if self.cache is not None and rows <= self.rows and max_seq <= self.max_seq:
            return
        rows = max(rows, self.rows, 1)
        wanted = max(max_seq, self.max_seq)
        max_seq = max(wanted, min(-(-wanted // _SEQ_ROUNDING) * _SEQ_ROUNDING, self.config.context_length))
        self.cache = None
        self.cache = KVCache(self.config, rows, max_seq, self.model.dtype, self.device)
        self.rows, self.max_seq = rows, max_seq
        self._build(max_seq)

    def _build(self, max_seq: int) -> None:
        dims = plan_dims(self.config, max_seq, self.num_sms, 2, self.stage_bytes)
        reason = None if self.emulate else kernel_unsupported_reason(dims, self.stage_bytes)
        if reason is not None:
            raise SoloError(reason)
        t0 = time.perf_counter()
        if self.program is None:
            # The program and the kernel do not depend on the cache length (the attention tasks
            # read it from the position; the kernel gets it per launch): built once.
            self.program = schedule(lower_decode_step(dims, attn_len_estimate=_ATTN_LEN_ESTIMATE), self.num_sms)
            if self.emulate:
                self.kernel = _EmulatedLauncher(dims, self.nthreads, self.stage_bytes)
            else:
                compiled = compile_kernel(dims, _arch(self.device), self.stage_bytes)
                self.kernel = _Kernel(compiled.cubin, shared_memory_bytes(dims, NTHREADS, self.stage_bytes))
        self.weights = model_weights(self.model, max_seq)
        self.buffers = make_buffers(dims, self.model.dtype, self.device, 1, self.program.num_counters,
                                    with_cache=False)
        self.instructions = torch.from_numpy(self.program.instructions).to(self.device)
        self.lengths = torch.from_numpy(self.program.lengths).to(self.device)
        self.table = torch.zeros(TABLE_GLOBAL_SLOTS + len(TABLE_LAYER) * dims.layers, dtype=torch.int64,
                                 device=self.device)
        self._table_row = -1
        log.info("megakernel: %d instructions on %d SMs, built in %.1f s", int(self.program.lengths.sum()),
                 self.num_sms, time.perf_counter() - t0)

    def _point_table(self, row: int) -> None:
        if row == self._table_row:
            return
        ptrs = pointer_table(self.weights, self.buffers, [k[row] for k in self.cache.k], [v[row] for v in self.cache.v])
        self.table.copy_(torch.tensor(ptrs, dtype=torch.int64))
        self._table_row = row

    def _require_cache(self) -> None:
        if self.cache is None:
            raise SoloError("reserve() the KV cache before prefill or decode")

    # -------------------------------------------------------------------------------------- launches

    def _launch(self, row: int, token: int, position: int, n_steps: int, stop_ids: tuple[int, ...],
                stream_ring: bool = False, temperature: float = 0.0, seed: int = 0) -> None:
        """Enqueue a launch of `n_steps` steps (state, counters and, with `stream_ring`, the ring reset)."""
        t0 = time.perf_counter()
        self._point_table(row)
        set_state(self.buffers["state"], token, position, n_steps, stop_ids, temperature, seed)
        self.buffers["counters"].zero_()
        if stream_ring:
            # An earlier launch still in flight could bump the count after this reset.
            if not self.emulate:
                torch.cuda.current_stream(self.device).synchronize()
            self._ring_view[0] = 0
        args = (self.instructions.data_ptr(), self.lengths.data_ptr(), int(self.program.instructions.shape[1]),
                self.table.data_ptr(), self.buffers["counters"].data_ptr(), self.buffers["state"].data_ptr(),
                self.ring_host.data_ptr(), n_steps, self.max_seq)
        self.kernel.launch(self.num_sms, args, None if self.emulate else torch.cuda.current_stream(self.device))
        self.launches += 1
        self.launch_host_s += time.perf_counter() - t0

    # --------------------------------------------------------------------------- DecodeRuntime protocol

    @torch.inference_mode()
    def prefill(self, row: int, token_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Prompt -> float32 [vocab] logits of its last position (eager modules; see `DecodeRuntime`).

        Raises:
            SoloError: no cache reserved, or the row or positions fall outside it.
        """
        self._require_cache()
        ids = token_ids.to(torch.long).view(1, -1)
        seq = ids.shape[1]
        if not 0 <= row < self.rows or start_pos + seq > self.max_seq:
            raise SoloError(f"prefill of {seq} tokens at {start_pos} does not fit row {row} of the cache")
        positions = torch.arange(start_pos, start_pos + seq).view(1, -1).to(self.device)
        logits = eager_forward_tokens(self.model, self.cache, ids.to(self.device), positions,
                                      torch.tensor([row], device=self.device), start_pos + seq, last_only=True)
        self.host_syncs += 1
        return logits[0, -1].float()

    @torch.inference_mode()
    def decode(self, rows: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step -> float32 [batch, vocab]: one kernel launch for one row, eager modules for several.

        Raises:
            SoloError: no cache reserved, mismatched lengths, or a row, position or token id out of range.
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
            self._launch(int(rows[0]), int(token_ids[0]), int(positions[0]), 1, ())
            self.host_syncs += 1
            logits = self.buffers["logits"].view(1, -1).clone()
            self._check_launch()
            return logits
        kv_len = int(positions.max()) + 1
        logits = eager_forward_tokens(self.model, self.cache, token_ids.view(-1, 1).to(self.device),
                                      positions.view(-1, 1).to(self.device), rows.to(self.device), kv_len,
                                      last_only=True)
        self.host_syncs += 1
        return logits[:, -1].float()

    # ---------------------------------------------------------------------------- N tokens per launch

    @torch.inference_mode()
    def iter_blocks(self, row: int, token: int, position: int, sampling: object,
                    stop_ids: frozenset[int], max_tokens: int, k: int | None = None) -> Iterator[list[int]]:
        """Stream a generation, N tokens per launch, yielded while the kernel runs.

        Greedy tokens come from launches of up to `max_launch_tokens` steps (the interface of
        `CudaGraphRuntime.iter_blocks`, which the engine's block loop drives).

        Args:
            row: cache row holding the sequence.
            token: the last token so far (not yet fed to the model), at `position`.
            position: its position.
            sampling: a `SamplingSpec` (or an object with its fields): greedy and temperature-only
                sampling run on the device; top-k / top-p / min-p decode one step per launch and sample
                with torch ops.
            stop_ids: tokens that end generation (reported as the last token).
            max_tokens: tokens to generate at most (also capped where the cache row ends).
            k: tokens per launch (default: `max_launch_tokens`).

        Yields:
            Non-empty lists of new tokens, in order.

        Raises:
            SoloError: no cache reserved, or a row outside the cache.
        """
        from solo.runtime.cuda.state import SamplingSpec

        self._require_cache()
        if not 0 <= row < self.rows:
            raise SoloError(f"row {row} is outside the cache's {self.rows} rows")
        spec = sampling if isinstance(sampling, SamplingSpec) else SamplingSpec.from_resolved(sampling)
        limit = min(max_tokens, self.max_seq - 1 - position)
        per_launch = max(1, min(k or self.max_launch_tokens, self.max_launch_tokens))
        device_stops = tuple(sorted(stop_ids))[:MAX_STOP_IDS]
        produced = 0
        if spec.temperature > 0 and (spec.top_k > 0 or spec.top_p < 1.0 or spec.min_p > 0):
            yield from self._iter_sampled(row, token, position, spec, stop_ids, limit)
            return
        while produced < limit:
            n = min(per_launch, limit - produced)
            self._launch(row, token, position, n, device_stops, stream_ring=True,
                         temperature=spec.temperature, seed=spec.seed)
            done_event = _DoneNow() if self.emulate else torch.cuda.Event()
            if not self.emulate:
                done_event.record()
            seen = 0
            while True:
                finished = done_event.query()
                count = int(self._ring_view[0])
                if count > seen:
                    tokens = [int(t) for t in self._ring_view[1 + seen:1 + count]]
                    seen = count
                    stop_at = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
                    if stop_at is not None:
                        yield tokens[:stop_at + 1]
                        done_event.synchronize()
                        self.host_syncs += 1
                        return
                    yield tokens
                if finished:
                    break
                time.sleep(20e-6)
            self.host_syncs += 1
            self._check_launch()
            produced += seen
            if seen < n or seen == 0:
                return
            token, position = int(self._ring_view[seen]), position + seen

    def _check_launch(self) -> None:
        """Raise if the last launch gave up on a counter wait (the kernel sets STATE_ERROR; a sync)."""
        if int(self.buffers["state"][STATE_ERROR]):
            raise SoloError("the megakernel stopped: a dependency wait timed out (a scheduling bug or a GPU "
                            "shared with other work); use --backend cuda-graph")

    def _iter_sampled(self, row: int, token: int, position: int, spec, stop_ids: frozenset[int],
                      limit: int) -> Iterator[list[int]]:
        gen = torch.Generator(device=self.device).manual_seed(spec.seed % 2**62)
        for _ in range(limit):
            self._launch(row, token, position, 1, ())
            self._check_launch()
            logits = self.buffers["logits"] / spec.temperature
            if spec.top_k > 0:
                kth = torch.topk(logits, min(spec.top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            if spec.min_p > 0:
                probs = probs.masked_fill(probs < spec.min_p * probs.max(), 0.0)
            if spec.top_p < 1.0:
                sorted_p, order = torch.sort(probs, descending=True)
                drop = sorted_p.cumsum(0) - sorted_p > spec.top_p
                probs = probs.scatter(0, order, sorted_p.masked_fill(drop, 0.0))
            token = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
            self.host_syncs += 1
            position += 1
            yield [token]
            if token in stop_ids:
                return

    def describe(self) -> dict[str, object]:
        """Backend, SMs, instructions and tiles (for reports)."""
        d = self.program.dims if self.program is not None else None
        return {
            "backend": self.name, "num_sms": self.num_sms, "max_seq": self.max_seq,
            "instructions": int(self.program.lengths.sum()) if self.program is not None else 0,
            "tiles": None if d is None else {"qkv_pairs": d.qkv_pairs, "o_rows": d.o_rows, "gu_rows": d.gu_rows,
                                              "down_rows": d.down_rows, "lm_rows": d.lm_rows, "splits": d.splits},
            "max_launch_tokens": self.max_launch_tokens, "emulated": self.emulate,
            "launches": self.launches, "launch_host_s": self.launch_host_s,
        }


