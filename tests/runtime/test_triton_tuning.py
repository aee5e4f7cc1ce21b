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


def test_tuner_times_the_steps_launches_in_a_graph_and_falls_back_to_single_launches(tmp_path, monkeypatch):
    import triton.testing

    from solo.runtime.triton import tuning

    monkeypatch.setenv("SOLO_TUNING_CACHE", str(tmp_path / "cache.json"))
    monkeypatch.setattr(tuning, "_MEMORY", {})
    graph_ms = {FakeConfig(5.0): 4.0, FakeConfig(3.0): 3.0}  # graph timing disagrees with single launches
    flushed = []

    def fake_time_graph(launches, rounds, flush_bytes):
        flushed.append((rounds, flush_bytes))
        config = launches[0]()
        if config not in graph_ms:
            raise RuntimeError("capture refused")
        return graph_ms[config] / 1e3

    monkeypatch.setattr(tuning, "time_graph", fake_time_graph)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **_: fn().speed)
    candidates = [FakeConfig(3.0), FakeConfig(1.0)]
    key = tuning.make_key("fake", n=8)
    chosen = tuning.tune(key, candidates, lambda c: torch.ones(4), FakeConfig(5.0),
                         graph_launches=lambda c: [lambda: c] * 3)
    # The 1.0 config failed its capture: dropped, not ranked by a lone launch's time against graph times.
    assert chosen == FakeConfig(3.0)
    assert flushed and all(f == (1, tuning.L2_FLUSH_BYTES) for f in flushed)  # once per replay, L2 flushed
    saved = json.loads((tmp_path / "cache.json").read_text())[key]
    assert saved["timing"] == "graph" and len(saved["ms"]) == 2
    assert key.endswith(f"|v{tuning.KEY_VERSION}")  # choices made before this timing method are not reused

    # No candidate captures: every one is timed by single launches instead (one method per choice).
    graph_ms.clear()
    key = tuning.make_key("fake", n=16)
    chosen = tuning.tune(key, candidates, lambda c: _Out(c), FakeConfig(5.0), graph_launches=lambda c: [lambda: c])
    assert chosen == FakeConfig(1.0)
    assert json.loads((tmp_path / "cache.json").read_text())[key]["timing"] == "do_bench"


class _Out(torch.Tensor):
    """A launch's output that also says which configuration made it (for the fake do_bench)."""

    @staticmethod
    def __new__(cls, config):
        out = torch.ones(4).as_subclass(cls)
        out.speed = config.speed
        return out
