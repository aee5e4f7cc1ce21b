"""config.json -> ModelConfig, on real model configs and on the edge cases of each family."""

from __future__ import annotations

import json
import math
import re

import pytest

from solo.errors import CheckpointError, SoloError, UnsupportedArchitectureError
from solo.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from solo.model.generation_config import GenerationDefaults


def test_real_llama32_config(shared_hf):
    config = ModelConfig.from_file(shared_hf / "Llama-3.2-1B")
    assert config.architecture == "LlamaForCausalLM"
    assert (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads) == (2048, 16, 32, 8)
    assert config.head_dim == 64 and config.tie_word_embeddings
    assert config.rope.rope_type == "llama3" and config.rope.factor == 32.0
    assert config.context_length == 131072
    assert config.num_parameters() == pytest.approx(1.236e9, rel=0.01)


@pytest.mark.parametrize(
    "folder, arch",
    [("Llama-2-7b-hf", "LlamaForCausalLM"), ("TinyLlama_v1.1", "LlamaForCausalLM"),
     ("Mistral-7B-Instruct-v0.3", "MistralForCausalLM"), ("Qwen2.5-Math-72B-Instruct", "Qwen2ForCausalLM")],
)
def test_real_configs_parse(shared_hf, folder, arch):
    config = ModelConfig.from_file(shared_hf / folder)
    assert config.architecture == arch
    assert config.num_heads % config.num_kv_heads == 0


def test_qwen2_bias_and_inactive_sliding_window(shared_hf):
    config = ModelConfig.from_file(shared_hf / "Qwen2.5-Math-72B-Instruct")
    assert config.qkv_bias and not config.o_bias
    # use_sliding_window is false: every layer attends globally.
    assert set(config.layer_sliding_windows) == {None}


def test_unsupported_architecture_is_named_with_the_supported_list():
    with pytest.raises(UnsupportedArchitectureError) as err:
        ModelConfig.from_dict(_raw(architectures=["PhiMoEForCausalLM"], model_type="phimoe"))
    message = str(err.value)
    assert "PhiMoEForCausalLM" in message
    for supported in SUPPORTED_ARCHITECTURES:
        assert supported in message


def test_real_phi3_mini_4k_config(shared_hf):
    config = ModelConfig.from_file(shared_hf / "Phi-3-mini-4k-instruct")
    assert config.architecture == "Phi3ForCausalLM"
    assert (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads) == (3072, 32, 32, 32)
    assert set(config.layer_sliding_windows) == {2047} and config.context_length == 4096
    assert config.rope.rope_type == "default" and not config.qkv_bias and not config.tie_word_embeddings
    assert config.num_parameters() == pytest.approx(3.82e9, rel=0.01)


def test_real_phi35_longrope_config_and_its_two_contexts(shared_hf):
    config = ModelConfig.from_file(shared_hf / "Phi-3.5-mini-instruct")
    rope = config.rope
    assert rope.rope_type == "longrope" and rope.original_max_position_embeddings == 4096
    assert len(rope.short_factor) == len(rope.long_factor) == config.head_dim // 2 == 48
    # transformers: factor = 131072 / 4096, attention factor sqrt(1 + ln(32) / ln(4096)).
    assert rope.factor == 32.0 and rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert config.context_length == 4096 and not rope.use_long_factor  # the original context: short factors
    assert config.max_context_length == 131072
    long = config.with_context_length(131072)
    assert long.context_length == 131072 and long.rope.use_long_factor
    assert not config.with_context_length(4096).rope.use_long_factor
    assert config.with_context_length(4097).rope.use_long_factor
    with pytest.raises(SoloError, match="from 2 to 131072"):
        config.with_context_length(131073)


def test_context_length_of_other_models_can_only_shrink():
    config = ModelConfig.from_dict(_raw(max_position_embeddings=256))
    assert config.with_context_length(64).context_length == 64 and config.max_context_length == 256
    for bad in (257, 1, 0, 64.0, True, "64"):
        with pytest.raises(SoloError, match="from 2 to 256"):
            config.with_context_length(bad)


