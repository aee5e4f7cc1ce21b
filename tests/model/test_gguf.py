"""GGUF files: written from a tiny HF checkpoint as llama.cpp's converter lays them out, then run by Solo.

F16 / BF16 files hold the same numbers as the folder loaded in float16 / bfloat16: identical greedy tokens.
Q8_0 / Q4_0 files are compared with the float32 folder: the logits' error stays within what the format's
rounding allows (stated below), and Q8_0 keeps the first greedy tokens.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from gguf_files import write_gguf_from_hf  # noqa: E402

from solo import Engine, SamplingParams  # noqa: E402
from solo.cli import main  # noqa: E402
from solo.errors import SoloError, SoloWarning  # noqa: E402

PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory, tiny_llama):
    out = tmp_path_factory.mktemp("gguf")
    return {t: write_gguf_from_hf(tiny_llama, out / f"tiny-{t}.gguf", t) for t in ("F16", "BF16", "Q8_0", "Q4_0")}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "solo-cache"))


def _tokens(engine: Engine, n: int = 16) -> list[int]:
    return engine.complete(PROMPT, SamplingParams(max_tokens=n, ignore_eos=True)).token_ids


def _logits(engine: Engine) -> torch.Tensor:
    ids = engine.encode_prompt(PROMPT)
    engine.runtime.reserve(1, len(ids) + 1)
    return engine.runtime.prefill(0, torch.tensor(ids, dtype=torch.long)).float()


@pytest.mark.parametrize("kind, dtype", [("F16", "float16"), ("BF16", "bfloat16")])
def test_float_gguf_gives_identical_greedy_tokens(gguf_dir, tiny_llama, kind, dtype):
    reference = Engine.load(tiny_llama, dtype=dtype, backend="eager")
    engine = Engine.load(gguf_dir[kind], backend="eager")
    assert engine.model.dtype == getattr(torch, dtype)
    assert engine.encode_prompt(PROMPT) == reference.encode_prompt(PROMPT)  # tokenizer from GGUF metadata
    assert _tokens(engine) == _tokens(reference)
    messages = [{"role": "user", "content": "hi"}]
    assert engine.encode_prompt(messages) == reference.encode_prompt(messages)  # chat template from metadata


# Max |logit error| vs the float32 folder, in units of the same model's error in bfloat16 (the rounding every
# bfloat16 checkpoint has). Q8_0 rounds each weight to 1/127 of its 32-weight block's largest (plus bfloat16
# storage): within 3x of bfloat16 alone and the same greedy tokens. Q4_0 rounds to 1/7 of it: within 40x.
@pytest.mark.parametrize("kind, bound", [("Q8_0", 3.0), ("Q4_0", 40.0)])
def test_quantized_gguf_within_stated_error(gguf_dir, tiny_llama, kind, bound):
    reference = Engine.load(tiny_llama, dtype="float32", backend="eager")
    want = _logits(reference)
    bf16 = float((_logits(Engine.load(tiny_llama, dtype="bfloat16", backend="eager")) - want).abs().max())
    # (float32 computes with the conversion's bfloat16 values, said at every load: a trial took them for exact)
    with pytest.warns(SoloWarning, match=f"tiny-{kind}.gguf held {kind} weights, which its conversion stores "
                                         "dequantized to bfloat16: float32 computes with those bfloat16 values"):
        engine = Engine.load(gguf_dir[kind], dtype="float32", backend="eager")
    error = float((_logits(engine) - want).abs().max())
    assert error < bound * bf16, (error, bf16)
    if kind == "Q8_0":
        assert _tokens(engine, 4) == _tokens(reference, 4)


def test_gguf_via_cli_and_cache_reuse(gguf_dir, capsys, tmp_path):
    assert main(["run", str(gguf_dir["BF16"]), "--prompt", PROMPT, "--max-tokens", "4"]) == 0
    first = capsys.readouterr()
    assert "TTFT" in first.err
    assert main(["run", str(gguf_dir["BF16"]), "--prompt", PROMPT, "--max-tokens", "4"]) == 0
    second = capsys.readouterr()
    assert second.out == first.out and "converting" not in second.err  # converted once
    assert "dequantized" not in first.err
    # A quantized file says it runs dequantized (its memory is several times its file's).
    import shutil

    quantized = shutil.copy(gguf_dir["Q4_0"], tmp_path / "fresh-Q4_0.gguf")  # (not converted by another test)
    assert main(["run", str(quantized), "--prompt", PROMPT, "--max-tokens", "1"]) == 0
    assert "holds Q4_0 weights, which Solo runs dequantized to bfloat16" in capsys.readouterr().err


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    junk = tmp_path / "weights.bin"
    junk.write_bytes(b"not a model")
    with pytest.raises(SoloError, match="is a file but not a GGUF file"):
        Engine.load(junk)
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(SoloError, match="not a readable GGUF file"):
        Engine.load(damaged)


def test_a_full_or_read_only_cache_is_one_clear_line(gguf_dir, tmp_path, monkeypatch, capsys):
    import errno
    import shutil
    from collections import namedtuple

    from solo.model import gguf as gguf_module

    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))
    usage = namedtuple("usage", "total used free")
    with monkeypatch.context() as m:  # too little room for the converted weights: refused before writing
        m.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 100, 100))
        with pytest.raises(SoloError, match=r"writes about \d+\.\d KB of float16 weights .* has 100 B free"):
            Engine.load(gguf_dir["F16"])
    # (tokenizers raises a bare Exception with the OS error in its text: the disk filled while writing tokenizer.json)
    # (safetensors' error for a write past `ulimit -f`, which Python's ignored SIGXFSZ turns into EFBIG)
    for failure in (OSError(errno.EROFS, "Read-only file system"), OSError(errno.ENOSPC, "No space left on device"),
                    Exception("No space left on device (os error 28)"),
                    Exception("Error while serializing: I/O error: File too large (os error 27)")):
        def fail(*args, failure=failure, **kwargs):
            raise failure

        with monkeypatch.context() as m:
            m.setattr(gguf_module, "_convert", fail)
            assert main(["run", str(gguf_dir["F16"]), "--prompt", PROMPT, "--max-tokens", "2"]) == 2
        err = capsys.readouterr().err
        reason = failure.strerror if isinstance(failure, OSError) else str(failure)
        assert f"cannot write the converted GGUF model under {tmp_path / 'cache' / 'gguf'} ({reason})" in err
        assert ("ulimit -f unlimited" if "27" in reason else "SOLO_CACHE_DIR") in err and "Traceback" not in err
        assert not list((tmp_path / "cache" / "gguf").iterdir())  # the partial folder is gone


@pytest.mark.skipif(sys.platform != "linux", reason="file names of any bytes (Linux)")
def test_a_gguf_under_a_path_that_is_not_utf8_runs(gguf_dir, tmp_path):
    # From a break test: hashing the path raised UnicodeEncodeError (a traceback), and the converted folder's name
    # carried the bytes into safetensors, which opens UTF-8 paths only.
    import os
    import shutil

    folder = Path(os.fsdecode(bytes(tmp_path) + b"/g\xff"))
    folder.mkdir()
    shutil.copy(gguf_dir["F16"], folder / "m\udcfe.gguf")
    engine = Engine.load(folder / "m\udcfe.gguf")
    assert engine.complete(PROMPT, SamplingParams(max_tokens=2)).text is not None
    assert "\ufffd" in engine.model_dir.name  # (the converted folder's own name is UTF-8)


def test_an_unwritable_cache_folder_is_one_clear_line(gguf_dir, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SOLO_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be created
    assert main(["run", str(gguf_dir["F16"]), "--prompt", PROMPT, "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "cannot create the folder for converted GGUF files" in err and "SOLO_CACHE_DIR" in err
    assert "Traceback" not in err


def test_a_hub_repository_of_gguf_files_runs_by_quantization_tag(tmp_path, monkeypatch, capsys, gguf_dir):
    # "org/name:Q8_0" (llama.cpp's -hf and Ollama's syntax) picks that file of a cached repository of GGUF files;
    # a repository holding one GGUF file runs by its name alone; otherwise the message lists the files.
    from hf_cache import add_to_cache, use_offline_cache

    from solo.model.hub import resolve_model_dir

    cache = tmp_path / "hub"
    use_offline_cache(cache, monkeypatch)
    several, single = tmp_path / "several", tmp_path / "single"
    several.mkdir()
    single.mkdir()
    for t in ("F16", "BF16", "Q8_0"):
        (several / gguf_dir[t].name).write_bytes(gguf_dir[t].read_bytes())
    (several / "README.md").write_text("GGUF files")
    (single / gguf_dir["F16"].name).write_bytes(gguf_dir["F16"].read_bytes())
    split = tmp_path / "split"
    split.mkdir()
    for part in ("tiny-Q8_0-00001-of-00002.gguf", "tiny-Q8_0-00002-of-00002.gguf"):
        (split / part).write_bytes(gguf_dir["Q8_0"].read_bytes())
    add_to_cache(cache, "someone/tiny-GGUF", several)
    add_to_cache(cache, "someone/tiny-F16-GGUF", single)
    add_to_cache(cache, "someone/tiny-split-GGUF", split)
    default = tmp_path / "default"  # (the Q4_K_M file's bytes are another file's: only its name matters here)
    default.mkdir()
    (default / "tiny-Q8_0.gguf").write_bytes(gguf_dir["Q8_0"].read_bytes())
    (default / "tiny-Q4_K_M.gguf").write_bytes(gguf_dir["Q4_0"].read_bytes())
    add_to_cache(cache, "someone/tiny-default-GGUF", default)

    want = _tokens(Engine.load(str(gguf_dir["Q8_0"]), dtype="float32"))
    assert _tokens(Engine.load("someone/tiny-GGUF:q8_0", dtype="float32")) == want
    # F16 is a word of tiny-F16.gguf, not of tiny-BF16.gguf; the folder is named after the file, not its blob.
    f16 = resolve_model_dir("someone/tiny-GGUF:F16")
    assert f16.name.startswith("tiny-F16-") and (f16 / "gguf_source.json").is_file()
    assert (resolve_model_dir("someone/tiny-F16-GGUF") / "gguf_source.json").is_file()
    # Ollama's names: hf.co/ (or huggingface.co/) before the repository, ":latest" naming no quantization.
    assert resolve_model_dir("hf.co/someone/tiny-GGUF:F16") == f16
    assert resolve_model_dir("https://huggingface.co/someone/tiny-F16-GGUF:latest") == \
        resolve_model_dir("someone/tiny-F16-GGUF")
    # Without a tag (or with :latest), several files stand for the Q4_K_M one, as llama.cpp's -hf and Ollama pick.
    q4_k_m = resolve_model_dir("someone/tiny-default-GGUF")
    assert q4_k_m.name.startswith("tiny-Q4_K_M-") and resolve_model_dir("hf.co/someone/tiny-default-GGUF:latest") == \
        q4_k_m
    for name, message in (("someone/tiny-GGUF", "holds several GGUF files (tiny-BF16.gguf, tiny-F16.gguf, "
                                                "tiny-Q8_0.gguf) and none is Q4_K_M, the default; name one as "
                                                "someone/tiny-GGUF:<quantization>"),
                          ("someone/tiny-GGUF:Q5_K_M", "has no GGUF file whose name holds 'Q5_K_M' in the Hugging "
                                                       "Face cache, and HF_HUB_OFFLINE keeps Solo from asking the Hub; "
                                                       "`solo pull someone/tiny-GGUF:Q5_K_M` online downloads it"),
                          ("someone/tiny-split-GGUF:Q8_0", "stores this model split into parts"),
                          ("someone/tiny-split-GGUF:00001-of-00002", "one part of a split GGUF; merge the parts")):
        with pytest.raises(SoloError) as info:
            resolve_model_dir(name)
        assert message in str(info.value)
    assert main(["pull", "someone/tiny-GGUF:Q8_0"]) == 0
    assert "ready: solo run someone/tiny-GGUF:Q8_0 --prompt" in capsys.readouterr().out
    assert main(["pull", "someone/tiny-default-GGUF"]) == 0  # (its Q4_K_M file)
    assert "ready: solo run someone/tiny-default-GGUF --prompt" in capsys.readouterr().out
    assert main(["pull", "someone/tiny-GGUF:zz"]) == 2  # what `solo run` would refuse, pull refuses too
    assert "has no GGUF file whose name holds 'zz'" in capsys.readouterr().err


@pytest.mark.parametrize("window,partial", [(None, 1.0), (8, 1.0), (None, 0.75)],
                         ids=["longrope", "sliding-window", "phi4-partial-rotary"])
def test_phi3_gguf_keeps_longrope_and_the_sliding_window(tmp_path, window, partial):
    # transformers' GGUF reader drops them; without them the model runs with plain RoPE and no window. Phi-4-mini's
    # files rotate 3/4 of each head (phi3.rope.dimension_count), which the reader drops too.
    from checkpoints import make_longrope_checkpoint

    folder = make_longrope_checkpoint(tmp_path / "phi3", partial_rotary_factor=partial, dtype=torch.float16)
    if window is not None:
        config = json.loads((folder / "config.json").read_text())
        config["sliding_window"] = window
        (folder / "config.json").write_text(json.dumps(config))
    path = write_gguf_from_hf(folder, tmp_path / "tiny-phi3-F16.gguf", "F16")
    reference = Engine.load(folder, dtype="float16", backend="eager")
    engine = Engine.load(path, backend="eager")
    rope, expected = engine.config.rope, reference.config.rope
    assert rope.rope_type == "longrope" and rope.attention_factor == expected.attention_factor
    assert rope.original_max_position_embeddings == expected.original_max_position_embeddings == 32
    for factors in ("short_factor", "long_factor"):  # stored as float32, as transformers builds them
        assert torch.equal(torch.tensor(getattr(rope, factors)), torch.tensor(getattr(expected, factors)))
    assert engine.config.layer_sliding_windows == reference.config.layer_sliding_windows
    assert engine.config.rotary_dim == reference.config.rotary_dim == (12 if partial != 1.0 else None)
    assert engine.config.context_length == 32 and engine.config.max_context_length == 128
    assert _tokens(engine) == _tokens(reference)
    prompt = "The quick brown fox jumps over the lazy dog. " * 2  # beyond the original context: long factors
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    long = Engine.load(path, backend="eager", context_length=128).complete(prompt, params)
    assert long.token_ids == Engine.load(folder, dtype="float16", backend="eager",
                                         context_length=128).complete(prompt, params).token_ids


def test_a_phi3_gguf_repository_is_listed_as_runnable(tmp_path, monkeypatch):
    from checkpoints import make_checkpoint
    from hf_cache import add_to_cache, use_offline_cache

    from solo.model import store

    cache = tmp_path / "hub"
    cache.mkdir()
    use_offline_cache(cache, monkeypatch)
    files = tmp_path / "phi3-gguf"
    files.mkdir()
    write_gguf_from_hf(make_checkpoint(tmp_path / "phi3", "phi3", dtype=torch.float16), files / "tiny-phi3-F16.gguf",
                       "F16")
    add_to_cache(cache, "tiny/phi3-GGUF", files)
    split = tmp_path / "split"
    split.mkdir()
    for part in ("tiny-00001-of-00002.gguf", "tiny-00002-of-00002.gguf"):
        (split / part).write_bytes((files / "tiny-phi3-F16.gguf").read_bytes())
    add_to_cache(cache, "tiny/split-GGUF", split)
    phi3, parts = store.list_models()
    assert phi3.supported and phi3.architecture == "gguf:phi3"
    assert not parts.supported and "parts of a split file; merge them" in parts.reason  # as solo run refuses it


def test_stale_conversions_are_pruned(gguf_dir, tmp_path, monkeypatch, capsys):
    # A changed file converts again and its old folder goes; solo rm of a GGUF repository frees its conversions.
    import os

    from hf_cache import add_to_cache, use_offline_cache

    from solo.model.hub import resolve_model_dir

    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))
    converted = tmp_path / "cache" / "gguf"
    path = tmp_path / "tiny.gguf"
    path.write_bytes(gguf_dir["Q8_0"].read_bytes())
    first = resolve_model_dir(str(path))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # changed since
    second = resolve_model_dir(str(path))
    assert second != first and not first.exists() and [p.name for p in converted.iterdir()] == [second.name]
    # Never pruned: a conversion being written (another process), one whose file cannot be seen now (an
    # unmounted drive: not a file solo rm deleted).
    for name, file in ((".converting-abc123", path), ("elsewhere-0123456789abcdef", tmp_path / "gone" / "x.gguf")):
        (converted / name).mkdir()
        (converted / name / "gguf_source.json").write_text(json.dumps({"file": str(file)}))
    hub = tmp_path / "hub"
    hub.mkdir()
    use_offline_cache(hub, monkeypatch)
    files = tmp_path / "repo"
    files.mkdir()
    (files / "tiny-F16.gguf").write_bytes(gguf_dir["F16"].read_bytes())
    add_to_cache(hub, "someone/tiny-GGUF", files)
    from_hub = resolve_model_dir("someone/tiny-GGUF")
    assert from_hub.is_dir()
    assert main(["rm", "someone/tiny-GGUF"]) == 0
    assert not from_hub.exists() and second.exists()  # the local file is still there: its conversion stays
    assert (converted / ".converting-abc123").exists() and (converted / "elsewhere-0123456789abcdef").exists()


_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize("arch, rope", [
    # Llama 3.1's edges and context (one frequency of the tiny head inside the band); a 16-token original
    # context (one in the band, edges not Llama 3.1's); 64 (two in the band: the edges are fitted).
    ("llama", {**_LLAMA3, "original_max_position_embeddings": 8192}),
    ("llama", {**_LLAMA3, "original_max_position_embeddings": 16}),
    ("llama", {**_LLAMA3, "factor": 32.0, "original_max_position_embeddings": 64}),
    ("llama", {"rope_type": "linear", "factor": 2.0}),
    ("llama", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    ("qwen3", {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64, "beta_fast": 16.0,
               "beta_slow": 2.0}),
    ("llama", {"rope_type": "yarn", "factor": 2.0}),  # no original context in the file: the trained one
], ids=["llama3", "llama3-16", "llama3-64-fitted", "linear", "yarn", "qwen3-yarn-betas", "yarn-no-original"])
def test_gguf_keeps_the_rope_scaling(tmp_path, arch, rope):
    # From a break test: transformers' GGUF reader maps neither the rope.scaling.* keys nor Llama 3's rope_freqs
    # tensor, so such files ran with unscaled RoPE (other tokens from the first positions on), without a word.
    from checkpoints import make_checkpoint

    from solo.model.rope import rope_inv_freq

    folder = make_checkpoint(tmp_path / "hf", arch, rope_parameters={"rope_theta": 10000.0, **rope})
    path = write_gguf_from_hf(folder, tmp_path / f"tiny-{arch}-F32.gguf", "F32")
    reference, engine = Engine.load(folder, backend="eager"), Engine.load(path, backend="eager")
    assert engine.config.rope.rope_type == rope["rope_type"]
    head_dim = reference.config.head_dim
    torch.testing.assert_close(rope_inv_freq(engine.config.rope, head_dim),
                               rope_inv_freq(reference.config.rope, head_dim), rtol=1e-6, atol=0)
    if rope["rope_type"] != "llama3":  # (llama3's edges are read back from float32 factors: equal up to rounding)
        assert engine.config.rope == reference.config.rope
    long = "The quick brown fox jumps over the lazy dog. " * 4  # past a 16- or 32-token original context
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    assert engine.complete(long, params).token_ids == reference.complete(long, params).token_ids


def test_gguf_rope_freqs_that_are_not_llama3s_are_refused(tmp_path):
    from checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "hf", "llama")

    def odd_factors(writer):  # a factor per frequency, but falling: no Llama 3 bands make them
        import numpy as np

        writer.add_tensor("rope_freqs.weight", np.array([4.0, 3.0, 2.0, 1.0, 1.5, 1.0, 1.0, 1.0], dtype=np.float32))

    path = write_gguf_from_hf(folder, tmp_path / "tiny-odd-F32.gguf", "F32", metadata=odd_factors)
    with pytest.raises(SoloError, match="rope_freqs tensor is not Llama 3's RoPE scaling"):
        Engine.load(path, backend="eager")


def test_an_older_conversion_gains_the_rope_scaling(tmp_path, capsys):
    # Folders converted before Solo read the scaling (format 4) are brought up to date in place, not run unscaled.
    from checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "hf", "llama", rope_parameters={"rope_theta": 10000.0, "rope_type": "linear",
                                                                        "factor": 2.0})
    path = write_gguf_from_hf(folder, tmp_path / "tiny-linear-F32.gguf", "F32")
    converted = Engine.load(path, backend="eager").model_dir
    record_path, config_path = converted / "gguf_source.json", converted / "config.json"
    config = json.loads(config_path.read_text())
    config["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}  # what format 4 wrote
    config_path.write_text(json.dumps(config))
    record_path.write_text(json.dumps({**json.loads(record_path.read_text()), "format": 4}))
    engine = Engine.load(path, backend="eager")
    assert engine.model_dir == converted and engine.config.rope.rope_type == "linear"
    assert json.loads(record_path.read_text())["format"] == 5


def test_gemma3_gguf_keeps_the_global_rope_scaling_and_the_layer_pattern(tmp_path):
    # transformers' GGUF reader drops gemma3.rope.scaling.*; llama.cpp's layout: five sliding layers, then a
    # global one, every norm stored as 1 + w.
    from checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "gemma3", "gemma3", dtype=torch.float16, num_hidden_layers=6,
                             layer_types=["sliding_attention"] * 5 + ["full_attention"])
    path = write_gguf_from_hf(folder, tmp_path / "tiny-gemma3-F16.gguf", "F16")
    reference = Engine.load(folder, dtype="float16", backend="eager")
    engine = Engine.load(path, backend="eager")
    assert engine.config.architecture == "Gemma3ForCausalLM"
    assert engine.config.rope_tables == reference.config.rope_tables
    assert engine.config.rope.rope_type == "linear" and engine.config.rope.factor == 8.0
    assert engine.config.layer_sliding_windows == reference.config.layer_sliding_windows == (8,) * 5 + (None,)
    assert engine.config.attn_scale == reference.config.attn_scale
    assert _tokens(engine) == _tokens(reference)


def test_conversions_are_listed_and_removed(gguf_dir, tmp_path, monkeypatch, capsys):
    # Converted copies (several times a quantized file's size) are Solo's disk use: `solo list` shows them, with the
    # ones whose file is gone, and `solo rm FILE.gguf` deletes them (never the file).
    import shutil

    from solo.model.gguf import list_conversions

    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty Hugging Face cache
    kept, gone = tmp_path / "kept.gguf", tmp_path / "gone.gguf"
    shutil.copy(gguf_dir["Q8_0"], kept)
    shutil.copy(gguf_dir["Q4_0"], gone)
    for file in (kept, gone):
        assert main(["run", str(file), "--prompt", PROMPT, "--max-tokens", "1"]) == 0
    gone.unlink()
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert f"{kept}\n" in out and f"{gone}  (source gone)" in out and "solo rm FILE.gguf" in out
    assert main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["models"] == [] and listed["interrupted_downloads"] == []
    assert sorted((c["source"], c["source_exists"]) for c in listed["gguf_conversions"]) == [
        (str(gone), False), (str(kept), True)]
    assert main(["rm", str(gone)]) == 0
    assert "deleted Solo's conversion of" in capsys.readouterr().out
    assert [c.source for c in list_conversions()] == [kept]
    assert main(["rm", str(gone)]) == 2  # nothing left of it
    assert "holds no conversion" in capsys.readouterr().err
    assert main(["rm", str(kept), "--revision", "main"]) == 2
    # A read-only cache (from a trial: "deleted ... freed" with the folder still there).
    with monkeypatch.context() as readonly:
        def refuse(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
            raise OSError(30, "Read-only file system", str(path))

        readonly.setattr(shutil, "rmtree", refuse)
        assert main(["rm", str(kept)]) == 2
        assert "could not delete Solo's conversion of" in capsys.readouterr().err
    assert [c.source for c in list_conversions()] == [kept]
    assert main(["rm", str(kept)]) == 0 and kept.is_file() and list_conversions() == []
    # Converted under one spelling of the path, removed under another.
    (tmp_path / "sub").mkdir()
    assert main(["run", str(tmp_path / "sub" / ".." / "kept.gguf"), "--prompt", PROMPT, "--max-tokens", "1"]) == 0
    assert main(["rm", str(kept)]) == 0 and list_conversions() == []
    # A name with a newline is one escaped line (from a break test: it spilled over two lines).
    odd = tmp_path / "two\nlines.gguf"
    shutil.copy(gguf_dir["Q8_0"], odd)
    assert main(["run", str(odd), "--prompt", PROMPT, "--max-tokens", "1"]) == 0
    capsys.readouterr()
    assert main(["list"]) == 0
    assert f"$'{tmp_path}/two\\nlines.gguf'\n" in capsys.readouterr().out
    assert main(["rm", str(odd)]) == 0
    assert f"conversion of $'{tmp_path}/two\\nlines.gguf' (" in capsys.readouterr().out  # (one line too)


def test_a_gguf_without_a_tokenizer_is_refused_before_converting(tiny_llama, tmp_path, capsys):
    path = write_gguf_from_hf(tiny_llama, tmp_path / "no-tokenizer.gguf", "F16", tokenizer=False)
    assert main(["run", str(path), "--prompt", PROMPT]) == 2
    err = capsys.readouterr().err
    assert "carries no tokenizer (no tokenizer.ggml.tokens field)" in err and "Traceback" not in err


def test_end_of_turn_tokens_and_sampling_defaults_are_the_files(tiny_llama, tmp_path, monkeypatch):
    # llama.cpp stops on every end-of-generation token (eos, eot, eom, and end-of-turn markers found by their
    # text) and samples with the file's general.sampling.* defaults; the converted folder kept eos alone and no
    # sampling values, so a chat reply ran past <|im_end|> and a model that asks for temperature 0.7 decoded
    # greedily.
    from solo.errors import SoloWarning

    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))

    def metadata(writer) -> None:  # noqa: ANN001
        writer.add_eot_token_id(3)  # (a file's own eot id, whatever its text)
        writer.add_eom_token_id(2)  # = eos: counted once
        writer.add_sampling_temp(0.7)
        writer.add_sampling_top_k(20)
        writer.add_sampling_top_p(0.8)
        writer.add_sampling_min_p(0.05)
        writer.add_sampling_penalty_repeat(1.1)
        writer.add_sampling_mirostat(2)

    path = write_gguf_from_hf(tiny_llama, tmp_path / "tiny-eot.gguf", "F16", metadata=metadata)
    with pytest.warns(SoloWarning, match="^tiny-eot.gguf's sampling defaults: mirostat 2, which Solo does not run"):
        engine = Engine.load(path, backend="eager")
    plain = Engine.load(write_gguf_from_hf(tiny_llama, tmp_path / "tiny-plain.gguf", "F16"), backend="eager")
    assert plain.eos_ids == {2, 4}  # </s>, and <|im_end|> by its text
    assert engine.eos_ids == {2, 3, 4}
    d = engine.defaults
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.repetition_penalty) == (0.7, 20, 0.8, 0.05, 1.1)
    assert plain.defaults.temperature is None and plain.defaults.top_k is None
    result = engine.complete([{"role": "user", "content": "hi"}], {"max_tokens": 8, "logit_bias": {4: 100}})
    assert result.finish_reason == "stop" and result.token_ids == [4]


def test_out_of_range_sampling_defaults_are_left_out(tiny_llama, tmp_path, monkeypatch):
    # The file loaded before its defaults were read: one out of Solo's range must not make it unloadable.
    from solo.errors import SoloWarning

    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))

    def metadata(writer) -> None:  # noqa: ANN001
        writer.add_sampling_temp(-1.0)  # llama.cpp's greedy
        writer.add_sampling_top_p(0.0)
        writer.add_sampling_top_k(40)

    path = write_gguf_from_hf(tiny_llama, tmp_path / "tiny-odd.gguf", "F16", metadata=metadata)
    with pytest.warns(SoloWarning, match="^tiny-odd.gguf's sampling defaults: top_p 0 is out of range, left out"):
        engine = Engine.load(path, backend="eager")
    assert (engine.defaults.temperature, engine.defaults.top_p, engine.defaults.top_k) == (0.0, None, 40)


def test_a_folder_converted_by_an_older_solo_is_brought_up_to_date(tiny_llama, tmp_path, monkeypatch):
    # A format-1 folder (no end-of-turn tokens, no sampling defaults) gains them in place: converting a large
    # file again would take minutes and its size in disk once more.
    from solo.model.gguf import gguf_to_folder

    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf_from_hf(tiny_llama, tmp_path / "tiny-old.gguf", "F16",
                              metadata=lambda writer: writer.add_sampling_temp(0.6))
    folder = gguf_to_folder(path)
    record = json.loads((folder / "gguf_source.json").read_text())
    assert record["format"] == 5
    del record["format"]
    (folder / "gguf_source.json").write_text(json.dumps(record))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    weights = (folder / "model.safetensors").stat().st_mtime_ns
    said = []
    assert gguf_to_folder(path, log=said.append) == folder
    assert said == ["updated Solo's conversion of tiny-old.gguf to what a conversion writes now (the file's "
                    "end-of-turn tokens and sampling defaults), as llama.cpp reads them"]  # (a BPE vocabulary)
    assert json.loads((folder / "generation_config.json").read_text()) == {
        "bos_token_id": 1, "eos_token_id": [2, 4], "temperature": 0.6}
    assert json.loads((folder / "gguf_source.json").read_text())["format"] == 5
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights  # not converted again
    said.clear()
    gguf_to_folder(path, log=said.append)
    assert said == []  # (once)


def test_a_special_token_id_outside_the_vocabulary_is_one_clear_line(tiny_llama, tmp_path, capsys):
    # (transformers' GGUF tokenizer reader failed on it with a bare IndexError)
    path = write_gguf_from_hf(tiny_llama, tmp_path / "bad-ids.gguf", "F16",
                              metadata=lambda writer: writer.add_pad_token_id(10**6))
    assert main(["run", str(path), "--prompt", PROMPT]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.ggml.padding_token_id is 1000000, outside its" in err and "Traceback" not in err


def test_an_architecture_solo_does_not_run_is_named_as_gguf_names_them(tiny_llama, tmp_path, monkeypatch, capsys):
    from solo.errors import UnsupportedArchitectureError
    from solo.model import config as config_module
    from solo.model.store import GGUF_ARCHITECTURES

    def refuse(raw):
        raise UnsupportedArchitectureError("unsupported architecture model_type 'mamba'")

    path = write_gguf_from_hf(tiny_llama, tmp_path / "other.gguf", "F16")
    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(config_module.ModelConfig, "from_dict", staticmethod(refuse))
    assert main(["run", str(path), "--prompt", PROMPT]) == 2
    err = capsys.readouterr().err
    assert "other.gguf: GGUF architecture 'llama' is not one Solo runs" in err
    assert f"Solo runs GGUF files of {', '.join(GGUF_ARCHITECTURES)} models" in err and "Traceback" not in err


def test_a_qwen3_gguf_keeps_its_head_size(tmp_path):
    # Qwen3 files give a head's size as key_length, which transformers' GGUF reader does not map for qwen3: the
    # conversion took its config default (128) and the file was refused as not matching its own weights.
    from checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "qwen3", "qwen3", head_dim=32)  # (not hidden / heads: 16)
    path = write_gguf_from_hf(folder, tmp_path / "tiny-qwen3-F32.gguf", "F32")
    assert _tokens(Engine.load(str(path))) == _tokens(Engine.load(str(folder)))


def test_a_sentencepiece_gguf_prefixes_a_space_to_every_text(shared_hf, tmp_path):
    # As sentencepiece and llama.cpp: " one" is "▁" + "▁one" (29871, 697). transformers' GGUF tokenizer gave
    # [697], so a prompt starting with whitespace (indented code) lost a space (a trial found it).
    import sentencepiece
    from checkpoints import hf_config, write_tokenizer
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from solo.model.gguf import gguf_to_folder

    model = sentencepiece.SentencePieceProcessor(model_file=str(shared_hf / "Llama-2-7b-hf" / "tokenizer.model"))
    folder = tmp_path / "llama"
    write_tokenizer(folder)  # (the weights' vocabulary is the SentencePiece model's)
    AutoModelForCausalLM.from_config(hf_config("llama", model.vocab_size())).save_pretrained(folder)
    path = write_gguf_from_hf(folder, tmp_path / "tiny-spm-F16.gguf", "F16", spm=shared_hf / "Llama-2-7b-hf")
    tokenizer = Tokenizer.from_file(str(gguf_to_folder(path) / "tokenizer.json"))
    for text in (" one", "  two spaces", "    return x", "Hello world", "a\n  b", "def f():\n    return 1"):
        assert tokenizer.encode(text, add_special_tokens=False).ids == model.encode(text), text
    assert tokenizer.decode(model.encode("  two spaces")) == "  two spaces"


def test_a_phi3_gguf_tokenizes_a_chat_prompt_as_its_own_tokenizer(shared_hf, tmp_path):
    # Phi-3's special tokens take the blanks after them (rstrip), in its tokenizer.json and in llama.cpp; without
    # it, "<|user|>\nhi" gained a "▁" and a newline token after each marker.
    from checkpoints import hf_config, write_tokenizer
    from gguf.vocab import SentencePieceVocab
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from solo.model.gguf import gguf_to_folder

    phi = shared_hf / "Phi-3.5-mini-instruct"
    vocab = sum(1 for _ in SentencePieceVocab(phi).all_tokens())
    folder = tmp_path / "phi3"
    write_tokenizer(folder)
    AutoModelForCausalLM.from_config(hf_config("phi3", vocab)).save_pretrained(folder)
    path = write_gguf_from_hf(folder, tmp_path / "tiny-phi3-spm-F16.gguf", "F16", spm=phi)
    ours = Tokenizer.from_file(str(gguf_to_folder(path) / "tokenizer.json"))
    theirs = Tokenizer.from_file(str(phi / "tokenizer.json"))
    prompt = "<|system|>\nBe brief.<|end|>\n<|user|>\n  def f():\n    return 1<|end|>\n<|assistant|>\n"
    assert ours.encode(prompt, add_special_tokens=False).ids == theirs.encode(prompt, add_special_tokens=False).ids


def test_a_conversion_left_by_a_process_that_is_gone_is_pruned(tmp_path):
    # A server stopped mid-load exits without waiting for a conversion, whose temporary folder (the size of the
    # weights) stayed behind for good.
    import os
    import socket
    import subprocess
    import sys

    from solo.model.gguf import _prune_abandoned_conversions

    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    host = socket.gethostname()
    folders = [tmp_path / f".converting-{gone}@{host}@abc", tmp_path / f".converting-{os.getpid()}@{host}@def",
               tmp_path / f".converting-{gone}@another-host@ghi",  # (a shared cache: another host's, maybe live)
               tmp_path / ".converting-jkl",  # (an older Solo's, without a pid: maybe live)
               tmp_path / f".converting-{gone}@old-container@mno", tmp_path / ".converting-pqr"]  # (unchanged 7 h)
    for folder in folders:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x")
    # Two minutes old (younger, a folder without a lock may be a conversion that has not taken it yet); the last two
    # 7 hours (another host's or an older Solo's leftover stayed for good).
    for i, folder in enumerate(folders):
        when = time.time() - (7 * 3600 if i >= 4 else 120)
        os.utime(folder / "model.safetensors", (when, when))
        os.utime(folder, (when, when))
    _prune_abandoned_conversions(tmp_path)
    assert [f.exists() for f in folders] == [False, True, True, True, False, False]


def test_a_conversions_lock_says_whether_it_runs_whatever_its_pid_says(tmp_path):
    # A container's entrypoint restarted as PID 1 saw its killed run's PID 1 alive and kept its leftover (every retry
    # then failed for room); a live conversion in another PID namespace (a container on the host's network: same host
    # name) has a PID that is dead here, and was deleted mid-way.
    import fcntl
    import os
    import socket

    from solo.model.gguf import _ALIVE_LOCK, _prune_abandoned_conversions

    host = socket.gethostname()
    killed = tmp_path / f".converting-{os.getpid()}@{host}@abc"  # (its PID alive: this process's)
    running = tmp_path / f".converting-999999999@{host}@def"  # (its PID not one here)
    for folder in (killed, running):
        folder.mkdir()
        (folder / _ALIVE_LOCK).write_text("")
    with open(running / _ALIVE_LOCK) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        _prune_abandoned_conversions(tmp_path)
        assert not killed.exists() and running.exists()
    _prune_abandoned_conversions(tmp_path)  # (its converter ended: the lock is free)
    assert not running.exists()


def test_abandoned_conversions_are_pruned_before_the_free_space_check(gguf_dir, tmp_path, monkeypatch):
    # A 500 MB leftover of a killed conversion made the retry fail for want of room, every time: the prune ran after
    # the free-space check, and not at all when the file was already converted.
    import shutil
    import socket

    import solo.model.gguf as gguf

    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))
    leftover = tmp_path / "cache" / "gguf" / f".converting-999999999@{socket.gethostname()}@x"
    leftover.mkdir(parents=True)
    (leftover / gguf._ALIVE_LOCK).write_text("")  # (its converter gone: the lock free)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(gguf.shutil, "disk_usage", lambda path: usage._replace(free=0 if leftover.exists() else
                                                                               usage.free))
    convert, seen = gguf._convert, []

    def convert_and_look(reader, src, tmp, *args):
        seen.append(gguf._lock_says_abandoned(tmp))  # (while it runs, its lock is held)
        return convert(reader, src, tmp, *args)

    monkeypatch.setattr(gguf, "_convert", convert_and_look)
    folder = Engine.load(gguf_dir["F16"], backend="eager").model_dir
    assert not leftover.exists() and folder.is_dir() and seen == [False]
    assert not (folder / gguf._ALIVE_LOCK).exists()
    assert gguf._ALIVE_LOCK not in json.loads((folder / "gguf_source.json").read_text())["files"]
    leftover.mkdir()
    (leftover / gguf._ALIVE_LOCK).write_text("")
    Engine.load(gguf_dir["F16"], backend="eager")  # (already converted: pruned all the same)
    assert not leftover.exists()


def test_a_conversion_that_lost_a_file_is_converted_again(gguf_dir, tmp_path, monkeypatch, capsys):
    # From a break test: a conversion folder whose model.safetensors was deleted was reused, and the load then
    # asked to "download the weights too".
    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))
    folder = Engine.load(gguf_dir["F16"], backend="eager").model_dir
    assert "chat_template.jinja" in json.loads((folder / "gguf_source.json").read_text())["files"]
    for lost in ("model.safetensors", "chat_template.jinja", "generation_config.json"):
        (folder / lost).unlink()  # (without its chat template the folder ran without one, silently)
        engine = Engine.load(gguf_dir["F16"], backend="eager")
        assert engine.model_dir == folder and (folder / lost).is_file()
        assert "lacks some of its files; converting it again" in capsys.readouterr().err


@pytest.mark.parametrize("key, match", [("llama.attention.head_count", "metadata is damaged"),
                                        ("llama.attention.head_count=3", "metadata is damaged"),  # (64 % 3)
                                        ("llama.attention.head_count_kv", "num_key_value_heads = 0"),
                                        ("llama.rope.dimension_count", "metadata is damaged"),
                                        ("llama.context_length", "max_position_embeddings = 0; it must be from 2 to")])
def test_a_zero_size_in_the_metadata_is_a_clear_error(tiny_llama, tmp_path, monkeypatch, key, match):
    # A head count of 0 raised ZeroDivisionError inside transformers' reader; a context of 0 loaded and then
    # refused every request ("lower it below 0"), and `solo serve` failed after it started listening.
    from solo.errors import CheckpointError

    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "cache"))

    def metadata(writer) -> None:  # noqa: ANN001
        name, _, value = key.partition("=")
        writer.kv_data[0][name].value = int(value or 0)

    path = write_gguf_from_hf(tiny_llama, tmp_path / "tiny-zero.gguf", "F16", metadata=metadata)
    with pytest.raises(CheckpointError, match=f"^tiny-zero.gguf: .*{match}"):
        Engine.load(path, backend="eager")


def test_a_conversion_is_never_found_with_its_lock_free_or_missing_while_it_starts(tmp_path):
    # The lock file was created, then locked: a prune in between found it free and deleted the live conversion; and
    # one without a lock file yet (in another PID namespace: a PID dead here) was judged by its PID.
    import socket

    from solo.model.gguf import _ALIVE_LOCK, _hold_alive_lock, _lock_says_abandoned, _prune_abandoned_conversions

    starting = tmp_path / f".converting-999999999@{socket.gethostname()}@abc"
    starting.mkdir()
    _prune_abandoned_conversions(tmp_path)
    assert starting.exists()  # (no lock yet, and young)
    handle = _hold_alive_lock(starting)
    try:
        assert [p.name for p in starting.iterdir()] == [_ALIVE_LOCK] and _lock_says_abandoned(starting) is False
        _prune_abandoned_conversions(tmp_path)
        assert starting.exists()
    finally:
        handle.close()
    assert _lock_says_abandoned(starting) is True
