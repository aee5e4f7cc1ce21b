"""Flash-decoding attention against SDPA / the eager soft-capped attention, in float64."""

from __future__ import annotations

# isort: off
from _triton_env import DEVICE, ON_GPU, bf16_close, requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import pytest
import torch

from solo.model.layers import _softcapped_attention, attention_mask

pytestmark = requires_triton


def _reference(q, kc, vc, row, pos, heads, head_dim, window, softcap):
    qq = q.view(1, heads, 1, head_dim).double()
    keys, values = kc[row:row + 1, :, :pos + 1].double(), vc[row:row + 1, :, :pos + 1].double()
    mask = attention_mask(torch.tensor([[pos]], device=q.device), pos + 1, window)
    if softcap is None:
        out = torch.nn.functional.scaled_dot_product_attention(qq, keys, values, attn_mask=mask,
                                                               scale=head_dim**-0.5, enable_gqa=True)
    else:
        out = _softcapped_attention(qq, keys, values, mask, head_dim**-0.5, softcap)
    return out.reshape(-1)


DYNAMIC = {"min_partition": 16, "grid_partition": 16, "ctas_per_sm": 3}  # 3 partitions whose lengths follow pos
# ... of at least 64 keys, while the float32 kernel's key block is 32 (group 4 x head_dim 64): lengths round up
# to the kernel's block, which the combine must use too
DYNAMIC_64 = {"min_partition": 64, "grid_partition": 64, "ctas_per_sm": 3}

