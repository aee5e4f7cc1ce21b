"""Flash-decoding attention for one query token: split over the KV length, then combined.

One decode query attends over the whole cache, which is too little work per KV head to fill the GPU.
Flash-decoding (Dao, Haziza, Massa, Sizov 2023) splits the keys into partitions processed in parallel,
each with an online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022), and merges the
partial results by their log-sum-exp:

    for (kv_head, partition) in parallel:                 # grid = (H_kv, n_partitions)
        keys j in [partition start, min(end, pos + 1)), and j > pos - window with a sliding window
        for the GROUP query heads sharing kv_head (GQA): one [GROUP, BLOCK_S] score tile per step
            s = scale * q . k_j ; s = cap * tanh(s / cap) with soft-capping (Gemma 2)
            online softmax -> o_part[partition, head], lse[partition, head]
    for head in parallel:                                 # combine: grid = (H_q,)
        o[head] = sum_p exp(lse_p - max) o_p / sum_p exp(lse_p - max)

A captured graph's grid is fixed when the cache is sized, but the partition length is not: every step
spreads the keys it attends over the grid's partitions (at least `MIN_PARTITION` keys each, a multiple
of the key block), so a short context uses few of them and a long one all of them, and the combine reads
only those that hold keys. A fixed length sized for the longest sequence (1024 keys for a 128k cache)
left most SMs idle at medium contexts: on an H200 (Llama-3.2-1B shape, cache reserved for 131k tokens)
decode ran at 46% of the roofline at 8192 positions against 58% at 128. With a single partition the
kernel writes the output directly.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from solo.runtime.triton.common import (
    STATE_POS,
    STATE_ROW,
    check_vectors,
    interpreting,
    launch_options,
    next_power_of_2,
    pdl_mode,
    pdl_release,
    pdl_wait,
    round_to,
    tanh_f32,
)

MIN_PARTITION = 128
"""Fewest keys a partition takes (tokens) unless a plan forces its own. On an H200 (attention of one decode
step over a 131072-position cache, Llama-3.2-1B shape; benchmarks/attention_partitions_cuda.py) 128 took
7.0 us at 1024 positions against 9.2 with 256 and 23.4 with the fixed 1024 before; 64 (with 8 CTAs per SM)
was slower from 8192 positions (16.4 against 12.1 us)."""
GRID_PARTITION = 256
"""The grid holds at most max_seq / GRID_PARTITION partitions per KV head: more, shorter ones at full length
made the combine (one CTA per query head) the bottleneck (Qwen2.5-0.5B shape at 32638 positions: 20.1 us
with a grid of 256 partitions of 128 keys against 15.3 with 128 of 256)."""
CTAS_PER_SM = 4
"""Partitions per KV head: enough for this many CTAs per SM once the context fills them all (8 was slower at
32768 positions and more: 34.4 against 30.6 us)."""


class AttentionPlan:
    """Partitioning of the KV length and the scratch buffers of the partial results.

    Each step splits the keys it attends (positions 0..pos, or the sliding window's) into partitions of
    max(partition, ceil(keys / num_parts) rounded up to the key block) keys: few at short contexts, all
    `num_parts` of them at long ones (see the module docstring).

    Args:
        max_seq: cache length (tokens per row).
        num_heads, num_kv_heads, head_dim: attention geometry.
        device: where the scratch buffers live.
        sm_count: streaming multiprocessors (the grid aims at `ctas_per_sm` CTAs per SM).
        partition: force a fixed partition length in tokens (power of two >= 16), e.g. in tests: every
            partition then holds exactly that many keys (the last fewer).
        min_partition: the shortest partition when none is forced (a power of two >= 16; default
            `MIN_PARTITION`).
        ctas_per_sm: CTAs per SM the grid aims at when no partition is forced (default `CTAS_PER_SM`).
        grid_partition: without a forced partition the grid holds at most ceil(max_seq / grid_partition)
            partitions per KV head (default `GRID_PARTITION`; at least `min_partition`).

    Attributes:
        partition: the shortest partition (tokens).
        num_parts: the grid's partitions per KV head: ceil(max_seq / partition) with a forced partition,
            else max(1, min(ceil(ctas_per_sm * sm_count / num_kv_heads),
            ceil(max_seq / max(grid_partition, min_partition)))).
        part_out: float32 [num_parts, num_heads, head_dim] partial outputs ([0, ...] with one partition).
        part_lse: float32 [num_parts, num_heads] partial log-sum-exps.

    Raises:
        ValueError: `partition` or `min_partition` is not a power of two >= 16.
    """

    def __init__(self, max_seq: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 device: torch.device | str, sm_count: int = 132, partition: int | None = None,
                 min_partition: int = MIN_PARTITION, ctas_per_sm: int = CTAS_PER_SM,
                 grid_partition: int = GRID_PARTITION) -> None:
        for name, value in (("partition", partition), ("min_partition", min_partition)):
            if value is not None and (value < 16 or value & (value - 1)):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")
        self.partition = partition or min_partition
        # Keys per step: a [BLOCK_S, head_dim] tile of K and of V stays in registers.
        self.block_s = min(self.partition, 64 if head_dim <= 128 else 32)
        self.num_parts = math.ceil(max_seq / self.partition)
        if partition is None:
            self.num_parts = max(1, min(math.ceil(max_seq / max(grid_partition, min_partition)),
                                        math.ceil(ctas_per_sm * sm_count / num_kv_heads)))
        self.max_seq = max_seq
        parts = self.num_parts if self.num_parts > 1 else 0
        self.part_out = torch.empty(parts, num_heads, head_dim, dtype=torch.float32, device=device)
        self.part_lse = torch.empty(parts, num_heads, dtype=torch.float32, device=device)


@triton.jit
def _partitioning(pos, window, HAS_WINDOW: tl.constexpr, N_PARTS: tl.constexpr, MIN_PART: tl.constexpr,
                  BLOCK_S: tl.constexpr):
    # The keys this step attends start at `first`; partitions of `length` keys each (the last fewer).
    first = pos * 0
    if HAS_WINDOW:
        first = tl.maximum(first, pos - window + 1)
    per = (pos + 1 - first + N_PARTS - 1) // N_PARTS
    length = tl.maximum((per + BLOCK_S - 1) // BLOCK_S * BLOCK_S, MIN_PART)
    return first, length


@triton.jit
def decode_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, state_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    scale, softcap, window, stride_row, stride_head, stride_pos,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, N_PARTS: tl.constexpr,
    MIN_PART: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, SINGLE_PART: tl.constexpr,
    TENSOR_CORES: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Partial attention of one KV head's query group over one partition; grid (H_kv, N_PARTS)."""
    pdl_wait(USE_PDL)
    GROUP: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    kv_head = tl.program_id(0)
    part = tl.program_id(1)
    pos = tl.load(state_ptr + STATE_POS)
    row = tl.load(state_ptr + STATE_ROW)
    first, length = _partitioning(pos, window, HAS_WINDOW, N_PARTS, MIN_PART, BLOCK_S)
    lo = first + part * length  # a partition past the keys (lo > pos) writes lse = -inf, never read
    hi = tl.minimum(lo + length, pos + 1)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q = tl.load(q_ptr + heads[:, None] * HEAD_DIM + d[None, :], mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    base = row * stride_row + kv_head.to(tl.int64) * stride_head
    start = lo
    while start < hi:
        j = start + tl.arange(0, BLOCK_S)
        valid = j < hi
        kv_off = base + j[:, None] * stride_pos + d[None, :]
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        if TENSOR_CORES:
            scores = tl.dot(q, tl.trans(k))
        else:
            scores = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        scores = scores * scale
        if HAS_SOFTCAP:
            scores = softcap * tanh_f32(scores / softcap)
        scores = tl.where(valid[None, :], scores, float("-inf"))
        # Each step has at least one valid key (j = start), so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        if TENSOR_CORES:
            # Probabilities in the value dtype for the tensor cores, as flash-attention does.
            pv = tl.dot(round_to(p, v.dtype).to(v.dtype), v)
        else:
            pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
        start += BLOCK_S
    pdl_release(USE_PDL)

    out_mask = g_mask[:, None] & d_mask[None, :]
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if SINGLE_PART:
        o = round_to(o, out_ptr.dtype.element_ty)
        tl.store(out_ptr + heads[:, None] * HEAD_DIM + d[None, :], o, mask=out_mask)
    else:
        slot = part * NUM_HEADS + heads
        tl.store(part_out_ptr + slot[:, None] * HEAD_DIM + d[None, :], o, mask=out_mask)
        lse = tl.where(l_i > 0, m_i + tl.log(l_safe), float("-inf"))
        tl.store(part_lse_ptr + slot, lse, mask=g_mask)


@triton.jit
def combine_partitions_kernel(
    part_out_ptr, part_lse_ptr, state_ptr, out_ptr, window,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, N_PARTS: tl.constexpr, MIN_PART: tl.constexpr,
    BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Merge the partitions' partial outputs of one query head by log-sum-exp; grid (H_q,)."""
    pdl_wait(USE_PDL)
    head = tl.program_id(0)
    pos = tl.load(state_ptr + STATE_POS)
    first, length = _partitioning(pos, window, HAS_WINDOW, N_PARTS, MIN_PART, BLOCK_S)
    n_valid = (pos + 1 - first + length - 1) // length  # the partitions that hold keys
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    # The running max and denominator are kept as BLOCK_D copies (a vector) so loop types stay fixed.
    m_run = tl.full([BLOCK_D], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_D], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    c0 = n_valid * 0
    while c0 < n_valid:
        c = c0 + tl.arange(0, BLOCK_C)
        c_mask = c < n_valid
        lse = tl.load(part_lse_ptr + c * NUM_HEADS + head, mask=c_mask, other=float("-inf"))
        m_new = tl.maximum(m_run, tl.max(lse, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_run - m_safe)
        w = tl.exp(lse - tl.max(m_safe, axis=0))
        o = tl.load(part_out_ptr + (c[:, None] * NUM_HEADS + head) * HEAD_DIM + d[None, :],
                    mask=c_mask[:, None] & d_mask[None, :], other=0.0)
        acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
        den = den * alpha + tl.sum(w, axis=0)
        m_run = m_new
        c0 += BLOCK_C
    pdl_release(USE_PDL)
    o = round_to(acc / den, out_ptr.dtype.element_ty)
    tl.store(out_ptr + head * HEAD_DIM + d, o, mask=d_mask)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    state: torch.Tensor,
    out: torch.Tensor,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    plan: AttentionPlan | None = None,
    num_warps: int = 4,
    pdl: bool = False,
) -> torch.Tensor:
    """Attention of one query token over cache row `state[ROW]`, positions 0..state[POS].

    Flash-decoding (Dao et al. 2023, "Flash-Decoding for long-context inference") with GQA (Ainslie et
    al. 2023): see the module docstring.

    Args:
        q: [num_heads * head_dim] rotated queries, model dtype.
        k_cache, v_cache: [rows, num_kv_heads, max_seq, head_dim] (this step's k/v already written).
        state: int64 decode state; the position and row are read from it.
        out: [num_heads * head_dim] attention output (written), model dtype.
        num_heads, num_kv_heads, head_dim: geometry (GQA when num_kv_heads < num_heads).
        scale: softmax scale of the scores.
        window: sliding-window size in tokens (a query sees itself and window - 1 earlier keys), or None.
        softcap: tanh soft-capping of the scores, or None.
        plan: partitioning and scratch (default: one for this cache length, allocated here).
        num_warps: Triton launch option.
        pdl: launch with programmatic dependent launch (Hopper; see `common.pdl_wait`).

    Returns:
        `out`.

    Raises:
        ValueError: shapes or strides do not fit, or `plan` was made for another cache length.
    """
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must share shape and strides, innermost dim contiguous")
    if k_cache.shape[1] != num_kv_heads or k_cache.shape[3] != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not fit {num_heads}/{num_kv_heads} heads")
    check_vectors(num_heads * head_dim, q=q, out=out)
    max_seq = k_cache.shape[2]
    if plan is None:
        plan = AttentionPlan(max_seq, num_heads, num_kv_heads, head_dim, q.device)
    if plan.max_seq != max_seq:
        raise ValueError(f"the attention plan was made for {plan.max_seq} positions, the cache has {max_seq}")
    single = plan.num_parts == 1
    group = num_heads // num_kv_heads
    # Tensor-core dots need >= 16 rows (the query group is padded); float32 models and the interpreter
    # (whose dot mishandles bf16) use exact float32 broadcast products instead.
    tensor_cores = q.dtype in (torch.bfloat16, torch.float16) and not interpreting()
    block_d = max(16, next_power_of_2(head_dim))
    block_g = max(16 if tensor_cores else 1, next_power_of_2(group))
    block_s = plan.block_s
    if not tensor_cores:  # the broadcast product holds BLOCK_G * BLOCK_S * BLOCK_D floats
        block_s = min(block_s, max(16, 8192 // (block_g * block_d)))
    decode_attention_kernel[(num_kv_heads, plan.num_parts)](
        q, k_cache, v_cache, state, out, plan.part_out if not single else out,
        plan.part_lse if not single else out,
        float(scale), float(softcap or 1.0), int(window or 0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, N_PARTS=plan.num_parts,
        MIN_PART=plan.partition, BLOCK_G=block_g, BLOCK_S=block_s, BLOCK_D=block_d,
        HAS_WINDOW=window is not None, HAS_SOFTCAP=softcap is not None, SINGLE_PART=single,
        TENSOR_CORES=tensor_cores, USE_PDL=pdl_mode(pdl), **launch_options(num_warps, 1, pdl),
    )
    if not single:
        combine_partitions_kernel[(num_heads,)](
            plan.part_out, plan.part_lse, state, out, int(window or 0),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, N_PARTS=plan.num_parts, MIN_PART=plan.partition,
            BLOCK_S=block_s, HAS_WINDOW=window is not None, BLOCK_C=min(32, next_power_of_2(plan.num_parts)),
            BLOCK_D=block_d, USE_PDL=pdl_mode(pdl),
            **launch_options(num_warps, 1, pdl),
        )
    return out


if __name__ == "__main__":
    from solo.runtime.triton.benchtools import attention_benchmark_main

    attention_benchmark_main()
