"""The native CPU runtime for lane models (Laneformer): a whole decode step in one native call.

The lane counterpart of `solo.runtime.cpu.CpuRuntime`, on the same kernel library (cpu_kernels/lanes.h,
compiled per ISA level by `solo.runtime.cpu_build`). On one device the lanes are a batch dimension
(../shared/laneformer.md section 5): each lane linear (`[L, out/L, in]` or `[L, out, in/L]`) is streamed as
one row-split matrix-vector product whose rows take their own lane's input, the residual is `[batch, L,
hidden]`, and the delayed sums of Delayed Tensor Parallelism read a ring of the last d + 1 layers' partials.
A decode step reads every weight once, as a dense model of the same shape does, so it has the same roofline.

Numerics follow the eager `LaneTransformer` (solo/model/lanes.py), which stays the oracle: every rounding to
the activation dtype where eager rounds, lane sums in lane order with float32 accumulation, interleaved RoPE
from the eager model's own float32 tables. Every delay mode (d = 0, early all-reduce on or off, any per-layer
broadcast flags), sliding windows per layer and each `lm_head_type` run natively.

Prefill runs the eager model's forward over this runtime's cache (batched PyTorch matmuls per layer), so the
cache holds exactly what eager would have written. Capabilities: `verify` (the decode kernel over k
positions of one row, on one thread) and `export_kv` / `import_kv` (the cache layout is the eager one).
Lane models sharded over ranks (`--tp`), non-CPU devices and dtypes other than bfloat16 / float32 are
refused by `cpu_lanes_unsupported_reason`, and `create_runtime` then uses the eager runtime.
"""

from __future__ import annotations

import ctypes
import math

import torch
from torch import nn

from solo.cpus import threads_within_cpu_limit
from solo.errors import SoloError
from solo.model.lanes import LaneTransformer
from solo.model.transformer import KVCache
from solo.runtime.base import KVSnapshot, export_cache_kv, import_cache_kv
from solo.runtime.cpu import (
    _W_BF16,
    _W_F32,
    _Layer,
    _Mat,
    _Model,
    allocate_beside_cache,
    bind_kv_cache,
    checked_library,
    checked_step_inputs,
    new_workspace,
    step_workspace,
)
from solo.runtime.cpu_build import KernelBuildError, library_isa

_DT_BF16, _DT_F32 = 0, 1
_HEAD_TYPES = {"replicate": 0, "pre_norm_lane_agg": 1, "lane": 2, "vocab_parallel": 3}
_LANE_MATS = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")


