"""Batch-1 MoE kernels (router, gate/up, down, expert ids on the device) against the eager MoE block."""

from __future__ import annotations

# isort: off
from _triton_env import DEVICE, bf16_close, requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import pytest
import torch

from solo.model.config import ModelConfig
from solo.model.layers import RMSNorm
from solo.model.moe import SparseMoeBlock, route

pytestmark = requires_triton


def _block(dtype, norm_topk_prob, weights_fp32, experts=6, top_k=3, hidden=40, inter=24):
    cfg = ModelConfig.from_dict(dict(architectures=["OlmoeForCausalLM"], hidden_size=hidden, intermediate_size=inter,
                                     num_hidden_layers=1, num_attention_heads=4, vocab_size=50, num_experts=experts,
                                     num_experts_per_tok=top_k, norm_topk_prob=norm_topk_prob))
    torch.manual_seed(3)
    block = SparseMoeBlock(cfg)
    block.weights_fp32 = weights_fp32
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.5)
    norm = RMSNorm(hidden, 1e-5)
    torch.nn.init.normal_(norm.weight, mean=1.0, std=0.2)
    return block.to(DEVICE, dtype), norm.to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("norm_topk_prob,weights_fp32", [(False, False), (True, False), (True, True)],
                         ids=["olmoe", "qwen", "mixtral"])
def test_moe_mlp_matches_the_eager_block(dtype, norm_topk_prob, weights_fp32):
    from solo.runtime.triton.moe import MoeGemvConfig, MoeScratch, moe_mlp

    block, norm = _block(dtype, norm_topk_prob, weights_fp32)
    scratch = MoeScratch.allocate(3, 24, dtype, DEVICE)
    config = MoeGemvConfig(block_f=4, block_n=8, block_k=16)
    for seed in range(2):
        x = torch.randn(40, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)
        out = torch.full((40,), float("nan"), device=DEVICE).to(dtype)
        moe_mlp(x, block.router.weight, block.gate_up_proj, block.down_proj, 3, norm_weight=norm.weight, eps=1e-5,
                norm_topk_prob=norm_topk_prob, weights_fp32=weights_fp32, residual=x, out=out, scratch=scratch,
                config=config)
        h = norm(x.view(1, -1))
        weights, ids = route(h, block.router.weight, 3, norm_topk_prob, weights_fp32)
        assert scratch.ids.tolist() == ids[0].tolist()  # the same experts, in torch.topk order
        expected = x + block(h.view(1, 1, -1)).view(-1)
        if dtype == torch.float32:
            torch.testing.assert_close(scratch.weights, weights[0].float(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        else:
            bf16_close(out, expected)


def test_router_ties_pick_the_lower_expert_and_checks():
    # torch.topk leaves the order of equal values unspecified (the CPU kernel's partial sort may return
    # [1, 3] here); the kernel's rule is fixed: the lower expert index first.
    from solo.runtime.triton.moe import MoeScratch, moe_mlp

    block, _ = _block(torch.float32, True, False, experts=5, top_k=2)
    block.router.weight.data[:] = block.router.weight.data[:1]  # every expert ties
    x = torch.randn(40, device=DEVICE)
    scratch = MoeScratch.allocate(2, 24, torch.float32, DEVICE)
    moe_mlp(x, block.router.weight, block.gate_up_proj, block.down_proj, 2, norm_topk_prob=True, scratch=scratch)
    assert scratch.ids.tolist() == [0, 1]
    torch.testing.assert_close(scratch.weights, torch.full((2,), 0.5, device=DEVICE))
    with pytest.raises(ValueError, match="top_k"):
        moe_mlp(x, block.router.weight, block.gate_up_proj, block.down_proj, 6)
    with pytest.raises(ValueError, match="do not fit"):
        moe_mlp(x, block.router.weight, block.gate_up_proj, block.down_proj[:, :, :20], 2)
