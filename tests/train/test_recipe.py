"""The recipe end to end at the tiny size: runs, writes a loadable folder, resumes exactly."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from solo.train import cli
from solo.train.trainer import Trainer

TINY = ["--size", "tiny", "--max-files", "12", "--steps", "12", "--precision", "fp32", "--threads", "2"]


def _run(out: Path, run_dir: Path, *extra: str) -> int:
    return cli.main([*TINY, "--out", str(out), "--run-dir", str(run_dir), *extra])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("recipe")
    assert _run(base / "tiny-model", base / "run") == 0
    return base


def test_folder_loads_with_transformers(tiny_run: Path) -> None:
    out = tiny_run / "tiny-model"
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        "training_summary.json",
        "eval_subset.json",
    ):
        assert (out / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    cfg = model.config
    assert cfg.model_type == "llama" and cfg.tie_word_embeddings
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.vocab_size == len(tok) and cfg.bos_token_id == tok.bos_token_id
    weights = load_file(out / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    ids = tok("def fibonacci(n):", return_tensors="pt")["input_ids"]
    assert ids[0, 0].item() == tok.bos_token_id
    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
    assert gen.shape[1] <= ids.shape[1] + 4


def test_summary_and_card(tiny_run: Path) -> None:
    out = tiny_run / "tiny-model"
    s = json.loads((out / "training_summary.json").read_text())
    assert s["training"]["steps"] == 12 and s["training"]["tokens"] == 12 * 4 * 64
    assert s["heldout"]["bits_per_byte"] > 0 and s["xz_heldout"]["concatenated_bits_per_byte"] > 0
    assert len(s["corpus"]["file_list_sha256"]) == 64 and s["corpus"]["python_version"]
    assert [x["prompt"] for x in s["samples"]] == ["def fibonacci(n):", "import os\n", "class Stack:"]
    card = (out / "README.md").read_text()
    for needle in ("PSF", s["corpus"]["file_list_sha256"], "bits per byte", "xz -9e", "chat"):
        assert needle in card
    log = [json.loads(line) for line in (tiny_run / "run" / "train_log.jsonl").read_text().splitlines()]
    assert any("tokens_per_s" in r for r in log) and any("heldout_loss" in r for r in log)


def test_refuses_to_clobber_without_flags(tiny_run: Path) -> None:
    assert _run(tiny_run / "tiny-model", tiny_run / "run") == 2  # a user mistake: exit 2, as `solo`


def test_interrupted_run_resumes_to_identical_weights(tiny_run: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    original = Trainer._train_step
    calls = {"n": 0}

    def crash_after_7(self: Trainer, *args, **kwargs):  # noqa: ANN002, ANN003
        if calls["n"] == 7:
            raise KeyboardInterrupt
        calls["n"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "_train_step", crash_after_7)
    out, run_dir = tiny_run / "resumed-model", tiny_run / "run2"
    assert _run(out, run_dir, "--checkpoint-every-min", "0") == 130  # Ctrl-C: one line, exit status 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("solo train: interrupted; the checkpoint is in") and "--resume" in err[-1]
    assert not out.exists()
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert ckpt["state"]["step"] == 7 and ckpt["data_position"]["next_batch"] == 7
    monkeypatch.setattr(Trainer, "_train_step", original)
    # Resumed without --precision: the run's fp32 goes on (it fell back to "auto", bf16 where the CPU has it).
    without = [a for a in TINY if a not in ("--precision", "fp32")]
    assert cli.main([*without, "--out", str(out), "--run-dir", str(run_dir), "--resume"]) == 0
    assert json.loads((run_dir / "run_config.json").read_text())["precision"] == "fp32"
    a = load_file(tiny_run / "tiny-model" / "model.safetensors")
    b = load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_while_the_token_cache_is_written_leaves_none(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A cache cut by Ctrl-C was kept, and --resume loaded it (a short or unreadable token stream).
    from solo.train import pipeline

    save = pipeline.np.save

    def cut_save(file, array) -> None:  # noqa: ANN001
        file.write(b"\x93NUMPY partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.np, "save", cut_save)
    out, run_dir = tiny_run / "cut-cache-model", tiny_run / "run-cut-cache"
    assert _run(out, run_dir) == 130
    assert not (run_dir / "train_tokens.npy").exists() and (run_dir / "tokenizer" / "tokenizer.json").is_file()
    monkeypatch.setattr(pipeline.np, "save", save)
    assert _run(out, run_dir, "--resume") == 0
    a = load_file(tiny_run / "tiny-model" / "model.safetensors")
    b = load_file(out / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_ends_the_step_and_saves_a_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    # Ctrl-C used to leave no checkpoint before the first 10-minute save, while the message pointed at one.
    import os
    import signal

    original = Trainer._train_step
    calls = {"n": 0}

    def interrupt_during_step_3(self: Trainer, *args, **kwargs):  # noqa: ANN002, ANN003
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "_train_step", interrupt_during_step_3)
    assert _run(tmp_path / "model", tmp_path / "run") == 130
    assert "solo train: interrupted; the checkpoint is in" in capsys.readouterr().err
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["state"]["step"] == 3


@pytest.mark.parametrize("flags, words", [
    (["--context", "0"], "--context must be >= 1"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--log-every", "0"], "--log-every must be >= 1"),
    (["--eval-windows", "0"], "--eval-windows must be >= 1"),
    (["--num-layers", "0"], "--num-layers must be >= 1"),
    (["--hidden-size", "30", "--num-heads", "4"], "--hidden-size (30) must be a multiple of --num-heads (4)"),
    (["--device", "tpu"], "--device 'tpu': use auto, cpu, cuda or cuda:N"),
])
def test_bad_flags_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], words: str) -> None:
    # Each was a traceback (ZeroDivisionError, transformers' config validation) or a model no one could load.
    assert _run(tmp_path / "model", tmp_path / "run", *flags) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_out_never_replaces_what_it_did_not_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    # `--out "" --overwrite` deleted the working folder; `--resume` replaced an unrelated --out folder.
    work = tmp_path / "work"
    (work / "project").mkdir(parents=True)
    (work / "notes.txt").write_text("precious")
    monkeypatch.chdir(work)
    for out in ("", ".", str(tmp_path)):
        assert cli.main([*TINY, "--out", out, "--run-dir", str(tmp_path / "run"), "--overwrite"]) == 2
        assert "which the model folder would replace" in capsys.readouterr().err
    (work / "mine").mkdir()
    (work / "mine" / "notes.txt").write_text("precious")
    for extra in (["--overwrite"], ["--resume"]):
        assert _run(work / "mine", tmp_path / "run", *extra) == 2
        assert "holds files that are not a model this recipe wrote" in capsys.readouterr().err
    assert (work / "notes.txt").read_text() == "precious" and (work / "mine" / "notes.txt").is_file()
    assert (work / "project").is_dir()


def test_an_out_folder_that_cannot_be_written_is_refused_before_training(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture) -> None:
    # From a break test: a read-only --out trained, evaluated and exported, then ended in a traceback.
    import os

    from solo.train import pipeline

    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    monkeypatch.setattr(pipeline.os, "access", lambda p, mode: Path(p) != locked and access(p, mode))
    assert _run(locked / "deeper" / "model", tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert f"cannot write in {locked}" in err and "name a folder you can write" in err
    assert not (tmp_path / "run").exists()  # refused before the run started
    (tmp_path / "a-file").write_text("")
    assert _run(tmp_path / "a-file" / "model", tmp_path / "run") == 2
    assert "a-file is a file, not a folder" in capsys.readouterr().err


def test_a_model_that_cannot_be_copied_to_out_leaves_no_half_folder(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # From a break test: --out on a full file system got a folder of empty files that looked like a model (and the
    # earlier model there was deleted first), with a wall of (source, destination, error) tuples.
    import errno
    import os
    import shutil

    from solo.train import pipeline

    export, out = tmp_path / "run" / "export", tmp_path / "elsewhere" / "model"
    export.mkdir(parents=True)
    (export / "model.safetensors").write_bytes(b"weights")
    (export / pipeline.SUMMARY_NAME).write_text("{}")
    out.mkdir(parents=True)
    (out / pipeline.SUMMARY_NAME).write_text('{"earlier": true}')
    rename = os.rename

    def across_devices(src, dst):
        if Path(src) == export:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return rename(src, dst)

    def full(src, dst):
        Path(dst).mkdir()
        (Path(dst) / "model.safetensors").write_bytes(b"")
        raise shutil.Error([(str(src), str(dst), "[Errno 28] No space left on device")])

    monkeypatch.setattr(pipeline.os, "rename", across_devices)
    monkeypatch.setattr(pipeline.shutil, "copytree", full)
    with pytest.raises(RuntimeError, match=r"cannot write the model to .*model \(\[Errno 28\] No space left on "
                                           r"device\); the trained model is in .*export"):
        pipeline.replace_model_folder(export, out, tmp_path / "run")
    assert (out / pipeline.SUMMARY_NAME).read_text() == '{"earlier": true}'  # the earlier model is intact
    assert sorted(p.name for p in out.parent.iterdir()) == ["model"]  # no partial copy left beside it
    assert (export / "model.safetensors").read_bytes() == b"weights"
    monkeypatch.undo()
    pipeline.replace_model_folder(export, out, tmp_path / "run")  # (same file system: renamed)
    assert (out / "model.safetensors").read_bytes() == b"weights" and not export.exists()
