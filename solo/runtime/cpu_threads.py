"""How many threads the next native CPU decode step runs on (CpuRuntime's thread governor).

The decode step splits every matrix over its threads and meets at ~5 barriers per layer. When another
process holds one of the cores, the step's thread on that core runs only part of the time; even with the rows
handed out in chunks (the free threads take the late one's rows), every barrier still waits until the OS
runs that thread again, so the step runs at the speed of the shared core. One thread fewer leaves the busy
core to the other work and streams the weights from the free ones: measured on a 2-core Zen 4 beside one
busy loop, one thread decoded faster than two (benchmarks/results/amd-epyc-zen4/).

The kernel counts barrier waits longer than 1 ms (an idle machine's threads meet within microseconds);
`ThreadGovernor` drops a thread after a step with several of them, and after a hold of some steps tries one
more again, doubling the hold each time the extra thread is still late (up to `max_hold`: 128 steps, a few
seconds, is how long a step stays on fewer threads after the other work has stopped; one slow try per 128
steps costs little while it runs). A row's arithmetic does not depend on the thread count, so the logits are
bit for bit the same whatever it decides.
"""

from __future__ import annotations

import os


class ThreadGovernor:
    """Threads for the next decode step, from the late barrier waits of the previous ones.

    Args:
        max_threads: the runtime's thread count (the most this returns).
        enabled: False keeps `max_threads` always (SOLO_CPU_ADAPT_THREADS=0).
        late_waits: waits longer than the kernel's threshold in one step that count as a preempted thread.
        min_hold: steps at a lowered count before one more thread is tried.
        max_hold: the longest hold (reached by doubling after failed tries).

    Attributes:
        threads: the count for the next step.
        steps: steps reported so far; reduced_steps: how many of them ran on fewer than `max_threads`.
    """

    def __init__(self, max_threads: int, enabled: bool | None = None, late_waits: int = 2, min_hold: int = 16,
                 max_hold: int = 128) -> None:
        if enabled is None:
            enabled = os.environ.get("SOLO_CPU_ADAPT_THREADS", "1") != "0"
        self.max_threads = max(1, max_threads)
        self.enabled = enabled
        self.late_waits = late_waits
        self.min_hold = min_hold
        self.max_hold = max_hold
        self.threads = self.max_threads
        self._hold = min_hold
        self._steps = 0
        self.steps = 0
        self.reduced_steps = 0
        self._retry_at = 0
        self._trying = False  # the last step ran one thread more than the steps before it

    def report(self, late: int) -> None:
        """Record one step's count of late barrier waits (the value `solo_decode` returned)."""
        self.steps += 1
        self.reduced_steps += self.threads < self.max_threads
        if not self.enabled:
            return
        self._steps += 1
        if late >= self.late_waits and self.threads > 1:
            # A failed try doubles the hold; lateness after a steady stretch starts from the shortest hold.
            self._hold = min(2 * self._hold, self.max_hold) if self._trying else self.min_hold
            self.threads -= 1
            self._retry_at = self._steps + self._hold
            self._trying = False
            return
        if self._trying:
            self._trying = False
            self._hold = self.min_hold
        if self.threads < self.max_threads and self._steps >= self._retry_at:
            self.threads += 1
            self._trying = True
