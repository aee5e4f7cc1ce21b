"""`solo bench --agent`: the trace format, its errors, and a replay on a tiny model."""

from __future__ import annotations

import json

import pytest

from solo.bench.agent import TRACE_DIR, Trace
from solo.cli import main
from solo.errors import SoloError


def test_shipped_traces_load():
    names = sorted(p.stem for p in TRACE_DIR.glob("*.json"))
    assert {"edit-loop", "tool-loop"} <= set(names)
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
    solo = report["configs"]["solo"]["runs"][0]
    assert solo["turns"][1]["cached_tokens"] > 0 and solo["cached_tokens"] > 0
    assert "end to end" in capsys.readouterr().out
