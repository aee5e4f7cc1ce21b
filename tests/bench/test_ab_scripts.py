"""Measurement scripts (benchmarks/ A/B scripts, `python -m solo.bench.cpu_profile`): what breaks before any timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_build_library_passes_the_compiler_command_as_one_flat_list(monkeypatch):
    """$CXX may carry arguments, so the compiler is a list: `build_library` put that list inside the command
    (a TypeError before anything ran), and every `lib:DIR` variant of the A/B scripts failed."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("CXX", f"{sys.executable} -c pass")  # a "compiler" with arguments; never run here
    step_ab = pytest.importorskip("step_ab")
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(subprocess.CalledProcessError):
        step_ab.build_library("kernels-copy")
    (cmd,) = seen
    assert all(isinstance(part, str) for part in cmd)
    assert cmd[:3] == [sys.executable, "-c", "pass"]
    assert cmd[cmd.index("-o") - 1] == str(Path("kernels-copy") / "decode.cpp")


def test_the_profile_command_runs_without_docstrings():
    """`python -OO` strips docstrings: `python -OO -m solo.bench.cpu_profile --help` split a None description."""
    proc = subprocess.run([sys.executable, "-OO", "-m", "solo.bench.cpu_profile", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "--shape" in proc.stdout, proc.stderr
