"""Run-time compilation of the interpreter kernel (kernel.cu) with NVRTC, through `cuda-bindings`.

The kernel is specialised per model: its sizes arrive as -D defines, so loops over the hidden size,
the head dim and the GQA group unroll and the register count is fixed. NVRTC compiles it straight to
a cubin for the GPU's architecture (sm_90a on Hopper); `--ptxas-options=-v` puts the register and spill
counts in the compile log, which `resource_usage` parses (CI checks them without a GPU or a driver).

Loading and launching use the CUDA driver API from the same package (`cuda.bindings.driver`): the
cubin is loaded into torch's current context and launched on torch's current stream.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from importlib import resources

from solo.errors import SoloError
from solo.runtime.megakernel.graph import Dims
from solo.runtime.megakernel.schedule import INSTR_WORDS

NTHREADS = 512
"""Threads per CTA (16 warps)."""

STAGE_BYTES = 64 * 1024
"""Default bytes of one shared-memory prefetch stage (two stages: the running instruction's and the
next's); `stage_bytes_for` picks a larger one where shared memory allows."""

MAX_SHARED_BYTES = 227 * 1024
"""Dynamic shared memory one CTA may use on an H100 / H200 (sm_90)."""

_MAX_STAGE_BYTES = 96 * 1024

MAX_REGISTERS = 128
"""Registers per thread the kernel may use: 512 threads x 128 = the whole register file of one SM."""

KERNEL_NAME = "solo_megakernel"

# Pointer-table layout (kernel.cu's P_* / L_* defines).
TABLE_GLOBAL = ("embed", "lm_head", "final_norm", "rope_cos", "rope_sin", "x0", "x1", "q", "attn", "h",
                "part_o", "part_ml", "logits", "amax_val", "amax_idx")
TABLE_GLOBAL_SLOTS = 16
TABLE_LAYER = ("attn_norm", "w_qkv", "w_o", "mlp_norm", "w_gate_up", "w_down", "k_cache", "v_cache")


def stage_bytes_for(hidden: int, inter: int, q_size: int, nthreads: int = NTHREADS) -> int:
    """Bytes of the largest prefetch stage that fits twice in shared memory (bigger tiles, fewer instructions).

    A multiple of 16 KiB, at most 96 KiB, beside the activation vector and the scratch.
    """
    rest = -(-max(hidden, inter, q_size) * 2 // 16) * 16 + 4 * (3 + 3 * nthreads + 3 + 2 * (nthreads // 32)) + 16
    stage = (MAX_SHARED_BYTES - rest) // 2 // (16 * 1024) * (16 * 1024)
    return max(16 * 1024, min(_MAX_STAGE_BYTES, stage))


def kernel_unsupported_reason(dims: Dims, stage_bytes: int = STAGE_BYTES) -> str | None:
    """Why kernel.cu cannot run a lowering's sizes (one line), or None."""
    if dims.elem_bytes != 2:
        return "the megakernel's CUDA kernel runs bfloat16 weights only"
    for name, k in (("hidden_size", dims.hidden), ("intermediate_size", dims.inter),
                    ("heads * head_dim", dims.q_size)):
        if k % 8:
            return f"{name} {k} is not a multiple of 8 (16-byte rows)"
    rows = max(dims.qkv_pairs, dims.o_rows, dims.gu_rows, dims.down_rows, dims.lm_rows)
    if rows > NTHREADS:
        return f"a tile of {rows} rows exceeds {NTHREADS} (one thread per output row)"
    if NTHREADS // 32 * dims.groups * (dims.head_dim + 2) * 4 > stage_bytes:
        return f"GQA group {dims.groups} x head_dim {dims.head_dim} is too wide for attention's scratch"
    if shared_memory_bytes(dims, NTHREADS, stage_bytes) > MAX_SHARED_BYTES:
        return f"intermediate_size {dims.inter} leaves too little shared memory for the prefetch stages"
    return None


WAIT_TIMEOUT_S = 2.0
"""A counter wait longer than this stops the launch with STATE_ERROR set (no step waits that long)."""


def kernel_source(dims: Dims, nthreads: int = NTHREADS, stage_bytes: int = STAGE_BYTES,
                  wait_timeout_s: float = WAIT_TIMEOUT_S) -> str:
    """kernel.cu preceded by the model's sizes (and the CTA's threads / stage bytes / wait timeout) as #defines."""
    defines = {
        "HIDDEN": dims.hidden, "INTER": dims.inter, "VOCAB": dims.vocab, "LAYERS": dims.layers,
        "HEADS": dims.heads, "KV_HEADS": dims.kv_heads, "HEAD_DIM": dims.head_dim,
        "SPLITS": dims.splits, "LM_TILES": dims.lm_tiles, "INSTR_WORDS": INSTR_WORDS, "NTHREADS": nthreads,
        "STAGE_BYTES": stage_bytes, "RMS_EPS": f"{dims.eps!r}f", "ATTN_SCALE": f"{dims.attn_scale!r}f",
        "WAIT_TIMEOUT_NS": f"{int(wait_timeout_s * 1e9)}ull",
    }
    head = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    return head + resources.files("solo.runtime.megakernel").joinpath("kernel.cu").read_text()


def shared_memory_bytes(dims: Dims, nthreads: int = NTHREADS, stage_bytes: int = STAGE_BYTES) -> int:
    """Dynamic shared memory per CTA: two prefetch stages, one activation vector, the scratch struct."""
    maxk = max(dims.hidden, dims.inter, dims.q_size)
    nwarps = nthreads // 32
    smem_struct = 4 * (3 + nthreads + 2 * nthreads + 3 + 2 * nwarps)
    return 2 * stage_bytes + -(-maxk * 2 // 16) * 16 + -(-smem_struct // 16) * 16


def pointer_table(weights, buffers: dict, k_layers: list, v_layers: list) -> list[int]:
    """The kernel's pointer table (kernel.cu's P_* / L_* slots): addresses of the weights and buffers.

    Args:
        weights: `vm.ModelWeights`.
        buffers: `vm.make_buffers` output (activations, partials, logits, argmax tiles).
        k_layers, v_layers: per layer, the KV-cache rows the kernel reads and writes ([kv_heads, max_seq,
            head_dim] tensors).

    Returns:
        int64 addresses: TABLE_GLOBAL_SLOTS global slots, then len(TABLE_LAYER) per layer.
    """
    w = weights
    sources = {"embed": w.embed, "lm_head": w.lm_head, "final_norm": w.final_norm, "rope_cos": w.rope_cos,
               "rope_sin": w.rope_sin, **{k: buffers[k] for k in TABLE_GLOBAL[5:]}}
    ptrs = [sources[name].data_ptr() for name in TABLE_GLOBAL]
    ptrs += [0] * (TABLE_GLOBAL_SLOTS - len(ptrs))
    for layer, lw in enumerate(w.layers):
        for t in (lw.attn_norm, lw.w_qkv, lw.w_o, lw.mlp_norm, lw.w_gate_up, lw.w_down):
            if not t.is_contiguous():
                raise ValueError("the kernel needs contiguous weights")
        ptrs += [lw.attn_norm.data_ptr(), lw.w_qkv.data_ptr(), lw.w_o.data_ptr(), lw.mlp_norm.data_ptr(),
                 lw.w_gate_up.data_ptr(), lw.w_down.data_ptr(), k_layers[layer].data_ptr(),
                 v_layers[layer].data_ptr()]
    return ptrs


@dataclass
class CompiledKernel:
    """NVRTC's output.

    Attributes:
        cubin: the binary for `arch`.
        ptx: the PTX it was assembled from (for a second opinion from a standalone ptxas).
        log: NVRTC's log (with ptxas' resource report).
        arch: e.g. "sm_90a".
    """

    cubin: bytes
    ptx: bytes
    log: str
    arch: str


def nvrtc_available() -> str | None:
    """None when `cuda-bindings` and an NVRTC library load, else why not (one line)."""
    try:
        from cuda.bindings import nvrtc

        err, _, _ = nvrtc.nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 - any import/loader failure means "not available"
        return f"NVRTC is not available ({type(exc).__name__}: {exc}); pip install cuda-bindings nvidia-cuda-nvrtc"
    if int(err) != 0:
        return f"NVRTC failed to initialise ({err})"
    return None


def compile_kernel(dims: Dims, arch: str = "sm_90a", stage_bytes: int = STAGE_BYTES) -> CompiledKernel:
    """Compile kernel.cu for `dims` with NVRTC (cached per sizes and target in this process).

    The KV-cache length is a launch argument, so caches of any length share one compiled kernel.

    Args:
        dims: the lowering's sizes.
        arch: the target, "sm_90a" for H100 / H200.
        stage_bytes: bytes of a prefetch stage (the tile size `plan_dims` was given).

    Returns:
        The `CompiledKernel`.

    Raises:
        SoloError: NVRTC is missing or the compilation failed (the log's first lines are quoted).
    """
    return _compile(dataclasses.replace(dims, max_seq=0), arch, stage_bytes)


@functools.lru_cache(maxsize=8)
def _compile(dims: Dims, arch: str, stage_bytes: int) -> CompiledKernel:
    reason = nvrtc_available()
    if reason is not None:
        raise SoloError(reason)
    from cuda.bindings import nvrtc

    source = kernel_source(dims, NTHREADS, stage_bytes).encode()
    err, prog = nvrtc.nvrtcCreateProgram(source, b"solo_megakernel.cu", 0, [], [])
    _check(err, "nvrtcCreateProgram")
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"--ptxas-options=-v", b"--fmad=true"]
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log_buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log_buf)
        log = log_buf.rstrip(b"\0 ").decode(errors="replace")
        if int(err) != 0:
            raise SoloError(f"the megakernel failed to compile for {arch}: {log.strip()[:2000]}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(err, "nvrtcGetCUBIN")
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        _check(err, "nvrtcGetPTXSize")
        ptx = b" " * size
        (err,) = nvrtc.nvrtcGetPTX(prog, ptx)
        _check(err, "nvrtcGetPTX")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompiledKernel(cubin=bytes(cubin), ptx=bytes(ptx).rstrip(b"\0"), log=log, arch=arch)


def _check(err, what: str) -> None:
    if int(err) != 0:
        raise SoloError(f"{what} failed: {err}")


@dataclass(frozen=True)
class ResourceUsage:
    """ptxas' report for the kernel: registers per thread and spill bytes."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int


def resource_usage(log: str, kernel: str = KERNEL_NAME) -> ResourceUsage:
    """Parse ptxas' `-v` report (from NVRTC's log or ptxas' output) for `kernel`.

    Raises:
        ValueError: the report does not mention the kernel.
    """
    start = log.find(f"Function properties for {kernel}")
    if start < 0:
        raise ValueError(f"no ptxas report for {kernel} in the log")
    part = log[start:]
    stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", part)
    regs = re.search(r"Used (\d+) registers", part)
    if stack is None or regs is None:
        raise ValueError(f"unreadable ptxas report for {kernel}: {part[:300]!r}")
    return ResourceUsage(registers=int(regs.group(1)), spill_stores=int(stack.group(2)),
                         spill_loads=int(stack.group(3)), stack_bytes=int(stack.group(1)))
