"""Parity with transformers: identical greedy tokens and close logits on tiny checkpoints it wrote."""

from __future__ import annotations

import json

import pytest
import torch
from checkpoints import hf_greedy_ids, make_checkpoint, make_gemma3_image_text_checkpoint, make_longrope_checkpoint
from transformers import AutoModelForCausalLM

from solo import Engine, SamplingParams
from solo.errors import SoloError

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n"
ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "phi4", "smollm3"]
LOGIT_ATOL = 1e-4  # float32: only summation order differs from transformers


def _hf_greedy(folder, ids, new_tokens, dtype=torch.float32, attn="eager"):
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn)
    with torch.no_grad():
        # (the prompt's logits first: dynamic NTK keeps the longest length the model object has seen)
        logits = hf(torch.tensor([ids])).logits[0, -1].float()
    return hf_greedy_ids(hf, ids, new_tokens), logits


def _check_parity(folder, prompt=PROMPT, new_tokens=32, backend="eager", speculative="auto"):
    engine = Engine.load(folder, dtype="float32", backend=backend, speculative=speculative)
    ids = engine.encode_prompt(prompt)
    hf_tokens, hf_logits = _hf_greedy(folder, ids, new_tokens)
    result = engine.complete(prompt, SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True))
    assert result.token_ids == hf_tokens
    engine.runtime.reserve(1, len(ids))
    logits = engine.runtime.prefill(0, torch.tensor(ids))
    assert torch.allclose(logits, hf_logits, atol=LOGIT_ATOL, rtol=0)
    return engine, ids


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_and_logits_match_transformers(tmp_path, arch):
    folder = make_checkpoint(tmp_path / arch, arch)
    engine, ids = _check_parity(folder)
    windows = [w for w in engine.config.layer_sliding_windows if w is not None]
    if arch in ("mistral", "gemma2", "gemma3", "phi3"):
        # The prompt alone is longer than the sliding window, so the window really masks.
        assert windows and len(ids) > max(windows)


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_greedy_matches_transformers_bfloat16(tmp_path, arch):
    folder = make_checkpoint(tmp_path / arch, arch, dtype=torch.bfloat16)
    engine = Engine.load(folder, dtype="auto")
    assert engine.model.dtype == torch.bfloat16
    ids = engine.encode_prompt(PROMPT)
    hf_tokens, _ = _hf_greedy(folder, ids, 16, dtype=torch.bfloat16, attn="sdpa" if arch != "gemma2" else "eager")
    result = engine.complete(PROMPT, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    assert result.token_ids == hf_tokens


@pytest.mark.parametrize("backend", ["eager", "cpu"])
def test_gemma3_image_text_checkpoint_runs_its_language_model(tmp_path, backend):
    # gemma-3-4b and larger ship as Gemma3ForConditionalGeneration: Solo runs the language model on text, as
    # transformers' class does for a prompt without images; the vision tower is not loaded.
    from safetensors.torch import load_file, save_file

    folder = make_gemma3_image_text_checkpoint(tmp_path / "gemma3-it")
    engine, _ = _check_parity(folder, backend=backend)
    assert engine.config.architecture == "Gemma3ForConditionalGeneration"
    assert engine.runtime.name == backend
    # transformers >= 5 names the language model model.language_model.*; the published files language_model.*
    tensors = load_file(folder / "model.safetensors")
    assert any(name.startswith("vision_tower.") for name in tensors)
    save_file({name.replace("language_model.model.", "model.language_model."): t for name, t in tensors.items()},
              folder / "model.safetensors", metadata={"format": "pt"})
    _check_parity(folder, new_tokens=8, backend=backend)


def test_sharded_checkpoint(tmp_path):
    folder = make_checkpoint(tmp_path / "sharded", "llama", max_shard_size="100KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    _check_parity(folder)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_and_untied_embeddings(tmp_path, tied):
    folder = make_checkpoint(tmp_path / f"tied-{tied}", "llama", tie_word_embeddings=tied)
    engine, _ = _check_parity(folder, new_tokens=8)
    assert engine.config.tie_word_embeddings is tied
    assert (engine.model.lm_head is None) is tied


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 16},
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
        # DeepSeek's attention factor from mscale / mscale_all_dim; bounds not rounded to whole dims.
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
         "mscale_all_dim": 0.5, "beta_fast": 16, "truncate": False},
    ],
    ids=lambda r: r["rope_type"] + ("-mscale" if "mscale" in r else ""),
)
def test_rope_scaling(tmp_path, rope):
    # linear/dynamic/yarn: a 32-token trained context stretched by 2 (yarn: its original one by its factor), so 26
    # prompt + 32 new tokens run past the trained length (dynamic NTK kicks in); llama3 configs state the
    # stretched length themselves.
    max_pos = 64 if rope["rope_type"] == "llama3" else 32
    folder = make_checkpoint(tmp_path / rope["rope_type"], "llama", max_position_embeddings=max_pos,
                             rope_parameters={"rope_theta": 10000.0, **rope})
    engine = Engine.load(folder)
    assert engine.config.rope.rope_type == rope["rope_type"]
    if rope["rope_type"] == "yarn":  # as vLLM derives it: the original context times the factor
        assert engine.config.context_length == max(32, rope["original_max_position_embeddings"] * rope["factor"])
    prompt = PROMPT + "\n    return fibonacci(n - 1)"
    _check_parity(folder, prompt=prompt, new_tokens=32)


