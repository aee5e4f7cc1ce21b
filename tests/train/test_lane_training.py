"""`solo train --lanes L --delay d`: the recipe trains a lane model and writes a Laneformer folder Solo serves."""

import json
from pathlib import Path

import pytest
import torch

from solo import Engine, SamplingParams
from solo.train import cli
from solo.train.config import TrainConfig
from solo.train.lanes import build_lane_model, load_lane_model

TINY = ["--size", "tiny", "--max-files", "12", "--steps", "6", "--precision", "fp32", "--threads", "2"]


@pytest.mark.slow
def test_recipe_trains_a_lane_model(tmp_path: Path) -> None:
    out = tmp_path / "lanes"
    assert cli.main([*TINY, "--out", str(out), "--run-dir", str(tmp_path / "run"), "--lanes", "2", "--delay", "1",
                     "--no-early-comm"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LaneformerForCausalLM"]
    assert (config["num_lanes"], config["broadcast_delay"], config["use_early_comm"]) == (2, 1, False)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["architecture"] == "LaneformerForCausalLM" and summary["heldout"]["bits_per_byte"] > 0
    engine = Engine.load(out)
    result = engine.complete("def f(x):", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(result.token_ids) == 4


def test_lane_export_round_trip_and_flags(tmp_path: Path) -> None:
    from solo.train.lanes import export_lane_model

    cfg = TrainConfig().with_preset("tiny")
    cfg = TrainConfig(**{**cfg.to_dict(), "num_lanes": 2, "broadcast_delay": 1})
    torch.manual_seed(0)
    model = build_lane_model(cfg, 1, 2, 0)
    export_lane_model(model, tmp_path / "m")
    loaded = load_lane_model(tmp_path / "m")
    ids = torch.arange(3, 19)[None]
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, loaded(input_ids=ids).logits
    assert torch.allclose(a, b, atol=0.05)  # exported in bfloat16
    assert cli.main(["--out", str(tmp_path / "x"), "--delay", "1"]) == 2
