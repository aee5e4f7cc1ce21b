"""Bad model folders fail with one clear message that names the problem and the fix."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from checkpoints import make_checkpoint
from safetensors.torch import load_file, save_file

from solo import Engine, SamplingParams
from solo.errors import CheckpointError, ModelNotFoundError, SoloError, SoloWarning, UnsupportedArchitectureError


@pytest.fixture()
def folder(tmp_path, tiny_llama):
    dst = tmp_path / "model"
    shutil.copytree(tiny_llama, dst)
    return dst


def test_missing_folder(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        Engine.load(tmp_path / "nope")


def test_hub_id_unreachable_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotFoundError, match="Hugging Face"):
        Engine.load("some-org/some-model-that-is-not-cached")


def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        Engine.load(tmp_path / "empty")


def test_folder_without_weights(folder):
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        Engine.load(folder)


def test_bin_only_weights(folder):
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="safetensors"):
        Engine.load(folder)


def test_missing_shard(tmp_path):
    folder = make_checkpoint(tmp_path / "sharded", "llama", max_shard_size="100KB")
    shard = sorted(folder.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"missing shard {shard.name}"):
        Engine.load(folder)


@pytest.mark.parametrize("index_text", ['{"weight_map": ["model-00001-of-00002.safetensors"]}',
                                        '{"weight_map": {"lm_head.weight": 3}}', '[]', '{"metadata": {}}',
                                        'not json', '[' * 100_000])  # (deep nesting: RecursionError)
def test_malformed_shard_index(tmp_path, index_text):
    # A weight_map that is not an object of file names raised AttributeError/TypeError from deep inside.
    folder = make_checkpoint(tmp_path / "sharded", "llama", max_shard_size="100KB")
    (folder / "model.safetensors.index.json").write_text(index_text)
    with pytest.raises(CheckpointError, match="is not a valid safetensors index.*re-download it"):
        Engine.load(folder)


def test_unknown_architecture(folder):
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["FancyNewForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="FancyNewForCausalLM.*LlamaForCausalLM"):
        Engine.load(folder)


def test_unknown_dtype(folder):
    with pytest.raises(SoloError, match="unknown dtype 'float8'"):
        Engine.load(folder, dtype="float8")


def test_a_config_dtype_solo_does_not_load_in_gives_way_to_the_weights_own(folder):
    # From a break test: config.json's "dtype": "float128" loaded in float32 without a word; transformers' "auto"
    # (read the weights' dtype) loaded bfloat16 weights in float32 too.
    import warnings

    tensors = load_file(folder / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "float128", "torch_dtype": "float128"}))
    with pytest.warns(SoloWarning, match="config.json names the dtype 'float128'.*loading in bfloat16, the weights'"):
        assert Engine.load(folder, backend="eager").model.dtype == torch.bfloat16
    (folder / "config.json").write_text(json.dumps({**config, "dtype": "auto", "torch_dtype": "auto"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SoloWarning)
        assert Engine.load(folder, backend="eager").model.dtype == torch.bfloat16


def test_missing_tensor(folder):
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    # (named as the checkpoint names it: a trial read Solo's own name, which no checkpoint holds)
    with pytest.raises(CheckpointError, match=r"lacks tensor model.layers.1.mlp.up_proj.weight \(Solo's "
                                              r"layers.1.mlp.up_proj.weight\); the weights are incomplete"):
        Engine.load(folder)


def test_phi3_fused_tensors_are_named_in_errors(tmp_path):
    import torch

    folder = make_checkpoint(tmp_path / "phi3", "phi3")
    path = folder / "model.safetensors"
    clean = load_file(path)

    def save(tensors):
        save_file(tensors, path, metadata={"format": "pt"})

    # Fused and unfused copies of a projection: transformers uses the fused one; Solo would mix them.
    save({**clean, "model.layers.0.self_attn.v_proj.weight": torch.zeros(64, 64)})
    with pytest.raises(CheckpointError, match="'model.layers.0.self_attn.qkv_proj.weight' and 'model.layers.0."
                                              "self_attn.v_proj.weight' both hold layers.0.attn.v_proj"):
        Engine.load(folder)
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    save({**clean, qkv: clean[qkv][:, :63].contiguous()})
    with pytest.raises(CheckpointError, match=r"'model.layers.0.self_attn.qkv_proj.weight' \(its q_proj rows\) has "
                                              r"shape \(64, 63\)"):
        Engine.load(folder)
    save({k: v for k, v in clean.items() if k != "model.layers.1.mlp.gate_up_proj.weight"})
    with pytest.raises(CheckpointError, match="lacks tensor layers.1.mlp.gate_proj.weight .*, which "
                                              "Phi3ForCausalLM checkpoints hold in model.layers.1.mlp.gate_up_proj"):
        Engine.load(folder)


def test_misshapen_tensor(folder):
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="has shape"):
        Engine.load(folder)


def test_missing_tokenizer(folder):
    (folder / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer"):
        Engine.load(folder)


def test_hub_id_resolves_through_huggingface_hub_cache(monkeypatch, tmp_path, tiny_llama):
    """A hub id goes through huggingface_hub's real snapshot code; here the snapshot is a local cache entry."""
    import huggingface_hub.constants as constants

    cache = tmp_path / "hub-cache"
    repo = cache / "models--solo-test--tiny-llama"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny_llama, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    engine = Engine.load("solo-test/tiny-llama")
    assert engine.model_dir == repo / "snapshots" / commit
    assert engine.name == "solo-test/tiny-llama"
    assert engine.complete("hi", SamplingParams(max_tokens=3)).stats.completion_tokens <= 3


