"""The Triton tuner's on-disk cache (solo/runtime/triton/tuning.py): where it lives, and writers sharing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from solo.runtime.triton import tuning


def test_the_cache_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("SOLO_TUNING_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuning.cache_path() == tmp_path / "solo" / "triton_tuning.json"
    monkeypatch.setenv("SOLO_TUNING_CACHE", str(tmp_path / "mine.json"))
    assert tuning.cache_path() == tmp_path / "mine.json"


def test_two_processes_storing_at_once_keep_every_entry(tmp_path):
    # Two GPU servers tuning at once shared one temporary file name and no lock: 198 and 168 of 600 entries survived.
    path = tmp_path / "tuning.json"
    script = ("import sys\nfrom solo.runtime.triton import tuning\n"
              "for i in range(150):\n    tuning._store_disk(f'{sys.argv[1]}-{i}', {'i': i})\n")
    env_path = {"SOLO_TUNING_CACHE": str(path)}
    procs = [subprocess.Popen([sys.executable, "-c", script, name], env={**os.environ, **env_path},
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    errors = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0] and not any("could not write" in e for e in errors), errors
    data = json.loads(path.read_text())
    assert len(data) == 300 and not list(tmp_path.glob("*.tmp"))
