"""Mixture-of-experts parity with transformers: Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE on tiny checkpoints."""

from __future__ import annotations

import pytest
import torch
from checkpoints import hf_greedy_ids, make_checkpoint
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from solo import Engine, SamplingParams
from solo.errors import CheckpointError, UnsupportedArchitectureError
from solo.model.config import ModelConfig
from solo.model.moe import route

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n"
ARCHS = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
LOGIT_ATOL = 1e-4  # float32: only summation order differs from transformers


def _hf_greedy(folder, ids, new_tokens, dtype=torch.float32):
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, -1].float()
    return hf_greedy_ids(hf, ids, new_tokens), logits


def _check_parity(folder, new_tokens=32):
    engine = Engine.load(folder, dtype="float32", backend="eager")
    ids = engine.encode_prompt(PROMPT)
    hf_tokens, hf_logits = _hf_greedy(folder, ids, new_tokens)
    result = engine.complete(PROMPT, SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True))
    assert result.token_ids == hf_tokens
    engine.runtime.reserve(1, len(ids))
    logits = engine.runtime.prefill(0, torch.tensor(ids))
    assert torch.allclose(logits, hf_logits, atol=LOGIT_ATOL, rtol=0)
    return engine


@pytest.mark.parametrize("arch", ["olmoe", "qwen3_moe", pytest.param("mixtral", marks=pytest.mark.slow),
                                  pytest.param("qwen2_moe", marks=pytest.mark.slow)])
def test_greedy_and_logits_match_transformers(tmp_path, arch):
    engine = _check_parity(make_checkpoint(tmp_path / arch, arch))
    config = engine.config
    assert config.is_moe and config.num_experts == 8 and config.num_experts_per_tok == 2
    assert config.num_active_parameters() < config.num_parameters()
    assert config.num_parameters() == sum(p.numel() for p in engine.model.parameters())
    if arch == "qwen2_moe":
        assert config.moe_layers == (True, False, True) and config.shared_expert_intermediate_size == 48
    if arch == "qwen3_moe":
        assert config.moe_layers == (False, True)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_greedy_matches_transformers_bfloat16(tmp_path, arch):
    folder = make_checkpoint(tmp_path / arch, arch, dtype=torch.bfloat16)
    engine = Engine.load(folder, dtype="auto", backend="eager")
    assert engine.model.dtype == torch.bfloat16
    ids = engine.encode_prompt(PROMPT)
    hf_tokens, _ = _hf_greedy(folder, ids, 16, dtype=torch.bfloat16)
    result = engine.complete(PROMPT, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    assert result.token_ids == hf_tokens


def test_router_ties_break_like_transformers(tmp_path):
    # Every router row of every layer made equal: all experts tie, so which 2 of 8 run is decided by the
    # tie-breaking alone; the experts differ, so a different pick changes the logits.
    folder = make_checkpoint(tmp_path / "ties", "olmoe")
    tensors = load_file(folder / "model.safetensors")
    for name, tensor in tensors.items():
        if name.endswith("mlp.gate.weight"):
            tensors[name] = tensor[:1].expand_as(tensor).contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    _check_parity(folder, new_tokens=8)

    probs_source = torch.zeros(3, 8)
    weights, ids = route(torch.ones(3, 4), torch.zeros(8, 4), 2, True, False)
    assert ids.tolist() == torch.topk(torch.softmax(probs_source, -1), 2).indices.tolist()
    assert torch.equal(weights, torch.full((3, 2), 0.5))


def test_fused_expert_tensors_load(tmp_path):
    # transformers 5 keeps experts as fused [experts, ...] tensors; a checkpoint written that way loads too.
    folder = make_checkpoint(tmp_path / "fused", "qwen3_moe")
    reference = Engine.load(folder, dtype="float32", backend="eager")
    tensors = load_file(folder / "model.safetensors")
    prefix = "model.layers.1.mlp.experts"
    gate = torch.stack([tensors.pop(f"{prefix}.{e}.gate_proj.weight") for e in range(8)])
    up = torch.stack([tensors.pop(f"{prefix}.{e}.up_proj.weight") for e in range(8)])
    tensors[f"{prefix}.gate_up_proj"] = torch.cat([gate, up], dim=1)
    tensors[f"{prefix}.down_proj"] = torch.stack([tensors.pop(f"{prefix}.{e}.down_proj.weight") for e in range(8)])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    fused = Engine.load(folder, dtype="float32", backend="eager")
    for (name, a), (_, b) in zip(reference.model.named_parameters(), fused.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_missing_expert_is_named(tmp_path):
    folder = make_checkpoint(tmp_path / "partial", "mixtral")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.0.block_sparse_moe.experts.5.w3.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="layers.0.mlp.gate_up_proj"):
        Engine.load(folder, dtype="float32", backend="eager")


def _moe_raw(**overrides):
    raw = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 100, "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    raw.update(overrides)
    return raw


def test_config_rejects_bad_expert_fields():
    with pytest.raises(CheckpointError, match="num_experts_per_tok"):
        ModelConfig.from_dict(_moe_raw(num_experts_per_tok=9))
    with pytest.raises(UnsupportedArchitectureError, match="clip_qkv"):
        ModelConfig.from_dict(_moe_raw(architectures=["OlmoeForCausalLM"], clip_qkv=8.0))
    config = ModelConfig.from_dict(_moe_raw(decoder_sparse_step=2, mlp_only_layers=[3]))
    assert config.moe_layers == (False, True, False, False)


def test_real_mixtral_config(shared_hf):
    folder = shared_hf / "Mixtral-8x7B-Instruct-v0.1"
    if not folder.is_dir():
        pytest.skip(f"{folder.name} is not among the shared fixtures")
    config = ModelConfig.from_file(folder)
    assert config.architecture == "MixtralForCausalLM"
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (8, 2, 14336)
    assert config.norm_topk_prob and config.router_weights_fp32 and all(config.moe_layers)
    assert config.num_parameters() == pytest.approx(46.7e9, rel=0.01)
    assert config.num_active_parameters() == pytest.approx(12.9e9, rel=0.01)


def test_gathered_experts_equal_grouped_experts():
    # The GPU decode path (experts gathered on the device, no host sync) against the grouped host path.
    from solo.model.moe import _gathered_experts, experts_forward

    gen = torch.Generator().manual_seed(0)
    hidden, gate_up, down = (torch.randn(*s, generator=gen) for s in ((3, 16), (5, 24, 16), (5, 16, 12)))
    weights, ids = route(hidden, torch.randn(5, 16, generator=gen), 2, True, False)
    torch.testing.assert_close(_gathered_experts(hidden, ids, weights, gate_up, down, torch.nn.functional.silu),
                               experts_forward(hidden, ids, weights, gate_up, down), rtol=1e-5, atol=1e-5)


def test_native_cpu_backend_and_quantization_run_moe(tmp_path):
    # The native CPU runtime and int8/int4 run MoE models (tests/runtime/test_cpu_moe.py checks their parity).
    from solo.runtime.quant import quantize_model

    folder = make_checkpoint(tmp_path / "olmoe", "olmoe")
    engine = Engine.load(folder, dtype="float32", backend="auto")
    assert engine.runtime.name == "cpu"
    assert quantize_model(engine.model, "int8").quantization == "int8"
