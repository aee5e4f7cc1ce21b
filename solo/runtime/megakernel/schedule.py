"""Static schedule of a task graph onto SMs, serialized as fixed-size int32 instructions.

List scheduling (Graham 1969; the cost-driven variant of HEFT, Topcuoglu et al. 2002): tasks are
taken in the graph's topological order and each goes to the SM where it would finish first, given when
that SM is free and when the counters it waits on are complete. A task's duration is the bytes it
streams plus a fixed per-instruction overhead. Every SM's queue is then in topological order, so no
schedule produced here can deadlock (the checker verifies it anyway).

The program is an int32 array [num_sms, max_len, INSTR_WORDS]; SM i runs its first `lengths[i]`
instructions, in order, once per decode step. Instruction words:

    0 opcode   1 layer   2 a   3 b   4 c   (operands, see `graph.Task`)
    5 wait0 counter (-1: none)   6 wait0 signals per step
    7 wait1 counter (-1: none)   8 wait1 signals per step
    9 signal counter (-1: none)  10 task index in the graph  11..15 zero (reserved)

A wait at step s (0-based, within one launch) is satisfied once the counter holds at least
`target * (s + 1)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solo.runtime.megakernel.graph import Dims, TaskGraph

INSTR_WORDS = 16
W_OP, W_LAYER, W_A, W_B, W_C = 0, 1, 2, 3, 4
W_WAIT0, W_TARGET0, W_WAIT1, W_TARGET1, W_SIGNAL, W_TASK = 5, 6, 7, 8, 9, 10

INSTRUCTION_OVERHEAD_BYTES = 8192
"""Fixed cost of one instruction in byte-equivalents (a counter round trip costs about as long as
streaming this much on one SM)."""


@dataclass
class Program:
    """An encoded decode step: what the interpreter kernel and the Python VM execute.

    Attributes:
        dims: the lowering's sizes.
        instructions: int32 [num_sms, max_len, INSTR_WORDS].
        lengths: int32 [num_sms], instructions per SM.
        counter_targets: int32 [num_counters], signals per step of each counter.
        counter_names: readable counter names.
        makespan_bytes: the scheduler's estimate of the step, in byte-equivalents on one SM.
    """

    dims: Dims
    instructions: np.ndarray
    lengths: np.ndarray
    counter_targets: np.ndarray
    counter_names: list[str]
    makespan_bytes: int = 0

    @property
    def num_sms(self) -> int:
        """Persistent CTAs (one per SM)."""
        return int(self.instructions.shape[0])

    @property
    def num_counters(self) -> int:
        """Dependency counters."""
        return int(self.counter_targets.shape[0])

    def queue(self, sm: int) -> np.ndarray:
        """SM `sm`'s instructions, int32 [lengths[sm], INSTR_WORDS]."""
        return self.instructions[sm, : int(self.lengths[sm])]


def schedule(graph: TaskGraph, num_sms: int) -> Program:
    """Assign the graph's tasks to `num_sms` SMs and encode them (see the module docstring).

    Args:
        graph: from `lower_decode_step`.
        num_sms: SMs, one persistent CTA each.

    Returns:
        The encoded `Program`.

    Raises:
        ValueError: num_sms < 1, or a task waits on more than two counters.
    """
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {num_sms}")
    n_counters = len(graph.counter_targets)
    counter_done = np.zeros(n_counters, dtype=np.int64)  # estimated completion time
    sm_free = np.zeros(num_sms, dtype=np.int64)
    queues: list[list[list[int]]] = [[] for _ in range(num_sms)]
    for index, task in enumerate(graph.tasks):
        if len(task.waits) > 2:
            raise ValueError(f"task {index} ({task.stage}) waits on {len(task.waits)} counters (at most 2)")
        ready = max((int(counter_done[c]) for c, _ in task.waits), default=0)
        finish = np.maximum(sm_free, ready) + task.cost_bytes + INSTRUCTION_OVERHEAD_BYTES
        sm = int(np.argmin(finish))
        sm_free[sm] = finish[sm]
        if task.signal >= 0:
            counter_done[task.signal] = max(counter_done[task.signal], finish[sm])
        words = [0] * INSTR_WORDS
        words[W_OP], words[W_LAYER], words[W_A], words[W_B], words[W_C] = (
            task.op, task.layer, task.a, task.b, task.c)
        waits = list(task.waits) + [(-1, 0)] * (2 - len(task.waits))
        words[W_WAIT0], words[W_TARGET0] = waits[0]
        words[W_WAIT1], words[W_TARGET1] = waits[1]
        words[W_SIGNAL], words[W_TASK] = task.signal, index
        queues[sm].append(words)
    max_len = max(1, max(len(q) for q in queues))
    instructions = np.zeros((num_sms, max_len, INSTR_WORDS), dtype=np.int32)
    lengths = np.zeros(num_sms, dtype=np.int32)
    for sm, q in enumerate(queues):
        lengths[sm] = len(q)
        if q:
            instructions[sm, : len(q)] = np.asarray(q, dtype=np.int32)
    return Program(dims=graph.dims, instructions=instructions, lengths=lengths,
                   counter_targets=np.asarray(graph.counter_targets, dtype=np.int32),
                   counter_names=list(graph.counter_names), makespan_bytes=int(sm_free.max()))
