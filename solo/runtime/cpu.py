"""The CPU runtime: a whole decode step in one native call, long prefills in batched PyTorch matmuls.

Why this design (measured on a 2-core Sapphire Rapids, see benchmarks/results/): at batch 1 a decode
step is a chain of matrix-vector products that must stream every weight from DRAM once. PyTorch's bf16
`F.linear` at one row reached 1-9 GB/s here against ~25 GB/s of streaming bandwidth, depending on the
shape, and running the step op by op costs hundreds of Python dispatches per token. So the step runs
in `cpu_kernels/`: one OpenMP parallel region per token, AVX512-BF16 (or int8 / int4) matrix-vector
products that split each matrix's rows across the cores and stream them with software prefetch, fused
q/k/v and gate/up matrices, and the norms, RoPE and attention in between, with no allocation.
(torch.compile of a static-cache step was the alternative. Inductor's C++ codegen works here with
the system gcc (the bench's hf-compile peer runs it), but it removes the dispatch cost, not the
bandwidth gap: transformers with a static cache + torch.compile decoded at 30% / 51% of the roofline
on the Qwen2.5-0.5B / Llama-3.2-1B shapes, against 75% / 71% for this runtime, and it compiles for
minutes on two cores.)

Prefill is compute-bound: its matrix products run as batched PyTorch matmuls (oneDNN, AMX where the
CPU has it) on the same fused weights, with the native kernels doing the norms, RoPE, cache writes and
activation in between, row-parallel. On a CPU without a native bf16 matrix path (no AVX512-BF16 / AMX:
AVX2 machines such as AMD Zen 2/3), oneDNN's bf16 matmul was measured 2x slower than widening the
layer's bf16 weights to float32 and running a float32 matmul, so prefill does that there, one layer's
matrix at a time (`native_bf16_matmul`); both accumulate in float32 and round once to bf16.

Weights keep the eager model's row-major [out, in] layout, which is what a row-split matrix-vector
product streams: q/k/v and gate/up are concatenated into one buffer each and the eager parameters
become row views of it, so prefill and decode share one copy. Every layer's matrices are copied into
fresh mappings that start on a 2 MiB boundary and are advised for transparent huge pages before their
first touch (`_huge_page_buffer`): PyTorch's own allocations left matrices under 2 MiB and the unaligned
ends of larger ones on 4 KiB pages, which a 2-core Zen 4 read ~30% slower.

Supported: every feature of `solo.model` (biases, q/k norms, sandwich norms, soft-capping, sliding
windows, all RoPE types, mixture-of-experts layers) with float32 or bfloat16 weights, or int8/int4
weights from `solo.runtime.quant`. Mixture-of-experts layers route and run their experts inside the
decode step (`cpu_kernels/moe.h`, structs from `solo.runtime.cpu_moe`); their prefill groups the prompt's
tokens by expert and runs each expert's rows over its tokens natively (`solo.runtime.cpu_moe.moe_prefill`).
float16 weights and non-CPU devices are refused by `cpu_unsupported_reason`, and `create_runtime` then
falls back to the eager runtime.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import platform
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from solo.cpus import threads_within_cpu_limit
from solo.env import env_switch
from solo.errors import KVCacheMemoryError, SoloError
from solo.memory import KV_MEMORY_FIX, host_memory, size_text
from solo.model.config import ModelConfig
from solo.model.layers import _softcapped_attention, attention_mask
from solo.model.transformer import KVCache, Transformer, out_of_memory
from solo.runtime.base import KVSnapshot, check_spans, export_cache_kv, import_cache_kv
from solo.runtime.cpu_build import (
    KernelBuildError,
    check_kernel_env,
    library_isa,
    load_library,
    prefetch_distance_bytes,
    selected_level,
)
from solo.runtime.cpu_packing import AmxPackedLinear, packed_shape
from solo.runtime.cpu_threads import ThreadGovernor, adapt_threads_enabled
from solo.runtime.quant import QuantLinear, model_quantization

if TYPE_CHECKING:
    from solo.runtime.cpu_lanes import CpuLaneRuntime

_DT_BF16, _DT_F32 = 0, 1
_W_BF16, _W_F32, _W_INT8, _W_INT4, _W_INT4_BF16X = 0, 1, 2, 3, 4
_W_INT8_Q8, _W_INT4_Q8 = 5, 6  # the same weights, integer dot products with int8-quantized inputs (qdot.h)
_W_BF16_AMX = 7  # bf16 packed for the AMX level (solo.runtime.cpu_packing)
_ACTS = {"silu": 0, "gelu_pytorch_tanh": 1, "gelu": 2}
_SPAN_SHARED_ROWS, _SPAN_LAST_LOGITS = 1, 2  # solo_decode_span flags (decode.cpp)
PAUSES_PER_STEP = 6
"""Runs of layers a step pausable between layers is cut into (`CpuRuntime.pause_points`), the LM head apart:
each ends with one more thread-pool start (tens of microseconds) and is the longest a new request waits."""

SPAN_PREFILL_TOKENS = 128
"""Default `CpuRuntime.span_prefill_tokens`: the longest tail after a cached prefix that `prefill` runs
through the decode kernel. On the Qwen2.5-0.5B shape (2-core Zen 4, AVX512-BF16, no AMX) the kernel beat
the batched matmuls at every tail measured, 1 to 192 tokens after a 1000-token prefix; AMX makes the
matmuls cheaper per token, so the bound stays below that (benchmarks/results/agent_ttft_cpu.md)."""

SPAN_PREFILL_POSITIONS = 512
"""Default `CpuRuntime.span_prefill_positions`: a prefill that ends within this many positions runs through
the decode kernel whatever its start, a cold prompt included. The kernel computes each token alone (its
arithmetic does not depend on the other tokens of the call), so the KV and logits of a sequence within this
bound are the same bits however its prefill was split: cold, after a prefix-cache hit of any length, on
the chunk grid, or fed token by token as decode steps. A batched-matmul prefill's rounding depends on the
split (the matmuls' row count, SDPA's query block): with it, a greedy request's output depended on what
the server had cached before (the load bench's "wrong outputs", issue #15). On a 2-core Zen 4 (AVX512-BF16,
no AMX) the kernel was also the faster cold prefill at every length measured, 16 to 2000 tokens (noisy);
AMX makes matmuls cheaper per token, so the bound stays at a chat turn's length, not a document's."""

SPAN_CALL_TOKENS = 512
"""Most tokens of one span-prefill kernel call (`CpuRuntime.prefill` splits longer ones): the kernel's
workspace holds every token's split-KV parts for the whole reserved cache (`solo_workspace_bytes`), 2.2 GB
for 512 tokens of Llama-3.1-8B at its 131072-token context."""

SPAN_PREFILL_POSITIONS_AMX = 2048
"""`CpuRuntime.span_prefill_positions` at the amx ISA level, and at avx512-bf16 with packed weights, for dense
bf16 models: there the decode kernel's span prefill runs its products on AMX tiles too, and a cold prompt
through it took (2-core Intel Xeon with AMX, one process, min of 2): Qwen2.5-0.5B 788 vs 965 ms at 1024
tokens, 1889 vs 2290 at 2000, 4759 vs 4831 at 4096, 15357 vs 12543 at 8192; Llama-3.2-1B 4094 vs 4043 ms at
2048, 11224 vs 8892 at 4096 (its per-token attention grows with the position; SDPA's does not). So up to 2048
positions every split of a prompt is exact at no cost in TTFT. At avx512-bf16 with packed weights (2-core
AMD EPYC Zen 4, one process; the matmul prefill's packed products convert their inputs and outputs to and
from float32): Llama-3.2-1B at 2048 12375-12546 ms against 14072-17028 through the matmuls (12170-13220 with
row-major weights and oneDNN's bf16 matmuls, the level's path before it packed), Qwen2.5-0.5B at 2000
5667-5715 against 6322-6848 (5395-5757 row-major). MoE models keep `SPAN_PREFILL_POSITIONS` (OLMoE-1B-7B-4L:
1998 vs 1727 ms at 1024, 4508 vs 3419 at 2048: the grouped expert matmuls win), and so do int8 / int4 and
float32 weights, whose products are neither on tiles nor packed (Qwen2.5-0.5B at 2000 tokens: int8 5808 vs
1594 ms, float32 9775 vs 4732)."""


PACKED_BF16_LEVELS = ("amx", "avx512-bf16")
"""Kernel ISA levels where `CpuRuntime` packs a bf16 model's matrices (solo.runtime.cpu_packing; `pack_amx`).
Both decode on AVX512-BF16 instructions that give the AMX tiles' bits (cpu_kernels/packed.h). The amx level
multiplies a prompt on tiles; avx512-bf16 as outer products over the packed rows (16 rows' sums in the lanes
of one vector: no horizontal sums), which on a 2-core AMD EPYC Zen 4 made the span prefill's products
faster than the row-major kernels' (benchmarks/results/amd-epyc-zen4/packed-bf16-2026-12-07.md)."""


class _Mat(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int32), ("rows", ctypes.c_int32), ("cols", ctypes.c_int32),
                ("group", ctypes.c_int32), ("weight", ctypes.c_void_p), ("scale", ctypes.c_void_p),
                ("bias", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Mat), ("o", _Mat), ("gate_up", _Mat), ("down", _Mat),
                ("attn_norm", ctypes.c_void_p), ("mlp_norm", ctypes.c_void_p),
                ("attn_out_norm", ctypes.c_void_p), ("mlp_out_norm", ctypes.c_void_p),
                ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p), ("window", ctypes.c_int32),
                ("rope", ctypes.c_int32)]