@pytest.mark.parametrize("field, value, message", [
    ("hidden_size", None, "lacks the field 'hidden_size'"),
    ("num_attention_heads", 0, "num_attention_heads = 0; it must be >= 1"),
    ("num_hidden_layers", -1, "num_hidden_layers = -1; it must be >= 1"),
    ("vocab_size", "many", "vocab_size = 'many'; it must be an integer"),
    # Each named (they were "a size field that is not a positive integer (...)", Infinity a traceback).
    ("num_key_value_heads", 0, "num_key_value_heads = 0; it must be >= 1"),  # (0 was read as absent)
    ("intermediate_size", 1.5, "intermediate_size = 1.5; it must be an integer"),
    ("max_position_embeddings", float("inf"), "max_position_embeddings = inf; it must be an integer"),
    ("max_position_embeddings", True, "max_position_embeddings = True; it must be an integer"),
    ("rms_norm_eps", True, "rms_norm_eps = True; it must be a number"),
])
def test_bad_size_fields_in_config(folder, field, value, message):
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        Engine.load(folder)


def test_a_damaged_kernel_library_falls_back_to_a_clear_error(monkeypatch, tmp_path):
    from solo.runtime import cpu_build

    broken = tmp_path / "broken.so"
    broken.write_bytes(b"not a shared library")
    monkeypatch.setattr(cpu_build, "_library", None)
    monkeypatch.setattr(cpu_build, "library_path", lambda level=None: broken)
    with pytest.raises(cpu_build.KernelBuildError, match="delete it to rebuild"):
        cpu_build.load_library()


def test_an_image_text_checkpoints_tensor_errors_name_the_files_own_tensors(tmp_path):
    from checkpoints import make_gemma3_image_text_checkpoint

    folder = make_gemma3_image_text_checkpoint(tmp_path / "gemma3-it")
    tensors = load_file(folder / "model.safetensors")
    name = "language_model.model.layers.0.mlp.up_proj.weight"
    twice = dict(tensors, **{name.replace("language_model.model.", "model.language_model."): tensors[name].clone()})
    save_file(twice, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="language_model.model.layers.0.mlp.up_proj.weight' and "
                                              "'model.language_model.layers.0.mlp.up_proj.weight' both hold"):
        Engine.load(folder, backend="eager")
    save_file({k: v for k, v in tensors.items() if k != name}, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="lacks tensor layers.0.mlp.up_proj.weight;"):  # (not a name it lacks)
        Engine.load(folder, backend="eager")
    tensors[name] = tensors[name][:, :3].contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"tensor '{name}' has shape"):
        Engine.load(folder, backend="eager")


def test_integer_weights_are_refused(folder):
    # A quantized checkpoint whose config lacks quantization_config: casting its integers to floats runs garbage.
    weights = load_file(folder / "model.safetensors")
    weights["model.layers.0.self_attn.q_proj.weight"] = weights["model.layers.0.self_attn.q_proj.weight"].to(torch.int8)
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.layers.0.self_attn.q_proj.weight' holds int8 values.*"
                                              "quantization_config"):
        Engine.load(folder)


