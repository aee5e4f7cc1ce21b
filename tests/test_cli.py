"""The `solo` command line: streaming output, the stats line, and one-line errors without tracebacks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from checkpoints import make_checkpoint, write_tokenizer

from solo import Engine, SamplingParams
from solo.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_streams_text_and_ends_with_stats(capsys, tiny_llama):
    code, out, err = _run(capsys, "run", str(tiny_llama), "--prompt", "def f(x):", "--max-tokens", "12",
                          "--ignore-eos")
    assert code == 0
    expected = Engine.load(tiny_llama).complete("def f(x):", SamplingParams(max_tokens=12, ignore_eos=True))
    assert out == expected.text + "\n"
    assert "TTFT" in err and "tok/s" in err and "12 generated tokens" in err


def test_run_reads_prompt_from_stdin(tiny_llama):
    proc = subprocess.run([sys.executable, "-m", "solo.cli", "run", str(tiny_llama), "--max-tokens", "3"],
                          input="def f(x):", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stderr


def test_chat_keeps_history(tiny_llama, monkeypatch, capsys):
    seen = []
    original = Engine.generate

    def spy(self, prompt, params=None):
        seen.append(list(prompt))
        return original(self, prompt, params)

    monkeypatch.setattr(Engine, "generate", spy)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("hello\nsecond turn\n"))
    code, out, err = _run(capsys, "chat", str(tiny_llama), "--max-tokens", "4", "--system", "be brief")
    assert code == 0
    assert [m["role"] for m in seen[0]] == ["system", "user"]
    assert [m["role"] for m in seen[1]] == ["system", "user", "assistant", "user"]
    assert seen[1][1]["content"] == "hello" and seen[1][3]["content"] == "second turn"


@pytest.fixture()
def no_template_model(tmp_path, tiny_llama):
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_llama, folder)
    write_tokenizer(folder, chat_template=False)
    return folder


def test_chat_on_a_completion_model_says_so(capsys, no_template_model):
    code, _, err = _run(capsys, "chat", str(no_template_model))
    assert code == 2
    assert "completion model without a chat template" in err and "solo run" in err


@pytest.mark.parametrize(
    "case, extra, message",
    [
        ("missing folder", ["/definitely/not/here"], "does not exist"),
        ("max tokens", ["--max-tokens", "0"], "max_tokens must be an integer >= 1, got 0"),
        ("top_p", ["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        ("temperature", ["--temperature", "-1"], "temperature must be >= 0"),
        ("too long", ["--max-tokens", "5000"], "plus max_tokens (5000)"),
    ],
)
def test_bad_input_is_one_clear_line(capsys, tiny_llama, case, extra, message):
    argv = ["run", *(extra if case == "missing folder" else [str(tiny_llama), *extra]), "--prompt", "hi"]
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert err.startswith("solo: error: ") and message in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_prompt_longer_than_context_names_both_numbers(capsys, tiny_llama):
    code, _, err = _run(capsys, "run", str(tiny_llama), "--prompt", "word " * 400)
    assert code == 2 and "the model's context is 256 tokens" in err and "the prompt is 1601 tokens" in err


def test_messages_to_a_model_without_template(capsys, no_template_model):
    code, _, err = _run(capsys, "run", str(no_template_model), "--chat", "--prompt", "hi")
    assert code == 2 and "no chat template" in err


def test_partial_folder_and_unknown_architecture(capsys, tmp_path, tiny_llama):
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(tiny_llama / "config.json", partial / "config.json")
    write_tokenizer(partial)
    code, _, err = _run(capsys, "run", str(partial), "--prompt", "hi")
    assert code == 2 and "no model.safetensors" in err

    odd = tmp_path / "odd"
    shutil.copytree(tiny_llama, odd)
    config = json.loads((odd / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (odd / "config.json").write_text(json.dumps(config))
    code, _, err = _run(capsys, "run", str(odd), "--prompt", "hi")
    assert code == 2 and "MambaForCausalLM" in err and "Qwen3ForCausalLM" in err


def test_missing_shard_via_cli(capsys, tmp_path):
    folder = make_checkpoint(tmp_path / "sharded", "llama", max_shard_size="100KB")
    sorted(folder.glob("model-*.safetensors"))[0].unlink()
    code, _, err = _run(capsys, "run", str(folder), "--prompt", "hi")
    assert code == 2 and "missing shard" in err


def test_unknown_dtype_via_cli(tiny_llama):
    proc = subprocess.run([sys.executable, "-m", "solo.cli", "run", str(tiny_llama), "--dtype", "float8",
                           "--prompt", "hi"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "invalid choice: 'float8'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_explains_every_flag():
    proc = subprocess.run([sys.executable, "-m", "solo.cli", "run", "--help"], capture_output=True, text=True,
                          timeout=120)
    for flag in ("--temperature", "--top-k", "--top-p", "--min-p", "--repetition-penalty", "--presence-penalty",
                 "--frequency-penalty", "--seed", "--stop", "--max-tokens", "--device", "--dtype"):
        assert flag in proc.stdout