class _Model(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in (
        "dtype", "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab", "layers", "max_seq", "cache_rows",
        "unit_offset", "sandwich", "qk_norm", "act")] + [
        (name, ctypes.c_float) for name in ("eps", "embed_scale", "attn_scale", "attn_softcap", "final_softcap")
    ] + [("embed", ctypes.c_void_p), ("final_norm", ctypes.c_void_p), ("head", _Mat),
         ("layer", ctypes.POINTER(_Layer)), ("skip_matmuls", ctypes.c_int32),
         ("moe", ctypes.c_void_p)]  # mixture of experts: solo.runtime.cpu_moe's MoeLayer array


_ROPE_BLOCK = 4096
"""Positions of the RoPE tables computed at a time (`CpuRuntime._rope_tables`)."""

_T = TypeVar("_T")


def allocate_beside_cache(build: Callable[[], _T], nbytes: int, what: str, rows: int, max_seq: int) -> _T:
    """Allocate memory that grows with a runtime's KV cache (RoPE tables, the step's workspace) beside it.

    They were outside the cache's memory check: a long context's cache that fitted could leave no room for them,
    and an allocation failure escaped as the allocator's RuntimeError (and, for the workspace, at every step after).

    Args:
        build: allocates (and fills) it.
        nbytes: its size in bytes, checked against the memory Linux can hand out (after the cache).
        what: what it is and its verb, for the message ("the RoPE tables of 4096 positions need").
        rows, max_seq: the cache's sequences and tokens (for the message).

    Raises:
        KVCacheMemoryError: `nbytes` above the memory left, or the allocator out of memory.
    """
    free, source = host_memory()
    said = f"{what} {size_text(nbytes)} beside the KV cache of {rows} sequence(s) x {max_seq} tokens"
    if free is not None and nbytes > free:
        raise KVCacheMemoryError(f"{said}, but {size_text(free)} of memory is left ({source}); {KV_MEMORY_FIX}")
    try:
        return build()
    except (MemoryError, RuntimeError) as exc:
        if not out_of_memory(exc):
            raise
        raise KVCacheMemoryError(f"out of memory: {said}; {KV_MEMORY_FIX}") from exc


def new_workspace(need: int, rows: int, max_seq: int) -> torch.Tensor:
    """A decode step's workspace: uint8 [need], beside a KV cache of `rows` x `max_seq` tokens.

    Raises:
        KVCacheMemoryError: see `allocate_beside_cache`.
    """
    return allocate_beside_cache(lambda: torch.empty(need, dtype=torch.uint8), need,
                                 "the decode step's workspace needs", rows, max_seq)


def step_workspace(runtime: CpuRuntime | CpuLaneRuntime, current: torch.Tensor, need: int) -> torch.Tensor:
    """`current` if it holds `need` bytes, else a `new_workspace` of `need` bytes.

    Raises:
        KVCacheMemoryError: out of memory (a batch larger than any before, at the reserved context).
    """
    return current if current.numel() >= need else new_workspace(need, runtime.rows, runtime.max_seq)