def test_phi3_early_longrope_names_and_bad_factors():
    half = 8
    raw = _raw(architectures=["Phi3ForCausalLM"], hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
               max_position_embeddings=128, original_max_position_embeddings=32,
               rope_scaling={"type": "su", "short_factor": [1.0] * half, "long_factor": [2.0] * half})
    assert ModelConfig.from_dict(raw).rope.rope_type == "longrope"  # "su" / "yarn": Phi3Config's old names
    raw["rope_scaling"]["long_factor"] = [2.0] * (half + 1)
    with pytest.raises(CheckpointError, match="short_factor and long_factor have 8 and 9 entries"):
        ModelConfig.from_dict(raw)
    del raw["rope_scaling"]["long_factor"]
    with pytest.raises(CheckpointError, match="lacks 'long_factor'"):
        ModelConfig.from_dict(raw)
    raw["rope_scaling"]["long_factor"] = [2.0] * half
    raw["partial_rotary_factor"] = 0.75  # 12 of the 16 dims rotated: 6 factors each
    with pytest.raises(CheckpointError, match="have 8 and 8 entries; 12 rotated dims need 6 each"):
        ModelConfig.from_dict(raw)


def test_phi4_mini_rotates_three_quarters_of_each_head():
    # Phi-4-mini-instruct's published config: a Phi-3 whose RoPE rotates 96 of each head's 128 dims (LongRoPE
    # with 48 factors each), tied embeddings.
    raw = _raw(architectures=["Phi3ForCausalLM"], vocab_size=200064, hidden_size=3072, intermediate_size=8192,
               num_hidden_layers=32, num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=131072,
               original_max_position_embeddings=4096, partial_rotary_factor=0.75, tie_word_embeddings=True,
               sliding_window=262144, rope_theta=10000.0,
               rope_scaling={"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48})
    config = ModelConfig.from_dict(raw)
    assert (config.head_dim, config.rotary_dim, config.rope_dim) == (128, 96, 96)
    assert config.rope.rope_type == "longrope" and config.context_length == 4096 and config.tie_word_embeddings
    assert config.num_parameters() == 3_836_021_760  # transformers' count (Phi3ForCausalLM on the meta device)
    # transformers 5 keeps it in rope_parameters; 1.0 (or none) rotates the whole head
    moved = dict(raw, rope_parameters={"partial_rotary_factor": 0.75, "rope_theta": 10000.0})
    del moved["partial_rotary_factor"]
    assert ModelConfig.from_dict(moved).rotary_dim == 96
    # In rope_scaling it wins, as the rest of rope_scaling does (transformers 5 takes rope_scaling whole then).
    scaled = dict(raw, rope_scaling={**raw["rope_scaling"], "partial_rotary_factor": 0.5})
    with pytest.raises(CheckpointError, match="64 rotated dims need 32 each"):
        ModelConfig.from_dict(scaled)
    scaled["rope_scaling"] = {"rope_type": "default", "partial_rotary_factor": 0.5}
    assert ModelConfig.from_dict(scaled).rotary_dim == 64
    assert ModelConfig.from_dict(dict(raw, partial_rotary_factor=1.0, rope_scaling=None)).rotary_dim is None
    with pytest.raises(CheckpointError, match="have 64 and 64 entries; 96 rotated dims need 48 each"):
        ModelConfig.from_dict(dict(raw, rope_scaling={"type": "longrope", "short_factor": [1.0] * 64,
                                                      "long_factor": [2.0] * 64}))
    for bad in (0, 1.5, "0.75", True):
        with pytest.raises(CheckpointError, match="partial_rotary_factor .* must be in \\(0, 1\\]"):
            ModelConfig.from_dict(dict(raw, partial_rotary_factor=bad))
    with pytest.raises(CheckpointError, match="rotates 5 dims; RoPE needs an even number"):
        ModelConfig.from_dict(_raw(architectures=["Phi3ForCausalLM"], partial_rotary_factor=0.3125))  # of 16
    # Other architectures' transformers code rotates the whole head whatever the field says: refused by name.
    with pytest.raises(UnsupportedArchitectureError, match="supported for Phi3ForCausalLM .* not for LlamaForCausalLM"):
        ModelConfig.from_dict(_raw(partial_rotary_factor=0.5))
    with pytest.raises(UnsupportedArchitectureError, match="not with dynamic NTK scaling"):
        ModelConfig.from_dict(_raw(architectures=["Phi3ForCausalLM"], partial_rotary_factor=0.5,
                                   rope_scaling={"type": "dynamic", "factor": 2.0}))


def _raw(**overrides):
    raw = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
    raw.update(overrides)
    return raw


def test_old_style_rope_scaling_fields():
    config = ModelConfig.from_dict(_raw(rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 4.0},
                                        max_position_embeddings=1024))
    assert config.rope.theta == 500000.0 and config.rope.rope_type == "linear"
    assert config.context_length == 4096


def test_rope_scaling_added_beside_rope_parameters_wins():
    # transformers 5 saves rope_parameters; a user then adds rope_scaling to stretch the context, and
    # transformers reads that (keeping the saved theta): so does Solo.
    params = {"rope_theta": 10000.0, "rope_type": "default"}
    config = ModelConfig.from_dict(_raw(rope_parameters=params, rope_scaling={"rope_type": "linear", "factor": 4.0}))
    assert (config.rope.rope_type, config.rope.factor, config.rope.theta) == ("linear", 4.0, 10000.0)
    # Qwen2.5's model card: add YaRN to reach 128k; the context becomes the original one times the factor.
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    config = ModelConfig.from_dict(_raw(rope_parameters=params, rope_scaling=yarn, max_position_embeddings=32768))
    assert (config.rope.rope_type, config.rope.factor, config.context_length) == ("yarn", 4.0, 131072)
    assert config.rope.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1)


