"""The launch-configuration tuner: fastest correct candidate wins, wrong ones are dropped, results cached."""

from __future__ import annotations

# isort: off
from _triton_env import requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import json
from dataclasses import dataclass

import pytest
import torch

pytestmark = requires_triton


@dataclass(frozen=True)
class FakeConfig:
    speed: float
    wrong: bool = False
    broken: bool = False


def test_tuner_picks_the_fastest_correct_config_and_caches_it(tmp_path, monkeypatch):
    import triton.testing

    from solo.runtime.triton import tuning

    monkeypatch.setenv("SOLO_TUNING_CACHE", str(tmp_path / "cache.json"))
    monkeypatch.setattr(tuning, "_MEMORY", {})
    current = {}

    def launch(config: FakeConfig) -> torch.Tensor:
        if config.broken:
            raise RuntimeError("does not compile")
        current["speed"] = config.speed
        return torch.ones(4) * (2.0 if config.wrong else 1.0)

    def fake_do_bench(fn, warmup, rep, return_mode):
        fn()
        return current["speed"]

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    reference = FakeConfig(5.0)
    candidates = [FakeConfig(3.0), FakeConfig(1.0, wrong=True), FakeConfig(0.5, broken=True), FakeConfig(2.0)]
    key = tuning.make_key("fake", n=4)
    assert tuning.tune(key, candidates, launch, reference) == FakeConfig(2.0)
    saved = json.loads((tmp_path / "cache.json").read_text())
    assert saved[key]["config"] == {"speed": 2.0, "wrong": False, "broken": False}
    monkeypatch.setattr(tuning, "_MEMORY", {})  # a new process: read back from disk, nothing re-timed
    monkeypatch.setattr(triton.testing, "do_bench", lambda *a, **k: pytest.fail("re-tuned a cached key"))
    assert tuning.tune(key, candidates, launch, reference) == FakeConfig(2.0)
