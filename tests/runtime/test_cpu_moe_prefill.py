"""The CPU runtime's native MoE prefill (`solo.runtime.cpu_moe.moe_prefill`, moe.h's solo_moe_prefill) against
the eager MoE block it replaces, on random layers whose widths exercise every tile remainder (rows not a
multiple of 6, tokens not a multiple of 4, inputs not a multiple of 32), many tokens per expert, chunking and
int8/int4 experts. End-to-end parity with the eager runtime and transformers is in test_cpu_moe.py.
"""

from __future__ import annotations

import pytest
import torch

from solo.bench.shapes import build_model
from solo.model.config import ModelConfig
from solo.runtime import cpu_moe
from solo.runtime.cpu import CpuRuntime
from solo.runtime.quant import quantize_model


def _model(dtype: torch.dtype, inter: int = 80, hidden: int = 96, shared: int = 0):
    raw = dict(architectures=["Qwen2MoeForCausalLM" if shared else "OlmoeForCausalLM"], hidden_size=hidden,
               intermediate_size=64, moe_intermediate_size=inter, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=2, vocab_size=64, num_experts=16, num_experts_per_tok=4, norm_topk_prob=False,
               shared_expert_intermediate_size=shared, tie_word_embeddings=False, rms_norm_eps=1e-5,
               max_position_embeddings=512)
    if not shared:
        raw["intermediate_size"] = inter
    # std 0.1: outputs well above bf16's resolution, so rounding differences stay single steps
    return build_model(ModelConfig.from_dict(raw), dtype, seed=3, std=0.1)


def _inputs(model, tokens: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(tokens, model.config.hidden_size, generator=gen).to(model.dtype)


def _native(model, x: torch.Tensor) -> torch.Tensor:
    rt = CpuRuntime(model, num_threads=2)
    return cpu_moe.moe_prefill(rt._lib, rt._struct, 0, model.layers[0].mlp, x, rt.num_threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", [1, 3, 37, 130])
def test_native_prefill_matches_the_eager_block(dtype, tokens):
    model = _model(dtype)
    x = _inputs(model, tokens)
    expected = model.layers[0].mlp(x[None])[0]
    got = _native(model, x)
    assert got.dtype == dtype and got.shape == expected.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    else:  # summation order only: at most a bf16 step or two of the largest outputs
        torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_native_prefill_of_quantized_experts_matches_the_eager_block(dtype, mode):
    model = quantize_model(_model(dtype, inter=96), mode)
    x = _inputs(model, 45)
    expected = model.layers[0].mlp(x[None])[0]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(_native(model, x).float(), expected.float(), atol=tol, rtol=tol)


def test_shared_expert_is_added_as_the_eager_block_adds_it():
    model = _model(torch.float32, shared=48)
    x = _inputs(model, 21)
    torch.testing.assert_close(_native(model, x), model.layers[0].mlp(x[None])[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_tokens_result_does_not_depend_on_the_other_tokens_or_the_chunking(dtype, monkeypatch):
    # Tiles of 4 tokens and the dynamic work items never change a token's arithmetic: the whole prompt,
    # the prompt in chunks of 5 and each token alone give bit-identical rows.
    model = _model(dtype)
    x = _inputs(model, 23)
    whole = _native(model, x)
    monkeypatch.setattr(cpu_moe, "PREFILL_CHUNK_TOKENS", 5)
    assert torch.equal(_native(model, x), whole)
    # Alone, a token gets the routing it had in the prompt (PyTorch's router product may round an M = 1
    # matmul differently from a batched one; that is the eager block's, not the experts' arithmetic).
    block = model.layers[0].mlp
    weights, ids = cpu_moe.route(x, block.router.weight, block.top_k, block.norm_topk_prob, block.weights_fp32)
    for t in (0, 9, 22):
        monkeypatch.setattr(cpu_moe, "route", lambda *args, t=t: (weights[t:t + 1], ids[t:t + 1]))
        assert torch.equal(_native(model, x[t:t + 1])[0], whole[t])
