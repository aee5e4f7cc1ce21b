"""The CPU kernels compile with every GCC and clang on the machine, and a clang build gives batch-1 bits.

`cpu_build._compiler` takes `$CXX`, else the first of c++, g++ and clang++ on PATH, so users build the kernels
with whatever compiler they have. Compilers differ: clang rejected one `auto` declaration with two
declarators of different types (GCC accepts it), and clang 16 allocates no register for an `asm` operand of
bf16 vector type (clang 15 and 19 do). So every ISA level is compiled (unoptimized, object code only: the
second error comes from code generation) with every `g++`, `g++-N`, `clang++` and `clang++-N` on PATH,
x86 levels natively and ARM levels with clang's --target. CI has Debian's default g++ and clang (`clang`
and `libomp-dev`, which .ci/run installs); each other version found is checked too. A clang without its
own omp.h borrows another compiler's (the declarations are the same API). The machine's own level is
also built optimized with clang and run: batched products against batch 1, and a float32 MoE model's decode
step on 1 and 2 threads, bit for bit.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from checkpoints import make_checkpoint

from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime import cpu_build
from solo.runtime.cpu import _W_BF16, CpuRuntime, _Mat, check_struct_layout
from solo.runtime.cpu_build import LEVELS, compile_flags, load_library, selected_level
from solo.server.scheduler import runtime_is_batch_invariant

KERNELS = Path(__file__).resolve().parents[2] / "solo" / "runtime" / "cpu_kernels"
NAME = re.compile(r"^(g\+\+|clang\+\+)(-\d+)?$")


def _compilers() -> list[str]:
    """Every g++ / clang++ (plain or versioned) on PATH, one per real file, sorted by name."""
    found: dict[str, str] = {}
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder or ".", name)
            if NAME.match(name) and os.access(path, os.X_OK):
                found.setdefault(os.path.realpath(path), name)
    return sorted(set(found.values()))


def _omp_header(cxx: str, tmp_path: Path) -> Path | None:
    """The omp.h `cxx -fopenmp` finds, or None."""
    probe = tmp_path / "omp_probe.cpp"
    probe.write_text("#include <omp.h>\n")
    result = subprocess.run([cxx, "-fopenmp", "-M", str(probe)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        return None
    headers = [p for p in result.stdout.replace("\\\n", " ").split() if p.endswith("/omp.h")]
    return Path(headers[0]) if headers else None


@pytest.mark.slow
@pytest.mark.parametrize("cxx", _compilers() or ["(none)"])
def test_every_isa_level_compiles_with_every_compiler_here(tmp_path, cxx):
    if cxx == "(none)":
        pytest.skip("no g++ or clang++ on PATH")
    extra: list[str] = []
    if _omp_header(cxx, tmp_path) is None:
        # (the kernels call a few OpenMP functions; any compiler's omp.h declares them)
        donors = [h for other in _compilers() if other != cxx and (h := _omp_header(other, tmp_path))]
        if not donors or not cxx.startswith("clang"):
            pytest.skip(f"{cxx} finds no omp.h (clang: apt-get install libomp-dev; GCC: libgomp)")
        (tmp_path / "omp").mkdir()
        shutil.copy(donors[0], tmp_path / "omp" / "omp.h")
        extra = ["-isystem", str(tmp_path / "omp")]
    host = platform.machine()
    checked = []
    for level in LEVELS:
        target = []
        if level.arch not in (None, host):
            if level.arch != "aarch64" or not cxx.startswith("clang"):
                continue  # (g++ targets its own machine; the ARM build under qemu: test_cpu_arm.py)
            target = ["--target=aarch64-linux-gnu"]
        cmd = [cxx, *target, *extra, *compile_flags(level), "-O0", "-c", str(KERNELS / "decode.cpp"), "-o",
               str(tmp_path / f"{level.name}.o")]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if target and "fatal error" in result.stderr and "file not found" in result.stderr:
            continue  # no aarch64 C++ headers here (g++-aarch64-linux-gnu, which .ci/run installs)
        assert result.returncode == 0, f"{cxx}, {level.name}:\n{result.stderr[-3000:]}"
        checked.append(level.name)
    assert selected_level().name in checked


def _clang(tmp_path: Path) -> str:
    clang = shutil.which("clang++")
    if clang is None:
        pytest.skip("needs clang++ (apt-get install clang libomp-dev)")
    if _omp_header(clang, tmp_path) is None:
        pytest.skip("clang++ finds no omp.h (apt-get install libomp-dev)")
    return clang


@pytest.mark.slow
def test_a_clang_build_gives_the_same_bits_at_any_batch_and_thread_count(tmp_path, monkeypatch):
    clang = _clang(tmp_path)
    monkeypatch.setenv("CXX", clang)
    monkeypatch.setattr(cpu_build, "_library", None)  # load_library builds with clang (restored afterwards)
    lib = load_library()
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
    # A float32 Mixtral's decode step on 1 and 2 threads: clang's default contraction (a * b + c fused only
    # within one expression) made them differ, and under load the thread governor changes the count between a
    # batched step and a batch-1 one (the batch-invariance test failed in 5 of 7 runs beside other tests).
    folder = make_checkpoint(tmp_path / "mixtral", "mixtral", dtype=torch.float32)
    runtime = CpuRuntime(load_weights(folder, ModelConfig.from_file(folder), torch.float32), rows=5, max_seq=72)
    assert runtime._lib is lib
    runtime.threads.enabled = False
    ids = torch.randint(0, runtime.config.vocab_size, (9,), generator=torch.Generator().manual_seed(0))
    logits = []
    for threads in (1, 2):
        runtime.threads.threads = threads
        runtime.prefill(0, ids)
        logits.append(runtime.decode(torch.tensor([0]), torch.tensor([5]), torch.tensor([9])).clone())
    assert torch.equal(logits[0], logits[1])
    assert runtime_is_batch_invariant(runtime, rows=5, trials=2)
