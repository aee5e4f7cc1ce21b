"""The CPU kernels build with clang++ as well as g++, and give the same batch-invariant bits.

`cpu_build._compiler` takes `$CXX`, else the first of c++, g++ and clang++ on PATH, so a machine with only
clang (or a user who sets CXX=clang++) builds the kernels with it. clang is stricter than GCC in places (it
rejected one `auto` declaration with two declarators of different types, which GCC accepts), so every ISA
level is checked with clang's front end here (x86 levels natively, ARM levels with --target), and the
machine's own level is built and run: batched products against batch 1, bit for bit. Needs Debian's `clang`
and `libomp-dev` (its omp.h; .ci/run installs both); skipped where they are absent.
"""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from solo.runtime.cpu import _W_BF16, _Mat, check_struct_layout
from solo.runtime.cpu_build import LEVELS, compile_flags, declare, selected_level

KERNELS = Path(__file__).resolve().parents[2] / "solo" / "runtime" / "cpu_kernels"
ARM_SYSROOT = Path("/usr/aarch64-linux-gnu")


def _clang(tmp_path: Path) -> str:
    clang = shutil.which("clang++")
    if clang is None:
        pytest.skip("needs clang++ (apt-get install clang libomp-dev)")
    probe = tmp_path / "omp_probe.cpp"
    probe.write_text("#include <omp.h>\nint main() { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
    result = subprocess.run([clang, "-fopenmp", "-fsyntax-only", str(probe)], capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        pytest.skip("clang++ finds no omp.h (apt-get install libomp-dev)")
    return clang


def test_every_isa_level_passes_clangs_front_end(tmp_path):
    clang = _clang(tmp_path)
    host = platform.machine()
    checked = []
    for level in LEVELS:
        target = []
        if level.arch not in (None, host):
            if level.arch != "aarch64" or not ARM_SYSROOT.is_dir():
                continue  # (ARM headers: g++-aarch64-linux-gnu, which .ci/run installs for the qemu test)
            target = ["--target=aarch64-linux-gnu"]
        result = subprocess.run([clang, *target, *compile_flags(level), "-fsyntax-only", str(KERNELS / "decode.cpp")],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{level.name}:\n{result.stderr[-3000:]}"
        checked.append(level.name)
    assert selected_level().name in checked


@pytest.mark.slow
def test_a_clang_build_gives_batch_1_bits(tmp_path):
    clang = _clang(tmp_path)
    out = tmp_path / "solo_cpu_clang.so"
    result = subprocess.run([clang, *compile_flags(selected_level()), str(KERNELS / "decode.cpp"), "-o", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lib = declare(ctypes.CDLL(str(out)))
    check_struct_layout(lib)
    torch.manual_seed(0)
    for cols in (896, 2048, 8192):  # the decode tile's K (4 tokens at a time) and the pass tile's (K > 3072)
        w = torch.randn(37, cols).bfloat16()
        mat = _Mat(_W_BF16, 37, cols, 32, w.data_ptr(), None, None)
        x = torch.randn(11, cols).bfloat16().float()

        def gemv(rows: torch.Tensor, mat=mat) -> torch.Tensor:
            y = torch.empty(rows.shape[0], mat.rows)
            workspace = torch.empty(rows.numel() * 4 + 64, dtype=torch.uint8)
            lib.solo_gemv(ctypes.byref(mat), rows.data_ptr(), rows.shape[0], y.data_ptr(), workspace.data_ptr(), 2)
            return y

        singles = torch.cat([gemv(x[i:i + 1]) for i in range(11)])
        for batch in (2, 4, 5, 11):
            assert torch.equal(gemv(x[:batch]), singles[:batch]), (cols, batch)
        torch.testing.assert_close(singles, x @ w.float().T, atol=1e-3 * cols ** 0.5, rtol=1e-4)
