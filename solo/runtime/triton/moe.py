"""Batch-1 mixture-of-experts (MoE) MLP in three launches, the expert ids never leaving the device.

One decode token through a sparse MoE block (`solo.model.moe.SparseMoeBlock`), with the routed experts'
weights fused as [experts, 2F, hidden] (gate rows, then up rows) and [experts, hidden, F]:

    router:   p = softmax(W_router @ norm(x)); ids, w = top-k of p (ties: lower index first)   # 1 CTA
              w /= sum(w) when norm_topk_prob; w rounded to the dtype unless weights_fp32
    gate/up:  for slot s < k, features f in parallel:  a[s, f] = act(W_gu[ids[s], f] @ norm(x))
                                                                 * (W_gu[ids[s], F + f] @ norm(x))
    down:     for output rows n in parallel:  y[n] = sum_s round(w[s] * round(W_d[ids[s], n] @ a[s]))
                                              (+ residual[n])

The gate/up and down kernels read the expert ids from device memory, so the step needs no host sync and
can be captured in a CUDA graph; only the k selected experts' weights are streamed. Exactly equal
router probabilities go to the lower expert index first (torch.topk leaves their order unspecified).
Rounding follows the eager block (transformers' grouped_mm experts path): each expert's output is
rounded to the dtype, scaled by its routing weight (rounded again unless the weights are float32, as
Mixtral keeps them), and the k products are summed in float32 and rounded once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from solo.runtime.triton.common import (
    check_vectors,
    dot_row_pairs,
    dot_rows,
    launch_options,
    next_power_of_2,
    rms_rstd,
    round_to,
    tanh_f32,
)
from solo.runtime.triton.swiglu import ACTIVATIONS


@dataclass(frozen=True)
class MoeGemvConfig:
    """Launch configuration of the MoE kernels: features per CTA (gate/up), rows per CTA (down), K tiles."""

    block_f: int = 4
    block_n: int = 8
    block_k: int = 512
    num_warps: int = 4


@triton.jit
def moe_router_kernel(
    x_ptr, norm_ptr, w_ptr, ids_ptr, weights_ptr,
    E, stride_w, eps,
    HIDDEN: tl.constexpr, TOP_K: tl.constexpr, HAS_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    NORM_TOPK: tl.constexpr, WEIGHTS_FP32: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_NORM: tl.constexpr,
):
    """ids[TOP_K], weights[TOP_K] (float32 storage) from the router; grid (1,)."""
    dtype = w_ptr.dtype.element_ty
    e = tl.arange(0, BLOCK_E)
    e_mask = e < E
    if HAS_NORM:
        rstd = rms_rstd(x_ptr, HIDDEN, eps, BLOCK_NORM)
    else:
        rstd = 1.0
    logits = round_to(dot_rows(w_ptr, e, e_mask, stride_w, x_ptr, norm_ptr, rstd, 0, HIDDEN, HIDDEN,
                               HAS_NORM, UNIT_OFFSET, BLOCK_E, BLOCK_K), dtype)
    logits = tl.where(e_mask, logits, float("-inf"))
    num = tl.exp(logits - tl.max(logits, axis=0))
    probs = num / tl.sum(num, axis=0)
    probs = tl.where(e_mask, probs, -1.0)
    top_w = tl.zeros([BLOCK_E], tl.float32)
    top_ids = tl.zeros([BLOCK_E], tl.int32)
    for s in tl.static_range(TOP_K):
        best = tl.max(probs, axis=0)
        pick = tl.min(tl.where(probs == best, e, BLOCK_E), axis=0)
        top_w = tl.where(e == s, best, top_w)
        top_ids = tl.where(e == s, pick, top_ids)
        probs = tl.where(e == pick, -1.0, probs)
    if NORM_TOPK:
        top_w = top_w / tl.sum(top_w, axis=0)
    if not WEIGHTS_FP32:
        top_w = round_to(top_w, dtype)
    tl.store(ids_ptr + e, top_ids, mask=e < TOP_K)
    tl.store(weights_ptr + e, top_w, mask=e < TOP_K)


@triton.jit
def moe_gate_up_kernel(
    x_ptr, norm_ptr, w_ptr, ids_ptr, out_ptr,
    F, stride_e, stride_w, eps,
    HIDDEN: tl.constexpr, ACTIVATION: tl.constexpr, HAS_NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_NORM: tl.constexpr,
):
    """out[s, f] = act(gate_e(norm(x)))[f] * up_e(norm(x))[f] for e = ids[s]; grid (cdiv(F, BLOCK_F), TOP_K)."""
    dtype = w_ptr.dtype.element_ty
    slot = tl.program_id(1)
    expert = tl.load(ids_ptr + slot).to(tl.int64)
    f = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_mask = f < F
    if HAS_NORM:
        rstd = rms_rstd(x_ptr, HIDDEN, eps, BLOCK_NORM)
    else:
        rstd = 1.0
    g, u = dot_row_pairs(w_ptr + expert * stride_e, f, f + F, f_mask, stride_w, x_ptr, norm_ptr, rstd, HIDDEN,
                         HAS_NORM, UNIT_OFFSET, BLOCK_F, BLOCK_K)
    g = round_to(g, dtype)
    u = round_to(u, dtype)
    if ACTIVATION == 0:
        a = g / (1.0 + tl.exp(-g))
    elif ACTIVATION == 1:
        a = 0.5 * g * (1.0 + tanh_f32(0.7978845608028654 * (g + 0.044715 * g * g * g)))
    else:
        a = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
    tl.store(out_ptr + slot * F + f, round_to(round_to(a, dtype) * u, dtype), mask=f_mask)


@triton.jit
def moe_down_kernel(
    h_ptr, w_ptr, ids_ptr, weights_ptr, residual_ptr, out_ptr,
    N, stride_e, stride_w,
    INTER: tl.constexpr, TOP_K: tl.constexpr, WEIGHTS_FP32: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[n] = sum_s w[s] * (W_down[ids[s]] @ h[s])[n] (+ residual[n]); grid (cdiv(N, BLOCK_N),)."""
    dtype = w_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    acc = tl.zeros([BLOCK_N], tl.float32)
    for s in tl.static_range(TOP_K):
        expert = tl.load(ids_ptr + s).to(tl.int64)
        y = dot_rows(w_ptr + expert * stride_e, rows, row_mask, stride_w, h_ptr + s * INTER, h_ptr, 1.0, 0,
                     INTER, INTER, False, False, BLOCK_N, BLOCK_K)
        weight = tl.load(weights_ptr + s)
        if WEIGHTS_FP32:
            acc += round_to(y, dtype) * weight
        else:
            acc += round_to(round_to(y, dtype) * weight, dtype)
    y = round_to(acc, dtype)
    if HAS_RESIDUAL:
        y = round_to(y + tl.load(residual_ptr + rows, mask=row_mask, other=0.0).to(tl.float32), dtype)
    tl.store(out_ptr + rows, y, mask=row_mask)


