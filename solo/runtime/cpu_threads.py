"""How many threads the next native CPU decode step runs on (CpuRuntime's thread governor).

The decode step splits every matrix over its threads and meets at ~5 barriers per layer. When another
process holds one of the cores, the step's thread on that core runs only part of the time; even with the rows
handed out in chunks (the free threads take the late one's rows), every barrier still waits until the OS
runs that thread again, so the step runs at the speed of the shared core. One thread fewer leaves the busy
core to the other work and streams the weights from the free ones: measured on a 2-core Zen 4 beside one
busy loop, one thread decoded faster than two (benchmarks/results/amd-epyc-zen4/).

The kernel counts barrier waits longer than 1 ms (an idle machine's threads meet within microseconds).
After two steps in a row (`late_steps`) with several of them (`late_waits`, and as many again for every
further `late_window_s` of the step: a 1.4 s span prefill on a noisy VM meets 10-15 such waits among its ~100
barriers, costing it about 1%, where beside a busy loop nearly every barrier waits; before this scaling,
back-to-back prefills of one length started tries that ran the next ones on one thread, 1.8 s -> 3.5 s),
`ThreadGovernor` tries one thread fewer for a few steps and keeps it only
if those steps are clearly faster than the steps just before, by `margin` (10%; on a machine that is merely
busy, losing a core's bandwidth can cost more than the waits); at a lowered count it tries one more thread
again after a hold of some steps, and keeps it unless it is clearly slower. The margin is there for VMs
whose memory speed moves from second to second: a try of fewer threads that ran in a faster spell looked
faster, was kept, and the next prompt was prefilled on one thread (a 2-core Zen 5 VM, idle: prefill 1.8x
slower on one thread; beside a busy loop 0.7x: there one thread is the right choice, and 3x faster steps
say so). So a step of a prompt's many tokens runs on every thread unless the lower count was kept for a gain
of 1.5x or more (`ThreadGovernor.threads_for`). A failed try doubles the hold before the same try (up to
`max_hold`: 128 steps, a few seconds, is how long a step may stay on fewer threads after the other work has
stopped). A row's arithmetic does not depend on the thread count, so the logits are bit for bit the same
whatever it decides.
"""

from __future__ import annotations

import statistics
from collections import deque

from solo.env import env_switch


def adapt_threads_enabled() -> bool:
    """Whether `ThreadGovernor` may run steps on fewer threads: yes unless SOLO_CPU_ADAPT_THREADS is off.

    Raises:
        EnvSettingError: a value that is not a switch (`solo.env.env_switch`).
    """
    return env_switch("SOLO_CPU_ADAPT_THREADS", True)


