"""kernel.cu itself, compiled for the host over an emulation of CUDA (one OS thread per CUDA thread),
executes the scheduled program as the Python VM does: same tokens and state, logits and KV cache equal
up to float32 rounding in attention. This is the CUDA C++'s test on machines without a GPU.

Why not bit for bit: the kernel's split-KV attention is an online softmax with `expf`, lane-parallel dot
products and a shuffle reduction; the VM's is a two-pass softmax with `torch.exp` and matmuls. Their float32
partials differ in the last ulps (how many depends on the CPU's exp and sum kernels), and the attention
output is rounded to bf16, so now and then one element lands one bf16 step apart and moves later values
by about 1e-6.
"""

from __future__ import annotations

import pytest
import torch
from _cuda_helpers import TinyCheckpoints
from _megakernel_helpers import PROMPT, lowered, make_vm, start

from solo.runtime.megakernel.emulate import EmulatedKernel, emulator_unavailable_reason
from solo.runtime.megakernel.graph import STATE_DONE, STATE_EMITTED, STATE_POS

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(emulator_unavailable_reason() is not None, reason=str(emulator_unavailable_reason()))]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = TinyCheckpoints(tmp_path_factory.mktemp("mk-emu")).model("llama", dtype=torch.bfloat16)
    yield lowered(model, num_sms=4)
    torch.set_num_threads(threads)


def _run_both(setup, stage_bytes: int, steps: int, stop_ids=(), temperature=0.0):
    kernel = EmulatedKernel(setup.dims, nthreads=64, stage_bytes=stage_bytes)
    emu, ref = make_vm(setup), make_vm(setup)
    for vm in (emu, ref):
        start(vm, setup.first_token, len(PROMPT), budget=steps, stop_ids=stop_ids, temperature=temperature, seed=9)
    ring = torch.zeros(1 + steps, dtype=torch.int32)
    kernel.launch(setup.program, emu.w, emu.b, ring, steps)
    ref.launch(steps)
    return emu, ref, ring


def _assert_same(emu, ref, ring, emitted):
    assert int(ring[0]) == emitted
    assert ring[1:1 + emitted].tolist() == ref.b["ring"][:emitted].tolist()
    assert torch.equal(emu.b["state"], ref.b["state"])
    for name in ("logits", "k_cache", "v_cache"):
        # One bf16 step (1/128 relative) at most; see the module docstring.
        torch.testing.assert_close(emu.b[name].nan_to_num().float(), ref.b[name].nan_to_num().float(),
                                   rtol=1 / 128, atol=1e-4, msg=name)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_kernel_source_matches_the_vm_with_prefetched_tiles(setup, temperature):
    emu, ref, ring = _run_both(setup, stage_bytes=2048, steps=3, temperature=temperature)
    _assert_same(emu, ref, ring, 3)


@pytest.mark.timeout(300)
def test_kernel_source_matches_the_vm_streaming_tiles_and_stops(setup):
    # Stages smaller than the tiles: every matrix streams from "global" memory instead.
    _, probe, _ = _run_both(setup, stage_bytes=512, steps=1)
    first = int(probe.b["ring"][0])
    emu, ref, ring = _run_both(setup, stage_bytes=512, steps=3, stop_ids=(first,))
    _assert_same(emu, ref, ring, 1)
    assert emu.b["state"][STATE_DONE] == 1 and emu.b["state"][STATE_EMITTED] == 1
    assert emu.b["state"][STATE_POS] == len(PROMPT) + 1


@pytest.mark.timeout(300)
def test_kernel_source_matches_the_vm_at_head_dim_64(tmp_path):
    # head_dim 64: 8 lanes read each key (the Llama-3.2-1B layout), 4 keys per warp at a time.
    from checkpoints import make_checkpoint

    from solo.model.config import ModelConfig
    from solo.model.weights import load_weights

    folder = make_checkpoint(tmp_path / "hd64", "llama", head_dim=64, hidden_size=128)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16, torch.device("cpu"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        setup = lowered(model, num_sms=4)
        assert setup.dims.head_dim == 64 and setup.dims.splits == 2
        emu, ref, ring = _run_both(setup, stage_bytes=4096, steps=3)
        _assert_same(emu, ref, ring, 3)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.timeout(300)
def test_a_wait_that_never_ends_stops_the_launch_instead_of_hanging(setup):
    import numpy as np

    from solo.runtime.megakernel.graph import OP_SAMPLE, STATE_ERROR
    from solo.runtime.megakernel.schedule import W_OP, W_TARGET0, Program

    p = setup.program
    broken = Program(p.dims, p.instructions.copy(), p.lengths.copy(), p.counter_targets.copy(), list(p.counter_names))
    sm = next(s for s in range(broken.num_sms) if (broken.queue(s)[:, W_OP] == OP_SAMPLE).any())
    i = int(np.nonzero(broken.queue(sm)[:, W_OP] == OP_SAMPLE)[0][0])
    broken.instructions[sm, i, W_TARGET0] += 1  # one LM-head tile more than exist: never satisfied
    kernel = EmulatedKernel(setup.dims, nthreads=32, stage_bytes=2048, wait_timeout_s=1.0)
    vm = make_vm(setup)
    start(vm, setup.first_token, len(PROMPT), budget=2)
    ring = torch.zeros(3, dtype=torch.int32)
    kernel.launch(broken, vm.w, vm.b, ring, 2)
    assert vm.b["state"][STATE_ERROR] == 1 and int(ring[0]) == 0
