"""`solo bench --structured`: decode with a JSON schema against unconstrained, and the mask time per token."""

from __future__ import annotations

import json

import pytest

from solo.cli import main


@pytest.mark.slow
def test_structured_bench_reports_mask_time_and_slowdown(tmp_path, capsys):
    out = tmp_path / "structured.json"
    assert main(["bench", "--structured", "--gen-len", "6", "--repeats", "1", "--pause-ms", "0",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["grammar_backend"] == "xgrammar" and report["machine"]["cpu"]
    assert report["mask_wait_us"]["p99"] >= report["mask_wait_us"]["p50"] > 0
    assert set(report["decode_tokens_per_s"]) == {"unconstrained", "json_schema", "json_schema_inline_mask"}
    assert report["slowdown"] is not None and 0 < report["mask_share_of_token_time"] < 1
    assert "slowdown" in capsys.readouterr().out


def test_structured_bench_shape_needs_a_tokenizer(capsys):
    assert main(["bench", "--structured", "--shape", "SmolLM2-135M"]) != 0
    assert "needs --tokenizer FOLDER" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--compare", "llama.cpp", "--sweep-context", "--plot", "x.png"],
     "--compare, --sweep-context, --plot: not used by --structured (it takes --gen-len, --repeats, --pause-ms)"),
    (["--repeats", "0"], "--repeats and --gen-len must be >= 1, got 0 and"),
])
def test_structured_bench_refuses_flags_it_would_ignore(capsys, extra, message):
    assert main(["bench", "--structured", *extra]) == 2
    assert message in capsys.readouterr().err


def test_agent_bench_refuses_flags_it_would_ignore(capsys):
    assert main(["bench", "--agent", "edit-loop", "--prompt-len", "64", "--cpu-hog", "1"]) == 2
    assert "--prompt-len, --cpu-hog: not used by --agent" in capsys.readouterr().err


def test_seed_is_taken_by_every_bench_mode(capsys):
    # --seed seeds a --shape's random weights: not refused as an unused flag (the tokenizer check comes next).
    assert main(["bench", "--structured", "--shape", "SmolLM2-135M", "--seed", "1"]) == 2
    assert "needs --tokenizer FOLDER" in capsys.readouterr().err