@dataclass
class MoeScratch:
    """Device buffers of one MoE step.

    Attributes:
        ids: int32 [top_k] expert ids; weights: float32 [top_k] routing weights; act: [top_k, F] the
            experts' gated activations in the weights' dtype.
    """

    ids: torch.Tensor
    weights: torch.Tensor
    act: torch.Tensor

    @classmethod
    def allocate(cls, top_k: int, inter: int, dtype: torch.dtype, device: torch.device) -> MoeScratch:
        """Buffers for `top_k` experts of width `inter`."""
        return cls(torch.zeros(top_k, dtype=torch.int32, device=device),
                   torch.zeros(top_k, dtype=torch.float32, device=device),
                   torch.zeros(top_k, inter, dtype=dtype, device=device))


def _check_experts(gate_up: torch.Tensor, down: torch.Tensor) -> tuple[int, int, int]:
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.stride(2) != 1 or down.stride(2) != 1:
        raise ValueError(f"expert weights must be row-major [experts, 2F, hidden] and [experts, hidden, F], got "
                         f"{tuple(gate_up.shape)} and {tuple(down.shape)}")
    experts, two_f, hidden = gate_up.shape
    if two_f % 2 or tuple(down.shape) != (experts, hidden, two_f // 2):
        raise ValueError(f"expert weights [experts, 2F, hidden] {tuple(gate_up.shape)} and [experts, hidden, F] "
                         f"{tuple(down.shape)} do not fit together")
    return experts, two_f // 2, hidden


def moe_mlp(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    unit_offset: bool = False,
    norm_topk_prob: bool = False,
    weights_fp32: bool = False,
    activation: str = "silu",
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    scratch: MoeScratch | None = None,
    config: MoeGemvConfig | None = None,
) -> torch.Tensor:
    """The routed experts of one MoE layer for one token, in three launches and no host sync.

    Routing follows `solo.model.moe.route` (softmax in float32, top-k, optional renormalization), the
    experts `solo.model.moe.experts_forward` (Shazeer et al. 2017; SwiGLU experts as in Mixtral).

    Args:
        x: [hidden] input (the residual stream when `norm_weight` is given), the weights' dtype.
        router_weight: [experts, hidden] router matrix (at most 1024 experts).
        gate_up: [experts, 2F, hidden], gate rows then up rows per expert.
        down: [experts, hidden, F].
        top_k: experts per token.
        norm_weight: [hidden] RMSNorm weight applied to x first (the pre-MLP norm), or None.
        eps: RMSNorm epsilon.
        unit_offset: Gemma-style (1 + w) RMSNorm scaling.
        norm_topk_prob: renormalize the top-k probabilities.
        weights_fp32: keep the routing weights in float32 (Mixtral).
        activation: "silu", "gelu_pytorch_tanh" or "gelu".
        residual: [hidden] added to the output (rounded once more), or None.
        out: [hidden] output (default: new, weights' dtype).
        scratch: the step's device buffers (default: new ones); `scratch.ids` holds the chosen experts after
            the call, in top-k order.
        config: launch configuration.

    Returns:
        `out`, [hidden].

    Raises:
        ValueError: shapes, strides, top_k or the activation do not fit.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    experts, inter, hidden = _check_experts(gate_up, down)
    if tuple(router_weight.shape) != (experts, hidden) or router_weight.stride(1) != 1:
        raise ValueError(f"router_weight must be a row-major [{experts}, {hidden}] matrix, got "
                         f"{tuple(router_weight.shape)}")
    if not 1 <= top_k <= experts or experts > 1024:
        raise ValueError(f"top_k must be in [1, {experts}] and experts <= 1024, got top_k {top_k}, {experts} experts")
    check_vectors(hidden, x=x, norm_weight=norm_weight, residual=residual)
    config = config or MoeGemvConfig()
    if out is None:
        out = torch.empty(hidden, dtype=gate_up.dtype, device=gate_up.device)
    check_vectors(hidden, out=out)
    if scratch is None:
        scratch = MoeScratch.allocate(top_k, inter, gate_up.dtype, gate_up.device)
    if scratch.ids.shape != (top_k,) or scratch.act.shape != (top_k, inter):
        raise ValueError(f"scratch buffers are for {scratch.ids.shape[0]} experts of width {scratch.act.shape[-1]}, "
                         f"not {top_k} of width {inter}")
    block_norm = min(1024, next_power_of_2(hidden))
    norm = norm_weight if norm_weight is not None else x
    block_e = max(next_power_of_2(experts), next_power_of_2(top_k), 2)
    moe_router_kernel[(1,)](
        x, norm, router_weight, scratch.ids, scratch.weights, experts, router_weight.stride(0), float(eps),
        HIDDEN=hidden, TOP_K=top_k, HAS_NORM=norm_weight is not None, UNIT_OFFSET=unit_offset,
        NORM_TOPK=norm_topk_prob, WEIGHTS_FP32=weights_fp32, BLOCK_E=block_e,
        BLOCK_K=max(16, min(config.block_k, 8192 // block_e)), BLOCK_NORM=block_norm,
        **launch_options(config.num_warps),
    )
    moe_gate_up_kernel[(triton.cdiv(inter, config.block_f), top_k)](
        x, norm, gate_up, scratch.ids, scratch.act, inter, gate_up.stride(0), gate_up.stride(1), float(eps),
        HIDDEN=hidden, ACTIVATION=ACTIVATIONS[activation], HAS_NORM=norm_weight is not None,
        UNIT_OFFSET=unit_offset, BLOCK_F=config.block_f, BLOCK_K=config.block_k, BLOCK_NORM=block_norm,
        **launch_options(config.num_warps),
    )
    moe_down_kernel[(triton.cdiv(hidden, config.block_n),)](
        scratch.act, down, scratch.ids, scratch.weights, residual if residual is not None else out, out,
        hidden, down.stride(0), down.stride(1),
        INTER=inter, TOP_K=top_k, WEIGHTS_FP32=weights_fp32, HAS_RESIDUAL=residual is not None,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, **launch_options(config.num_warps),
    )
    return out