CASES = [  # heads, kv_heads, head_dim, max_seq, pos, window, softcap, partition (a forced length, or DYNAMIC)
    (4, 2, 12, 40, 37, None, None, 16),  # GQA, several partitions, head_dim not a power of two
    (4, 2, 12, 40, 37, 8, None, 16),  # sliding window: its keys in the first partition, the others empty
    (4, 2, 16, 200, 150, None, None, DYNAMIC),  # 3 partitions of 64, 64, 23
    (4, 2, 16, 200, 20, None, None, DYNAMIC),  # two of the three hold keys (16, 5)
    (8, 2, 64, 256, 199, None, None, DYNAMIC_64),  # 96, 96, 8 keys (128, 72 with the plan's block of 64)
    (4, 2, 16, 200, 150, 40, None, DYNAMIC),  # window: 16, 16, 8 from 111
    (6, 3, 16, 70, 69, None, 30.0, 32),  # soft-capping
    (4, 4, 16, 20, 5, None, None, None),  # MHA, one partition (direct write)
    (8, 2, 16, 64, 31, 20, None, 16),  # position at a partition's end
    (8, 2, 16, 64, 32, None, None, 16),  # position at a partition's start
    (2, 1, 16, 48, 0, None, None, 16),  # the first token
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim,max_seq,pos,window,softcap,partition", CASES)
def test_decode_attention_matches_reference(dtype, heads, kv_heads, head_dim, max_seq, pos, window, softcap,
                                            partition):
    from solo.runtime.triton.attention import AttentionPlan, decode_attention

    torch.manual_seed(pos)
    row = 1
    kc = torch.randn(2, kv_heads, max_seq, head_dim, device=DEVICE).to(dtype)
    vc = torch.randn(2, kv_heads, max_seq, head_dim, device=DEVICE).to(dtype)
    q = torch.randn(heads * head_dim, device=DEVICE).to(dtype)
    state = torch.zeros(8, dtype=torch.int64, device=DEVICE)
    state[1], state[2] = pos, row
    out = torch.full((heads * head_dim,), float("nan"), device=DEVICE).to(dtype)
    options = partition if isinstance(partition, dict) else {"partition": partition}
    plan = AttentionPlan(max_seq, heads, kv_heads, head_dim, DEVICE, sm_count=2, **options) if partition else None
    if isinstance(partition, dict):
        assert plan.num_parts == 3 and plan.block_s == (16 if partition is DYNAMIC else 64)
    decode_attention(q, kc, vc, state, out, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     scale=head_dim**-0.5, window=window, softcap=softcap, plan=plan)
    expected = _reference(q, kc, vc, row, pos, heads, head_dim, window, softcap)
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    elif not ON_GPU:
        # Products of bf16 inputs are exact in float32; the output is rounded once.
        bf16_close(out, expected.to(torch.bfloat16), ulps=4)
    else:
        # On a GPU p @ v runs on tensor cores with the probabilities rounded to bf16 (relative error
        # 2^-9 each), so the error is bounded by 2^-9 * sum_j p_j |v_j|, which is not small next to an
        # output that cancels towards 0: allow twice that bound on top of 4 ulp of the output.
        weighted = _reference(q, kc, vc.abs(), row, pos, heads, head_dim, window, softcap)
        a, e = out.double(), expected.to(torch.bfloat16).double()
        ulp = torch.exp2(torch.floor(torch.log2(e.abs().clamp(min=1e-30))) - 7)
        bad = (a - e).abs() > 4 * ulp + 2.0**-8 * weighted
        assert not bad.any(), f"{int(bad.sum())} elements off by more than 4 ulp + 2^-8 sum p|v|"


@pytest.mark.parametrize("pos", [0, 15, 16, 47, 48, 49, 96, 97, 143, 144, 145, 199])
def test_partition_lengths_follow_the_position_through_one_plan(pos):
    # One dynamic plan (3 partitions of at least 16 keys, in blocks of 16) at the positions where the length
    # steps (keys = 48 k + 1) and around them: every key attended once, the combine reading the right ones.
    from solo.runtime.triton.attention import AttentionPlan, decode_attention

    heads, kv_heads, head_dim, max_seq = 4, 2, 16, 200
    torch.manual_seed(pos)
    kc = torch.randn(1, kv_heads, max_seq, head_dim, device=DEVICE)
    vc = torch.randn_like(kc)
    q = torch.randn(heads * head_dim, device=DEVICE)
    state = torch.zeros(8, dtype=torch.int64, device=DEVICE)
    state[1] = pos
    out = torch.full((heads * head_dim,), float("nan"), device=DEVICE)
    plan = AttentionPlan(max_seq, heads, kv_heads, head_dim, DEVICE, sm_count=2, **DYNAMIC)
    decode_attention(q, kc, vc, state, out, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     scale=head_dim**-0.5, plan=plan)
    expected = _reference(q, kc, vc, 0, pos, heads, head_dim, None, None)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_attention_plan_partitions():
    from solo.runtime.triton.attention import AttentionPlan

    # The grid: CTAS_PER_SM CTAs per SM once all partitions hold keys, at most max_seq / GRID_PARTITION of them;
    # partitions of at least MIN_PARTITION keys.
    short = AttentionPlan(400, 32, 8, 64, "cpu", sm_count=132)
    assert short.partition == 128 and short.num_parts == 2 and short.part_out.shape == (2, 32, 64)
    long = AttentionPlan(131072, 32, 8, 64, "cpu", sm_count=132)
    assert long.partition == 128 and long.num_parts == 66
    assert AttentionPlan(32768, 14, 2, 64, "cpu", sm_count=132).num_parts == 128  # not 264: GRID_PARTITION
    assert AttentionPlan(131072, 32, 8, 64, "cpu", sm_count=132, min_partition=64, ctas_per_sm=8).num_parts == 132
    forced = AttentionPlan(400, 32, 8, 64, "cpu", sm_count=132, partition=32)
    assert forced.partition == 32 and forced.num_parts == 13
    single = AttentionPlan(16, 4, 2, 16, "cpu", partition=16)
    assert single.num_parts == 1 and single.part_out.numel() == 0
    with pytest.raises(ValueError):
        AttentionPlan(64, 4, 2, 16, "cpu", partition=24)
    with pytest.raises(ValueError):
        AttentionPlan(64, 4, 2, 16, "cpu", min_partition=8)