@pytest.mark.parametrize("backend", ["eager", "cpu"])
def test_a_stored_head_that_differs_from_the_tied_embedding_is_used(tmp_path, backend):
    # transformers 5 does not tie a head the checkpoint stores with other values than the embedding's.
    from transformers import AutoModelForCausalLM

    folder = make_checkpoint(tmp_path / "model", tie_word_embeddings=False)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    ids = torch.tensor([[1, 5, 9, 14, 3]])
    expected = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(ids).logits[0]
    engine = Engine.load(folder, backend=backend, dtype="float32")
    assert engine.model.lm_head is not None and not engine.config.tie_word_embeddings
    engine.runtime.reserve(1, 16)
    logits = engine.runtime.prefill(0, ids[0])
    torch.testing.assert_close(logits, expected[-1], atol=1e-4, rtol=0)
    # The same values stored twice stay tied (nothing to untie).
    weights = load_file(folder / "model.safetensors")
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, folder / "model.safetensors")
    assert Engine.load(folder, backend=backend, dtype="float32").model.lm_head is None


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"[" * 100_000])
def test_a_json_file_that_is_not_json_text_is_a_clear_error(folder, name, content):
    # Bytes that are not UTF-8 and nesting past Python's recursion limit were tracebacks.
    (folder / name).write_bytes(content)
    with pytest.raises(CheckpointError, match=f"{name} is not valid JSON"):
        Engine.load(folder)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("content,kind", [("[]", "list"), ("null", "null"), ('"x"', "str")])
def test_every_json_file_that_is_not_an_object_is_named_alike(folder, name, content, kind):
    # The three files share one reader (solo/model/json_file.py): the same message for each.
    (folder / name).write_text(content)
    with pytest.raises(CheckpointError, match=f"{name} holds a JSON {kind}, not an object; re-download it"):
        Engine.load(folder)


def test_json_and_template_files_that_are_not_what_they_should_be(folder):
    # A tokenizer_config.json holding a list, and a chat_template.jinja that is not UTF-8: tracebacks before.
    (folder / "tokenizer_config.json").write_text("[]")
    with pytest.raises(CheckpointError, match="tokenizer_config.json holds a JSON list, not an object"):
        Engine.load(folder)
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(CheckpointError, match="chat_template.jinja is not UTF-8 text"):
        Engine.load(folder)
    (folder / "chat_template.jinja").unlink()
    # Named templates whose name is not a string, and an added token whose id is a superscript digit ("2".isdigit()
    # but int() refuses it): tracebacks before; now skipped.
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": [{"name": ["default"], "template": "x"}],
        "added_tokens_decoder": {"\u00b2": {"content": "<x>", "special": True}}}))
    assert Engine.load(folder).tokenizer.chat_template is None


def test_a_null_context_falls_back_to_the_default_for_every_rope_type(tmp_path):
    # max_position_embeddings: null took the default on most configs and was a traceback beside LongRoPE / YaRN.
    from checkpoints import hf_config

    from solo.model.config import ModelConfig

    for scaling in ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, None):
        raw = hf_config("llama", 384).to_dict()
        raw.update(max_position_embeddings=None, rope_scaling=scaling)
        assert ModelConfig.from_dict(raw).max_position_embeddings == 2048
    raw = hf_config("smollm3", 384).to_dict()
    raw["max_position_embeddings"] = None  # (absent gave SmolLM3Config's 32768, null the generic 2048)
    assert ModelConfig.from_dict(raw).max_position_embeddings == 32768
    # Past any context (1e308 times a linear factor overflowed to a traceback).
    raw = hf_config("llama", 384).to_dict()
    raw.update(max_position_embeddings=1e308, rope_scaling={"rope_type": "linear", "factor": 4.0})
    with pytest.raises(CheckpointError, match="it must be from 2 to 2"):
        ModelConfig.from_dict(raw)


@pytest.mark.skipif(sys.platform != "linux", reason="file names of any bytes (Linux)")
def test_a_model_folder_whose_path_is_not_utf8_loads(tiny_llama, tmp_path):
    # From a break test: safetensors opens UTF-8 paths only, and the error said the intact file was damaged.
    import os

    folder = Path(os.fsdecode(bytes(tmp_path) + b"/bad\xff\xfe"))
    shutil.copytree(tiny_llama, folder)
    params = SamplingParams(max_tokens=6)
    expected = Engine.load(tiny_llama).complete("def f(", params).text
    assert Engine.load(folder).complete("def f(", params).text == expected
