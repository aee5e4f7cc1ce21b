"""RMSNorm fused into the following matrix-vector product: y = W @ rmsnorm(x) (+ bias).

Each CTA recomputes the norm's statistic over the whole input (a few KB, read from L2) instead of
waiting for a separate norm kernel, so the normalized vector never goes through HBM and the step saves
a launch. Used for the LM head (final norm + vocabulary projection) and, where the QKV kernel does not
apply (per-head q/k norms), for the attention input projection:

    rstd = 1 / sqrt(mean(x^2) + eps)                       # per CTA, float32
    for each row block in parallel:                        # grid = cdiv(N, BLOCK_N)
        y[rows] = round(sum_k W[rows, k] * norm(x)[k] (+ bias[rows]))

`norm(x)` rounds like the eager RMSNorm (see `common.load_input`); `y` is rounded to the weights'
dtype like nn.Linear's output and may be stored as float32 (logits).
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
    rms_rstd,
    round_to,
)


@dataclass(frozen=True)
class RmsNormGemvConfig:
    """Launch configuration of `rmsnorm_gemv_kernel` (see `gemv.GemvConfig` for the fields)."""

    block_n: int = 8
    block_k: int = 1024
    num_warps: int = 4
    num_stages: int = 1


CANDIDATES = (
    RmsNormGemvConfig(4, 1024, 4),
    RmsNormGemvConfig(8, 1024, 4),
    RmsNormGemvConfig(4, 512, 2),
    RmsNormGemvConfig(8, 512, 2),
    RmsNormGemvConfig(16, 512, 2),
    RmsNormGemvConfig(8, 2048, 8),
    RmsNormGemvConfig(4, 1024, 4, 2),  # num_stages=2: double-buffered weight tiles (see `gemv.GemvConfig`)
    RmsNormGemvConfig(8, 1024, 4, 2),
)
"""Configurations the tuner times per shape (BLOCK_K = 8 * 32 * num_warps: see `gemv.CANDIDATES`)."""


def default_config(n: int, k: int, sm_count: int = 132, elem_bytes: int = 2) -> RmsNormGemvConfig:
    """Untuned configuration with at least ~2 CTAs per SM (see `gemv.default_config`)."""
    block_k = min(16 // elem_bytes * 32 * 4, max(16, triton.next_power_of_2(k)))
    block_n = 8
    while block_n > 1 and triton.cdiv(n, block_n) < 2 * sm_count:
        block_n //= 2
    return RmsNormGemvConfig(block_n, block_k, 4)


@triton.jit
def rmsnorm_gemv_kernel(
    x_ptr, norm_ptr, w_ptr, bias_ptr, out_ptr,
    N, stride_w, eps,
    K: tl.constexpr, UNIT_OFFSET: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_NORM: tl.constexpr, DOUBLE_BUFFER: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """y[N] = round(W[N, K] @ rmsnorm(x[K]) (+ bias)); grid (cdiv(N, BLOCK_N),)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    w_first = first_tile(w_ptr, rows, row_mask, stride_w, 0, K, BLOCK_K)
    pdl_wait(USE_PDL)
    rstd = rms_rstd(x_ptr, K, eps, BLOCK_NORM)
    acc = dot_rows_from(w_first, w_ptr, rows, row_mask, stride_w, x_ptr, norm_ptr, rstd, 0, K, K,
                        True, UNIT_OFFSET, BLOCK_N, BLOCK_K, DOUBLE_BUFFER)
    pdl_release(USE_PDL)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, round_to(acc, w_ptr.dtype.element_ty), mask=row_mask)


def rmsnorm_gemv(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    unit_offset: bool = False,
    config: RmsNormGemvConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Y = W @ rmsnorm(x) (+ bias), one launch (RMSNorm: Zhang & Sennrich 2019).

    Args:
        x: [K] un-normalized input (the residual stream), model dtype.
        norm_weight: [K] RMSNorm weight.
        weight: [N, K] row-major projection, bf16/fp16/fp32.
        eps: RMSNorm epsilon.
        out: [N] output (default: new, weight's dtype); float32 is allowed (values are still rounded to
            the weight's dtype first, as the eager model's logits are).
        bias: [N] or None.
        unit_offset: Gemma's (1 + w) scaling.
        config: launch configuration (default: `default_config`).
        pdl: launch with programmatic dependent launch (Hopper; see `common.pdl_wait`).

    Returns:
        `out`.

    Raises:
        ValueError: shapes, strides or devices do not fit.
    """
    check_matrix("weight", weight)
    n, k = weight.shape
    check_vectors(k, x=x, norm_weight=norm_weight)
    if out is None:
        out = torch.empty(n, dtype=weight.dtype, device=weight.device)
    check_vectors(n, weight.device, out=out, bias=bias)
    config = config or default_config(n, k, elem_bytes=weight.element_size())
    grid = (triton.cdiv(n, config.block_n),)
    rmsnorm_gemv_kernel[grid](
        x, norm_weight, weight, bias if bias is not None else out, out, n, weight.stride(0), float(eps),
        K=k, UNIT_OFFSET=unit_offset, HAS_BIAS=bias is not None,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, BLOCK_NORM=min(1024, triton.next_power_of_2(k)),
        DOUBLE_BUFFER=config.num_stages > 1,
        USE_PDL=pdl_mode(pdl), **launch_options(config.num_warps, 1, pdl),
    )
    return out


if __name__ == "__main__":
    from solo.runtime.triton.benchtools import rmsnorm_gemv_benchmark_main

    rmsnorm_gemv_benchmark_main()