class ThreadGovernor:
    """Threads for the next decode step, from the late barrier waits and the times of the previous ones.

    Args:
        max_threads: the runtime's thread count (the most this returns).
        enabled: False keeps `max_threads` always (default: unless SOLO_CPU_ADAPT_THREADS=0).
        late_waits: waits longer than the kernel's threshold in one step that count as a preempted thread.
        trial_steps: steps a try runs (the first, which wakes or parks a thread, is not timed).
        min_hold: steps before a failed or reverted try is made again, at first.
        max_hold: the longest hold (reached by doubling after failed tries).
        margin: how much faster (fewer threads) a try's median step must be to be kept, and how much slower
            (more threads) to be dropped, as a fraction of the steps before it.
        late_window_s: a step longer than this needs `late_waits` late waits per this many seconds of it
            (a long span prefill is not judged by a decode step's count).
        late_steps: steps in a row with late waits before a try of fewer threads. Beside a busy loop nearly
            every step has them; on an idle 2-core Zen 4 VM one decode step in 70-170 had two, never two steps
            in a row, and with 1 each started a try: 1.3-2.3% of the steps ran on one thread at about half
            speed (benchmarks/governor_idle.py).
        span_batch: steps of at least this many entries (a prompt through the decode kernel: compute-bound)
            run on every thread unless the fewer threads were kept for a gain of `strong_gain` or more, or were
            kept on steps of this size themselves (`threads_for`).
        strong_gain: see span_batch (beside a busy loop one thread's steps were ~3x faster; on a noisy VM a
            try kept by the 10% margin had halved the next prompt's prefill).
        decode_threads: the most threads a step of fewer than `span_batch` entries runs on (default:
            `max_threads`); a container's CPU quota sets it (`solo.cpus.threads_within_cpu_limit`): decode steps
            run back to back and spend the quota, where a prompt's step after an idle spell runs on every
            thread within the quota left in the period (Qwen2.5-0.5B shape at 1 CPU: decode 14.8 tok/s on one
            thread vs 13.1 on two, a 64-token prompt's TTFT 88-112 ms on two vs 143-145 on one).

    Attributes:
        threads: the count for the next step.
        steps: steps reported so far; reduced_steps: how many of them ran on fewer than `max_threads`.

    Raises:
        ValueError: `late_window_s` is not positive.
    """

    def __init__(self, max_threads: int, enabled: bool | None = None, late_waits: int = 2, trial_steps: int = 4,
                 min_hold: int = 16, max_hold: int = 128, margin: float = 0.1, late_window_s: float = 0.1,
                 span_batch: int = 32, strong_gain: float = 1.5, decode_threads: int | None = None,
                 late_steps: int = 2) -> None:
        if enabled is None:
            enabled = adapt_threads_enabled()
        if not late_window_s > 0:
            raise ValueError(f"late_window_s must be a positive number of seconds, got {late_window_s!r}")
        self.max_threads = max(1, max_threads)
        self.enabled = enabled
        self.late_waits = late_waits
        self.late_steps = max(1, late_steps)
        self.trial_steps = max(2, trial_steps)
        self.min_hold = min_hold
        self.max_hold = max_hold
        self.margin = margin
        self.late_window_s = late_window_s
        self.span_batch = span_batch
        self.strong_gain = strong_gain
        self.decode_threads = max(1, min(self.max_threads, decode_threads or self.max_threads))
        self.threads = self.decode_threads
        self.steps = 0
        self.reduced_steps = 0
        self._recent: deque[float] = deque(maxlen=4)  # step seconds at the current count
        self._batch = -1
        self._from: int | None = None  # the count before the running try
        self._before = 0.0  # its median step time
        self._trial: list[float] = []
        self._down_hold = self._up_hold = min_hold
        self._no_down_until = 0  # no try with fewer threads before this step
        self._retry_at = 0  # a try with one more thread at this step
        self._kept_gain = 1.0  # step time before / during the try that lowered the count to `threads`
        self._kept_batch = -1  # the batch size of that try's steps
        self._used = self.threads  # the count `threads_for` gave the step being run
        self._late_run = 0  # steps in a row with late waits (`late_waits`), the last one included

    def _start(self, threads: int) -> None:
        self._from, self._before, self._trial = self.threads, statistics.median(self._recent), []
        self.threads = threads
        self._recent.clear()

    def threads_for(self, batch: int) -> int:
        """Threads for the next step, of `batch` entries (call it before the step; `report` after).

        `threads`, or every thread for a step of `span_batch` or more entries while the count was lowered
        on smaller steps for a gain under `strong_gain`: the decode steps' evidence does not carry to a
        compute-bound prefill, which one thread fewer makes ~2x slower on an idle machine. A try's own steps
        run on its count (so that it is judged); a step of another batch size, which ends the try, runs on
        the count before it.
        """
        threads = self.threads
        if self._from is not None:
            if batch == self._batch:
                self._used = threads
                return threads
            threads = self._from
        lowered_on_small_steps = self._kept_batch < self.span_batch and self._kept_gain < self.strong_gain
        if not self.enabled:
            threads = self.threads if batch < self.span_batch else self.max_threads
        elif batch >= self.span_batch and threads < self.max_threads and lowered_on_small_steps:
            threads = self.max_threads
        self._used = threads
        return threads

    def report(self, late: int, seconds: float, batch: int = 1) -> None:
        """Record one step: its late barrier waits (`solo_decode`'s result), wall time and batch size."""
        self.steps += 1
        self.reduced_steps += self._used < self.max_threads
        self._decide(late, seconds, batch)
        self._used = self.threads  # the next step's count unless `threads_for` says otherwise

    def is_late(self, late: int, seconds: float) -> bool:
        """Whether a step counts toward a try of fewer threads (`late_steps` such steps in a row start one).

        Args:
            late: the step's barrier waits longer than the kernel's threshold.
            seconds: the step's wall time.

        Returns:
            True with `late_waits` late waits, and as many again for every further `late_window_s` of the step.
        """
        return late >= self.late_waits * max(1.0, seconds / self.late_window_s)

    def _decide(self, late: int, seconds: float, batch: int) -> None:
        if not self.enabled:
            return
        self._late_run = self._late_run + 1 if self.is_late(late, seconds) else 0
        if batch != self._batch:  # times of another batch size do not compare
            self._batch = batch
            self._recent.clear()
            if self._from is not None:
                self.threads, self._from = self._from, None
            return
        if self._used != self.threads:  # a span step on every thread (`threads_for`): not this count's time
            return
        if self._from is not None:
            self._trial.append(seconds)
            if len(self._trial) < self.trial_steps:
                return
            went_down = self.threads < self._from
            trial = statistics.median(self._trial[1:])
            # Fewer threads must be clearly faster to stay, more threads clearly slower to go (noise keeps more).
            limit = self._before * (1 - self.margin if went_down else 1 + self.margin)
            failed = trial >= limit if went_down else trial > limit
            if failed:  # back, and wait longer before the same try
                self.threads = self._from
                if went_down:
                    self._down_hold = min(2 * self._down_hold, self.max_hold)
                    self._no_down_until = self.steps + self._down_hold
                else:
                    self._up_hold = min(2 * self._up_hold, self.max_hold)
                    self._retry_at = self.steps + self._up_hold
            else:
                self._down_hold = self.min_hold
                if went_down:
                    self._kept_gain = self._before / trial if trial > 0 else float("inf")
                    self._kept_batch = batch
                    self._retry_at = self.steps + self._up_hold
                else:  # the evidence for the lower count is gone with it
                    self._kept_gain, self._kept_batch = 1.0, -1
                    self._up_hold = self.min_hold
                    self._retry_at = self.steps + self.min_hold
            self._from = None
            return
        self._recent.append(seconds)
        if len(self._recent) < 2:
            return
        if self._late_run >= self.late_steps and self.threads > 1 and self.steps >= self._no_down_until:
            self._start(self.threads - 1)
        elif self.threads < self.decode_threads and self.steps >= self._retry_at:
            self._start(self.threads + 1)