class _LaneLayer(ctypes.Structure):
    _fields_ = [(name, _Mat) for name in _LANE_MATS] + [
        ("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p),
        ("bcast_attn", ctypes.c_int32), ("bcast_mlp", ctypes.c_int32)]


class _LaneModel(ctypes.Structure):
    _fields_ = [("base", ctypes.POINTER(_Model)), ("lanes", ctypes.c_int32), ("delay", ctypes.c_int32),
                ("early_comm", ctypes.c_int32), ("head_type", ctypes.c_int32), ("sqrt_lanes", ctypes.c_float),
                ("layer", ctypes.POINTER(_LaneLayer))]


def _python_layout() -> list[int]:
    out: list[int] = []
    for struct in (_LaneLayer, _LaneModel):
        out.append(ctypes.sizeof(struct))
        out += [getattr(struct, name).offset for name, _ in struct._fields_]
    return out


_declared: set[int] = set()


def lane_library() -> ctypes.CDLL:
    """The kernel library with the lane entry points declared and their struct layout checked.

    Raises:
        KernelBuildError: the library cannot be built or loaded, lacks the lane entry points, or its lane
            struct layout differs from this module's ctypes mirrors.
        IsaError: `SOLO_CPU_ISA` names a level this CPU lacks.
    """
    lib = checked_library()
    if id(lib) in _declared:
        return lib
    p, i = ctypes.c_void_p, ctypes.c_int
    try:
        lib.solo_lane_workspace_bytes.argtypes = [p, i, i]
        lib.solo_lane_workspace_bytes.restype = ctypes.c_size_t
        lib.solo_lane_decode.argtypes = [p, i, p, p, p, p, p, p, p, i]
        lib.solo_lane_decode.restype = None
        lib.solo_lane_struct_layout.argtypes = [ctypes.POINTER(ctypes.c_int64), i]
        lib.solo_lane_struct_layout.restype = i
    except AttributeError as exc:
        raise KernelBuildError(f"the CPU kernel library lacks a lane entry point ({exc}); delete it to rebuild") \
            from None
    expected = _python_layout()
    buf = (ctypes.c_int64 * (len(expected) + 16))()
    count = lib.solo_lane_struct_layout(buf, len(buf))
    if list(buf[:min(count, len(buf))]) != expected:
        raise KernelBuildError("the CPU kernels' lane struct layout differs from solo/runtime/cpu_lanes.py: "
                               "update lanes.h and cpu_lanes.py together")
    _declared.add(id(lib))
    return lib


def cpu_lanes_unsupported_reason(model: nn.Module) -> str | None:
    """Why the native CPU runtime cannot run this lane model, or None when it can.

    Checks that it is a one-process `LaneTransformer` (all lanes held here) on the CPU with bfloat16 or
    float32 weights and an even head size, and that the kernel library builds.
    """
    if not isinstance(model, LaneTransformer):
        return f"{type(model).__name__} is not a lane model (solo.model.lanes.LaneTransformer)"
    if model.shard.num_lanes != model.lane_config.num_lanes:
        return "the model holds only some of its lanes (a tensor-parallel shard); the CPU kernels run all lanes"
    if model.device.type != "cpu":
        return f"the model is on {model.device}, not the CPU"
    if model.dtype not in (torch.bfloat16, torch.float32):
        return (f"{model.dtype} weights are not supported by the CPU kernels (bfloat16 and float32 are): load the "
                "model with dtype bfloat16 or float32 (--dtype; auto loads float16 checkpoints as bfloat16)")
    if model.config.head_dim % 2 or model.config.head_dim > 1024:
        return f"head_dim {model.config.head_dim} is not supported by the CPU kernels (even, <= 1024)"
    if any(not isinstance(p, torch.Tensor) or p.dtype != model.dtype for p in model.parameters()):
        return "the lane model's weights are not all of one dtype (quantized lane models run eager)"
    try:
        lane_library()
    except KernelBuildError as exc:
        return str(exc)
    return None


class CpuLaneRuntime:
    """Decode runtime for lane models on the CPU (see the module docstring).

    Args:
        model: a one-process `LaneTransformer` with bfloat16 or float32 weights on the CPU (its parameters
            are made contiguous in place where they are not; values unchanged).
        rows: KV-cache rows (concurrent sequences).
        max_seq: tokens per row (0: reserve later).
        num_threads: decode threads (default: torch.get_num_threads() within the container's CPU quota:
            `solo.cpus.threads_within_cpu_limit`).

    Raises:
        SoloError: the model is not supported (`cpu_lanes_unsupported_reason` gives why).
    """

    name = "cpu"
    # Each sequence keeps its own accumulator chain per weight row and its own residual, so a row's logits do
    # not depend on the other rows of a batched decode (tests/runtime/test_cpu_lanes.py).
    batch_invariant = True
    speculative_auto = True

    def __init__(self, model: LaneTransformer, rows: int = 1, max_seq: int = 0, num_threads: int | None = None) -> None:
        reason = cpu_lanes_unsupported_reason(model)
        if reason is not None:
            raise SoloError(f"the cpu backend cannot run this model: {reason}")
        self.model = model
        self.config = model.config
        self.device = torch.device("cpu")
        self.quantization = None
        self.num_threads = num_threads or threads_within_cpu_limit(torch.get_num_threads())
        # float32: each position's verify logits equal a batch-1 decode step's bit for bit (the kernel's
        # multi-sequence tiles keep each sequence's order); bfloat16 as the dense runtime (see cpu.py).
        self.verify_matches_decode = model.dtype == torch.float32
        self.rows = 0
        self.max_seq = 0
        self.cache: KVCache | None = None
        self._lib = lane_library()
        self.isa = library_isa(self._lib)
        self._keep: list[torch.Tensor] = []
        self._layers = (_Layer * self.config.num_layers)()
        self._lane_layers = (_LaneLayer * self.config.num_layers)()
        self._base = _Model()
        self._struct = _LaneModel()
        self._workspace = torch.empty(0, dtype=torch.uint8)
        self._cos = self._sin = torch.empty(0)
        self._build_struct()
        if max_seq:
            self.reserve(rows, max_seq)

    # ----------------------------------------------------------------------------------------- setup

    def _tensor(self, owner: nn.Module, name: str) -> torch.Tensor:
        # The parameter itself when contiguous; else a contiguous copy the eager module is re-pointed at.
        tensor = getattr(owner, name).detach()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
            owner._parameters[name] = nn.Parameter(tensor, requires_grad=False)
        self._keep.append(tensor)
        return tensor

    def _mat(self, owner: nn.Module, name: str = "weight") -> _Mat:
        # A lane weight [L, rows per lane, cols] (or a plain [rows, cols]) as one row-major matrix.
        w = self._tensor(owner, name)
        fmt = _W_BF16 if w.dtype == torch.bfloat16 else _W_F32
        return _Mat(fmt, w.numel() // w.shape[-1], w.shape[-1], 32, w.data_ptr(), None, None)

    def _build_struct(self) -> None:
        cfg, model, lc = self.config, self.model, self.model.lane_config
        for i, layer in enumerate(model.layers):
            entry = self._lane_layers[i]
            attn, mlp = layer.attention, layer.feed_forward
            for name, owner in zip(_LANE_MATS, (attn.wq, attn.wk, attn.wv, attn.wo, mlp.w1, mlp.w3, mlp.w2),
                                   strict=True):
                setattr(entry, name, self._mat(owner))
            entry.attn_norm = self._tensor(layer.attention_norm, "weight").data_ptr()
            entry.ffn_norm = self._tensor(layer.ffn_norm, "weight").data_ptr()
            entry.bcast_attn = int(lc.broadcast_attention_to_future[i])
            entry.bcast_mlp = int(lc.broadcast_mlp_to_future[i])
            self._layers[i].window = cfg.layer_sliding_windows[i] or 0
        s = self._base
        s.dtype = _DT_BF16 if model.dtype == torch.bfloat16 else _DT_F32
        s.hidden, s.heads, s.kv_heads, s.head_dim = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        s.inter, s.vocab, s.layers = cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
        s.eps = cfg.rms_norm_eps
        s.attn_scale = cfg.attn_scale
        s.embed = self._tensor(model.tok_embeddings, "weight").data_ptr()
        s.final_norm = self._tensor(model.norm, "weight").data_ptr()
        head = model.lm_head_weight().detach()
        if not head.is_contiguous():  # a tied head is the embedding itself (contiguous)
            head = self._tensor(model.lm_head, "weight")
        self._keep.append(head)
        fmt = _W_BF16 if head.dtype == torch.bfloat16 else _W_F32
        s.head = _Mat(fmt, head.shape[0], head.shape[1], 32, head.data_ptr(), None, None)
        s.layer = ctypes.cast(self._layers, ctypes.POINTER(_Layer))
        t = self._struct
        t.base = ctypes.pointer(self._base)
        t.lanes, t.delay = lc.num_lanes, lc.broadcast_delay
        t.early_comm, t.head_type = int(lc.use_early_comm), _HEAD_TYPES[lc.lm_head_type]
        t.sqrt_lanes = math.sqrt(lc.num_lanes)  # ctypes rounds to float32, as PyTorch casts the scalar
        t.layer = ctypes.cast(self._lane_layers, ctypes.POINTER(_LaneLayer))

    def reserve(self, rows: int, max_seq: int) -> None:
        """Allocate the cache if it is smaller than `rows` x `max_seq` tokens (discarding its contents)."""
        if self.cache is not None and rows <= self.rows and max_seq <= self.max_seq:
            return
        rows, max_seq = max(rows, self.rows), max(max_seq, self.max_seq)
        self.cache = None  # free the old cache, tables and workspace before allocating the new ones
        self._cos = self._sin = torch.empty(0)
        self._workspace = torch.empty(0, dtype=torch.uint8)
        cache = bind_kv_cache(self, self._base, rows, max_seq)

        def tables() -> tuple[torch.Tensor, torch.Tensor]:
            # The eager model's own float32 interleaved-RoPE tables [max_seq, head_dim / 2] (element for element
            # what it computes for any single position).
            cos, sin = self.model.rotary(torch.arange(max_seq).view(1, -1))
            return cos[0].float().contiguous(), sin[0].float().contiguous()  # (float32 whatever torch's default)

        # (a transient pair beside the kept one while they are made)
        cos, sin = allocate_beside_cache(tables, 4 * max_seq * (self.config.head_dim // 2) * 4,
                                         f"the RoPE tables of {max_seq} positions need", rows, max_seq)
        need = self._lib.solo_lane_workspace_bytes(ctypes.byref(self._struct), 1, self.num_threads)
        workspace = new_workspace(need, rows, max_seq)
        # the sizes last: after a failure the next reserve() allocates again
        self._cos, self._sin, self.cache, self._workspace = cos, sin, cache, workspace
        self.rows, self.max_seq = rows, max_seq

    def weight_nbytes(self) -> int:
        """Bytes of weights one decode step streams (matrices, norms, the LM head; the embedding as one row).

        A tied LM head counts the whole embedding matrix (the head reads it in full).
        """
        seen, total = set(), 0
        embed = self.model.tok_embeddings.weight
        for t in self._keep:
            if t.data_ptr() in seen or t.data_ptr() == embed.data_ptr():
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        if self.model.lm_head is None:
            total += embed.numel() * embed.element_size()
        return total + self.config.hidden_size * embed.element_size()

    def skip_matmuls(self, skip: bool) -> None:
        """Measurement only: matrix-vector products write zeros without reading their weights."""
        self._base.skip_matmuls = int(skip)

    # ------------------------------------------------------------------------------------------ steps

    @torch.inference_mode()
    def prefill(self, row: int, token_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Prompt -> float32 [vocab] logits of its last position (see `DecodeRuntime.prefill`).

        The eager model's forward over this runtime's cache (batched matmuls per layer).

        Raises:
            SoloError: the row or the positions fall outside the reserved cache, or the prompt is empty.
        """
        ids = token_ids.to(self.device, torch.long).view(1, -1)
        seq = ids.shape[1]
        if self.cache is None or not 0 <= row < self.rows or start_pos + seq > self.max_seq or seq == 0:
            raise SoloError(f"prefill of row {row}, positions {start_pos}..{start_pos + seq - 1} is "
                            f"outside the reserved cache ({self.rows} rows x {self.max_seq} tokens)")
        positions = torch.arange(start_pos, start_pos + seq).view(1, -1)
        logits = self.model(ids, positions, self.cache, torch.tensor([row]), last_only=True)
        return logits[0, -1].float()

    @torch.inference_mode()
    def decode(self, rows: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step for a batch -> float32 [batch, vocab] (see `DecodeRuntime.decode`).

        Args:
            rows, token_ids, positions: int64 [batch] each (any device; copied to the CPU).

        Raises:
            SoloError: no cache reserved, mismatched lengths, or a row, position or token id out of range
                (checked, since the kernels do not).
        """
        rows, ids, positions = checked_step_inputs(self, rows, token_ids, positions)
        batch = rows.numel()
        cos, sin = self._cos[positions].contiguous(), self._sin[positions].contiguous()
        struct = ctypes.byref(self._struct)
        need = self._lib.solo_lane_workspace_bytes(struct, batch, self.num_threads)
        self._workspace = step_workspace(self, self._workspace, need)
        logits = torch.empty(batch, self.config.vocab_size, dtype=torch.float32)
        self._lib.solo_lane_decode(struct, batch, ids.data_ptr(), positions.data_ptr(), rows.data_ptr(),
                                   cos.data_ptr(), sin.data_ptr(), logits.data_ptr(), self._workspace.data_ptr(),
                                   self.num_threads)
        return logits

    # ------------------------------------------------------------------- capabilities (solo.runtime.base)

    @torch.inference_mode()
    def verify(self, row: int, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Score k consecutive tokens of one row: float32 [k, vocab], every position's logits (`VerifyRuntime`).

        The decode kernel over k batch entries sharing the row at consecutive positions, on one thread (so every
        entry's keys and values are in the cache before any entry attends), as `CpuRuntime.verify`.

        Raises:
            SoloError: no cache, k == 0, or the row, positions or ids fall outside the cache / vocabulary.
        """
        ids = token_ids.to("cpu", torch.long).view(-1)
        k = ids.numel()
        if k == 0:
            raise SoloError("verify needs at least one token")
        threads = self.num_threads
        self.num_threads = 1
        try:
            return self.decode(torch.full((k,), row, dtype=torch.long), ids,
                               torch.arange(start_pos, start_pos + k, dtype=torch.long))
        finally:
            self.num_threads = threads

    def export_kv(self, row: int, length: int) -> KVSnapshot:
        """Copy positions 0 .. length - 1 of `row` out of the cache (see `KVSnapshotRuntime`)."""
        return export_cache_kv(self.cache, row, length)

    def import_kv(self, row: int, snapshot: KVSnapshot, length: int, start: int = 0) -> None:
        """Write a snapshot's positions start .. length - 1 into `row` (see `KVSnapshotRuntime`)."""
        import_cache_kv(self.cache, row, snapshot, length, start)
