"""The monokernel's CUDA C++ compiles for Hopper (sm_90a) with NVRTC, on a machine without a GPU.

NVRTC runs ptxas itself (`--ptxas-options=-v`); the register and spill counts it reports are checked.
Triton's bundled ptxas assembles the same PTX again as a second opinion where its version accepts it.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from solo.bench.shapes import shape_config
from solo.runtime.megakernel.graph import plan_dims
from solo.runtime.megakernel.nvrtc import (
    MAX_REGISTERS,
    MAX_SHARED_BYTES,
    NTHREADS,
    compile_kernel,
    kernel_unsupported_reason,
    nvrtc_available,
    resource_usage,
    shared_memory_bytes,
    stage_bytes_for,
)

pytestmark = pytest.mark.skipif(nvrtc_available() is not None, reason=str(nvrtc_available()))


def _compile(shape: str):
    cfg = shape_config(shape)
    stage = stage_bytes_for(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim)
    assert 64 * 1024 <= stage <= 96 * 1024
    dims = plan_dims(cfg, 4096, num_sms=132, tile_bytes=stage)
    assert kernel_unsupported_reason(dims, stage) is None
    assert shared_memory_bytes(dims, NTHREADS, stage) <= MAX_SHARED_BYTES
    return compile_kernel(dims, "sm_90a", stage)


def _check_resources(log: str) -> None:
    usage = resource_usage(log)
    assert usage.registers <= MAX_REGISTERS, usage
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage


def test_llama_1b_shape_compiles_for_sm90a_without_spills():
    kernel = _compile("Llama-3.2-1B")
    assert kernel.cubin[:4] == b"\x7fELF"
    _check_resources(kernel.log)
    ptxas = _triton_ptxas()
    if ptxas is None:
        return
    version = re.search(rb"^\.version (\d+)\.(\d+)", kernel.ptx, re.M)
    accepted = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release (\d+)\.(\d+)", accepted)
    # PTX ISA 8.7 came with CUDA 12.8; newer PTX needs a newer ptxas than Triton's.
    if version and release and (int(version[1]), int(version[2])) <= (int(release[1]) - 4, int(release[2]) - 1):
        done = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", "-o", "/dev/null", "-"], input=kernel.ptx,
                              capture_output=True)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        _check_resources(done.stderr.decode())


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["Laneformer-2B", "Llama-3.1-8B"])
def test_other_shapes_compile_without_spills(shape):
    _check_resources(_compile(shape).log)


def test_refusals():
    dims = plan_dims(shape_config("Llama-3.2-1B"), 4096, num_sms=132, elem_bytes=4)
    assert "bfloat16" in kernel_unsupported_reason(dims)


def _triton_ptxas() -> Path | None:
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return path if path.is_file() else None


def test_kernel_constants_match_the_python_side():
    from importlib import resources

    from solo.runtime.megakernel import graph, schedule

    source = resources.files("solo.runtime.megakernel").joinpath("kernel.cu").read_text()
    defines = dict(re.findall(r"^#define (\w+) (\d+)\b", source, re.M))
    for name in ("OP_NOP", "OP_EMBED", "OP_QKV", "OP_ATTN", "OP_MERGE", "OP_OPROJ", "OP_GATE_UP", "OP_DOWN",
                 "OP_LM_HEAD", "OP_SAMPLE", "STATE_POS", "STATE_TOKEN", "STATE_DONE", "STATE_EMITTED",
                 "STATE_BUDGET", "STATE_NUM_STOP", "STATE_STOP", "STATE_TEMPERATURE", "STATE_SEED", "STATE_ERROR"):
        assert int(defines[name]) == getattr(graph, name), name
    for name in ("W_OP", "W_LAYER", "W_A", "W_B", "W_C", "W_WAIT0", "W_TARGET0", "W_WAIT1", "W_TARGET1", "W_SIGNAL"):
        assert int(defines[name]) == getattr(schedule, name), name
