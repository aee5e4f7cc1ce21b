"""Split-K matrix-vector product (GEMV) for batch-1 decode: y = W x (+ bias) (+ residual).

At batch 1 every weight byte is used once per token, so a projection is bound by how fast the weights
stream from HBM. Speed then comes from keeping enough bytes in flight: many CTAs, each loading a
[BLOCK_N rows x BLOCK_K] tile per step with 16-byte vector loads along the contiguous K axis (bf16
weights, float32 accumulation). When N alone gives too few CTAs, the K axis is split as well (split-K):

    for each (row block n, K slice s) in parallel:         # grid = (cdiv(N, BLOCK_N), SPLIT_K)
        partial[s, rows] = sum_{k in slice s} W[rows, k] * x[k]
        if SPLIT_K == 1: y[rows] = epilogue(partial)       # bias, rounding, residual add
        else:
            arrived = atomic_add(counter[n], 1)            # release our partial / acquire the others'
            if arrived == SPLIT_K - 1:                     # the last CTA of the row block
                y[rows] = epilogue(sum_s partial[s, rows]) # fixed order: bitwise deterministic
                counter[n] = 0                             # ready for the next launch (graph replay)

The "last CTA reduces" scheme keeps split-K to one launch without floating-point atomics, so results
do not depend on CTA scheduling (the serial split-K "fixup" of stream-K GEMMs, Osama et al. 2023).

The epilogue matches `nn.Linear` followed by the eager residual add: the product is rounded to the
weights' dtype, then added to the residual and rounded again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from solo.runtime.triton.common import (
    check_matrix,
    check_vectors,
    dot_rows_from,
    first_tile,
    launch_options,
    pdl_mode,
    pdl_release,
    pdl_wait,
    round_to,
)


@dataclass(frozen=True)
class GemvConfig:
    """Launch configuration of `gemv_kernel`.

    Attributes:
        block_n: output rows per CTA.
        block_k: K elements per tile step; 8 * 32 * num_warps for bf16 (see `CANDIDATES`).
        split_k: K slices, each its own CTA (1: no split).
        num_warps: Triton launch option.
        num_stages: 2 double-buffers the weight tiles in registers (the next tile loads before this one
            is used, `common.dot_rows_from`); 1 keeps one tile in flight. Kernels launch with Triton's
            num_stages=1 either way (its pipeliner does not apply to loads that feed no dot).
    """

    block_n: int = 4
    block_k: int = 1024
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 1


CANDIDATES = (
    GemvConfig(2, 1024, 1, 4),
    GemvConfig(4, 1024, 1, 4),
    GemvConfig(8, 1024, 1, 4),
    GemvConfig(4, 512, 1, 2),
    GemvConfig(8, 512, 1, 2),
    GemvConfig(8, 2048, 1, 8),
    GemvConfig(4, 1024, 2, 4),
    GemvConfig(8, 1024, 4, 4),
    # Double-buffered (num_stages=2): two tiles per thread in flight.
    GemvConfig(2, 1024, 1, 4, 2),
    GemvConfig(4, 1024, 1, 4, 2),
    GemvConfig(8, 1024, 1, 4, 2),
    GemvConfig(4, 1024, 2, 4, 2),
)
"""Configurations `solo.runtime.triton.tuning` times per shape on the device.

