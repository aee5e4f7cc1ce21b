"""Gated MLP input in one launch: RMSNorm + gate/up projection + activation (SwiGLU, GeGLU).

The gate and up weights are stacked into one [2F, hidden] matrix (gate rows, then up rows). Each CTA
computes gate row f and up row F + f for BLOCK_F features against the normalized input, loaded once,
and applies the gated activation before anything leaves the registers:

    rstd = 1 / sqrt(mean(x^2) + eps)
    for each block of BLOCK_F features in parallel:     # grid = cdiv(F, BLOCK_F)
        g, u = W[f] @ norm(x), W[F + f] @ norm(x)  (+ bias), rounded like nn.Linear
        a[f] = round(act(g) * u)                         # act = silu (SwiGLU, Shazeer 2020) or gelu

The [F] activation then feeds the down projection (`gemv.gemv` with the residual add). Rounding
follows the eager `down(act(gate(x)) * up(x))`: act(g) and the product are each rounded to the dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from solo.runtime.triton.common import (
    check_matrix,
    check_vectors,
    dot_row_pairs_from,
    first_tile,
    launch_options,
    pdl_mode,
    pdl_release,
    pdl_wait,
    rms_rstd,
    round_to,
    tanh_f32,
)

ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1, "gelu": 2}
"""Activation names (as in config.json) and their kernel codes."""


@dataclass(frozen=True)
class GatedMlpConfig:
    """Launch configuration of `gated_mlp_kernel` (block_f features per CTA, 2 * block_f rows)."""

    block_f: int = 4
    block_k: int = 1024
    num_warps: int = 4
    num_stages: int = 1


CANDIDATES = (
    GatedMlpConfig(2, 1024, 4),
    GatedMlpConfig(4, 1024, 4),
    GatedMlpConfig(8, 1024, 4),
    GatedMlpConfig(4, 512, 2),
    GatedMlpConfig(8, 512, 2),
    GatedMlpConfig(4, 2048, 8),
    GatedMlpConfig(2, 1024, 4, 2),  # num_stages=2: double-buffered weight tiles (see `gemv.GemvConfig`)
    GatedMlpConfig(4, 1024, 4, 2),
    GatedMlpConfig(8, 512, 2, 2),
)
"""Configurations the tuner times per shape (BLOCK_K = 8 * 32 * num_warps: see `gemv.CANDIDATES`)."""


@triton.jit
def gated_mlp_kernel(
    x_ptr, norm_ptr, w_ptr, bias_ptr, out_ptr,
    F, stride_w, eps,
    HIDDEN: tl.constexpr, ACTIVATION: tl.constexpr, HAS_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_NORM: tl.constexpr,
    DOUBLE_BUFFER: tl.constexpr, USE_PDL: tl.constexpr,
):
    """a[F] = act(W_gate @ norm(x)) * (W_up @ norm(x)); grid (cdiv(F, BLOCK_F),)."""
    dtype = w_ptr.dtype.element_ty
    f = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_mask = f < F
    w_gate = first_tile(w_ptr, f, f_mask, stride_w, 0, HIDDEN, BLOCK_K)
    w_up = first_tile(w_ptr, f + F, f_mask, stride_w, 0, HIDDEN, BLOCK_K)
    pdl_wait(USE_PDL)
    if HAS_NORM:
        rstd = rms_rstd(x_ptr, HIDDEN, eps, BLOCK_NORM)
    else:
        rstd = 1.0
    g, u = dot_row_pairs_from(w_gate, w_up, w_ptr, f, f + F, f_mask, stride_w, x_ptr, norm_ptr, rstd, HIDDEN,
                              HAS_NORM, UNIT_OFFSET, BLOCK_F, BLOCK_K, DOUBLE_BUFFER)
    pdl_release(USE_PDL)
    if HAS_BIAS:
        g += tl.load(bias_ptr + f, mask=f_mask, other=0.0).to(tl.float32)
        u += tl.load(bias_ptr + F + f, mask=f_mask, other=0.0).to(tl.float32)
    g = round_to(g, dtype)
    u = round_to(u, dtype)
    if ACTIVATION == 0:
        a = g / (1.0 + tl.exp(-g))
    elif ACTIVATION == 1:
        a = 0.5 * g * (1.0 + tanh_f32(0.7978845608028654 * (g + 0.044715 * g * g * g)))
    else:
        a = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
    y = round_to(round_to(a, dtype) * u, dtype)
    tl.store(out_ptr + f, y, mask=f_mask)


def gated_mlp(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    bias: torch.Tensor | None = None,
    activation: str = "silu",
    unit_offset: bool = False,
    config: GatedMlpConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """A = act(gate(norm(x))) * up(norm(x)), one launch (SwiGLU / GeGLU, Shazeer 2020; RMSNorm, Zhang & Sennrich 2019).

    Args:
        x: [hidden] input (the residual stream when `norm_weight` is given), model dtype.
        w_gate_up: [2F, hidden] row-major, gate rows then up rows, bf16/fp16/fp32.
        out: [F] output (default: new, weight's dtype).
        norm_weight: [hidden] RMSNorm weight applied to x first, or None for no norm.
        eps: RMSNorm epsilon.
        bias: [2F] (gate bias then up bias) or None.
        activation: "silu", "gelu_pytorch_tanh" (tanh approximation) or "gelu" (exact, erf).
        unit_offset: Gemma's (1 + w) RMSNorm scaling.
        config: launch configuration (default: `GatedMlpConfig()`).
        pdl: launch with programmatic dependent launch (Hopper; see `common.pdl_wait`).

    Returns:
        `out`, [F] in its dtype.

    Raises:
        ValueError: shapes, strides or the activation do not fit.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    check_matrix("w_gate_up", w_gate_up)
    two_f, hidden = w_gate_up.shape
    if two_f % 2:
        raise ValueError(f"w_gate_up must stack gate and up rows [2F, hidden], got {two_f} rows")
    f = two_f // 2
    check_vectors(hidden, x=x, norm_weight=norm_weight)
    check_vectors(two_f, bias=bias)
    if out is None:
        out = torch.empty(f, dtype=w_gate_up.dtype, device=w_gate_up.device)
    check_vectors(f, out=out)
    config = config or GatedMlpConfig()
    gated_mlp_kernel[(triton.cdiv(f, config.block_f),)](
        x, norm_weight if norm_weight is not None else x, w_gate_up, bias if bias is not None else x, out,
        f, w_gate_up.stride(0), float(eps),
        HIDDEN=hidden, ACTIVATION=ACTIVATIONS[activation], HAS_NORM=norm_weight is not None,
        UNIT_OFFSET=unit_offset, HAS_BIAS=bias is not None,
        BLOCK_F=config.block_f, BLOCK_K=config.block_k, BLOCK_NORM=min(1024, triton.next_power_of_2(hidden)),
        DOUBLE_BUFFER=config.num_stages > 1, USE_PDL=pdl_mode(pdl), **launch_options(config.num_warps, 1, pdl),
    )
    return out


if __name__ == "__main__":
    from solo.runtime.triton.benchtools import gated_mlp_benchmark_main

    gated_mlp_benchmark_main()
