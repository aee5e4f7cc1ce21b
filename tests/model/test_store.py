"""solo pull / list / rm against a local Hugging Face cache folder (laid out as huggingface_hub lays it out).

No test touches the network: the Hub is switched to offline mode, so `pull` of a cached model resolves from
the cache, and one that is not cached fails with the one-line message.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hf_cache import COMMIT, add_to_cache, use_offline_cache

from solo.cli import main
from solo.model import store


@pytest.fixture()
def cache(tmp_path, monkeypatch, tiny_llama):
    cache = tmp_path / "hub"
    cache.mkdir()
    use_offline_cache(cache, monkeypatch)
    add_to_cache(cache, "tiny/llama", tiny_llama)
    gptq = tmp_path / "gptq"
    shutil.copytree(tiny_llama, gptq)
    config = json.loads((gptq / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (gptq / "config.json").write_text(json.dumps(config))
    add_to_cache(cache, "someone/llama-gptq", gptq, commit="b" * 40)
    return cache


def test_list_shows_size_architecture_and_support(cache, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SOLO_CACHE_DIR", str(tmp_path / "solo-cache"))  # no GGUF conversions
    models = store.list_models()
    assert [m.repo_id for m in models] == ["someone/llama-gptq", "tiny/llama"]
    tiny = models[1]
    assert tiny.supported and tiny.architecture == "LlamaForCausalLM" and tiny.revision == "main"
    assert tiny.size_bytes == sum(p.stat().st_size for p in Path(tiny.path).iterdir())
    assert not models[0].supported and "GPTQ" in models[0].reason
    assert main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["MODEL", "REVISION", "SIZE", "ARCHITECTURE"]
    assert out[2].startswith("tiny/llama") and out[2].rstrip().endswith("yes")
    assert main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["models"][1]["repo_id"] == "tiny/llama"
    assert listed["interrupted_downloads"] == [] and listed["gguf_conversions"] == []


def test_pull_of_a_cached_model_and_a_missing_one_offline(cache, capsys):
    folder = store.pull("tiny/llama")
    assert folder == cache / "models--tiny--llama" / "snapshots" / COMMIT
    assert main(["pull", "tiny/llama"]) == 0
    out, err = capsys.readouterr()
    assert "LlamaForCausalLM" in out and "ready: solo run tiny/llama" in out
    assert "offline (HF_HUB_OFFLINE is set): nothing was downloaded" in err
    assert main(["pull", "nobody/nothing"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be reached" in err and "resumes" in err
    # Cached, but not at that revision: said so, with the revisions that are cached.
    assert main(["run", "tiny/llama", "--revision", "v2", "-p", "x"]) == 2
    err = capsys.readouterr().err
    assert "revision 'v2' of 'tiny/llama' is not in the Hugging Face cache (cached: main)" in err
    assert main(["pull", "tiny/llama", "--revision", "v2"]) == 2  # (it said "not in the cache")
    assert "tiny/llama is cached at main only, not at v2; pass --revision main" in capsys.readouterr().err


def test_rm_deletes_and_reports(cache, capsys):
    assert main(["rm", "tiny/llama", "--revision", "nope"]) == 2
    assert "no cached revision 'nope'" in capsys.readouterr().err
    assert main(["rm", "tiny/llama"]) == 0
    assert "deleted tiny/llama" in capsys.readouterr().out
    assert [m.repo_id for m in store.list_models()] == ["someone/llama-gptq"]
    assert main(["rm", "tiny/llama"]) == 2
    assert "not in the Hugging Face cache" in capsys.readouterr().err


def test_pull_and_rm_of_a_local_folder_say_it_is_not_theirs(cache, tiny_llama, capsys, monkeypatch):
    # A new user's trial: pull said only "not a Hugging Face Hub id", rm "not in the Hugging Face cache".
    assert main(["pull", str(tiny_llama)]) == 2
    assert "is a local path, which needs no pull: give it to solo run / serve as it is" in capsys.readouterr().err
    assert main(["rm", str(tiny_llama)]) == 2
    assert "a local folder or file is not Solo's to remove" in capsys.readouterr().err
    assert tiny_llama.is_dir()
    # A relative path shaped as a Hub id is local first, as solo run takes it.
    monkeypatch.chdir(tiny_llama.parent.parent)
    relative = f"{tiny_llama.parent.name}/{tiny_llama.name}"
    assert main(["pull", relative]) == 2
    assert f"{relative!r} is a local path" in capsys.readouterr().err


def test_rm_that_cannot_delete_says_so(cache, capsys, monkeypatch):
    # From a trial on a read-only cache: a traceback for a healthy repository, and "deleted" (exit 0) for a damaged
    # one that was still there (its folder removed with errors ignored).
    import os

    def read_only(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        raise OSError(30, "Read-only file system", str(path))

    for blob in (cache / "models--someone--llama-gptq" / "blobs").iterdir():
        blob.unlink()  # (damaged: its blobs gone behind their links)
    monkeypatch.setattr(os, "unlink", read_only)
    monkeypatch.setattr(os, "remove", read_only)
    monkeypatch.setattr(shutil, "rmtree", read_only)
    assert main(["rm", "tiny/llama"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not delete tiny/llama" in err and "Read-only file system" in err
    assert main(["rm", "someone/llama-gptq"]) == 2
    assert "could not delete someone/llama-gptq" in capsys.readouterr().err
    assert (cache / "models--someone--llama-gptq").exists()


def test_interrupted_downloads_are_listed_and_removed(cache, capsys):
    # huggingface_hub writes a file being downloaded as blobs/<hash>.incomplete; scan_cache_dir does not count it,
    # and a download interrupted before any file completed leaves a repo folder it does not list at all.
    (cache / "models--tiny--llama" / "blobs" / "f00.incomplete").write_bytes(b"x" * 1500)
    partial = cache / "models--org--partial" / "blobs"
    partial.mkdir(parents=True)
    (partial / "a.incomplete").write_bytes(b"y" * 2500)
    assert store.partial_downloads() == {"org/partial": 2500, "tiny/llama": 1500}
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert "org/partial: an interrupted download holds 2.5 KB; `solo pull org/partial` resumes it, " \
           "`solo rm org/partial` deletes it" in err
    assert "tiny/llama: an interrupted download holds 1.5 KB" in err and "org/partial" not in out
    assert main(["list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["interrupted_downloads"] == [
        {"repo_id": "org/partial", "size_bytes": 2500}, {"repo_id": "tiny/llama", "size_bytes": 1500}]
    assert main(["rm", "org/partial"]) == 0
    assert "deleted org/partial (2.5 KB freed)" in capsys.readouterr().out
    assert not partial.parent.exists()  # the whole folder: no empty blobs folder left
    # Removing every revision of a repo removes its interrupted downloads too, counted in what was freed.
    size = store.list_models()[1].size_bytes
    assert main(["rm", "tiny/llama"]) == 0
    assert f"({store.human_size(size + 1500)} freed)" in capsys.readouterr().out
    assert store.partial_downloads() == {}


def test_rm_of_a_mirror_deletes_only_the_named_repo(cache, tiny_llama, capsys):
    # A mirror holds the same commit as the original: huggingface_hub's delete_revisions, given bare hashes,
    # would delete it wherever it is cached.
    add_to_cache(cache, "mirror/llama", tiny_llama)
    assert main(["rm", "mirror/llama", "--revision", COMMIT[:8]]) == 0
    assert "deleted mirror/llama" in capsys.readouterr().out
    assert [m.repo_id for m in store.list_models()] == ["someone/llama-gptq", "tiny/llama"]
    add_to_cache(cache, "mirror/llama", tiny_llama)
    assert main(["rm", "tiny/llama"]) == 0
    assert [m.repo_id for m in store.list_models()] == ["mirror/llama", "someone/llama-gptq"]
    assert store.pull("mirror/llama").is_dir()


def test_empty_cache(tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "none"))
    assert store.list_models() == []
    assert main(["list"]) == 0 and "solo pull ORG/NAME" in capsys.readouterr().err


def test_human_size():
    assert [store.human_size(n) for n in (5, 1500, 31_000_000, 4_200_000_000)] == ["5 B", "1.5 KB", "31.0 MB",
                                                                                  "4.2 GB"]


def test_a_model_without_tokenizer_files_is_not_listed_as_runnable(cache, tmp_path, tiny_llama, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_llama, bare)
    for name in ("tokenizer.json", "tokenizer.model", "vocab.json"):
        (bare / name).unlink(missing_ok=True)
    add_to_cache(cache, "tiny/no-tokenizer", bare, commit="c" * 40)
    model = next(m for m in store.list_models() if m.repo_id == "tiny/no-tokenizer")
    assert not model.supported and "no tokenizer" in model.reason
    assert main(["pull", "tiny/no-tokenizer"]) == 0
    assert "ready: solo run" not in capsys.readouterr().out


def test_a_cached_commit_needs_no_hub_call(cache, monkeypatch):
    # A commit's files never change: online but unreachable, asking the Hub for its file list retried for ~25 s.
    import huggingface_hub
    import huggingface_hub.constants as hf_constants

    from solo.model.hub import resolve_model_dir

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    real = huggingface_hub.snapshot_download

    def local_only(*args, **kwargs):
        if not kwargs.get("local_files_only"):
            raise AssertionError("the Hub was asked")
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", local_only)
    assert resolve_model_dir("tiny/llama", revision=COMMIT).name == COMMIT
    # A snapshot whose download stopped part-way: the Hub is asked (it resumes it).
    (cache / "models--tiny--llama" / "snapshots" / COMMIT / "tokenizer.json").unlink()
    (cache / "models--tiny--llama" / "blobs" / "deadbeef.incomplete").write_bytes(b"x")
    with pytest.raises(AssertionError, match="the Hub was asked"):
        resolve_model_dir("tiny/llama", revision=COMMIT)


def test_an_interrupted_download_is_named_offline(cache, capsys):
    # Offline, huggingface_hub returns the partial snapshot: the error says so instead of naming a missing file.
    (cache / "models--tiny--llama" / "blobs" / "deadbeef.incomplete").write_bytes(b"x" * 2000)
    assert main(["run", "tiny/llama", "-p", "x", "--max-tokens", "2"]) == 0  # complete: partial files beside it
    (cache / "models--tiny--llama" / "snapshots" / COMMIT / "model.safetensors").unlink()
    assert main(["run", "tiny/llama", "-p", "x"]) == 2
    err = capsys.readouterr().err
    assert "the download of tiny/llama was interrupted (2.0 KB of partial files" in err
    assert "solo pull tiny/llama" in err


def test_a_missing_gguf_path_is_named_as_a_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "models" / "missing.gguf"), "-p", "x"]) == 2
    assert "GGUF file" in capsys.readouterr().err
    assert main(["run", "models/missing.gguf", "-p", "x"]) == 2  # relative: not taken for a Hub id
    err = capsys.readouterr().err
    assert "GGUF file 'models/missing.gguf' does not exist" in err and "Hub" not in err.split(";")[0]


def test_rm_of_a_tag_deletes_only_that_gguf_file(cache, tmp_path, capsys):
    # As `ollama rm model:tag`: the file `solo run org/name:TAG` picks, not the whole repository.
    files = tmp_path / "gguf-repo"
    files.mkdir()
    (files / "model-Q8_0.gguf").write_bytes(b"q" * 3000)
    (files / "model-BF16.gguf").write_bytes(b"b" * 5000)
    snapshot = add_to_cache(cache, "someone/model-GGUF", files, commit="c" * 40)
    assert main(["rm", "someone/model-GGUF:Q8_0"]) == 0
    assert "deleted someone/model-GGUF:Q8_0 (3.0 KB freed)" in capsys.readouterr().out
    assert sorted(p.name for p in snapshot.iterdir()) == ["model-BF16.gguf"]
    assert len(list((snapshot.parent.parent / "blobs").iterdir())) == 1
    assert main(["rm", "someone/model-GGUF:F16"]) == 2  # F16 is not in BF16
    assert "no cached GGUF file whose name holds 'F16'" in capsys.readouterr().err
    # A snapshot link to a file outside the cache's blobs: the link goes, the file stays.
    mine = tmp_path / "my-Q4_0.gguf"
    mine.write_bytes(b"m" * 100)
    (snapshot / "my-Q4_0.gguf").symlink_to(mine)
    assert main(["rm", "someone/model-GGUF:Q4_0"]) == 0
    assert mine.is_file() and not (snapshot / "my-Q4_0.gguf").exists()


def test_a_damaged_cache_folder_is_listed_apart_and_removed(cache, capsys):
    # A blob deleted behind its snapshot's link: huggingface_hub's scan leaves the repository out (corrupted).
    damaged = cache / "models--tiny--llama"
    for blob in (damaged / "blobs").iterdir():
        blob.unlink()
    refs_only = cache / "models--org--badref" / "refs"
    refs_only.mkdir(parents=True)
    (refs_only / "main").write_text("c" * 40)
    assert store.damaged_repos() == {"org/badref": cache / "models--org--badref", "tiny/llama": damaged}
    for repo, why in (("tiny/llama", "config.json's file is missing"), ("org/badref", "a file or a ref is missing")):
        assert main(["run", repo, "-p", "hi"]) == 2  # named as `solo list` names it, with the same two commands
        assert f"the cached {repo} is damaged ({why}) and the Hub cannot be reached to mend it; `solo pull {repo}` " \
            f"online downloads it again (`solo rm {repo}` deletes it)" in capsys.readouterr().err
    assert main(["pull", "org/badref"]) == 2  # (it said "not in the cache")
    assert "the cached org/badref is damaged (a file or a ref is missing: " in capsys.readouterr().err
    assert main(["pull", "tiny/llama"]) == 2  # (it said "Solo cannot run it: no config.json", exit 0)
    assert "the cached tiny/llama is damaged (config.json's file is missing)" in capsys.readouterr().err
    assert main(["list"]) == 0
    err = capsys.readouterr().err
    assert "tiny/llama: its cache folder is damaged (a file or a ref is missing: " in err
    assert "`solo rm tiny/llama` deletes it, `solo pull tiny/llama` downloads it again" in err
    assert main(["list", "--json"]) == 0
    assert [d["repo_id"] for d in json.loads(capsys.readouterr().out)["damaged"]] == ["org/badref", "tiny/llama"]
    for repo in ("tiny/llama", "org/badref"):
        assert main(["rm", repo]) == 0 and f"deleted {repo}" in capsys.readouterr().out
    assert store.damaged_repos() == {} and not damaged.exists()


def test_revisions_are_named_by_ref_or_a_hash_that_begins_one_commit(cache, tiny_llama, capsys):
    # From a break test: `solo rm --revision ab` deleted every revision whose hash began "ab", and "" deleted them
    # all; `solo run --revision` took only whole hashes though `solo list` shows 12 characters.
    add_to_cache(cache, "acme/pref", tiny_llama, commit="ab1" + "1" * 37, ref="v1")
    add_to_cache(cache, "acme/pref", tiny_llama, commit="ab2" + "2" * 37, ref="main")
    add_to_cache(cache, "acme/pref", tiny_llama, commit="cc3" + "3" * 37, ref="v3")
    for revision, message in (("", "--revision is empty"), ("ab", "no cached revision 'ab'"),
                              ("ab1", "no cached revision 'ab1'")):  # (fewer than 4 characters: no hash)
        assert main(["rm", "acme/pref", "--revision", revision]) == 2
        assert message in capsys.readouterr().err
    (cache / "models--acme--pref" / "refs" / "v3").unlink()  # a commit no ref names: shown by its hash
    listed = {m.revision for m in store.list_models() if m.repo_id == "acme/pref"}
    assert listed == {"v1", "main", "cc3333333333"}
    assert main(["run", "acme/pref", "--revision", "cc3333333333", "-p", "x", "--max-tokens", "1"]) == 0
    capsys.readouterr()
    assert main(["rm", "acme/pref", "--revision", "ab11"]) == 0  # the one commit it begins
    assert {m.revision for m in store.list_models() if m.repo_id == "acme/pref"} == {"main", "cc3333333333"}
    add_to_cache(cache, "acme/pref", tiny_llama, commit="ab1" + "1" * 37, ref="v1")
    assert main(["rm", "acme/pref", "--revision", "ab11"]) == 0
    capsys.readouterr()
    add_to_cache(cache, "acme/pref", tiny_llama, commit="abcd1" + "1" * 35, ref="v1")
    add_to_cache(cache, "acme/pref", tiny_llama, commit="abcd2" + "2" * 35, ref="v2")
    assert main(["rm", "acme/pref", "--revision", "abcd"]) == 2  # two commits begin so: neither is deleted
    assert "begins 2 cached commits of acme/pref (abcd11111111, abcd22222222); give more" in capsys.readouterr().err
    assert len([m for m in store.list_models() if m.repo_id == "acme/pref"]) == 4


def test_odd_configs_and_caches_are_one_line_never_a_traceback(cache, tmp_path, tiny_llama, capsys, monkeypatch):
    # From a break test: a config.json that parses but is not an object, or names its architecture by a number,
    # made tracebacks, and one such model in the cache made `solo list` fail for every model.
    for name, change in (("listed", lambda c: []), ("numbered", lambda c: {**c, "architectures": [5]})):
        folder = tmp_path / name
        shutil.copytree(tiny_llama, folder)
        (folder / "config.json").write_text(json.dumps(change(json.loads((folder / "config.json").read_text()))))
        assert main(["run", str(folder), "-p", "x", "--max-tokens", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "config" in err and "Traceback" not in err
        add_to_cache(cache, f"odd/{name}", folder)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "tiny/llama" in out and "odd/numbered" in out and "odd/listed" in out
    # One class name, not in a list, as transformers takes it.
    named = tmp_path / "named"
    shutil.copytree(tiny_llama, named)
    config = json.loads((named / "config.json").read_text())
    (named / "config.json").write_text(json.dumps({**config, "architectures": "LlamaForCausalLM"}))
    assert main(["run", str(named), "-p", "x", "--max-tokens", "1"]) == 0
    capsys.readouterr()
    # The Hugging Face cache setting pointing at a file.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(blocker))
    for command in (["list"], ["rm", "tiny/llama"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "cannot be read" in err and "HF_HUB_CACHE" in err and err.count("\n") == 1


def test_a_folder_saved_again_over_its_shards_loads_its_one_file(tmp_path, tiny_llama, capsys):
    # transformers' save_pretrained over a sharded folder writes model.safetensors and leaves the old index behind;
    # transformers then reads model.safetensors, and so does Solo (it refused the folder for missing shards).
    folder = tmp_path / "resaved"
    shutil.copytree(tiny_llama, folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    assert main(["run", str(folder), "-p", "x", "--max-tokens", "1"]) == 0
    assert store.inspect_folder(folder)[1]
    (folder / "model.safetensors").unlink()  # now the index is all there is: its shard is missing
    arch, ok, reason, _ = store.inspect_folder(folder)
    assert not ok and "missing shard model-00001-of-00002.safetensors" in reason
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.json").write_text("{}")
    (folder / "model.safetensors.index.json").unlink()
    shutil.copy(tiny_llama / "model.safetensors", folder)
    assert store.inspect_folder(folder)[2].startswith("no tokenizer")
    capsys.readouterr()
    assert main(["run", str(folder), "-p", "x", "--max-tokens", "1"]) == 2
    assert "has vocab.json but no merges.txt" in capsys.readouterr().err


def test_a_cached_model_without_an_organisation_runs(cache, tiny_llama, capsys):
    # From a break test: `solo list` showed a cached "gpt2"-style id (no organisation) as runnable, and `solo run`
    # and `solo pull` refused its name.
    add_to_cache(cache, "tinyllama", tiny_llama)
    assert any(m.repo_id == "tinyllama" and m.supported for m in store.list_models())
    assert main(["run", "tinyllama", "-p", "x", "--max-tokens", "1"]) == 0
    assert main(["pull", "tinyllama"]) == 0
    assert "ready: solo run tinyllama" in capsys.readouterr().out
    assert main(["run", "not-cached-either", "-p", "x"]) == 2  # a bare name not cached: a missing local folder
    assert "model folder or file 'not-cached-either' does not exist" in capsys.readouterr().err


def test_a_repo_of_several_gguf_files_is_listed_with_its_files_and_pulled_by_tag(cache, tmp_path, tiny_llama, capsys):
    # From a break test: `solo list` said "yes" where `solo run ORG/NAME` fails (several files, none the default
    # Q4_K_M), and `solo pull ORG/NAME:TAG` of an uncached tag printed its success line before the error.
    from gguf_files import write_gguf_from_hf

    files = tmp_path / "tiny-gguf"
    files.mkdir()
    for kind in ("F16", "Q8_0"):
        write_gguf_from_hf(tiny_llama, files / f"tiny-{kind}.gguf", kind)
    # A multimodal projector beside them is never the model's file (as llama.cpp's -hf and Ollama pick): it made
    # :F16 ambiguous and counted as one of the files to choose from.
    (files / "mmproj-tiny-F16.gguf").write_bytes(b"GGUF" + bytes(60))
    add_to_cache(cache, "org/tiny-GGUF", files)
    assert main(["list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("org/tiny-GGUF"))
    assert line.rstrip().endswith("yes, naming a file: org/tiny-GGUF:<quantization> of tiny-F16.gguf, tiny-Q8_0.gguf")
    assert main(["pull", "org/tiny-GGUF:Q5_K_M"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Q5_K_M" in err
    assert main(["pull", "org/tiny-GGUF:Q8_0"]) == 0
    assert "ready: solo run org/tiny-GGUF:Q8_0" in capsys.readouterr().out
    from solo.model.hub import pick_gguf

    snapshot = next((cache / "models--org--tiny-GGUF" / "snapshots").iterdir())
    assert pick_gguf(snapshot, "org/tiny-GGUF", "F16").name == "tiny-F16.gguf"
    # Another tag's file whose blob is gone does not make this tag's pull fail (the F16 file is not wanted).
    (snapshot / "tiny-F16.gguf").resolve().unlink()
    assert main(["pull", "org/tiny-GGUF:Q8_0"]) == 0
    assert main(["pull", "org/tiny-GGUF:F16"]) == 2
    assert "damaged (tiny-F16.gguf's file is missing)" in capsys.readouterr().err
    # A config.json nested past Python's recursion limit: listed as not runnable (it was a traceback).
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    _, ok, reason, _ = store.inspect_folder(deep)
    assert not ok and "does not parse" in reason
    projector_only = tmp_path / "projector-only"
    projector_only.mkdir()
    (projector_only / "mmproj-F16.gguf").write_bytes(b"GGUF" + bytes(60))
    _, ok, reason, _ = store.inspect_folder(projector_only)
    assert not ok and "multimodal projectors (mmproj)" in reason


def test_broken_links_are_the_wanted_files_whose_blob_is_gone(tmp_path):
    # Matched by path as huggingface_hub matches its allow_patterns: pull and run agree on what is damaged (pull
    # matched paths, run names, so a Llama 3 repo's original/tokenizer.model made run refuse what pull called ready).
    from solo.model.hub import broken_links

    for name in ("config.json", "original/tokenizer.model", "extra/a.bin", "tokenizer.model", "README.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).symlink_to(tmp_path / "gone")
    assert broken_links(tmp_path, ["*.json", "tokenizer.model", "extra/"]) == [
        "config.json", "extra/a.bin", "tokenizer.model"]
