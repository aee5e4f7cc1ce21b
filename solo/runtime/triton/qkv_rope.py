"""Attention input in one launch: RMSNorm + fused QKV projection + RoPE + KV-cache write.

The q, k and v projections are one [(H_q + 2 H_kv) * D, hidden] matrix (rows of q, then k, then v).
RoPE in the "rotate half" layout (Hugging Face Llama family) mixes element d of a head with element
d + D/2, so the kernel's unit of work is a rotation pair: each CTA computes BLOCK_P pairs, i.e. the two
rows d and d + D/2 of some heads, against the normalized input, then rotates and stores them:

    rstd = 1 / sqrt(mean(x^2) + eps)
    for each block of BLOCK_P pairs in parallel:          # grid = (H_q + 2 H_kv) * D/2 / BLOCK_P
        a, b = W[row_d] @ norm(x), W[row_d + D/2] @ norm(x)  (+ bias), rounded like nn.Linear
        if q or k: a, b = a cos - b sin, b cos + a sin    # cos/sin of (position, d), rounding as eager
        q -> q_out[head, d], q_out[head, d + D/2]
        k, v -> cache[row, kv_head, position, d], cache[..., d + D/2]

BLOCK_P divides H_kv * D/2, so a CTA never straddles the q, k and v segments. Any even head_dim works
(96 included), since pairs are addressed by index, not by a power-of-two tile of a head. The position
and cache row come from the device decode state, so a captured CUDA graph replays at any position.
cos/sin come from a float32 table [positions, D/2] built with the eager model's formula (RoFormer,
Su et al. 2021; scaling as transformers' modeling_rope_utils.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from solo.runtime.triton.common import (
    STATE_POS,
    STATE_ROW,
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
)


@dataclass(frozen=True)
class QkvRopeConfig:
    """Launch configuration of `qkv_rope_kernel`.

    Attributes:
        block_p: rotation pairs per CTA (2 * block_p weight rows); reduced to divide H_kv * D/2.
        block_k: hidden elements per tile step.
        num_warps: Triton launch option.
        num_stages: 2 double-buffers the weight tiles (see `gemv.GemvConfig`).
    """

    block_p: int = 4
    block_k: int = 1024
    num_warps: int = 4
    num_stages: int = 1


CANDIDATES = (
    QkvRopeConfig(2, 1024, 4),
    QkvRopeConfig(4, 1024, 4),
    QkvRopeConfig(8, 1024, 4),
    QkvRopeConfig(4, 512, 2),
    QkvRopeConfig(8, 512, 2),
    QkvRopeConfig(4, 2048, 8),
    QkvRopeConfig(2, 1024, 4, 2),  # num_stages=2: double-buffered weight tiles (see `gemv.GemvConfig`)
    QkvRopeConfig(4, 1024, 4, 2),
)
"""Configurations the tuner times per shape (BLOCK_K = 8 * 32 * num_warps: see `gemv.CANDIDATES`)."""


def fit_block_p(block_p: int, num_kv_heads: int, head_dim: int) -> int:
    """Largest power of two <= block_p dividing num_kv_heads * head_dim / 2 (so CTAs stay in one segment)."""
    kv_pairs = num_kv_heads * head_dim // 2
    fitted = 1
    while fitted * 2 <= block_p and kv_pairs % (fitted * 2) == 0:
        fitted *= 2
    return fitted


@triton.jit
def qkv_rope_kernel(
    x_ptr, norm_ptr, w_ptr, bias_ptr, cos_ptr, sin_ptr, state_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    stride_w, eps, table_stride, stride_row, stride_head, stride_pos,
    HIDDEN: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    UNIT_OFFSET: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_NORM: tl.constexpr, DOUBLE_BUFFER: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """See the module docstring; grid ((NUM_HEADS + 2 NUM_KV_HEADS) * HEAD_DIM / 2 / BLOCK_P,)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    Q_PAIRS: tl.constexpr = NUM_HEADS * HALF
    KV_PAIRS: tl.constexpr = NUM_KV_HEADS * HALF
    dtype = w_ptr.dtype.element_ty
    p0 = tl.program_id(0) * BLOCK_P
    # Segment of this CTA: 0 = q, 1 = k, 2 = v.
    seg = (p0 >= Q_PAIRS).to(tl.int32) + (p0 >= Q_PAIRS + KV_PAIRS).to(tl.int32)
    seg_pair0 = tl.where(seg == 0, 0, tl.where(seg == 1, Q_PAIRS, Q_PAIRS + KV_PAIRS))
    seg_row0 = tl.where(seg == 0, 0, tl.where(seg == 1, NUM_HEADS * HEAD_DIM, (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM))
    pair = p0 - seg_pair0 + tl.arange(0, BLOCK_P)
    head = pair // HALF
    d = pair % HALF
    row_a = seg_row0 + head * HEAD_DIM + d
    row_b = row_a + HALF
    w_a = first_tile(w_ptr, row_a, row_a >= 0, stride_w, 0, HIDDEN, BLOCK_K)
    w_b = first_tile(w_ptr, row_b, row_a >= 0, stride_w, 0, HIDDEN, BLOCK_K)
    pdl_wait(USE_PDL)

    rstd = rms_rstd(x_ptr, HIDDEN, eps, BLOCK_NORM)
    a, b = dot_row_pairs_from(w_a, w_b, w_ptr, row_a, row_b, row_a >= 0, stride_w, x_ptr, norm_ptr, rstd, HIDDEN,
                              True, UNIT_OFFSET, BLOCK_P, BLOCK_K, DOUBLE_BUFFER)
    pdl_release(USE_PDL)
    if HAS_BIAS:
        a += tl.load(bias_ptr + row_a).to(tl.float32)
        b += tl.load(bias_ptr + row_b).to(tl.float32)
    a = round_to(a, dtype)
    b = round_to(b, dtype)

    pos = tl.load(state_ptr + STATE_POS)
    row = tl.load(state_ptr + STATE_ROW)
    # Eager RoPE in the activation dtype: x * cos + rotate_half(x) * sin, each product rounded.
    cos = round_to(tl.load(cos_ptr + pos * table_stride + d), dtype)
    sin = round_to(tl.load(sin_ptr + pos * table_stride + d), dtype)
    rot_a = round_to(round_to(a * cos, dtype) - round_to(b * sin, dtype), dtype)
    rot_b = round_to(round_to(b * cos, dtype) + round_to(a * sin, dtype), dtype)
    out_a = tl.where(seg < 2, rot_a, a)
    out_b = tl.where(seg < 2, rot_b, b)

    if seg == 0:
        q_off = head * HEAD_DIM + d
        tl.store(q_ptr + q_off, out_a)
        tl.store(q_ptr + q_off + HALF, out_b)
    else:
        cache_off = row * stride_row + head.to(tl.int64) * stride_head + pos * stride_pos + d
        if seg == 1:
            tl.store(k_cache_ptr + cache_off, out_a)
            tl.store(k_cache_ptr + cache_off + HALF, out_b)
        else:
            tl.store(v_cache_ptr + cache_off, out_a)
            tl.store(v_cache_ptr + cache_off + HALF, out_b)


def qkv_rope(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    w_qkv: torch.Tensor,
    eps: float,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    state: torch.Tensor,
    q_out: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    bias: torch.Tensor | None = None,
    unit_offset: bool = False,
    per_step_table: bool = False,
    config: QkvRopeConfig | None = None,
    pdl: bool = False,
) -> None:
    """Normalize x, project to q/k/v, rotate q and k, write q to `q_out` and k/v into the cache.

    RMSNorm (Zhang & Sennrich 2019), then RoPE (Su et al. 2021) in the rotate-half layout; GQA
    (Ainslie et al. 2023) when num_kv_heads < num_heads.

    Args:
        x: [hidden] residual stream, model dtype.
        norm_weight: [hidden] the attention RMSNorm's weight.
        w_qkv: [(num_heads + 2 num_kv_heads) * head_dim, hidden] row-major, rows q | k | v, model dtype.
        eps: RMSNorm epsilon.
        cos_table, sin_table: float32 [positions, head_dim / 2] (or [1, head_dim / 2] with
            `per_step_table`, for RoPE types whose frequencies change with the position).
        state: int64 decode state (`common.STATE_*`): the position and cache row are read from it.
        q_out: [num_heads * head_dim] rotated queries (written), model dtype.
        k_cache, v_cache: [rows, num_kv_heads, max_seq, head_dim], model dtype, written at (row, :, position).
        num_heads, num_kv_heads, head_dim: attention geometry (head_dim even).
        bias: [(num_heads + 2 num_kv_heads) * head_dim] or None.
        unit_offset: Gemma's (1 + w) RMSNorm scaling.
        per_step_table: the tables hold one row for the current position (row 0 is read).
        config: launch configuration (default: `QkvRopeConfig()`; block_p is fitted by `fit_block_p`).
        pdl: launch with programmatic dependent launch (Hopper; see `common.pdl_wait`).

    Raises:
        ValueError: shapes or strides do not fit, an odd head_dim, or num_heads not a multiple of num_kv_heads.
    """
    hidden = x.shape[0]
    n_rows = (num_heads + 2 * num_kv_heads) * head_dim
    if head_dim % 2 or num_heads % num_kv_heads:
        raise ValueError("head_dim must be even and num_heads a multiple of num_kv_heads")
    check_matrix("w_qkv", w_qkv, (n_rows, hidden))
    check_vectors(hidden, x=x, norm_weight=norm_weight)
    check_vectors(num_heads * head_dim, q_out=q_out)
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must share shape and strides, innermost dim contiguous")
    if k_cache.shape[1] != num_kv_heads or k_cache.shape[3] != head_dim:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not match {num_kv_heads} KV heads x {head_dim}")
    half = head_dim // 2
    if cos_table.shape[-1] != half or sin_table.shape != cos_table.shape or not cos_table.is_contiguous():
        raise ValueError(f"RoPE tables must be contiguous float32 [positions, {half}]")
    if bias is not None and bias.shape != (n_rows,):
        raise ValueError(f"bias must be [{n_rows}]")
    config = config or QkvRopeConfig()
    block_p = fit_block_p(config.block_p, num_kv_heads, head_dim)
    grid = ((num_heads + 2 * num_kv_heads) * half // block_p,)
    qkv_rope_kernel[grid](
        x, norm_weight, w_qkv, bias if bias is not None else x, cos_table, sin_table, state, q_out,
        k_cache, v_cache, w_qkv.stride(0), float(eps), 0 if per_step_table else cos_table.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        HIDDEN=hidden, NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        UNIT_OFFSET=unit_offset, HAS_BIAS=bias is not None,
        BLOCK_P=block_p, BLOCK_K=config.block_k, BLOCK_NORM=min(1024, triton.next_power_of_2(hidden)),
        DOUBLE_BUFFER=config.num_stages > 1, USE_PDL=pdl_mode(pdl), **launch_options(config.num_warps, 1, pdl),
    )


if __name__ == "__main__":
    from solo.runtime.triton.benchtools import qkv_rope_benchmark_main

    qkv_rope_benchmark_main()
