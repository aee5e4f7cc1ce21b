"""The A/B measurement scripts under benchmarks/ (not part of the package): their build of another kernel copy."""

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
