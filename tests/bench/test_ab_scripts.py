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


@pytest.mark.parametrize("script,args", [("attention_ab.py", ["--context", "520"]),
                                         ("batch_decode_ab.py", ["--batch", "2"])])
def test_the_decode_ab_scripts_take_a_variant_and_refuse_rowmajor(script, args):
    """`parse_variant` (prefill_ab.py) grew a fourth item, `rowmajor`: attention_ab.py and batch_decode_ab.py
    unpacked three and stopped with a ValueError whatever the variant. They run one weight layout, so a
    `rowmajor` variant is refused by name."""
    common = [sys.executable, str(BENCHMARKS / script), "--shape", "SmolLM2-135M", "--steps", "1", "--rounds", "1",
              "--threads", "1", *args]
    proc = subprocess.run([*common, "--variant", "a=attn_prefetch=2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert " a " in proc.stdout
    proc = subprocess.run([*common, "--variant", "a=rowmajor"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "drop 'rowmajor'" in proc.stderr


def test_the_governor_diagnostic_runs():
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "governor_idle.py"), "--shape", "SmolLM2-135M", "--runs",
                           "1", "--tokens", "3"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "late_steps 1: 3 steps" in proc.stdout and "late_steps 2: 3 steps" in proc.stdout