def _stack_tables(tables: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """`RotaryEmbedding.layer_tables` ([1, seq, head_dim] each) -> float32 cos, sin [tables, seq, head_dim]."""
    return (torch.cat([c.float() for c, _ in tables]).contiguous(),
            torch.cat([s.float() for _, s in tables]).contiguous())


def _python_layout() -> list[int]:
    out: list[int] = []
    for struct in (_Mat, _Layer, _Model):
        out.append(ctypes.sizeof(struct))
        out += [getattr(struct, name).offset for name, _ in struct._fields_]
    return out


_layout_checked: set[int] = set()


def check_struct_layout(lib: ctypes.CDLL) -> None:
    """Compare the ctypes mirrors `_Mat`, `_Layer`, `_Model` with the structs the library was compiled with.

    The library exports sizeof and every field offset (`solo_struct_layout`); a mismatch (a field added on
    one side only) would otherwise pass garbage pointers to the kernels.

    Raises:
        KernelBuildError: the layouts differ (names the first differing entry).
    """
    if id(lib) in _layout_checked:
        return
    expected = _python_layout()
    buf = (ctypes.c_int64 * (len(expected) + 16))()
    count = lib.solo_struct_layout(buf, len(buf))
    native = list(buf[:min(count, len(buf))])
    if native != expected:
        names = [f"{struct.__name__}.{label}" for struct in (_Mat, _Layer, _Model)
                 for label in ["sizeof", *(name for name, _ in struct._fields_)]]
        first = next((i for i, (a, b) in enumerate(zip(native, expected, strict=False)) if a != b),
                     min(len(native), len(expected)))
        where = names[first] if first < len(names) else f"entry {first}"
        raise KernelBuildError(f"the CPU kernels' struct layout differs from solo/runtime/cpu.py at {where} "
                               f"({count} entries in C, {len(expected)} in Python): update both sides together")
    _layout_checked.add(id(lib))


def checked_library() -> ctypes.CDLL:
    """`load_library()` with its struct layout checked against this module's ctypes mirrors.

    Raises:
        KernelBuildError: the library cannot be built or loaded, or its layout differs.
        IsaError: `SOLO_CPU_ISA` names a level this CPU lacks.
    """
    lib = load_library()
    check_struct_layout(lib)
    return lib


def native_matrix(layer: nn.Module) -> _Mat:
    """The kernels' view of one Linear or QuantLinear layer (the caller keeps the layer alive).

    Args:
        layer: an `nn.Linear` with bf16 / float32 weight [out, in], or a `QuantLinear`.

    Returns:
        A ctypes struct holding the format, [rows, cols], the int4 group size (32) and raw pointers to the
        weight, the scales (quantized only) and the bias.
    """
    if isinstance(layer, QuantLinear):
        fmt = _W_INT8 if layer.mode == "int8" else _W_INT4
        qweight, scale, bias, cols = layer.qweight, layer.scale, layer.bias, layer.in_features
    else:
        qweight, scale, bias, cols = layer.weight.detach(), None, layer.bias, layer.in_features
        fmt = _W_BF16 if qweight.dtype == torch.bfloat16 else _W_F32
    assert qweight.is_contiguous()
    return _Mat(fmt, qweight.shape[0], cols, 32, qweight.data_ptr(),
                scale.data_ptr() if scale is not None else None, bias.data_ptr() if bias is not None else None)


def int_dot_enabled() -> bool:
    """Whether the decode kernels multiply int8 / int4 weights with int8-quantized activations (default yes).

    The integer-dot path (cpu_kernels/qdot.h) quantizes each matrix's input vector to int8 per block of 32
    inputs (one float32 scale per block, as llama.cpp's Q8_0) and runs integer dot products; the float path
    widens every weight to float32 instead, which keeps the activations exact but is compute-bound on few
    cores. `SOLO_CPU_INT_DOT=0` selects the float path (for models whose activations lose too much at 8
    bits per block, and for comparisons).
    """
    return env_switch("SOLO_CPU_INT_DOT", True)


def check_cpu_env() -> None:
    """Read every environment knob of the CPU runtime once, so a bad value is refused before any load.

    SOLO_CPU_ISA (`selected_level`), SOLO_CPU_PREFETCH, SOLO_CPU_INT_DOT, SOLO_CPU_ADAPT_THREADS and the
    kernels' own (`check_kernel_env`); `solo serve` calls it before it listens.

    Raises:
        EnvSettingError: the first knob whose value cannot be used, by name.
    """
    selected_level()
    prefetch_distance_bytes()
    int_dot_enabled()
    adapt_threads_enabled()
    check_kernel_env()


def q8_input_fits(cols: int) -> bool:
    """Whether an input of `cols` values fits qdot.h's quantized layout in its float32 slot (cols >= 17, != 33)."""
    return 68 * ((cols + 31) // 32) <= 4 * cols


def native_bf16_matmul() -> bool:
    """Whether PyTorch's CPU matmuls (oneDNN) have a native bf16 path on this machine.

    True with AVX512-BF16 or AMX on x86 (unless `ONEDNN_MAX_CPU_ISA` caps oneDNN below them) and with the
    bf16 extension on ARM64; without one, oneDNN emulates bf16 and a float32 matmul is faster.
    """
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    if cap and cap not in ("ALL", "DEFAULT") and not any(t in cap for t in ("BF16", "AMX", "FP16", "AVX10")):
        return False
    if platform.machine().lower() in ("aarch64", "arm64"):
        from solo.runtime.cpu_build import cpu_features

        return "bf16" in cpu_features()
    checks = [getattr(torch.cpu, n, None) for n in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check is not None and check() for check in checks)


def cpu_unsupported_reason(model: Transformer) -> str | None:
    """Why the CPU runtime cannot run `model`, or None when it can.

    Checks the device, the weight dtype, the head size and that the kernel library builds.
    """
    if model.device.type != "cpu":
        return f"the model is on {model.device}, not the CPU"
    if model.dtype not in (torch.bfloat16, torch.float32):
        return (f"{model.dtype} weights are not supported by the CPU kernels (bfloat16 and float32 are): load the "
                "model with dtype bfloat16 or float32 (--dtype; auto loads float16 checkpoints as bfloat16)")
    return cpu_config_unsupported_reason(model.config)


def cpu_config_unsupported_reason(config: ModelConfig) -> str | None:
    """Why the CPU runtime cannot run a model of `config` in bfloat16 or float32, or None when it can.

    Checks the head size, the widths, a mixture-of-experts layout and that the kernel library builds (the
    part of `cpu_unsupported_reason` that needs no weights).
    """
    if config.head_dim % 2 or config.head_dim > 1024:
        return f"head_dim {config.head_dim} is not supported by the CPU kernels (even, <= 1024)"
    if config.hidden_size > 16384 or config.intermediate_size > 32768:
        return (f"hidden size {config.hidden_size} / intermediate size {config.intermediate_size} "
                "is not supported by the CPU kernels (<= 16384 / 32768)")
    if config.is_moe:
        from solo.runtime.cpu_moe import moe_unsupported_reason

        reason = moe_unsupported_reason(config)
        if reason is not None:
            return reason
    try:
        checked_library()
    except KernelBuildError as exc:
        return str(exc)
    return None


def bind_kv_cache(runtime: CpuRuntime | CpuLaneRuntime, model_struct: _Model, rows: int, max_seq: int) -> KVCache:
    """A zeroed KV cache of `rows` x `max_seq` tokens, its layers' pointers and sizes set in the C structs.

    The layers live in one `_huge_page_buffer` (caches of 2 MiB and more): at long context the decode step
    streams the cache, and on 4 KiB pages (up to a quarter of PyTorch's own allocation, Qwen2.5-0.5B shape at
    32k positions) its attention ran up to 1.1x slower (AMX Xeon, benchmarks/attention_ab.py at 32000
    positions).

    Args:
        runtime: a native CPU runtime (its config, model dtype and `_layers` structs).
        model_struct: the `_Model` struct the kernels read the cache's sizes from.
        rows, max_seq: the cache's sequences and tokens per sequence.

    Raises:
        KVCacheMemoryError: more than the memory Linux can hand out, or out of memory (see `KVCache`; the structs
            keep the old cache's pointers: the runtime's cache is None until a reserve() succeeds, and every step
            checks it).

    Returns:
        The cache (the runtime keeps it: the structs point into its tensors).
    """
    def allocate(nbytes: int) -> torch.Tensor:  # (a cache under one huge page would take a whole one)
        return _huge_page_buffer(nbytes) if nbytes >= _HUGE_PAGE else torch.empty(nbytes, dtype=torch.uint8)

    cache = KVCache(runtime.config, rows, max_seq, runtime.model.dtype, runtime.device, allocate=allocate)
    for i in range(runtime.config.num_layers):
        runtime._layers[i].k_cache = cache.k[i].data_ptr()
        runtime._layers[i].v_cache = cache.v[i].data_ptr()
    model_struct.max_seq, model_struct.cache_rows = max_seq, rows
    return cache


def checked_step_inputs(runtime: CpuRuntime | CpuLaneRuntime, rows: torch.Tensor, token_ids: torch.Tensor,
                        positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decode step's rows, token ids and positions as contiguous int64 [batch] CPU tensors, checked.

    The kernels index the cache and the embedding with them unchecked, so every value is checked here.

    Raises:
        SoloError: no cache reserved, an empty batch, mismatched lengths, or a row, position or token id out of
            range of the cache (`runtime.rows` x `runtime.max_seq`) or the vocabulary.
    """
    rows = rows.to(device="cpu", dtype=torch.long).contiguous().view(-1)
    ids = token_ids.to(device="cpu", dtype=torch.long).contiguous().view(-1)
    positions = positions.to(device="cpu", dtype=torch.long).contiguous().view(-1)
    batch = rows.numel()
    if runtime.cache is None:
        raise SoloError("decode before reserve(): the KV cache is not allocated")
    if ids.numel() != batch or positions.numel() != batch or batch == 0:
        raise SoloError(f"decode got {batch} rows, {ids.numel()} tokens and {positions.numel()} positions")
    lo = torch.stack((rows.min(), positions.min(), ids.min()))
    hi = torch.stack((rows.max(), positions.max(), ids.max()))
    vocab = runtime.config.vocab_size
    if bool((lo < 0).any()) or int(hi[0]) >= runtime.rows or int(hi[1]) >= runtime.max_seq or int(hi[2]) >= vocab:
        raise SoloError(f"decode rows/positions/token ids out of range ({runtime.rows} rows x {runtime.max_seq} "
                        f"tokens, vocab {vocab})")
    return rows, ids, positions


def _replace_tensor(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    if name in module._parameters:
        module._parameters[name] = nn.Parameter(tensor, requires_grad=False)
    else:
        module._buffers[name] = tensor


def _adjacent(tensors: list[torch.Tensor]) -> bool:
    # True when the tensors already sit back to back in one buffer (a previous fusion).
    for prev, cur in zip(tensors, tensors[1:], strict=False):
        if not (prev.is_contiguous() and cur.is_contiguous()):
            return False
        if cur.untyped_storage().data_ptr() != prev.untyped_storage().data_ptr():
            return False
        if cur.data_ptr() != prev.data_ptr() + prev.numel() * prev.element_size():
            return False
    return tensors[0].is_contiguous()


def _fuse_rows(modules: list[nn.Module], names: tuple[str, ...]) -> list[torch.Tensor | None]:
    """Concatenate each named tensor of `modules` along rows into one buffer.

    The modules are re-pointed at row views of it (so the eager model keeps working on the same memory).
    Returns the fused tensors (or their existing fused storage as a view), None for absent ones.
    """
    fused: list[torch.Tensor | None] = []
    for name in names:
        parts = [getattr(m, name) for m in modules]
        if any(p is None for p in parts):
            fused.append(None)
            continue
        parts = [p.detach() for p in parts]
        if len(parts) > 1 and _adjacent(parts):
            rows = sum(p.shape[0] for p in parts)
            base = parts[0]
            whole = torch.as_strided(base, (rows, *base.shape[1:]), base.stride(), base.storage_offset())
            fused.append(whole)
            continue
        whole = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0].contiguous()
        start = 0
        for m, p in zip(modules, parts, strict=True):
            _replace_tensor(m, name, whole[start:start + p.shape[0]])
            start += p.shape[0]
        fused.append(whole)
    return fused


_HUGE_PAGE = 2 << 20
_ARENA_ALIGN = 4096
_ARENA_MIN = 64 << 20


def _weight_name(module: nn.Module) -> str:
    if isinstance(module, AmxPackedLinear):
        return "packed"
    return "qweight" if isinstance(module, QuantLinear) else "weight"


def _group_weight_bytes(modules: list[nn.Module]) -> int:
    name = _weight_name(modules[0])
    return sum(getattr(m, name).numel() * getattr(m, name).element_size() for m in modules)


_LIVE_ARENAS: set[int] = set()  # storage addresses of the live `_huge_page_buffer` mappings


def _in_arena(tensor: torch.Tensor) -> bool:
    """True if `tensor` already lives in a runtime's huge-page arena (another CpuRuntime on the same model).

    KV caches' mappings are registered too; no weight ever lives in one.
    """
    return tensor.untyped_storage().data_ptr() in _LIVE_ARENAS


def _huge_page_buffer(nbytes: int) -> torch.Tensor:
    """uint8 [nbytes] of fresh memory starting on a 2 MiB boundary, marked for transparent huge pages.

    PyTorch madvises its allocations of 2 MiB and more but neither aligns them nor keeps them from reusing
    memory freed earlier, whose pages are already 4 KiB ones: weights built by the runtime had a quarter of
    some matrices, and every matrix under 2 MiB, on 4 KiB pages (Qwen2.5-0.5B shape). A fresh anonymous
    mapping, advised before its first touch, gets huge pages wherever the kernel has them free. Without
    anonymous mappings or `MADV_HUGEPAGE` (not Linux) this is a plain buffer.
    """
    if not nbytes or not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.empty(nbytes, dtype=torch.uint8)
    padded = -(-nbytes // _HUGE_PAGE) * _HUGE_PAGE
    region = mmap.mmap(-1, padded + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive
    base = buf.untyped_storage().data_ptr()
    _LIVE_ARENAS.add(base)
    weakref.finalize(region, _LIVE_ARENAS.discard, base)
    off = (-buf.data_ptr()) % _HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE, off, padded)
    return buf[off:off + nbytes]


class CpuRuntime:
    """Decode through the native kernels; prefill through batched matmuls plus the kernels (module docstring).

    Args:
        model: the eager model (bf16 or f32), or one from `solo.runtime.quant.quantize_model`. Its
            matrices' weights are re-pointed to views of the runtime's buffers (values unchanged): q/k/v and
            gate/up fused, every dense layer's matrices on 2 MiB-aligned transparent huge pages.
        rows: KV-cache rows (concurrent sequences).
        max_seq: tokens per row.
        num_threads: worker threads (default: torch.get_num_threads(), one per physical core); decode steps run
            on at most the container's CPU quota of them (`solo.cpus.threads_within_cpu_limit`, `ThreadGovernor`).
        int_dot: int8 / int4 weights multiply int8-quantized activations in integer dot products (default:
            `int_dot_enabled()`, i.e. yes unless SOLO_CPU_INT_DOT=0); False keeps the float path.
        pack_amx: at the kernels' amx and avx512-bf16 levels (`PACKED_BF16_LEVELS`), pack a bf16 model's
            matrices in the AMX tiles' layout (default; the model's Linear layers become `AmxPackedLinear`);
            False keeps them row-major on the AVX512-BF16 kernels (measurement), unless another runtime
            already packed this model (then they stay packed: `pack_amx` is True). Ignored at other levels.

    Attributes:
        isa: the kernels' ISA level ("avx2", "avx512-bf16", ...; see `solo.runtime.cpu_build`).
        int_dot: whether int8 / int4 weights multiply int8-quantized activations (see `int_dot_enabled`).
        int_dot_primitive: the integer dot-product instructions those kernels use ("avx512-vnni", "avx2",
            "neon-sdot", "neon", "scalar").
        prefill_matmul_dtype: dtype of prefill's matmuls (float32 for a bf16 model on a CPU without a
            native bf16 matmul, else the model's dtype).
        span_prefill_tokens: a prefill that continues a cached prefix with at most this many tokens (and no
            more than the prefix) runs through the decode kernel instead of batched matmuls (see `prefill`).
        span_prefill_positions: a prefill that ends within this many positions runs through the decode
            kernel, cold or not (`SPAN_PREFILL_POSITIONS`, or `SPAN_PREFILL_POSITIONS_AMX` for a dense bf16
            model at the amx level or with packed weights; 0: only the tails above).

    Environment:
        SOLO_CPU_ISA forces a lower kernel ISA level; SOLO_CPU_SPIN_US sets how long (microseconds, default 2000)
        a decode thread spins at a barrier before it sleeps (0 on a machine shared with other busy work);
        SOLO_CPU_SPLIT_KV=0 turns off the split-KV attention past 512 positions (for comparisons);
        SOLO_CPU_ADAPT_THREADS=0 keeps every decode step on num_threads threads, or the CPU quota's count (see
        `solo.runtime.cpu_threads`);
        SOLO_CPU_INT_DOT=0 multiplies int8 / int4 weights with float32 activations (see `int_dot_enabled`).

    Raises:
        SoloError: the model is not supported (see `cpu_unsupported_reason`).
    """

    name = "cpu"
    # Each sequence keeps its own accumulator chain per weight row, so a row's logits do not depend on the
    # other rows of a batched decode (checked by tests/runtime/test_cpu_runtime.py).
    batch_invariant = True
    # verify() runs the decode kernel over k positions; "auto" speculation turns on here (see
    # solo.engine.speculative.resolve_speculative). Whether its logits are bit for bit those of batch-1 steps
    # is per instance (verify_matches_decode, set in __init__).
    speculative_auto = True
    # decode_spans() runs every row's tokens in one kernel call; an entry's arithmetic does not depend on the
    # other entries (decode.cpp's decode_step), so a row's span gives the logits it gives alone (tested bit for
    # bit in float32 and bfloat16: tests/runtime/test_decode_spans.py).
    spans_batch_invariant = True
    # decode_spans(between=...) runs a step as runs of layers with calls for other rows in between (decode.cpp:
    # solo_decode_span_layers), the same bits.
    pausable_steps = True

    def __init__(self, model: Transformer, rows: int = 1, max_seq: int = 0, num_threads: int | None = None,
                 int_dot: bool | None = None, pack_amx: bool | None = None) -> None:
        reason = cpu_unsupported_reason(model)
        if reason is not None:
            raise SoloError(f"the cpu backend cannot run this model: {reason}")
        self.model = model
        self.config = model.config
        self.device = torch.device("cpu")
        self.quantization = model_quantization(model)
        self.int_dot = int_dot_enabled() if int_dot is None else bool(int_dot)
        self.num_threads = num_threads or torch.get_num_threads()
        # Decode steps run on fewer threads while another process holds a core, and within a container's CPU
        # quota; a prompt's steps may use every thread (cpu_threads.py).
        self.threads = ThreadGovernor(self.num_threads, decode_threads=threads_within_cpu_limit(self.num_threads))
        # Every weight format sums each sequence in one order whatever the tile (gemv.h, qdot.h), so each
        # verified position's logits equal a batch-1 decode step's bit for bit: float32, bfloat16, int8, int4
        # (tests/runtime/test_verify_kv.py, at every ISA level through test_cpu_isa).
        self.verify_matches_decode = True
        self.rows = 0
        self.max_seq = 0
        self.cache: KVCache | None = None
        self._lib = checked_library()
        self.isa = library_isa(self._lib)  # the kernels' ISA level (solo.runtime.cpu_build.LEVELS)
        # The integer dot-product instructions of the int8 / int4 kernels ("avx512-vnni", "avx2", "neon-sdot", ...).
        self.int_dot_primitive = self._lib.solo_qdot().decode()
        # dtype of prefill's matmuls: float32 for a bf16 model where the CPU has no native bf16 matmul.
        self.prefill_matmul_dtype = model.dtype
        # The amx and avx512-bf16 levels pack the bf16 matrices for their kernels (solo.runtime.cpu_packing); the
        # model's Linear layers become AmxPackedLinear views of the packed weights.
        already = any(isinstance(m, AmxPackedLinear) for m in model.modules())
        self.pack_amx = self.isa in PACKED_BF16_LEVELS and model.dtype == torch.bfloat16 \
            and (pack_amx is not False or already)
        self._parents: dict[int, tuple[nn.Module, str]] = {}
        if self.pack_amx:
            for parent in model.modules():
                for name, child in parent.named_children():
                    self._parents[id(child)] = (parent, name)
        if model.dtype == torch.bfloat16 and not native_bf16_matmul():
            self.prefill_matmul_dtype = torch.float32
        self.span_prefill_tokens = SPAN_PREFILL_TOKENS
        # (AMX tiles and the packed layout serve bf16 weights only: int8 / int4 / float32 products stay on the
        # vector kernels, where the longer bound made a 2000-token prefill 2-3.6x slower)
        tiled_or_packed_spans = (self.isa == "amx" or self.pack_amx) and model.dtype == torch.bfloat16 \
            and model_quantization(model) is None
        self.span_prefill_positions = SPAN_PREFILL_POSITIONS_AMX if tiled_or_packed_spans and not self.config.is_moe \
            else SPAN_PREFILL_POSITIONS
        if self.config.rope.prefills_whole:  # (through the decode kernel each token takes its own length's)
            self.span_prefill_positions = self.span_prefill_tokens = 0
        self._keep: list[torch.Tensor] = []  # every tensor the native struct points at
        self._prefill_mats: list[tuple[_Mat, torch.Tensor | None, torch.Tensor | None] | None] = []
        self._arena = torch.empty(0, dtype=torch.uint8)  # the weights being built into (_mat, _build_struct)
        self._arena_used = 0
        self._arena_pending = 0  # bytes of the next arena, mapped when its first matrix is copied
        self._layers = (_Layer * self.config.num_layers)()
        self._struct = _Model()
        self._workspace = torch.empty(0, dtype=torch.uint8)
        # Calls made while a step is paused between layers (decode_spans' `between`) use their own workspace:
        # the paused step's per-thread state waits in the first.
        self._paused_workspace = torch.empty(0, dtype=torch.uint8)
        self._paused = False
        self._cos = self._sin = torch.empty(0)
        self._build_struct()
        if max_seq:
            self.reserve(rows, max_seq)

    # ----------------------------------------------------------------------------------------- setup

    def _arena_for(self, sizes: list[int], i: int) -> None:
        # Before layer i's matrices (sizes: each layer's arena bytes): a new arena when the current one is full,
        # for layers i.. up to at least 64 MiB, so the last partial huge page wastes little and building the
        # runtime holds at most one arena's worth of weights twice. Weights in the arenas sit on 2 MiB-aligned
        # transparent huge pages: a decode step streams every matrix once, and on a 2-core Zen 4 reads from
        # 4 KiB pages were measured ~30% slower (benchmarks/results/amd-epyc-zen4/README.md).
        # The arena is mapped at its first copy (_to_arena), so a model whose weights already sit in another
        # runtime's arenas maps nothing.
        if self._arena_used + sizes[i] <= self._arena.numel() + self._arena_pending:
            return
        end, total = i, 0
        while end < len(sizes) and (end == i or total < _ARENA_MIN):
            total += sizes[end]
            end += 1
        self._arena = torch.empty(0, dtype=torch.uint8)
        self._arena_pending = total
        self._arena_used = 0

    def _arena_tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        # The next free, aligned slice of the current arena (mapped on first use) as a tensor, or None when
        # it has no room left.
        if self._arena_pending:
            self._arena = _huge_page_buffer(self._arena_pending)
            self._arena_pending = 0
        nbytes = math.prod(shape) * dtype.itemsize
        if self._arena_used + nbytes > self._arena.numel():
            return None
        start = self._arena_used
        self._arena_used += -(-nbytes // _ARENA_ALIGN) * _ARENA_ALIGN
        return self._arena[start:start + nbytes].view(dtype).view(shape)

    def _to_arena(self, modules: list[nn.Module], whole: torch.Tensor) -> torch.Tensor:
        # The fused weight `whole` (the modules' rows concatenated, as _fuse_rows returns it) moves into the
        # current arena; the modules are re-pointed at row views of the copy. Weights that another runtime on
        # the same model already moved stay where they are: both runtimes read one copy.
        if _in_arena(whole):
            return whole
        copy = self._arena_tensor(whole.shape, whole.dtype)
        if copy is None:
            return whole
        copy.copy_(whole)
        name, row = _weight_name(modules[0]), 0
        for m in modules:
            rows = getattr(m, name).shape[0]
            _replace_tensor(m, name, copy[row:row + rows])
            row += rows
        return copy

    def _group_bytes(self, modules: list[nn.Module]) -> int:
        # Arena bytes of one fused matrix: packed (zero-padded) where the AMX level packs it.
        if self._packable(modules) and not isinstance(modules[0], AmxPackedLinear):
            return math.prod(packed_shape(sum(m.out_features for m in modules), modules[0].in_features)) * 2
        return _group_weight_bytes(modules)

    def _packable(self, modules: list[nn.Module]) -> bool:
        # Every part but the last must end on a 16-row group (each part's packed rows are then its own slice).
        if not self.pack_amx or not all(isinstance(m, nn.Linear) for m in modules):
            return all(isinstance(m, AmxPackedLinear) for m in modules)
        return (all(m.out_features % 16 == 0 for m in modules[:-1])
                and all(m.weight.dtype == torch.bfloat16 for m in modules))

    def _packed_mat(self, modules: list[nn.Module]) -> _Mat:
        # The modules' weights packed into the current arena (or already packed by another runtime on this
        # model): the modules become AmxPackedLinear slices of it, the dense copy is dropped.
        cols = modules[0].in_features
        rows = sum(m.out_features for m in modules)
        if all(isinstance(m, AmxPackedLinear) for m in modules):
            packed, bias = _fuse_rows(modules, ("packed", "bias"))
        else:
            dense, bias = _fuse_rows(modules, ("weight", "bias"))
            shape = packed_shape(rows, cols)
            packed = self._arena_tensor(shape, torch.bfloat16)
            if packed is None:
                packed = torch.empty(shape, dtype=torch.bfloat16)
            dense = dense.contiguous()
            self._lib.solo_pack_bf16_amx(dense.data_ptr(), rows, cols, packed.data_ptr(), self.num_threads)
            del dense
            group, row = 0, 0
            for m in modules:
                groups = packed_shape(m.out_features, cols)[0]
                part_bias = None if bias is None else bias[row:row + m.out_features]
                parent, name = self._parents[id(m)]
                setattr(parent, name, AmxPackedLinear(packed[group:group + groups], part_bias, cols, m.out_features))
                group, row = group + groups, row + m.out_features
        self._keep += [t for t in (packed, bias) if t is not None]
        mat = _Mat(_W_BF16_AMX, rows, cols, 32, packed.data_ptr(), None,
                   bias.data_ptr() if bias is not None else None)
        self._prefill_mats.append((mat, packed, bias))
        return mat

    def _mat(self, modules: list[nn.Module]) -> _Mat:
        first = modules[0]
        if self._packable(modules):
            return self._packed_mat(modules)
        if isinstance(first, QuantLinear):
            qweight, scale, bias = _fuse_rows(modules, ("qweight", "scale", "bias"))
            qweight = self._to_arena(modules, qweight)
            fmt = _W_INT8 if first.mode == "int8" else _W_INT4
            cols = first.in_features
            if self.int_dot and q8_input_fits(cols):
                fmt = _W_INT8_Q8 if fmt == _W_INT8 else _W_INT4_Q8
            elif fmt == _W_INT4 and self.model.dtype == torch.bfloat16:
                fmt = _W_INT4_BF16X  # bf16 activations: the faster bf16 dot-product kernel is exact for them
        else:
            qweight, bias = _fuse_rows(modules, ("weight", "bias"))
            qweight = self._to_arena(modules, qweight)
            scale = None
            fmt = _W_BF16 if qweight.dtype == torch.bfloat16 else _W_F32
            cols = qweight.shape[1]
        self._keep += [t for t in (qweight, scale, bias) if t is not None]
        mat = _Mat(fmt, qweight.shape[0], cols, 32, qweight.data_ptr(),
                   scale.data_ptr() if scale is not None else None,
                   bias.data_ptr() if bias is not None else None)
        # Prefill's matmuls need the dense matrix: the weight itself, or (quantized) None = dequantize.
        self._prefill_mats.append((mat, None if scale is not None else qweight, bias))
        return mat

    @staticmethod
    def _own(module: nn.Module, name: str = "weight") -> torch.Tensor:
        # A weight the struct points at that views memory it does not own becomes its own copy. `load_weights`
        # leaves the tensors it did not convert in the checkpoint's memory-mapped file (a storage of their own
        # size, not resizable): after the matrices were copied out, a norm or the embedding kept the whole mapping
        # alive, and every page of the file that the copies read stayed resident (a bfloat16 checkpoint's RSS was
        # its arenas plus the whole file).
        tensor = getattr(module, name)
        storage = tensor.untyped_storage()
        if not _in_arena(tensor) and (not storage.resizable()
                                      or storage.nbytes() > tensor.numel() * tensor.element_size()):
            _replace_tensor(module, name, tensor.clone())
        return getattr(module, name)

    def _ptr(self, tensor: torch.Tensor | None) -> int | None:
        if tensor is None:
            return None
        tensor = tensor.detach()
        assert tensor.is_contiguous() and tensor.dtype == self.model.dtype
        self._keep.append(tensor)
        return tensor.data_ptr()

    def _build_struct(self) -> None:
        cfg, model = self.config, self.model
        sizes = []
        for i, layer in enumerate(model.layers):
            groups = [[layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj], [layer.attn.o_proj]]
            if not cfg.is_moe_layer(i):
                groups += [[layer.mlp.gate_proj, layer.mlp.up_proj], [layer.mlp.down_proj]]
            sizes.append(sum(-(-self._group_bytes(g) // _ARENA_ALIGN) * _ARENA_ALIGN for g in groups))
        head = model.lm_head if model.lm_head is not None else model.embed  # (a tied head: the embedding goes in)
        sizes.append(-(-self._group_bytes([head]) // _ARENA_ALIGN) * _ARENA_ALIGN)
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.attn, layer.mlp
            entry = self._layers[i]
            self._arena_for(sizes, i)
            entry.qkv = self._mat([attn.q_proj, attn.k_proj, attn.v_proj])
            entry.o = self._mat([attn.o_proj])
            if cfg.is_moe_layer(i):  # the experts are described by solo.runtime.cpu_moe (below)
                self._prefill_mats += [None, None]  # keeps matrix 4 * i + k at its index
            else:
                entry.gate_up = self._mat([mlp.gate_proj, mlp.up_proj])
                entry.down = self._mat([mlp.down_proj])
            entry.attn_norm = self._ptr(self._own(layer.attn_norm))
            entry.mlp_norm = self._ptr(self._own(layer.mlp_norm))
            if cfg.sandwich_norm:
                entry.attn_out_norm = self._ptr(self._own(layer.attn_out_norm))
                entry.mlp_out_norm = self._ptr(self._own(layer.mlp_out_norm))
            if cfg.qk_norm:
                entry.q_norm = self._ptr(self._own(attn.q_norm))
                entry.k_norm = self._ptr(self._own(attn.k_norm))
            entry.window = cfg.layer_sliding_windows[i] or 0
            entry.rope = cfg.layer_rope_table(i)
        s = self._struct
        s.dtype = _DT_BF16 if model.dtype == torch.bfloat16 else _DT_F32
        s.hidden, s.heads, s.kv_heads, s.head_dim = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        s.inter, s.vocab, s.layers = cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
        s.unit_offset, s.sandwich, s.qk_norm = int(cfg.norm_unit_offset), int(cfg.sandwich_norm), int(cfg.qk_norm)
        if cfg.qk_norm and cfg.qk_norm_full_width:
            s.qk_norm = 2  # OLMoE: one norm over the whole q / k projection
        s.act = _ACTS[cfg.hidden_act]
        s.eps = cfg.rms_norm_eps
        s.embed_scale = cfg.embedding_scale or 0.0
        s.attn_scale = cfg.attn_scale
        s.attn_softcap = cfg.attn_logit_softcap or 0.0
        s.final_softcap = cfg.final_logit_softcap or 0.0
        s.final_norm = self._ptr(self._own(model.norm))
        self._arena_for(sizes, len(sizes) - 1)
        if model.lm_head is None:
            # The tied head streams the embedding every token: into the arena (huge pages), as the other matrices.
            self._to_arena([model.embed], model.embed.weight)
            s.embed = self._ptr(self._own(model.embed))  # (its own copy where the arena had no room)
            s.head = _Mat(_W_BF16 if model.dtype == torch.bfloat16 else _W_F32, cfg.vocab_size, cfg.hidden_size,
                          32, s.embed, None, None)
        else:
            s.embed = self._ptr(self._own(model.embed))
            s.head = self._mat([model.lm_head])
        self._arena = torch.empty(0, dtype=torch.uint8)  # the arenas live on as the matrices' storage
        self._arena_pending = 0
        s.layer = ctypes.cast(self._layers, ctypes.POINTER(_Layer))
        if cfg.is_moe:
            from solo.runtime.cpu_moe import build_moe_layers, check_moe_struct_layout

            check_moe_struct_layout(self._lib)
            for i, layer in enumerate(model.layers):  # (the router, shared experts: nothing keeps the file mapped)
                if cfg.is_moe_layer(i):
                    for module in layer.mlp.modules():
                        for name, value in list(module._parameters.items()) + list(module._buffers.items()):
                            if value is not None and value.is_floating_point():
                                self._own(module, name)
            self._moe_layers = build_moe_layers(model, self._keep)
            s.moe = ctypes.addressof(self._moe_layers)

    def reserve(self, rows: int, max_seq: int) -> None:
        """Allocate the cache if it is smaller than `rows` x `max_seq` tokens (discarding its contents).

        Also builds the static RoPE tables for `max_seq` positions (float32 cos and sin [tables, max_seq,
        head_dim]), which are checked against the memory left after the cache.

        Raises:
            KVCacheMemoryError: the cache, the tables or a batch-1 step's workspace do not fit (the runtime then
                holds no cache and keeps its old sizes: the next reserve() allocates again, and a step before it
                raises).
        """
        if self.cache is not None and rows <= self.rows and max_seq <= self.max_seq:
            return
        rows, max_seq = max(rows, self.rows), max(max_seq, self.max_seq)
        self.cache = None  # free the old cache, tables and workspaces before allocating the new ones
        self._cos = self._sin = torch.empty(0)
        self._workspace = self._paused_workspace = torch.empty(0, dtype=torch.uint8)
        cache = bind_kv_cache(self, self._struct, rows, max_seq)
        # (each raises with the cache freed)
        tables = self._rope_tables(rows, max_seq) if self.config.rope.rope_type != "dynamic" else None
        need = self._lib.solo_workspace_bytes(ctypes.byref(self._struct), 1, self.num_threads)  # a batch-1 step's
        workspace = new_workspace(need, rows, max_seq)
        # The sizes change last: after a failure the next reserve() allocates again (it returned early, and
        # every step then indexed the empty tables or failed to allocate its workspace).
        if tables is not None:
            self._cos, self._sin = tables
        self.cache, self._workspace = cache, workspace
        self.rows, self.max_seq = rows, max_seq

    def step_memory_bytes(self, rows: int, max_seq: int, entries: int) -> int:
        """Bytes of the largest decode step's workspace once the cache holds `rows` x `max_seq` tokens.

        The workspace grows with a call's entries (sequences x tokens) times the cache length (split-KV parts),
        when a call larger than any before comes: a server sets this aside beside the KV cache at start-up, so
        that no request finds the memory gone (`allocate_beside_cache`). The largest call: `entries`, or a
        span prefill's `SPAN_CALL_TOKENS`, whichever is larger.
        """
        struct = _Model.from_buffer_copy(self._struct)  # (a copy: the runtime's own struct keeps its sizes)
        struct.max_seq, struct.cache_rows = max_seq, rows
        entries = max(entries, SPAN_CALL_TOKENS if self.span_prefill_positions or self.span_prefill_tokens else 1)
        return int(self._lib.solo_workspace_bytes(ctypes.byref(struct), entries, self.num_threads))

    def reserve_step_memory(self, entries: int) -> None:
        """Allocate (and touch) now the workspace of the largest step to come at the reserved cache.

        `step_memory_bytes(rows, max_seq, entries)`; a server calls it at start-up, so that the memory is its own
        before traffic comes (set aside only, it was taken by the process's other growth under load).

        Raises:
            SoloError: before `reserve`; KVCacheMemoryError: it does not fit (`allocate_beside_cache`).
        """
        if self.cache is None:
            raise SoloError("reserve_step_memory() before reserve(): the KV cache is not allocated")
        self._workspace = step_workspace(self, self._workspace, self.step_memory_bytes(self.rows, self.max_seq,
                                                                                       entries))
        self._workspace.zero_()  # (pages untouched are not yet the process's: Linux hands them out on first write)

    def _rope_tables(self, rows: int, max_seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Static RoPE: per table of config.rope_tables, every position, rounded to the dtype as eager rounds it,
        # computed a block of positions at a time (each position's angles alone: the same bits), so building them
        # needs no transient copies of the whole tables.
        shape = (max(1, len(self.model.rotary.tables)), max_seq, self.config.head_dim)

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            cos, sin = torch.empty(shape, dtype=torch.float32), torch.empty(shape, dtype=torch.float32)
            for start in range(0, max_seq, _ROPE_BLOCK):
                positions = torch.arange(start, min(max_seq, start + _ROPE_BLOCK)).view(1, -1)
                c, s = _stack_tables(self.model.rotary.layer_tables(positions, self.model.dtype))
                cos[:, start:start + positions.shape[1]] = c
                sin[:, start:start + positions.shape[1]] = s
            return cos, sin

        return allocate_beside_cache(build, 2 * math.prod(shape) * 4, f"the RoPE tables of {max_seq} positions need",
                                     rows, max_seq)

    def weight_nbytes(self) -> int:
        """Bytes of weights one decode step streams (matrices, scales, biases, norms; the embedding as one row).

        A tied LM head counts the whole embedding matrix (the head reads it in full). A mixture-of-experts
        layer counts its router, shared expert and top-k routed experts only (what one token reads).
        """
        seen, total = set(), 0
        s = self._struct
        for t in self._keep:
            if t.data_ptr() in seen or t.data_ptr() == s.embed:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        row = self.config.hidden_size * self.model.embed.weight.element_size()
        if self.model.lm_head is None:
            total += self.model.embed.weight.numel() * self.model.embed.weight.element_size()
        if self.config.is_moe:
            from solo.runtime.cpu_moe import unread_expert_bytes

            total -= unread_expert_bytes(self.model)
        return total + row

    def skip_matmuls(self, skip: bool) -> None:
        """Measurement only: matrix-vector products write zeros without reading their weights.

        Timing `decode` then gives the step's cost outside weight streaming (the logits are meaningless).
        """
        self._struct.skip_matmuls = int(skip)

    # ------------------------------------------------------------------------------------------ steps

    @torch.inference_mode()
    def prefill(self, row: int, token_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Prompt -> float32 [vocab] logits of its last position (see `DecodeRuntime.prefill`).

        Matrix products run as batched PyTorch matmuls on the fused weights (dequantized layer by layer
        for int8/int4); norms, RoPE, the cache writes and the activation run in the native kernels,
        row-parallel; attention is PyTorch's SDPA over the cache (the eager model's own soft-capped
        attention for Gemma 2). Mixture-of-experts layers route as the eager block and run their experts
        natively, grouped by expert (`solo.runtime.cpu_moe.moe_prefill`). Past the last layer's cache writes
        only the last position goes on (its attention, o and MLP): no other position's output is read.

        A short tail after a longer cached prefix (at most `span_prefill_tokens` tokens and at most
        start_pos: the next turn of a conversation with the prefix cache) runs instead as one call of the
        decode kernel over
        all its tokens (`solo_decode_span`): the weights stream once for every token, and the LM head runs
        for the last one only. Batched matmuls have costs that do not shrink with the token count (a
        Python dispatch per op, oneDNN's weight packing, per-layer dequantization of int8/int4 weights),
        which dominated such a prefill. Its keys, values and logits are those of decode steps: they
        differ from a whole-prompt prefill's by rounding only, as the prefix cache's reuse of generated
        tokens already does (`solo.engine.prefix_cache`). A prompt whose cached part is shorter than its
        tail (an unrelated prompt that shares only its first tokens with the row) keeps the matmul path of
        a cold prefill: the cache saves it little, and its numerics stay those it had before.

        A prefill that ends within `span_prefill_positions` positions (a chat turn) runs through the decode
        kernel too, cold or not: then its keys, values and logits are the same bits however the sequence
        was split (cold, cached prefix + tail, chunks, decode steps), so a greedy output does not depend on
        what the prefix cache held (`SPAN_PREFILL_POSITIONS`). That kernel likewise runs the rest of the last
        layer for the last position alone (`SPAN_LAST_LOGITS` in decode.cpp).

        Args:
            row: cache row.
            token_ids: int64 [seq] prompt ids, written at positions start_pos .. start_pos + seq - 1.
            start_pos: position of the first id.

        Returns:
            float32 [vocab] logits of the last position (rounded to the weights' dtype first, as eager).

        Raises:
            SoloError: the row or the positions fall outside the reserved cache, or the prompt is empty.
        """
        ids = token_ids.to(self.device, torch.long).view(-1)
        seq = ids.numel()
        if self.cache is None:  # (never reserved, or the last reserve() failed: the structs' pointers are stale)
            raise SoloError("prefill before reserve(): the KV cache is not allocated")
        if not 0 <= row < self.rows or start_pos + seq > self.max_seq or seq == 0:
            raise SoloError(f"prefill of row {row}, positions {start_pos}..{start_pos + seq - 1} is "
                            f"outside the reserved cache ({self.rows} rows x {self.max_seq} tokens)")
        if start_pos + seq <= self.span_prefill_positions or seq <= min(start_pos, self.span_prefill_tokens):
            # Calls of at most SPAN_CALL_TOKENS tokens (the same bits: every token is computed alone): the
            # kernel's workspace grows with the tokens of a call times the cache length.
            for first in range(0, seq, SPAN_CALL_TOKENS):
                n = min(SPAN_CALL_TOKENS, seq - first)
                logits = self._step(torch.full((n,), row, dtype=torch.long), ids[first:first + n],
                                    torch.arange(start_pos + first, start_pos + first + n, dtype=torch.long),
                                    _SPAN_SHARED_ROWS | _SPAN_LAST_LOGITS)[0]
            return logits
        if self.config.is_moe:  # (cpu_moe imports this module)
            from solo.runtime.cpu_moe import moe_prefill
        cfg, model, lib, nt = self.config, self.model, self._lib, self.num_threads
        dtype, struct = model.dtype, ctypes.byref(self._struct)
        positions = torch.arange(start_pos, start_pos + seq).view(1, -1)
        cos, sin = _stack_tables(model.rotary.layer_tables(positions, dtype))  # [tables, seq, head_dim]
        x = model.embed_tokens(ids.view(1, -1))[0].float().contiguous()  # residual stream [seq, hidden]
        normed = torch.empty(seq, cfg.hidden_size, dtype=dtype)
        lib.solo_prefill_norm(struct, x.data_ptr(), seq, self._layers[0].attn_norm, normed.data_ptr(), nt)
        q = torch.empty(cfg.num_heads, seq, cfg.head_dim, dtype=dtype)
        kv_len = start_pos + seq
        masks: dict[int | None, torch.Tensor | None] = {}  # one mask per distinct window, shared by layers
        for i, layer in enumerate(model.layers):
            entry = self._layers[i]
            qkv = self._linear(4 * i, normed)
            if cfg.qk_norm and cfg.qk_norm_full_width:  # OLMoE: the eager norms over whole q / k (kernel skips them)
                nq, nkv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
                qkv[:, :nq] = layer.attn.q_norm(qkv[:, :nq])
                qkv[:, nq:nq + nkv] = layer.attn.k_norm(qkv[:, nq:nq + nkv])
            lib.solo_prefill_qkv(struct, i, qkv.data_ptr(), seq, start_pos, row, cos.data_ptr(), sin.data_ptr(),
                                 q.data_ptr(), nt)
            keys = self.cache.k[i][row:row + 1, :, :kv_len]
            values = self.cache.v[i][row:row + 1, :, :kv_len]
            window = cfg.layer_sliding_windows[i]
            if window is not None and window >= kv_len:
                window = None  # the window reaches back past the first token: plain causal
            if i + 1 == cfg.num_layers and seq > 1:
                # Only the last position's logits are wanted and every key and value is in the cache: the rest
                # of the last layer (attention, o, the MLP) runs for that position alone, as the span prefill
                # and llama.cpp do.
                q, x, positions, masks = q[:, -1:], x[-1:].contiguous(), positions[:, -1:], {}
                seq, normed = 1, torch.empty(1, cfg.hidden_size, dtype=dtype)
            if window not in masks:
                # Without a window or soft-capping, a whole prompt is SDPA's causal case and the last position
                # alone sees every key: no mask to build or read.
                plain = window is None and cfg.attn_logit_softcap is None and (start_pos == 0 or seq == 1)
                masks[window] = None if plain else attention_mask(positions, kv_len, window)
            mask = masks[window]
            if cfg.attn_logit_softcap is None:
                out = F.scaled_dot_product_attention(q[None], keys, values, attn_mask=mask,
                                                     is_causal=mask is None and seq > 1, scale=cfg.attn_scale,
                                                     enable_gqa=cfg.num_kv_groups > 1)
            else:
                out = _softcapped_attention(q[None], keys, values, mask, cfg.attn_scale, cfg.attn_logit_softcap)
            attn = out[0].transpose(0, 1).reshape(seq, cfg.num_heads * cfg.head_dim)
            proj = self._linear(4 * i + 1, attn)
            lib.solo_prefill_residual(struct, x.data_ptr(), proj.data_ptr(), seq, entry.attn_out_norm,
                                      entry.mlp_norm, normed.data_ptr(), nt)
            if cfg.is_moe_layer(i):  # router as eager, then each expert's rows over its tokens (cpu_moe.py)
                proj = moe_prefill(lib, self._struct, i, layer.mlp, normed, nt)
            else:
                gate_up = self._linear(4 * i + 2, normed)
                mid = torch.empty(seq, cfg.intermediate_size, dtype=dtype)
                lib.solo_prefill_act(struct, gate_up.data_ptr(), seq, mid.data_ptr(), nt)
                proj = self._linear(4 * i + 3, mid)
            last = i + 1 == cfg.num_layers
            next_norm = self._struct.final_norm if last else self._layers[i + 1].attn_norm
            lib.solo_prefill_residual(struct, x.data_ptr(), proj.data_ptr(), seq, entry.mlp_out_norm, next_norm,
                                      normed.data_ptr(), nt)
            del layer
        # LM head on the last position only, through the decode kernel (no dense copy of a quantized head).
        last_row = normed[-1:].float().contiguous()
        logits = torch.empty(1, cfg.vocab_size, dtype=torch.float32)
        workspace = torch.empty(cfg.hidden_size * 4 + 64, dtype=torch.uint8)
        lib.solo_gemv(ctypes.byref(self._struct.head), last_row.data_ptr(), 1, logits.data_ptr(),
                      workspace.data_ptr(), nt)
        logits = logits.to(dtype)  # eager's linear returns the weights' dtype
        cap = cfg.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits[0].float()

    def _linear(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Prefill matmul x [seq, in] @ W^T (+ bias) with fused matrix number `index`, in the model's dtype.

        Runs in `prefill_matmul_dtype`: a bf16 model's weights (or dequantized weights) are widened to
        float32 for this call only where that is faster (see the module docstring). An integer-dot matrix
        (`int_dot`) first quantizes x to int8 per block of 32 as its decode kernel does.
        """
        mat, weight, bias = self._prefill_mats[index]
        dtype = self.prefill_matmul_dtype
        if mat.format == _W_BF16_AMX:  # the packed weights' own kernel (AMX tiles, or outer products: packed.h)
            xf = x.float().contiguous()
            out = torch.empty(xf.shape[0], mat.rows, dtype=torch.float32)
            workspace = torch.empty(xf.numel() * 4 + 64, dtype=torch.uint8)
            self._lib.solo_gemv(ctypes.byref(mat), xf.data_ptr(), xf.shape[0], out.data_ptr(), workspace.data_ptr(),
                                self.num_threads)
            if bias is not None:
                out += bias.float()
            return out.to(self.model.dtype)
        if mat.format in (_W_INT8_Q8, _W_INT4_Q8):
            # The decode kernels multiply int8-quantized activations: prefill does the same, so a prompt's keys
            # and values are the ones decode steps would have written (up to rounding).
            x = x.contiguous().clone() if x.dtype in (torch.bfloat16, torch.float32) else x.float().contiguous()
            self._lib.solo_fake_quantize_q8(x.data_ptr(), x.shape[-1], x.numel() // x.shape[-1],
                                            int(x.dtype == torch.bfloat16), self.num_threads)
        if weight is None:  # quantized: a dense copy for this layer only, rounded as eager's dequantize
            weight = torch.empty(mat.rows, mat.cols, dtype=self.model.dtype)
            self._lib.solo_dequantize(ctypes.byref(mat), weight.data_ptr(), int(self.model.dtype == torch.bfloat16),
                                      self.num_threads)
        if dtype == self.model.dtype:
            return F.linear(x, weight, bias)
        out = F.linear(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
        return out.to(self.model.dtype)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # float32 [tables, batch, head_dim]: the kernels index table (Layer.rope), then batch entry.
        if self.config.rope.rope_type != "dynamic":
            return self._cos[:, positions].contiguous(), self._sin[:, positions].contiguous()
        # Dynamic NTK (one table): each entry its own row, so its frequencies follow its own length only.
        cos, sin = self.model.rotary(positions.view(-1, 1), self.model.dtype)
        return cos[:, 0][None].float().contiguous(), sin[:, 0][None].float().contiguous()

    @torch.inference_mode()
    def decode(self, rows: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step for a batch -> float32 [batch, vocab] (see `DecodeRuntime.decode`).

        Args:
            rows, token_ids, positions: int64 [batch] each (any device; copied to the CPU).

        Raises:
            SoloError: no cache reserved, mismatched lengths, or a row, position or token id out of range
                (checked, since the kernels do not).
        """
        return self._step(rows, token_ids, positions, 0)

    def pause_points(self) -> list[tuple[int, int]]:
        """The stage ranges [l0, l1) a step pausable between layers runs as (`decode_spans`' `between`).

        Stage l < layers is layer l, stage `layers` the LM head (decode.cpp: decode_step). About
        `PAUSES_PER_STEP` equal runs of layers, then the head alone: it is the largest matrix of a small model,
        and with a batch its products take longer than a run of layers.
        """
        layers = self.config.num_layers
        per = max(1, -(-layers // PAUSES_PER_STEP))
        return [(l0, min(l0 + per, layers)) for l0 in range(0, layers, per)] + [(layers, layers + 1)]

    def _step(self, rows: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor, flags: int,
              between: Callable[[], None] | None = None) -> torch.Tensor:
        """The native decode step over a batch of (row, token, position) entries with `_SPAN_*` flags.

        With `between`, the step runs as the layer ranges of `pause_points`, calling `between()` after each
        but the last: it may make other calls on this runtime (for other cache rows), which use their own
        workspace. The logits are those of one call, bit for bit (decode.cpp: decode_step).

        Returns:
            float32 [batch, vocab] logits, or [1, vocab] (the last entry's) with `_SPAN_LAST_LOGITS`.
        """
        if flags & _SPAN_LAST_LOGITS and not flags & _SPAN_SHARED_ROWS:  # its barrier orders the cache writes
            raise ValueError("_SPAN_LAST_LOGITS needs _SPAN_SHARED_ROWS (decode.cpp)")
        if between is not None and (flags & _SPAN_LAST_LOGITS or self._paused):
            raise ValueError("a step pausable between layers returns every entry's logits and does not nest")
        rows, ids, positions = checked_step_inputs(self, rows, token_ids, positions)
        batch = rows.numel()
        cos, sin = self._rope(positions)
        # The governor's count, capped by num_threads (which a caller may lower after construction): the
        # workspace must be sized for the threads the kernel actually runs, or they write past its end.
        nthreads = max(1, min(self.threads.threads_for(batch), self.num_threads))
        need = self._lib.solo_workspace_bytes(ctypes.byref(self._struct), batch, nthreads)
        if self._paused:
            workspace = self._paused_workspace = step_workspace(self, self._paused_workspace, need)
        else:
            workspace = self._workspace = step_workspace(self, self._workspace, need)
        logits = torch.empty(1 if flags & _SPAN_LAST_LOGITS else batch, self.config.vocab_size, dtype=torch.float32)
        args = (ctypes.byref(self._struct), batch, ids.data_ptr(), positions.data_ptr(), rows.data_ptr(),
                cos.data_ptr(), sin.data_ptr(), logits.data_ptr(), workspace.data_ptr(),
                nthreads)
        if between is None:
            start = time.perf_counter()
            late = self._lib.solo_decode_span(*args, flags) if flags else self._lib.solo_decode(*args)
            self.threads.report(late, time.perf_counter() - start, batch)
            return logits
        late, busy_s = 0, 0.0
        points = self.pause_points()
        for i, (l0, l1) in enumerate(points):
            start = time.perf_counter()
            late += self._lib.solo_decode_span_layers(*args, flags, l0, l1)
            busy_s += time.perf_counter() - start
            if i + 1 < len(points):
                self._paused = True
                try:
                    between()
                finally:
                    self._paused = False
        self.threads.report(late, busy_s, batch)
        return logits

    # ------------------------------------------------------------------- capabilities (solo.runtime.base)

    @torch.inference_mode()
    def verify(self, row: int, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Score k consecutive tokens of one row: float32 [k, vocab], every position's logits (`VerifyRuntime`).

        Runs the native decode step over k batch entries that share the row, at consecutive positions, on
        every thread, streaming the weights once for all k (`solo_decode_span` with a barrier after each
        layer's cache writes, so every entry attends over the keys the others just wrote). With float32
        weights of every format every position's logits equal a batch-1 `decode` step's bit for bit
        (`verify_matches_decode`).

        Raises:
            SoloError: no cache, k == 0, or the row, positions or ids fall outside the cache / vocabulary.
        """
        ids = token_ids.to("cpu", torch.long).view(-1)
        k = ids.numel()
        if k == 0:
            raise SoloError("verify needs at least one token")
        return self._step(torch.full((k,), row, dtype=torch.long), ids,
                          torch.arange(start_pos, start_pos + k, dtype=torch.long), _SPAN_SHARED_ROWS)

    @torch.inference_mode()
    def decode_spans(self, rows: Sequence[int], token_lists: Sequence[Sequence[int]],
                     start_positions: Sequence[int], between: Callable[[], None] | None = None) -> list[torch.Tensor]:
        """Every row's 1..k tokens in one native call (`SpanDecodeRuntime`): float32 [k_i, vocab] per row.

        The spans are laid end to end as the entries of one decode step (`solo_decode_span` with the
        barrier after each layer's cache writes, as `verify`), so the weights stream once for the whole
        step, where separate `verify` calls streamed them once per row with a draft. Each entry's
        arithmetic is that of a batch-1 step at its position whatever else is in the batch: a one-token row
        gets its `decode` logits and a longer row its `verify` logits, bit for bit. A step of one-token rows
        only is exactly `decode`.

        Args:
            rows, token_lists, start_positions: see `SpanDecodeRuntime.decode_spans`.
            between: called between runs of layers of this step (`pause_points`; `PausableStepRuntime`):
                it may run other calls on this runtime for other rows (a new request's prompt tail and first
                token, before the rest of a long batched step) but not another pausable step. The logits
                are the same bits.

        Raises:
            SoloError: see `check_spans`; rows, positions or ids outside the cache / vocabulary.
            ValueError: `between` given inside another step's `between`.
        """
        check_spans(rows, token_lists, start_positions)
        if not rows:
            return []
        counts = [len(tokens) for tokens in token_lists]
        flat_rows = [r for r, k in zip(rows, counts, strict=True) for _ in range(k)]
        flat_ids = [int(t) for tokens in token_lists for t in tokens]
        flat_pos = [p + j for p, k in zip(start_positions, counts, strict=True) for j in range(k)]
        flags = _SPAN_SHARED_ROWS if max(counts) > 1 else 0
        logits = self._step(torch.tensor(flat_rows, dtype=torch.long), torch.tensor(flat_ids, dtype=torch.long),
                            torch.tensor(flat_pos, dtype=torch.long), flags, between)
        return list(logits.split(counts))

    def export_kv(self, row: int, length: int) -> KVSnapshot:
        """Copy positions 0 .. length - 1 of `row` out of the cache (see `KVSnapshotRuntime`)."""
        return export_cache_kv(self.cache, row, length)

    def import_kv(self, row: int, snapshot: KVSnapshot, length: int, start: int = 0) -> None:
        """Write a snapshot's positions start .. length - 1 into `row` (see `KVSnapshotRuntime`)."""
        import_cache_kv(self.cache, row, snapshot, length, start)