BLOCK_K is one 16-byte bf16 vector per thread across the CTA (BLOCK_K = 8 * 32 * num_warps): the
input chunk's layout then equals a column slice of the weight tile's, so the compiler moves it through
no shared memory (other widths add a shared-memory round trip and two barriers per step). Triton does
not software-pipeline this loop (its loads feed no dot), so each thread keeps BLOCK_N 16-byte loads
in flight per step; the rest of the latency is hidden by CTAs resident on the SM."""


def default_config(n: int, k: int, sm_count: int = 132, elem_bytes: int = 2) -> GemvConfig:
    """A reasonable untuned configuration: enough CTAs to cover every SM several times.

    Args:
        n, k: the weight's shape [N, K].
        sm_count: streaming multiprocessors on the device.
        elem_bytes: bytes per weight element (BLOCK_K spans one 16-byte vector per thread of 4 warps).

    Returns:
        The largest block_n (<= 8) giving >= 2 CTAs per SM, then split_k (<= 8) doubled while CTAs are
        still short of that and each K slice keeps at least one full BLOCK_K tile.
    """
    block_k = min(16 // elem_bytes * 32 * 4, max(16, triton.next_power_of_2(k)))
    block_n = 8
    while block_n > 1 and triton.cdiv(n, block_n) < 2 * sm_count:
        block_n //= 2
    split_k = 1
    while split_k < 8 and triton.cdiv(n, block_n) * split_k < 2 * sm_count and k // (2 * split_k) >= block_k:
        split_k *= 2
    return GemvConfig(block_n, block_k, split_k, 4)


class SplitKWorkspace:
    """Scratch memory of a split-K launch: float32 partial sums [split_k, N] and int32 arrival counters.

    Counters start at zero and each launch leaves them at zero, so one workspace serves every replay of
    a captured graph. Allocate one per call site (launches in flight at once must not share one).

    Args:
        n: output rows N.
        config: the launch configuration the workspace is for.
        device: where the buffers live.

    Attributes:
        partials: float32 [max(1, split_k), N].
        counters: int32 [cdiv(N, block_n)], one per row block.
    """

    def __init__(self, n: int, config: GemvConfig, device: torch.device | str) -> None:
        self.partials = torch.empty(max(1, config.split_k), n, dtype=torch.float32, device=device)
        self.counters = torch.zeros(triton.cdiv(n, config.block_n), dtype=torch.int32, device=device)
        self.n = n
        self.config = config


@triton.jit
def gemv_epilogue(acc, rows, row_mask, w_ptr, out_ptr, bias_ptr, res_ptr,
                  HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """Bias, rounding to the weights' dtype (nn.Linear's output), residual add; stores y[rows]."""
    y = acc
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    y = round_to(y, w_ptr.dtype.element_ty)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + rows, mask=row_mask, other=0.0)
        y = round_to(y + res.to(tl.float32), res.dtype)
    tl.store(out_ptr + rows, y, mask=row_mask)


@triton.jit
def gemv_kernel(
    w_ptr, x_ptr, out_ptr, bias_ptr, res_ptr, partial_ptr, counter_ptr,
    N, stride_w, K: tl.constexpr, K_PER_SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOUBLE_BUFFER: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """y[N] = W[N, K] @ x[K] (+ bias) (+ residual); grid (cdiv(N, BLOCK_N), SPLIT_K)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    # K_PER_SPLIT is a whole number of tiles, so only the last slice has a masked tail.
    w_first = first_tile(w_ptr, rows, row_mask, stride_w, pid_k * K_PER_SPLIT, K, BLOCK_K)
    pdl_wait(USE_PDL)
    acc = dot_rows_from(w_first, w_ptr, rows, row_mask, stride_w, x_ptr, x_ptr, 1.0, pid_k * K_PER_SPLIT,
                        K_PER_SPLIT, K, False, False, BLOCK_N, BLOCK_K, DOUBLE_BUFFER)
    pdl_release(USE_PDL)
    if SPLIT_K == 1:
        gemv_epilogue(acc, rows, row_mask, w_ptr, out_ptr, bias_ptr, res_ptr, HAS_BIAS, HAS_RESIDUAL)
    else:
        tl.store(partial_ptr + pid_k * N + rows, acc, mask=row_mask)
        # Every thread's partial store is issued before the (release) arrival below.
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros([BLOCK_N], tl.float32)
            for s in range(SPLIT_K):
                # .cg reads L2, where the other CTAs' partials are, never a stale L1 line.
                total += tl.load(partial_ptr + s * N + rows, mask=row_mask, other=0.0, cache_modifier=".cg")
            gemv_epilogue(total, rows, row_mask, w_ptr, out_ptr, bias_ptr, res_ptr, HAS_BIAS, HAS_RESIDUAL)
            tl.store(counter_ptr + pid_n, 0)


def gemv(
    weight: torch.Tensor,
    x: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    workspace: SplitKWorkspace | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Y = round(W @ x + bias) (+ residual), one launch (split-K GEMV, see the module docstring).

    Args:
        weight: [N, K] row-major (nn.Linear layout), bf16/fp16/fp32.
        x: [K] input in any float dtype (read as float32).
        out: [N] output (default: new, weight's dtype); may be `residual` itself (in-place add).
        bias: [N] or None.
        residual: [N] added after rounding the product to the weights' dtype, or None.
        config: launch configuration (default: `default_config`).
        workspace: split-K scratch for `config` (allocated when None and split_k > 1).
        pdl: launch with programmatic dependent launch (Hopper; see `common.pdl_wait`).

    Returns:
        `out`.

    Raises:
        ValueError: shapes, strides or devices do not fit.
    """
    check_matrix("weight", weight)
    n, k = weight.shape
    check_vectors(k, x=x)
    if out is None:
        out = torch.empty(n, dtype=weight.dtype, device=weight.device)
    check_vectors(n, weight.device, out=out, bias=bias, residual=residual)
    config = config or default_config(n, k, elem_bytes=weight.element_size())
    if config.split_k > 1 and workspace is None:
        workspace = SplitKWorkspace(n, config, weight.device)
    if workspace is not None and (workspace.config != config or workspace.n != n):
        raise ValueError("the split-K workspace was made for another configuration")
    partials = workspace.partials if workspace is not None else out
    counters = workspace.counters if workspace is not None else out
    k_per_split = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
    grid = (triton.cdiv(n, config.block_n), triton.cdiv(k, k_per_split))
    if grid[1] != config.split_k:
        raise ValueError(f"split_k={config.split_k} leaves empty K slices for K={k}, block_k={config.block_k}")
    gemv_kernel[grid](
        weight, x, out, bias if bias is not None else out, residual if residual is not None else out,
        partials, counters, n, weight.stride(0), K=k, K_PER_SPLIT=k_per_split,
        HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
        SPLIT_K=config.split_k, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        DOUBLE_BUFFER=config.num_stages > 1, USE_PDL=pdl_mode(pdl),
        **launch_options(config.num_warps, 1, pdl),
    )
    return out


if __name__ == "__main__":
    from solo.runtime.triton.benchtools import gemv_benchmark_main

    gemv_benchmark_main()