_LLAMA3 = {"rope_theta": 10000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0}


def _drop_original(config):
    config["rope_parameters"].pop("original_max_position_embeddings")


def _drop_nested_original(config):
    config["rope_parameters"]["full_attention"].pop("original_max_position_embeddings")


@pytest.mark.parametrize(
    "arch, rope, edit",
    [
        # llama3 with no original context: transformers takes max_position_embeddings, not Llama 3.1's 8192
        ("llama", {**_LLAMA3, "original_max_position_embeddings": 16}, _drop_original),
        # a top-level original context wins over the dict's (llama3 and longrope on any architecture, as yarn)
        ("llama", {**_LLAMA3, "original_max_position_embeddings": 16},
         lambda c: c.update(original_max_position_embeddings=32)),
        # rope_scaling beside rope_parameters replaces it whole in transformers: the saved original does not carry over
        ("llama", {**_LLAMA3, "original_max_position_embeddings": 16}, lambda c: c.update(rope_scaling={
            "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0})),
        ("llama", {"rope_theta": 10000.0, "rope_type": "longrope", "short_factor": [1.0 + i / 8 for i in range(8)],
                   "long_factor": [2.0 + i / 4 for i in range(8)], "original_max_position_embeddings": 16},
         lambda c: c.update(original_max_position_embeddings=48)),
        # Gemma 3's per-layer-type dicts: without an original context, max_position_embeddings (not 2048 / 8192)
        ("gemma3", {"full_attention": {"rope_type": "yarn", "factor": 8.0, "rope_theta": 10000.0,
                                       "original_max_position_embeddings": 16},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, _drop_nested_original),
        ("gemma3", {"full_attention": {**_LLAMA3, "original_max_position_embeddings": 16},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, _drop_nested_original),
        # and yarn's truncate comes from the outer dict (true), not the layer type's own
        ("gemma3", {"full_attention": {"rope_type": "yarn", "factor": 8.0, "rope_theta": 10000.0, "beta_fast": 4.0,
                                       "original_max_position_embeddings": 64, "truncate": False},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, None),
        ("gemma3", {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "sliding_attention": {"rope_type": "yarn", "factor": 8.0, "rope_theta": 10000.0, "beta_fast": 4.0,
                                          "original_max_position_embeddings": 64, "truncate": False}}, None),
    ],
    ids=["llama3-no-original", "llama3-top-level-original", "llama3-rope-scaling-whole", "longrope-top-level-original",
         "gemma3-yarn-no-original", "gemma3-llama3-no-original", "gemma3-yarn-truncate",
         "gemma3-sliding-yarn-truncate"],
)
@pytest.mark.parametrize("backend", ["eager", "cpu"])
def test_rope_original_context_is_read_as_transformers_reads_it(tmp_path, arch, rope, edit, backend):
    # From a parity trial: each of these configs gave logits 0.5-8 off transformers' (greedy tokens from the first).
    overrides = {"sliding_window": 8} if arch == "gemma3" else {}
    folder = make_checkpoint(tmp_path / arch, arch, max_position_embeddings=64, rope_parameters=rope, **overrides)
    if edit is not None:
        path = folder / "config.json"
        config = json.loads(path.read_text())
        edit(config)
        path.write_text(json.dumps(config))
    _check_parity(folder, prompt=PROMPT + "\n    return fibonacci(n - 1)", new_tokens=16, backend=backend)


@pytest.mark.parametrize("backend, speculative", [("eager", "off"), ("eager", "ngram"), ("cpu", "ngram")])
def test_dynamic_rope_on_a_prompt_past_the_trained_context_matches_transformers(tmp_path, backend, speculative):
    # From a parity trial: transformers rotates every prompt token with the frequencies of the whole prompt's
    # length; the CPU runtime prefilled short prompts through its decode kernel, each token at its own length
    # (logits off by 6), and a prefix cached from a shorter prompt kept that prompt's rotation. The eager
    # runtime's speculative verify rotated its drafted tokens with the longest one's length, not each its own.
    folder = make_checkpoint(tmp_path / "dynamic", "llama", max_position_embeddings=32,
                             rope_parameters={"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0})
    prompt = PROMPT + "\n\n\ndef lucas(n):\n    if n < 2:\n        return 2 - n"
    engine, ids = _check_parity(folder, prompt=prompt, new_tokens=20, backend=backend, speculative=speculative)
    assert 32 < len(ids) and engine.prefix_cache is None and engine.speculative == speculative
    if speculative != "off":  # a verify of 6 tokens past the prompt: each row as its own decode step gives it
        runtime, tail = engine.runtime, torch.tensor(ids[:6])
        runtime.reserve(1, len(ids) + 6)
        runtime.prefill(0, torch.tensor(ids))
        verified = runtime.verify(0, tail, len(ids))
        runtime.prefill(0, torch.tensor(ids))
        stepped = torch.cat([runtime.decode(torch.tensor([0]), tail[i:i + 1], torch.tensor([len(ids) + i]))
                             for i in range(6)])
        torch.testing.assert_close(verified, stepped, atol=1e-4, rtol=0)


@pytest.mark.parametrize("backend", ["eager", "cpu"])
@pytest.mark.parametrize("partial", [1.0, 0.75], ids=["phi3", "phi4-partial-rotary"])
def test_longrope_short_context_matches_transformers(tmp_path, backend, partial):
    # The default context is the original one, where transformers uses the short factors for every sequence.
    # Phi-4-mini's layout: the attention factor scales only the rotated dims' cos and sin.
    folder = make_longrope_checkpoint(tmp_path / "longrope", partial_rotary_factor=partial)
    engine, ids = _check_parity(folder, new_tokens=12, backend=backend)
    assert engine.config.context_length == 32 and not engine.config.rope.use_long_factor
    assert len(ids) + 12 <= 32


@pytest.mark.parametrize("backend", ["eager", "cpu"])
@pytest.mark.parametrize("partial", [1.0, 0.75], ids=["phi3", "phi4-partial-rotary"])
def test_longrope_long_context_matches_transformers_on_a_long_prompt(tmp_path, backend, partial):
    # A prompt longer than the original context: transformers takes the long factors for the whole sequence,
    # as Solo does at every position once its context goes beyond the original one.
    folder = make_longrope_checkpoint(tmp_path / "longrope", partial_rotary_factor=partial)
    prompt = PROMPT + "\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\nclass Stack:\n    def push(self, item):"
    engine = Engine.load(folder, dtype="float32", backend=backend, context_length=128)
    assert engine.config.rope.use_long_factor and engine.config.context_length == 128
    ids = engine.encode_prompt(prompt)
    assert len(ids) > 32
    hf_tokens, hf_logits = _hf_greedy(folder, ids, 16)
    result = engine.complete(prompt, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    assert result.token_ids == hf_tokens
    engine.runtime.reserve(1, len(ids))
    assert torch.allclose(engine.runtime.prefill(0, torch.tensor(ids)), hf_logits, atol=LOGIT_ATOL, rtol=0)
    with pytest.raises(SoloError, match="from 2 to 128"):
        Engine.load(folder, dtype="float32", backend=backend, context_length=129)


def test_longrope_regimes_differ_on_a_long_prompt(tmp_path):
    # The parity test above tells the regimes apart: the short factors' logits on the same long prompt are
    # far from transformers' (which takes the long ones there).
    from dataclasses import replace

    from solo.model.rope import RotaryEmbedding

    folder = make_longrope_checkpoint(tmp_path / "longrope")
    engine = Engine.load(folder, dtype="float32", backend="eager", context_length=128)
    ids = engine.encode_prompt(PROMPT * 3)
    assert len(ids) > 32
    _, hf_logits = _hf_greedy(folder, ids, 1)
    short = replace(engine.config, rope=replace(engine.config.rope, use_long_factor=False))
    engine.model.rotary = RotaryEmbedding(short)
    engine.runtime.reserve(1, len(ids))
    assert (engine.runtime.prefill(0, torch.tensor(ids)) - hf_logits).abs().max() > 100 * LOGIT_ATOL


def test_multi_eos_generation_config(tmp_path):
    folder = make_checkpoint(tmp_path / "multi-eos", "llama")
    engine = Engine.load(folder)
    free = engine.complete(PROMPT, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)).token_ids
    # Make the 6th greedy token an EOS id (beside the usual one); generation must stop right there.
    stop_id = free[5]
    assert stop_id not in free[:5]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, stop_id], "bos_token_id": 1}))
    engine = Engine.load(folder)
    assert engine.eos_ids == {2, stop_id}
    result = engine.complete(PROMPT, SamplingParams(max_tokens=12, temperature=0))
    assert result.finish_reason == "stop"
    assert result.token_ids == free[:6]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = engine.encode_prompt(PROMPT)
    out = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert out[0, len(ids):].tolist() == free[:6]


def test_partial_rotary_loading_keeps_no_fused_tensor_alive(tmp_path):
    # Phi-4-mini's fused qkv_proj: q and k are copied to reorder their rows, so v_proj, a view of the fused tensor,
    # would keep all of it alive (0.8 GB in bf16 at its size): v is copied too, to its own storage.
    from solo.model.config import ModelConfig
    from solo.model.weights import load_weights

    folder = make_checkpoint(tmp_path / "phi4", "phi4", dtype=torch.bfloat16)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
    for name in ("q_proj", "k_proj", "v_proj"):
        weight = getattr(model.layers[0].attn, name).weight
        assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size(), name
