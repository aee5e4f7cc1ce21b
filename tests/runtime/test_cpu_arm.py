"""ARM64 correctness without ARM hardware: the kernels cross-compiled for NEON and run under qemu-user.

cpu_kernel_selftest.cpp checks every GEMV format against a double-precision reference and bit for bit
across batch sizes (the integer-dot formats also bit for bit against the scalar build: SDOT at neon-bf16,
widening multiplies at neon), the vectorized activation and norm, and decodes a tiny random model at batch 2 and 1;
its logits are compared here with a native scalar build of the same file. Needs Debian's
`g++-aarch64-linux-gnu` and `qemu-user` (.ci/run installs them); skipped where they are absent.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parents[1] / "solo" / "runtime" / "cpu_kernels"
SELFTEST = HERE / "cpu_kernel_selftest.cpp"
FLAGS = ["-O2", "-fopenmp", "-std=c++17", "-fno-math-errno", "-w", f"-I{KERNELS}"]


def _build(cxx: str, flags: list[str], out: Path) -> None:
    result = subprocess.run([cxx, *FLAGS, *flags, str(SELFTEST), "-o", str(out)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def _run(cmd: list[str]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout[-3000:]}{result.stderr[-1000:]}"
    logits, qgemv = {}, {}
    for line in result.stdout.splitlines():
        if line.startswith(("LOGITS ", "QGEMV ")):
            kind, name, *values = line.split()
            (logits if kind == "LOGITS" else qgemv)[name] = torch.tensor([float(v) for v in values])
    assert set(logits) == {"f32", "bf16"}, result.stdout[-2000:]
    assert len(qgemv) == 4, result.stdout[-2000:]
    return logits, qgemv


@pytest.mark.slow
@pytest.mark.parametrize("level,march", [("neon", "armv8-a"), ("neon-bf16", "armv8.2-a+bf16+dotprod")])
def test_neon_kernels_under_qemu_match_the_scalar_build(tmp_path, level, march):
    cross, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if cross is None or qemu is None:
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64 (apt-get install g++-aarch64-linux-gnu qemu-user)")
    if shutil.which("c++") is None:
        pytest.skip("no native C++ compiler for the scalar reference build")
    from solo.runtime.cpu_build import LEVELS

    assert next(lv for lv in LEVELS if lv.name == level).flags == (f"-march={march}",)
    _build(cross, [f"-march={march}", f'-DSOLO_ISA_NAME="{level}"'], tmp_path / "selftest-neon")
    _build("c++", ["-DSOLO_SCALAR=1", '-DSOLO_ISA_NAME="scalar"'], tmp_path / "selftest-scalar")
    # -cpu max: qemu's model with every extension it emulates, BF16 (BFDOT) included.
    neon, neon_q = _run([qemu, "-cpu", "max", "-L", "/usr/aarch64-linux-gnu", str(tmp_path / "selftest-neon")])
    scalar, scalar_q = _run([str(tmp_path / "selftest-scalar")])
    # int8 / int4 weights times int8-quantized inputs (SDOT on neon-bf16, widening multiplies on neon): exact
    # integer lane sums and the same float operations as the scalar reference, so equal bit for bit.
    for name, values in scalar_q.items():
        assert torch.equal(neon_q[name], values), name
    torch.testing.assert_close(neon["f32"], scalar["f32"], atol=1e-4, rtol=0)
    # bf16: the same roundings, only float32 summation orders differ before each one.
    torch.testing.assert_close(neon["bf16"], scalar["bf16"], atol=0.07, rtol=0)
