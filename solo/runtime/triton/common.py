"""Device helpers shared by the decode kernels.

The decode-step kernels reproduce the eager model's rounding: every tensor the eager model materializes
in the weights' dtype (a norm's output, a projection's output, a RoPE product) is rounded to that dtype
here too (`round_to`), while sums run in float32. With float32 weights the rounding is a no-op.

Decode state: the CUDA-graph runtime keeps the step's scalars in one int64 device tensor so that graphs
read them at replay time; its slot indices are defined once in `solo.runtime.cuda.state`.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from solo.env import env_choice
from solo.runtime.cuda import state as _state

try:  # grid dependency control (Hopper's programmatic dependent launch), Triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - old Triton: PDL is simply not offered
    gdc_launch_dependents = gdc_wait = None

# Slots of the decode-state tensors (solo/runtime/cuda/state.py), as constants the kernels can read.
STATE_TOKEN = tl.constexpr(_state.STATE_TOKEN)
STATE_POS = tl.constexpr(_state.STATE_POS)
STATE_ROW = tl.constexpr(_state.STATE_ROW)
STATE_COUNT = tl.constexpr(_state.STATE_COUNT)
STATE_LIMIT = tl.constexpr(_state.STATE_LIMIT)
STATE_DONE = tl.constexpr(_state.STATE_DONE)
STATE_SEED = tl.constexpr(_state.STATE_SEED)
STATE_TOP_K = tl.constexpr(_state.STATE_TOP_K)
PARAM_TEMPERATURE = tl.constexpr(_state.PARAM_TEMPERATURE)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """Round float32 `x` to `dtype` (nearest, ties to even) and back to float32.

    bf16 is rounded with integer arithmetic on the float32 bits: the same result as the GPU's
    conversion, and also under the Triton interpreter, whose own bf16 conversion truncates. Values
    rounded this way store into a bf16 tensor exactly on both.
    """
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif dtype == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit
def rms_rstd(x_ptr, N: tl.constexpr, eps, BLOCK: tl.constexpr):
    """1 / sqrt(mean(x[0:N]^2) + eps), accumulated in float32 (RMSNorm, Zhang & Sennrich 2019)."""
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc += x * x
    mean_sq = tl.sum(acc, axis=0) / N
    return 1.0 / tl.sqrt_rn(mean_sq + eps)


@triton.jit
def load_input(x_ptr, norm_ptr, cols, mask, rstd, HAS_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    """A chunk of a GEMV input as float32, optionally RMS-normalized.

    Rounding follows the eager RMSNorm: Llama scales the normalized value after rounding it to the
    activation dtype (`w * normed.to(dtype)`); Gemma scales by (1 + w) in float32 and rounds once.
    """
    x = tl.load(x_ptr + cols, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    if HAS_NORM:
        w = tl.load(norm_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if UNIT_OFFSET:
            xf = round_to(xf * rstd * (1.0 + w), x.dtype)
        else:
            xf = round_to(w * round_to(xf * rstd, x.dtype), x.dtype)
    return xf


@triton.jit
def weight_tile(w_ptr, row_off, row_mask, cols, col_mask):
    """W[rows, cols] in the weights' dtype, zero where a row or column is masked.

    `row_off` is rows * stride_w as int64 [BLOCK_N, 1].
    """
    return tl.load(w_ptr + row_off + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)


@triton.jit
def first_tile(w_ptr, rows, row_mask, stride_w, k_lo, k_end, BLOCK_K: tl.constexpr):
    """The first [BLOCK_N, BLOCK_K] weight tile of `dot_rows_from` (columns k_lo ...).

    Weights are never written during decode, so a kernel may load this before `pdl_wait`: the load then
    overlaps the previous kernel's tail instead of starting after it.
    """
    cols = k_lo + tl.arange(0, BLOCK_K)
    return weight_tile(w_ptr, rows.to(tl.int64)[:, None] * stride_w, row_mask, cols, cols < k_end)


@triton.jit
def dot_rows_from(w_first, w_ptr, rows, row_mask, stride_w, x_ptr, norm_ptr, rstd, k_lo, K_SPAN: tl.constexpr,
                  k_end, HAS_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, DOUBLE_BUFFER: tl.constexpr):
    """sum_k W[rows, k] * x[k] for k in [k_lo, min(k_lo + K_SPAN, k_end)): float32 [BLOCK_N].

    `w_first` is the span's first tile (`first_tile`). K_SPAN is a compile-time constant so the loop has
    a static trip count (and runs under the interpreter); `k_end` masks the tail.

    The product is kept as a [BLOCK_N, BLOCK_K] float32 tile and reduced once at the end, so the loop
    body is loads and fused multiply-adds only; rows are contiguous along k, so the loads coalesce.
    Each step loads the next tile (masked off past the span): with DOUBLE_BUFFER before this tile's
    multiply-adds, so two tiles per thread are in flight (Triton does not pipeline loads that feed no
    dot); without, after them (one tile in flight, fewer registers).
    """
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    row_off = rows.to(tl.int64)[:, None] * stride_w
    w = w_first
    for kk in range(0, K_SPAN, BLOCK_K):
        cols = k_lo + kk + tl.arange(0, BLOCK_K)
        x = load_input(x_ptr, norm_ptr, cols, cols < k_end, rstd, HAS_NORM, UNIT_OFFSET)
        next_mask = (cols + BLOCK_K < k_end) & (kk + BLOCK_K < K_SPAN)
        if DOUBLE_BUFFER:
            w_next = weight_tile(w_ptr, row_off, row_mask, cols + BLOCK_K, next_mask)
            acc += w.to(tl.float32) * x[None, :]
            w = w_next
        else:
            acc += w.to(tl.float32) * x[None, :]
            w = weight_tile(w_ptr, row_off, row_mask, cols + BLOCK_K, next_mask)
    return tl.sum(acc, axis=1)


@triton.jit
def dot_rows(w_ptr, rows, row_mask, stride_w, x_ptr, norm_ptr, rstd, k_lo, K_SPAN: tl.constexpr, k_end,
             HAS_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """`dot_rows_from` loading its own first tile, one tile in flight."""
    w_first = first_tile(w_ptr, rows, row_mask, stride_w, k_lo, k_end, BLOCK_K)
    return dot_rows_from(w_first, w_ptr, rows, row_mask, stride_w, x_ptr, norm_ptr, rstd, k_lo, K_SPAN, k_end,
                         HAS_NORM, UNIT_OFFSET, BLOCK_N, BLOCK_K, False)


@triton.jit
def dot_row_pairs_from(w_first_a, w_first_b, w_ptr, rows_a, rows_b, row_mask, stride_w, x_ptr, norm_ptr, rstd,
                       K: tl.constexpr, HAS_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, DOUBLE_BUFFER: tl.constexpr):
    """Two row sets against the whole input x[0:K]: (W[rows_a] @ x, W[rows_b] @ x), float32 [BLOCK_N] each.

    Used where an output needs two rows at once: the two halves of a RoPE rotation pair, or the gate and
    up rows of a gated MLP. The input chunk is loaded (and normalized) once for both. `w_first_a/b` are
    the first tiles (`first_tile` at k_lo = 0); DOUBLE_BUFFER as in `dot_rows_from`.
    """
    acc_a = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc_b = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    off_a = rows_a.to(tl.int64)[:, None] * stride_w
    off_b = rows_b.to(tl.int64)[:, None] * stride_w
    w_a = w_first_a
    w_b = w_first_b
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = load_input(x_ptr, norm_ptr, cols, cols < K, rstd, HAS_NORM, UNIT_OFFSET)
        next_mask = cols + BLOCK_K < K
        if DOUBLE_BUFFER:
            next_a = weight_tile(w_ptr, off_a, row_mask, cols + BLOCK_K, next_mask)
            next_b = weight_tile(w_ptr, off_b, row_mask, cols + BLOCK_K, next_mask)
            acc_a += w_a.to(tl.float32) * x[None, :]
            acc_b += w_b.to(tl.float32) * x[None, :]
            w_a = next_a
            w_b = next_b
        else:
            acc_a += w_a.to(tl.float32) * x[None, :]
            acc_b += w_b.to(tl.float32) * x[None, :]
            w_a = weight_tile(w_ptr, off_a, row_mask, cols + BLOCK_K, next_mask)
            w_b = weight_tile(w_ptr, off_b, row_mask, cols + BLOCK_K, next_mask)
    return tl.sum(acc_a, axis=1), tl.sum(acc_b, axis=1)


@triton.jit
def dot_row_pairs(w_ptr, rows_a, rows_b, row_mask, stride_w, x_ptr, norm_ptr, rstd, K: tl.constexpr,
                  HAS_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """`dot_row_pairs_from` loading its own first tiles, one tile per row set in flight."""
    w_a = first_tile(w_ptr, rows_a, row_mask, stride_w, 0, K, BLOCK_K)
    w_b = first_tile(w_ptr, rows_b, row_mask, stride_w, 0, K, BLOCK_K)
    return dot_row_pairs_from(w_a, w_b, w_ptr, rows_a, rows_b, row_mask, stride_w, x_ptr, norm_ptr, rstd, K,
                              HAS_NORM, UNIT_OFFSET, BLOCK_N, BLOCK_K, False)


PDL_OFF, PDL_RELEASE_LATE, PDL_RELEASE_EARLY = 0, 1, 2
"""The values of a kernel's USE_PDL constant (`pdl_mode`)."""


