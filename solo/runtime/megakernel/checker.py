"""Schedule checker: runs a program's instructions in many random orders the counters allow.

The interpreter kernel gives no order between SMs beyond the counters, so a schedule is correct only
if every order the counters allow computes the same thing. The checker first runs the program in the
fixed order and records, element by element, which instruction instance (task, step) last wrote each
element every instruction reads (`regions`). It then runs random orders with up to one instruction
in flight per SM and fails on:

- a hazard: when an instruction starts, or when it finishes, some element it reads was last written
  by another instance than in the fixed order (read before its producer finished, or overwritten by
  a later writer while still needed);
- a deadlock: no SM can start its next instruction and none is in flight (a counter never reaches its
  target);
- a counter that does not end a launch at exactly `target * n_steps`, or that is not zero when a
  launch starts (the host resets counters between launches; their step-scaled targets stand in for a
  reset between steps, which is only sound when every step adds exactly `target`);
- with `compute=True`, final buffers that differ bit for bit from the fixed order's (the kernel's
  results must not depend on timing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from solo.runtime.megakernel.graph import (
    OP_ATTN,
    OP_DOWN,
    OP_EMBED,
    OP_GATE_UP,
    OP_LM_HEAD,
    OP_MERGE,
    OP_NAMES,
    OP_NOP,
    OP_OPROJ,
    OP_QKV,
    OP_SAMPLE,
    STATE_BUDGET,
    STATE_DONE,
    STATE_EMITTED,
    STATE_POS,
    STATE_TOKEN,
    split_range,
)
from solo.runtime.megakernel.schedule import W_A, W_B, W_C, W_LAYER, W_OP, W_TASK, Program
from solo.runtime.megakernel.vm import DeadlockError, HazardError, MegakernelVM, run_launch

Region = tuple[str, np.ndarray]


class ScheduleError(RuntimeError):
    """A counter is not where the launch protocol needs it (not zero at a launch, or off its target after)."""


def regions(program: Program, instr: np.ndarray, step: int, n_steps: int,
            state: torch.Tensor, index: dict[str, np.ndarray]) -> tuple[list[Region], list[Region]]:
    """The elements an instruction reads and writes.

    Args:
        program: the encoded step.
        instr: int32 [INSTR_WORDS].
        step, n_steps: the step within the launch and the launch's length.
        state: the device state (the position decides the KV slots).
        index: per buffer, np.arange(numel) in the buffer's shape (flat element ids).

    Returns:
        (reads, writes), each a list of (buffer name, flat element ids). Weights are never written, so
        they are left out.
    """
    d = program.dims
    op = int(instr[W_OP])
    layer, a, b, c = (int(instr[i]) for i in (W_LAYER, W_A, W_B, W_C))
    if op == OP_NOP or (op == OP_EMBED and step > 0):
        return [], []
    pos = int(state[STATE_POS])
    reads: list[Region] = [("state", index["state"][[STATE_POS, STATE_DONE]])]
    writes: list[Region] = []
    hd, half = d.head_dim, d.head_dim // 2
    group_heads = slice(a * d.groups * hd, (a + 1) * d.groups * hd)
    if op == OP_EMBED:
        reads.append(("state", index["state"][[STATE_TOKEN]]))
        writes.append(("x0", index["x0"]))
    elif op == OP_QKV:
        reads.append(("x0", index["x0"]))
        cols = np.r_[b:b + c, half + b:half + b + c]
        if a < d.heads:
            writes.append(("q", index["q"][a * hd + cols]))
        elif a < d.heads + d.kv_heads:
            writes.append(("k_cache", index["k_cache"][layer, a - d.heads, pos, cols]))
        else:
            writes.append(("v_cache", index["v_cache"][layer, a - d.heads - d.kv_heads, pos, cols]))
    elif op == OP_ATTN:
        lo, hi = split_range(pos + 1, d.splits, b)
        reads += [("q", index["q"][group_heads]), ("k_cache", index["k_cache"][layer, a, lo:hi]),
                  ("v_cache", index["v_cache"][layer, a, lo:hi])]
        writes += [("part_o", index["part_o"][a, b]), ("part_ml", index["part_ml"][a, b])]
    elif op == OP_MERGE:
        reads += [("part_o", index["part_o"][a]), ("part_ml", index["part_ml"][a])]
        writes.append(("attn", index["attn"][group_heads]))
    elif op == OP_OPROJ:
        reads += [("attn", index["attn"]), ("x0", index["x0"][a:a + b])]
        writes.append(("x1", index["x1"][a:a + b]))
    elif op == OP_GATE_UP:
        reads.append(("x1", index["x1"]))
        writes.append(("h", index["h"][a:a + b]))
    elif op == OP_DOWN:
        reads += [("h", index["h"]), ("x1", index["x1"][a:a + b])]
        writes.append(("x0", index["x0"][a:a + b]))
    elif op == OP_LM_HEAD:
        reads.append(("x0", index["x0"]))
        writes += [("logits", index["logits"][a:a + b]), ("amax_val", index["amax_val"][c:c + 1]),
                   ("amax_idx", index["amax_idx"][c:c + 1])]
    elif op == OP_SAMPLE:
        reads += [("amax_val", index["amax_val"]), ("amax_idx", index["amax_idx"]), ("state", index["state"])]
        writes += [("state", index["state"][[STATE_POS, STATE_TOKEN, STATE_DONE, STATE_EMITTED]]),
                   ("ring", index["ring"][min(step, index["ring"].size - 1):][:1])]
        if step < n_steps - 1:
            writes.append(("x0", index["x0"]))
    return [(n, np.asarray(i).ravel()) for n, i in reads], [(n, np.asarray(i).ravel()) for n, i in writes]


def _light_execute(buffers: dict[str, torch.Tensor]) -> Callable[[np.ndarray, int, int], None]:
    # Without compute only SAMPLE matters: it advances the position (which decides the KV slots read).
    def execute(instr: np.ndarray, step: int, n_steps: int) -> None:
        state = buffers["state"]
        if int(instr[W_OP]) == OP_SAMPLE and not int(state[STATE_DONE]):
            state[STATE_POS] += 1
            state[STATE_EMITTED] += 1
            state[STATE_DONE] = int(int(state[STATE_EMITTED]) >= int(state[STATE_BUDGET]))

    return execute


@dataclass
class CheckReport:
    """What `check_schedule` ran.

    Attributes:
        orders: random orders run (per launch).
        launches: launches per order.
        instructions: instruction instances executed per order.
    """

    orders: int
    launches: int
    instructions: int


def check_schedule(program: Program, make_state: Callable[[], tuple[MegakernelVM, Callable[[], None]]],
                   n_steps: int, orders: int = 20, launches: int = 2, seed: int = 0, compute: bool = False,
                   reset_counters: bool = True) -> CheckReport:
    """Run `program` in the fixed order and in `orders` random orders; raise on any violation.

    Args:
        program: the encoded step.
        make_state: returns a fresh (vm, begin_launch) pair: a `MegakernelVM` over freshly initialised
            buffers (same contents every call), and a function that sets the state for the next launch
            (it is called before each launch, after the previous one finished).
        n_steps: steps per launch.
        orders: random orders to try.
        launches: launches per order (counters are reset between them unless reset_counters=False).
        seed: random seed.
        compute: execute the ops (and compare final buffers bit for bit with the fixed order); without
            it only the positions advance, which is enough for hazards and deadlocks and much faster.
        reset_counters: zero the counters before each launch (False models a runtime that forgets).

    Returns:
        A `CheckReport`.

    Raises:
        HazardError, DeadlockError, ScheduleError: the first violation found, with the instruction,
            step and SM involved.
    """
    expected: dict[tuple[int, int, int], list[tuple[str, np.ndarray, np.ndarray]]] = {}

    def run(rng: np.random.Generator | None) -> tuple[dict[str, torch.Tensor], int]:
        vm, begin = make_state()
        buffers = vm.b
        index = {name: np.arange(t.numel()).reshape(t.shape) for name, t in buffers.items()}
        last = {name: np.full(t.numel(), -1, dtype=np.int64) for name, t in buffers.items()}
        ntasks = int(program.lengths.sum())
        executed = [0]
        inner = vm.execute if compute else _light_execute(buffers)

        def instance(instr: np.ndarray, step: int, launch: int) -> int:
            return (launch * n_steps + step) * ntasks + int(instr[W_TASK])

        def describe(inst: int) -> str:
            if inst < 0:
                return "the host"
            launch_step, task = divmod(inst, ntasks)
            launch, step = divmod(launch_step, n_steps)
            sm, i = _locate(program, task)
            if sm < 0:
                return f"task {task} of launch {launch} step {step}"
            instr = program.instructions[sm, i]
            return (f"{OP_NAMES[int(instr[W_OP])]}(layer {int(instr[W_LAYER])}, {int(instr[W_A])}, "
                    f"{int(instr[W_B])}) of launch {launch} step {step} on SM {sm}")

        def check_reads(sm: int, instr: np.ndarray, step: int, launch: int, when: str) -> None:
            inst = instance(instr, step, launch)
            reads, _ = regions(program, instr, step, n_steps, buffers["state"], index)
            if rng is None:
                expected[(launch, step, int(instr[W_TASK]))] = [(n, i, last[n][i].copy()) for n, i in reads]
                return
            for name, ids, want in expected[(launch, step, int(instr[W_TASK]))]:
                got = last[name][ids]
                bad = np.nonzero(got != want)[0]
                if bad.size:
                    k = int(bad[0])
                    raise HazardError(
                        f"{describe(inst)} {when} reading {name}[{int(ids[k])}], last written by "
                        f"{describe(int(got[k]))}; the fixed order has {describe(int(want[k]))}")

        for launch in range(launches):
            counters = buffers["counters"]
            if reset_counters:
                counters.zero_()
            if launch and bool((counters != 0).any()):
                raise ScheduleError(f"launch {launch} starts with counters not reset: "
                                    f"{_nonzero_counters(program, counters)}")
            begin()

            def on_start(sm, instr, step, launch=launch):
                check_reads(sm, instr, step, launch, "started")

            def execute(instr, step, n, launch=launch):
                sm = -1
                check_reads(sm, instr, step, launch, "finished")
                _, writes = regions(program, instr, step, n_steps, buffers["state"], index)
                inner(instr, step, n)
                inst = instance(instr, step, launch)
                for name, ids in writes:
                    last[name][ids] = inst
                executed[0] += 1

            run_launch(program, n_steps, counters, execute, rng=rng, on_start=on_start)
            want = program.counter_targets.astype(np.int64) * n_steps
            got = counters.numpy().astype(np.int64)[: len(want)]
            if not np.array_equal(got, want):
                off = [f"{program.counter_names[i]}={got[i]} (want {want[i]})"
                       for i in np.nonzero(got != want)[0][:4]]
                raise ScheduleError(f"launch {launch} ends with counters off their targets: {', '.join(off)}")
        return buffers, executed[0]

    reference, count = run(None)
    rng = np.random.default_rng(seed)
    for _ in range(orders):
        buffers, _ = run(rng)
        if compute:
            for name, tensor in reference.items():
                if name != "counters" and not torch.equal(tensor.nan_to_num(), buffers[name].nan_to_num()):
                    raise HazardError(f"buffer {name} differs from the fixed order's after a random order")
    return CheckReport(orders=orders, launches=launches, instructions=count)


def _locate(program: Program, task: int) -> tuple[int, int]:
    for sm in range(program.num_sms):
        hits = np.nonzero(program.queue(sm)[:, W_TASK] == task)[0]
        if hits.size:
            return sm, int(hits[0])
    return -1, -1


def _nonzero_counters(program: Program, counters: torch.Tensor) -> str:
    nz = torch.nonzero(counters).view(-1).tolist()[:4]
    return ", ".join(f"{program.counter_names[i]}={int(counters[i])}" for i in nz)


__all__ = ["CheckReport", "DeadlockError", "HazardError", "ScheduleError", "check_schedule", "regions"]
