"""`solo bench --agent`: the trace format, its errors, and a replay on a tiny model."""

from __future__ import annotations

import json

import pytest

from solo.bench.agent import TRACE_DIR, Trace
from solo.cli import main
from solo.errors import SoloError


def test_shipped_traces_load():
    import tomllib
    from pathlib import Path

    import solo

    names = sorted(p.stem for p in TRACE_DIR.glob("*.json"))
    assert {"edit-loop", "tool-loop"} <= set(names)
    # In the package, and in its package data: an installed Solo found no trace outside a checkout.
    package = Path(solo.__file__).parent
    assert TRACE_DIR.is_relative_to(package)
    pyproject = tomllib.loads((package.parent / "pyproject.toml").read_text())
    assert TRACE_DIR.relative_to(package).as_posix() + "/*" in pyproject["tool"]["setuptools"]["package-data"]["solo"]
    edit = Trace.load("edit-loop")
    assert len(edit.turns) == 10 and edit.sampling["temperature"] == 0.0


@pytest.mark.parametrize(("trace", "message"), [
    ({"turns": []}, "non-empty"),
    ({"turns": [{"append": "x", "max_tokens": 2}]}, "cannot \"append\""),
    ({"turns": [{"prompt": ["a"], "max_tokens": 0}]}, "max_tokens"),
    ({"turns": [{"prompt": ["a", {"output_of": 0}], "max_tokens": 2}]}, "earlier turn"),
    ({"turns": [{"prompt": ["a"], "append": "b", "max_tokens": 2}]}, "exactly one"),
])
def test_bad_traces_are_clear_errors(tmp_path, trace, message):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    with pytest.raises(SoloError, match=message):
        Trace.load(path)


def test_replay_reports_cached_tokens_and_identical_output(tmp_path, tiny_llama, capsys):
    trace = {"name": "tiny", "sampling": {"temperature": 0.0},
             "turns": [{"prompt": ["def fibonacci(n):\n"], "max_tokens": 6},
                       {"append": "\n# tests passed\n", "max_tokens": 6},
                       {"prompt": [{"prompt_of": 0}, {"output_of": 1}], "max_tokens": 4, "stop": ["\n\n"]}]}
    path, out = tmp_path / "trace.json", tmp_path / "out.json"
    path.write_text(json.dumps(trace))
    assert main(["bench", str(tiny_llama), "--agent", str(path), "--repeats", "1", "--pause-ms", "0",
                 "--dtype", "float32", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["identical_tokens"] is True and report["turns"] == 3
    assert report["command"] and report["machine"]["cpu"] and report["versions"]  # (the command: sys.argv)
    solo = report["configs"]["solo"]["runs"][0]
    assert solo["turns"][1]["cached_tokens"] > 0 and solo["cached_tokens"] > 0
    assert "end to end" in capsys.readouterr().out


@pytest.mark.slow
def test_replay_on_a_shape_reports_ttft_against_a_cold_prefill(tmp_path, capsys):
    # Random weights of a real shape, the bundled tokenizer: the per-turn TTFT ratio is what it is for.
    trace = {"name": "tiny", "sampling": {"temperature": 0.0},
             "turns": [{"prompt": ["def fibonacci(n):\n    return n\n" * 4], "max_tokens": 2},
                       {"append": "\n# tests passed\n", "max_tokens": 2}]}
    path, out = tmp_path / "trace.json", tmp_path / "out.json"
    path.write_text(json.dumps(trace))
    assert main(["bench", "--shape", "SmolLM2-135M", "--agent", str(path), "--repeats", "1", "--pause-ms", "0",
                 "--speculative", "off", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["model"] == "SmolLM2-135M (random weights)"
    ratios = report["ttft_ratio_vs_baseline"]
    assert len(ratios) == 2 and all(r > 0 for r in ratios)
    assert report["configs"]["solo"]["runs"][0]["turns"][1]["cached_tokens"] > 0
    assert "from turn 1 on" in capsys.readouterr().out


def test_peers_replay_the_same_prompts(tmp_path, tiny_llama, capsys):
    trace = {"name": "tiny", "sampling": {"temperature": 0.0},
             "turns": [{"prompt": ["def fibonacci(n):\n"], "max_tokens": 4},
                       {"append": "\n# tests passed\n", "max_tokens": 4}]}
    path, out = tmp_path / "trace.json", tmp_path / "out.json"
    path.write_text(json.dumps(trace))
    assert main(["bench", str(tiny_llama), "--agent", str(path), "--repeats", "1", "--pause-ms", "0",
                 "--dtype", "float32", "--agent-no-baseline", "--compare", "hf,llama.cpp", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    solo, hf = (report["configs"][n]["runs"][0]["turns"] for n in ("solo", "hf-eager"))
    assert [t["prompt_tokens"] for t in hf] == [t["prompt_tokens"] for t in solo]
    assert [t["completion_tokens"] for t in hf] == [t["completion_tokens"] for t in solo]
    assert report["speedup_vs_hf-eager"] > 0
    captured = capsys.readouterr()
    assert "faster than hf-eager" in captured.out
    llama = [n for n in report["configs"] if n.startswith("llama.cpp")]
    if not llama:
        assert "peer skipped: llama.cpp" in captured.err
    else:  # llama.cpp keeps its KV cache across calls: turn 1 reuses turn 0's prompt, as Solo's cache does
        turns = report["configs"][llama[0]]["runs"][0]["turns"]
        assert [t["prompt_tokens"] for t in turns] == [t["prompt_tokens"] for t in solo]
        assert turns[0]["cached_tokens"] == 0
        assert 0 < turns[1]["cached_tokens"] < turns[1]["prompt_tokens"]
        assert f"faster than {llama[0]}" in captured.out


def test_agent_peers_are_checked_before_anything_loads():
    from solo.bench.agent import check_agent_peers

    assert check_agent_peers(None) == []
    assert check_agent_peers("hf,hf-eager") == ["hf-eager"]
    with pytest.raises(SoloError, match="hf-compile"):
        check_agent_peers("hf-compile")
    with pytest.raises(SoloError, match="peer names"):
        check_agent_peers(",")