def test_unsupported_rope_type():
    with pytest.raises(UnsupportedArchitectureError, match="mrope"):
        ModelConfig.from_dict(_raw(rope_scaling={"rope_type": "mrope", "factor": 4.0}))


@pytest.mark.parametrize("field, value", [("factor", "4"), ("factor", 0.5), ("beta_fast", None),
                                          ("original_max_position_embeddings", -1), ("attention_factor", -1.0),
                                          ("truncate", "false")])
def test_bad_yarn_fields_are_named(field, value):
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, field: value}
    if value is None:  # a null beta falls back to its default, as transformers reads it
        assert ModelConfig.from_dict(_raw(rope_scaling=yarn)).rope.beta_fast == 32.0
        return
    with pytest.raises(CheckpointError, match=field):
        ModelConfig.from_dict(_raw(rope_scaling=yarn))


@pytest.mark.parametrize("field, value, match", [
    ("max_position_embeddings", 0, "max_position_embeddings = 0; it must be from 2 to"),
    ("max_position_embeddings", -5, "max_position_embeddings = -5; it must be from 2 to"),
    ("rms_norm_eps", -1e-6, "rms_norm_eps = -1e-06; it must be a finite number >= 0"),
    ("rms_norm_eps", float("nan"), "rms_norm_eps = nan"),
])
def test_bad_context_and_norm_fields_are_refused_at_load(field, value, match):
    # (a context of 0 loaded, then refused every request with "lower it below 0"; a negative eps gave NaN text)
    with pytest.raises(CheckpointError, match=re.escape(match)):
        ModelConfig.from_dict(_raw(**{field: value}))


def test_gemma2_defaults_alternate_sliding_layers():
    config = ModelConfig.from_dict(_raw(architectures=["Gemma2ForCausalLM"], sliding_window=16, head_dim=16))
    assert config.layer_sliding_windows == (16, None, 16, None)
    assert config.norm_unit_offset and config.sandwich_norm and config.tie_word_embeddings
    assert config.attn_logit_softcap == 50.0 and config.final_logit_softcap == 30.0


def test_qwen3_layer_types_and_max_window_layers():
    raw = _raw(architectures=["Qwen3ForCausalLM"], use_sliding_window=True, sliding_window=8, max_window_layers=2)
    assert ModelConfig.from_dict(raw).layer_sliding_windows == (None, None, 8, 8)
    raw["layer_types"] = ["sliding_attention", "full_attention"] * 2
    config = ModelConfig.from_dict(raw)
    assert config.layer_sliding_windows == (8, None, 8, None) and config.qk_norm


def test_generation_defaults(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [3, 4], "do_sample": True, "temperature": 0.6, "top_p": 0.9}))
    defaults = GenerationDefaults.from_folder(tmp_path)
    assert defaults.eos_token_ids == (3, 4) and defaults.default_temperature() == 0.6
    assert GenerationDefaults.from_dict({"do_sample": False, "temperature": 0.7}).default_temperature() == 0.0
    missing = GenerationDefaults.from_folder(tmp_path / "nowhere", fallback_eos_ids=(2,))
    assert missing.eos_token_ids == (2,) and missing.default_temperature() is None



