"""The schedule checker passes the real schedule in random orders and catches broken ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _cuda_helpers import TinyCheckpoints
from _megakernel_helpers import PROMPT, lowered, make_vm, start

from solo.runtime.megakernel.checker import DeadlockError, HazardError, ScheduleError, check_schedule
from solo.runtime.megakernel.graph import OP_MERGE, OP_OPROJ, OP_SAMPLE
from solo.runtime.megakernel.schedule import W_OP, W_TARGET0, W_WAIT0, Program


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield lowered(TinyCheckpoints(tmp_path_factory.mktemp("mk-check")).model("llama"), num_sms=4)
    torch.set_num_threads(threads)


def _factory(setup, program: Program, steps: int):
    def make():
        vm = make_vm(setup)
        vm.program = program
        launches = [0]

        def begin():
            pos = len(PROMPT) + launches[0] * steps
            start(vm, setup.first_token if launches[0] == 0 else int(vm.b["ring"][steps - 1]), pos, budget=steps)
            launches[0] += 1

        return vm, begin

    return make


def _copy(program: Program) -> Program:
    return Program(program.dims, program.instructions.copy(), program.lengths.copy(),
                   program.counter_targets.copy(), list(program.counter_names))


def _find(program: Program, op: int) -> tuple[int, int]:
    for sm in range(program.num_sms):
        hits = np.nonzero(program.queue(sm)[:, W_OP] == op)[0]
        if hits.size:
            return sm, int(hits[0])
    raise AssertionError(op)


def test_real_schedule_passes_random_orders(setup):
    report = check_schedule(setup.program, _factory(setup, setup.program, 3), n_steps=3, orders=15, launches=2)
    assert report.orders == 15 and report.instructions == 2 * 3 * int(setup.program.lengths.sum())


def test_random_orders_compute_bit_identical_results(setup):
    check_schedule(setup.program, _factory(setup, setup.program, 2), n_steps=2, orders=2, launches=1,
                   compute=True, seed=1)


def test_a_missing_wait_is_caught_as_a_hazard(setup):
    broken = _copy(setup.program)
    sm, i = _find(broken, OP_OPROJ)
    broken.instructions[sm, i, W_WAIT0] = -1  # the O-projection no longer waits for the attention merge
    with pytest.raises(HazardError, match="oproj"):
        check_schedule(broken, _factory(setup, broken, 2), n_steps=2, orders=25, launches=1)


def test_a_short_target_is_caught(setup):
    broken = _copy(setup.program)
    sm, i = _find(broken, OP_MERGE)
    broken.instructions[sm, i, W_TARGET0] -= 1  # merges before the last split-KV partial is in
    with pytest.raises(HazardError):
        check_schedule(broken, _factory(setup, broken, 2), n_steps=2, orders=25, launches=1)


def test_an_unreachable_target_deadlocks(setup):
    broken = _copy(setup.program)
    sm, i = _find(broken, OP_SAMPLE)
    broken.instructions[sm, i, W_TARGET0] += 1  # waits for one LM-head tile more than exist
    with pytest.raises(DeadlockError, match="sample"):
        check_schedule(broken, _factory(setup, broken, 2), n_steps=2, orders=1, launches=1)


def test_a_queue_out_of_topological_order_deadlocks(setup):
    broken = _copy(setup.program)
    sm = int(np.argmax(broken.lengths))
    q = broken.instructions[sm, : broken.lengths[sm]]
    q[[0, -1]] = q[[-1, 0]]  # the SM's last instruction (late in the step) now runs first
    with pytest.raises(DeadlockError):
        check_schedule(broken, _factory(setup, broken, 1), n_steps=1, orders=1, launches=1)


def test_counters_not_reset_between_launches_are_caught(setup):
    with pytest.raises(ScheduleError, match="not reset"):
        check_schedule(setup.program, _factory(setup, setup.program, 2), n_steps=2, orders=1, launches=2,
                       reset_counters=False)


def test_a_signal_too_many_is_caught(setup):
    broken = _copy(setup.program)
    sm, i = _find(broken, OP_OPROJ)
    q = broken.instructions[sm]
    # Duplicate an O-projection tile: its counter overshoots, so a later step's wait passes early.
    broken.instructions = np.concatenate([broken.instructions, np.zeros_like(broken.instructions[:, :1])], axis=1)
    broken.instructions[sm, broken.lengths[sm]] = q[i]
    broken.instructions[sm, broken.lengths[sm], 10] = 10**6  # a distinct task id
    broken.lengths[sm] += 1
    with pytest.raises(ScheduleError, match="off their targets") as err:
        check_schedule(broken, _factory(setup, broken, 2), n_steps=2, orders=5, launches=1)
    assert "oproj" in str(err.value)
