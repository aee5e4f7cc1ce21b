"""`solo run`, `chat`, `serve` and `bench` on a lane model (a tiny Laneformer checkpoint, native CPU runtime)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from checkpoints import make_lane_checkpoint

from solo import Engine, SamplingParams
from solo.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))


@pytest.fixture(scope="module")
def lane_model(tmp_path_factory):
    return make_lane_checkpoint(tmp_path_factory.mktemp("laneformer"), delay=2, sliding_window=8,
                                sliding_window_n_layers=2)


def _expected(folder, prompt, n):
    return Engine.load(folder).complete(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))


def test_run_and_chat(capsys, monkeypatch, lane_model):
    code = main(["run", str(lane_model), "--prompt", "def f(x):", "--max-tokens", "8", "--ignore-eos",
                 "--temperature", "0"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out == _expected(lane_model, "def f(x):", 8).text + "\n"
    assert "backend: cpu" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))
    assert main(["chat", str(lane_model), "--max-tokens", "4"]) == 0
    assert "generated tokens" in capsys.readouterr().err


def test_serve(lane_model):
    from server_harness import start_server

    running = start_server(lane_model)
    try:
        assert running.state.status == "ok"
        reply = running.client().completions.create(model="tiny", prompt="def f(x):", max_tokens=6, temperature=0)
        assert reply.choices[0].text == _expected(lane_model, "def f(x):", 6).text
    finally:
        running.stop()


def test_bench(tmp_path, capsys, lane_model):
    out = tmp_path / "bench.json"
    code = main(["bench", str(lane_model), "--prompt-len", "8", "--gen-len", "4", "--repeats", "1", "--probe-gib",
                 "0.0625", "--pause-ms", "0", "--compare", "hf-eager", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["backend"] == "cpu" and report["engines"]["solo"]["decode_tokens_per_s"]["median"] > 0
    assert "lane models" in report["peers_skipped"]["hf-eager"]
    capsys.readouterr()


def test_laneformer_2b_shape_is_a_lane_model():
    from solo.bench.shapes import shape_config

    cfg = shape_config("Laneformer-2B")
    assert cfg.lanes.num_lanes == 8 and cfg.lanes.broadcast_delay == 2 and cfg.rope_interleaved
    assert cfg.layer_sliding_windows == (2048,) * 10 + (None,) * 5
    assert cfg.num_parameters() == 2_320_069_632  # the released model's exact count (spec section 2)