def test_generation_config_keys_solo_does_not_apply_are_named_not_ignored(tmp_path):
    from solo.errors import SoloWarning

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": 2, "no_repeat_ngram_size": 2, "suppress_tokens": [7], "num_beams": 1, "max_length": 4096,
         "repetition_penalty": 1.3}))
    with pytest.warns(SoloWarning, match=r"sets no_repeat_ngram_size=2, suppress_tokens=\[7\], which Solo does "
                                         r"not apply, so its outputs can differ from transformers' generate"):
        defaults = GenerationDefaults.from_folder(tmp_path)
    assert defaults.repetition_penalty == 1.3  # the rest applies


def test_real_generation_configs_load_quietly(shared_hf):
    # max_length and keys at values that do nothing are not warned about.
    import warnings

    from solo.errors import SoloWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", SoloWarning)
        for folder in sorted(shared_hf.glob("*/generation_config.json")):
            GenerationDefaults.from_folder(folder.parent)

@pytest.mark.parametrize("top, inner, expected", [(None, 16, 4096), (32, 16, 32), (None, None, 4096)])
def test_phi3_original_context_comes_from_the_top_level_as_in_transformers(top, inner, expected):
    # Phi3Config's original_max_position_embeddings (default 4096) replaces the RoPE dict's own.
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    if inner is not None:
        rope["original_max_position_embeddings"] = inner
    raw = _raw(architectures=["Phi3ForCausalLM"], num_attention_heads=4, num_key_value_heads=4,
               max_position_embeddings=128, rope_scaling=rope)
    if top is not None:
        raw["original_max_position_embeddings"] = top
    config = ModelConfig.from_dict(raw)
    assert config.rope.original_max_position_embeddings == expected
    assert config.max_context_length == 128 and config.context_length == min(expected, 128)


@pytest.mark.parametrize("arch", ["Phi3ForCausalLM", "MistralForCausalLM"])
def test_a_sliding_window_of_zero_is_none(arch):
    # llama.cpp reads 0 as no window (Phi-4's GGUF files write 0); a window of 0 would mask every key.
    assert set(ModelConfig.from_dict(_raw(architectures=[arch], sliding_window=0)).layer_sliding_windows) == {None}


def test_longrope_original_context_of_zero_is_named():
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    raw = _raw(architectures=["Phi3ForCausalLM"], num_attention_heads=4, num_key_value_heads=4, rope_scaling=rope,
               original_max_position_embeddings=0)
    with pytest.raises(CheckpointError, match="original_max_position_embeddings = 0; it must be >= 1"):
        ModelConfig.from_dict(raw)


# google/gemma-3-1b-it's config.json as published (transformers 4.50 wrote it: rope_theta and
# rope_local_base_freq at the top level, the pattern as sliding_window_pattern).
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attn_logit_softcapping": None, "bos_token_id": 2,
    "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
    "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512,
    "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "vocab_size": 262144,
}


def test_gemma3_1b_config_has_local_and_global_rope_tables():
    config = ModelConfig.from_dict(GEMMA3_1B)
    assert config.architecture == "Gemma3ForCausalLM"
    assert config.layer_sliding_windows == ((512,) * 5 + (None,)) * 4 + (512, 512)
    glob, local = config.rope_tables
    assert (glob.theta, local.theta) == (1e6, 1e4) and glob.rope_type == local.rope_type == "default"
    assert [config.layer_rope_table(i) for i in range(6)] == [1, 1, 1, 1, 1, 0]
    assert config.qk_norm and config.norm_unit_offset and config.sandwich_norm and config.tie_word_embeddings
    assert config.attn_logit_softcap is None and config.final_logit_softcap is None
    assert config.attn_scale == 256 ** -0.5 and config.embedding_scale == math.sqrt(1152)
    assert config.context_length == 32768 and config.eos_token_ids == (1, 106)
    # transformers' Gemma3Attention never applies attn_logit_softcapping (its final soft-capping it does)
    capped = ModelConfig.from_dict(dict(GEMMA3_1B, attn_logit_softcapping=50.0, final_logit_softcapping=30.0))
    assert capped.attn_logit_softcap is None and capped.final_logit_softcap == 30.0
    assert config.num_parameters() == pytest.approx(999_885_952, rel=1e-6)  # transformers' count