def pdl_mode(pdl: bool) -> int:
    """The USE_PDL constant of a launch: PDL_OFF, or how a PDL kernel releases its dependent.

    PDL_RELEASE_LATE (the default): release after the weight loop, so the next kernel's CTAs start (and
    load their first weight tiles, `first_tile`, before their wait) while this kernel finishes its
    epilogue. PDL_RELEASE_EARLY (SOLO_PDL_RELEASE=early, for measurement): each CTA releases the next
    kernel right after its own wait, so the next kernel's CTAs become resident as soon as all of this
    kernel's have started. Either way every read of an activation waits for the previous kernel to have
    completed (`pdl_wait`), so results are identical. On an H200 (Llama-3.2-1B shape, block decode) the two
    measured within run-to-run noise of each other (1203-1218 tok/s; benchmarks/results/nvidia-h200/README.md).
    """
    if not pdl:
        return PDL_OFF
    early = env_choice("SOLO_PDL_RELEASE", ("late", "early"), "late") == "early"
    return PDL_RELEASE_EARLY if early else PDL_RELEASE_LATE


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """With programmatic dependent launch, block until the previous kernel in the stream has finished.

    Called by every decode kernel before it reads anything the previous kernel may write (only weight
    tiles, which decode never writes, may be loaded before it). A PDL launch lets this kernel's CTAs be
    scheduled while the previous kernel drains (hiding the launch gap), and this wait keeps every read
    after its writes. In PDL_RELEASE_EARLY mode the next kernel is released here (see `pdl_mode`).
    """
    if USE_PDL != 0:  # PDL_OFF
        gdc_wait()
    if USE_PDL == 2:  # PDL_RELEASE_EARLY
        gdc_launch_dependents()


@triton.jit
def pdl_release(USE_PDL: tl.constexpr):
    """In PDL_RELEASE_LATE mode, let the next kernel in the stream start launching (see `pdl_mode`)."""
    if USE_PDL == 1:  # PDL_RELEASE_LATE
        gdc_launch_dependents()


def launch_options(num_warps: int, num_stages: int = 1, pdl: bool = False) -> dict:
    """Keyword launch options of a kernel call: num_warps, num_stages (and `launch_pdl` only when asked for)."""
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if pdl:
        options["launch_pdl"] = True
    return options


def pdl_supported() -> bool:
    """True when kernels can use programmatic dependent launch: Triton has it, and a Hopper-or-newer GPU."""
    if gdc_wait is None or interpreting():
        return False
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


@triton.jit
def tanh_f32(x):
    """Tanh in float32 from exp (portable to the interpreter); saturates correctly for large |x|."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")  # Triton < 3.4 has no knobs


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def check_matrix(name: str, weight: torch.Tensor, shape: tuple[int, int] | None = None) -> None:
    """Host-side check before a launch: `weight` is a row-major 2-D matrix (of `shape` when given).

    Raises:
        ValueError: it is not 2-D, its rows are strided, or its shape differs from `shape`.
    """
    if weight.dim() != 2 or weight.stride(1) != 1 or (shape is not None and tuple(weight.shape) != shape):
        expected = "[N, K]" if shape is None else f"[{shape[0]}, {shape[1]}]"
        raise ValueError(f"{name} must be a row-major {expected} matrix, got shape {tuple(weight.shape)}")


def check_vectors(length: int, device: torch.device | None = None, **vectors: torch.Tensor | None) -> None:
    """Host-side check before a launch: each tensor given is a contiguous [length] vector.

    None skips a vector (an optional input); with `device`, each must also live there. The kernels read
    these through raw pointers, so a strided or misplaced tensor would be read wrongly.

    Raises:
        ValueError: naming the first vector that does not fit.
    """
    for name, t in vectors.items():
        if t is not None and (t.shape != (length,) or not t.is_contiguous()
                              or (device is not None and t.device != device)):
            where = "" if device is None else f" on {device}"
            raise ValueError(f"{name} must be a contiguous [{length}] vector{where}, got shape {tuple(t.shape)}")