def test_gemma3_rope_scaling_applies_to_the_global_layers_only_and_states_the_context():
    # gemma-3-4b: linear factor 8 on the global layers; max_position_embeddings (131072) already counts it, as
    # vLLM reads Gemma 3 too. transformers >= 5 writes one rope_parameters dict per layer type.
    raw = dict(GEMMA3_1B, max_position_embeddings=131072, rope_scaling={"rope_type": "linear", "factor": 8.0})
    old = ModelConfig.from_dict(raw)
    new = ModelConfig.from_dict(dict(GEMMA3_1B, max_position_embeddings=131072, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}))
    for config in (old, new):
        glob, local = config.rope_tables
        assert (glob.rope_type, glob.factor, glob.theta) == ("linear", 8.0, 1e6)
        assert (local.rope_type, local.theta) == ("default", 1e4)
        assert config.context_length == 131072
    layer_types = ["sliding_attention", "full_attention"] * 13
    config = ModelConfig.from_dict(dict(GEMMA3_1B, layer_types=layer_types))
    assert config.layer_sliding_windows == (512, None) * 13
    assert [config.layer_rope_table(i) for i in range(4)] == [1, 0, 1, 0]
    # The layer type picks the RoPE table even without a window (transformers indexes the tables by type).
    config = ModelConfig.from_dict(dict(GEMMA3_1B, sliding_window=None))
    assert set(config.layer_sliding_windows) == {None}
    assert [config.layer_rope_table(i) for i in range(6)] == [1, 1, 1, 1, 1, 0]
    with pytest.raises(UnsupportedArchitectureError, match="dynamic RoPE scaling is not supported on a model whose"):
        ModelConfig.from_dict(dict(GEMMA3_1B, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))


def test_smollm3_nope_layers():
    raw = _raw(architectures=["SmolLM3ForCausalLM"], num_hidden_layers=8, rope_theta=5e6)
    config = ModelConfig.from_dict(raw)
    assert [config.layer_uses_rope(i) for i in range(8)] == [True, True, True, False] * 2
    assert config.rope_tables == (config.rope, None) and config.rope.theta == 5e6
    assert [config.layer_rope_table(i) for i in range(4)] == [0, 0, 0, 1]
    assert config.tie_word_embeddings and set(config.layer_sliding_windows) == {None}
    # an explicit list (1 = RoPE), and a window on the NoPE layers when use_sliding_window is on
    config = ModelConfig.from_dict(dict(raw, no_rope_layers=[0, 1] * 4, use_sliding_window=True, sliding_window=16))
    assert [config.layer_uses_rope(i) for i in range(2)] == [False, True]
    assert config.layer_sliding_windows == (16, None) * 4
    with pytest.raises(CheckpointError, match="no_rope_layers"):
        ModelConfig.from_dict(dict(raw, no_rope_layers=[1, 0]))
    # transformers reads the first num_hidden_layers entries; SmolLM3Config's defaults where config.json is silent
    config = ModelConfig.from_dict(dict(raw, no_rope_layers=[1, 1, 1, 0] * 3))
    assert [config.layer_uses_rope(i) for i in range(8)] == [True, True, True, False] * 2
    bare = {k: v for k, v in raw.items() if k != "rope_theta"}
    config = ModelConfig.from_dict(bare)
    assert config.rope.theta == 2e6 and config.rope_tables[0].theta == 2e6 and config.context_length == 32768


def test_rope_scalings_old_type_key_wins_over_rope_parameters_type():
    # A saved config (rope_parameters with rope_type "default") plus a user's {"type": "linear", ...}, as model
    # cards write it: transformers applies the scaling, so must Solo.
    raw = _raw(rope_parameters={"rope_type": "default", "rope_theta": 1e4},
               rope_scaling={"type": "linear", "factor": 4.0}, max_position_embeddings=64)
    config = ModelConfig.from_dict(raw)
    assert config.rope.rope_type == "linear" and config.rope.factor == 4.0 and config.context_length == 256
    assert ModelConfig.from_dict(dict(raw, rope_scaling={"type": "yarn", "factor": 2.0})).rope.rope_type == "yarn"
    with pytest.raises(UnsupportedArchitectureError, match="mrope"):
        ModelConfig.from_dict(dict(raw, rope_scaling={"type": "mrope", "factor": 2.0}))
    # The saved theta stays (transformers 5 would fall back to 10000 when rope_scaling replaces rope_parameters)
    config = ModelConfig.from_dict(dict(raw, rope_parameters={"rope_type": "default", "rope_theta": 5e5}))
    assert config.rope.theta == 5e5 and config.rope.rope_type == "linear"


@pytest.mark.parametrize("arch, fields, message", [
    ("Gemma3ForCausalLM", {"layer_types": 5}, "layer_types 5 for 4 layers"),
    ("Gemma3ForCausalLM", {"layer_types": ["linear_attention"] * 4}, "layer type 'linear_attention'"),
    ("Gemma3ForCausalLM", {"query_pre_attn_scalar": None}, "a Gemma3ForCausalLM field of the wrong type"),
    ("Gemma3ForCausalLM", {"sliding_window_pattern": "x"}, "wrong type or value"),
    ("Gemma3ForCausalLM", {"sliding_window": -1}, "sliding_window = -1"),
    ("Gemma3ForCausalLM", {"rope_parameters": {"full_attention": "linear"}}, "wrong type or value"),
    ("SmolLM3ForCausalLM", {"no_rope_layers": 3}, "no_rope_layers must list 1"),
    ("SmolLM3ForCausalLM", {"no_rope_layers": [{}] * 4}, "no_rope_layers must list 1"),
    ("SmolLM3ForCausalLM", {"no_rope_layer_interval": "abc"}, "no_rope_layer_interval = 'abc'"),
    ("LlamaForCausalLM", {"rope_theta": None}, "rope_theta = None"),
    ("LlamaForCausalLM", {"rope_theta": float("nan")}, "rope_theta = nan"),
    ("LlamaForCausalLM", {"rope_parameters": "x"}, "rope_parameters and rope_scaling must be objects"),
    ("Gemma3ForCausalLM", {"layer_types": [None] * 4}, "layer_types must be strings"),
])
def test_malformed_fields_are_one_line_errors(arch, fields, message):
    with pytest.raises((CheckpointError, UnsupportedArchitectureError), match=message) as err:
        ModelConfig.from_dict(_raw(architectures=[arch], head_dim=16, **fields))
    assert "\n" not in str(err.value)


_CONFIG_CLASSES = {"LlamaForCausalLM": "LlamaConfig", "MistralForCausalLM": "MistralConfig",
                   "Qwen2ForCausalLM": "Qwen2Config", "Qwen3ForCausalLM": "Qwen3Config",
                   "Gemma2ForCausalLM": "Gemma2Config", "Gemma3ForCausalLM": "Gemma3TextConfig",
                   "SmolLM3ForCausalLM": "SmolLM3Config", "MixtralForCausalLM": "MixtralConfig",
                   "Qwen2MoeForCausalLM": "Qwen2MoeConfig", "Qwen3MoeForCausalLM": "Qwen3MoeConfig",
                   "OlmoeForCausalLM": "OlmoeConfig", "Phi3ForCausalLM": "Phi3Config"}


@pytest.mark.parametrize("heads", [32, 64])  # (a default equal to the head count would go unseen at one count)
@pytest.mark.parametrize("arch", sorted(_CONFIG_CLASSES))
def test_a_config_with_only_the_sizes_reads_as_transformers_reads_it(arch, heads):
    # The fields left out take the architecture's transformers defaults (a Mistral config without
    # num_key_value_heads has 8 and a Qwen2 one 32, a Qwen3 head_dim is 128, Phi-3's eps 1e-5), not one default
    # for all.
    transformers = pytest.importorskip("transformers")
    sizes = dict(hidden_size=64 * heads, num_attention_heads=heads, num_hidden_layers=2, vocab_size=200_000,
                 intermediate_size=96)
    full = getattr(transformers, _CONFIG_CLASSES[arch])(**sizes).to_dict()
    assert ModelConfig.from_dict({**sizes, "architectures": [arch]}) == \
        ModelConfig.from_dict({**full, "architectures": [arch]})
    assert set(_CONFIG_CLASSES) == set(SUPPORTED_ARCHITECTURES) - {
        "Gemma3ForConditionalGeneration", "LaneformerForCausalLM"}  # (text_config read by transformers; no class)
