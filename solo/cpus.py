"""How many CPUs this process may use: its affinity mask and its cgroup's CPU quota (a container's CPU limit).

PyTorch's default thread count (one per physical core the affinity mask allows) does not see a CPU quota:
`docker run --cpus 1`, a Kubernetes CPU limit or systemd's CPUQuota= leave every core visible and let the
process run for only `quota` microseconds of CPU time per `period`. The decode step's threads meet at barriers
several times per layer, so a team larger than the quota burns the quota in spins and the cgroup is then
stopped until the next period. Measured on a 2-core Xeon (model 167) in a cgroup with 1 CPU's quota: 2 threads
decoded the Qwen2.5-0.5B shape at 13.1 tok/s and 1 thread at 14.8; the bundled model at 750 vs 1100 tok/s.
With 1.5 CPUs 2 threads were faster (20.4 vs 14.7 tok/s; the bundled model 585 vs 550), and with 1.2 slower
(407-460 vs 547-560). Hence `threads_for_cpu_limit`: the quota rounded to the nearest whole CPU, at least one,
for the decode steps (`solo.runtime.cpu_threads.ThreadGovernor`'s decode_threads). A prompt's steps keep every
thread: after an idle spell the period's quota is there to spend, and two threads prefilled a 64-token prompt
in 88-112 ms against 143-145 on one. Benchmark: benchmarks/results/intel-xeon-amx/cpu-quota-threads-2026-12-07.md.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from solo.cgroup import CGROUP_ROOT, SELF_CGROUP, cgroup_folders


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask; `os.cpu_count()` where the mask cannot be read), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cgroup_cpu_limit(root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> float | None:
    """CPUs' worth of time this process's cgroups allow (quota / period), or None where no quota is set.

    Read for this process's cgroup and each parent (`solo.cgroup.cgroup_folders`); the smallest wins. cgroup v2:
    `cpu.max` ("150000 100000", or "max 100000" for none); v1 (under `root`/cpu): `cpu.cfs_quota_us` (-1 for
    none) over `cpu.cfs_period_us`. Files that cannot be read or parsed count as no quota.

    Returns:
        float: for example 1.5 for `docker run --cpus 1.5`; None without a quota.
    """
    folders = cgroup_folders("cpu", root, self_cgroup)
    limits = [limit for folder in folders.v2 if (limit := _v2_limit(folder)) is not None]
    limits += [limit for folder in folders.v1 if (limit := _v1_limit(folder)) is not None]
    return min(limits) if limits else None


def _v2_limit(folder: Path) -> float | None:
    try:
        quota, _, period = (folder / "cpu.max").read_text(encoding="ascii").strip().partition(" ")
        if quota == "max":
            return None
        return _ratio(int(quota), int(period or "100000"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _v1_limit(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text(encoding="ascii").strip())
        if quota < 0:
            return None
        return _ratio(quota, int((folder / "cpu.cfs_period_us").read_text(encoding="ascii").strip()))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _ratio(quota_us: int, period_us: int) -> float | None:
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def threads_for_cpu_limit(limit: float) -> int:
    """The most threads worth running under a CPU quota of `limit` CPUs.

    `limit` rounded to the nearest whole CPU (halves up), at least 1; the module docstring has the measurements.
    """
    return max(1, math.floor(limit + 0.5))


def cpus_text(cpus: float) -> str:
    """A CPU count for messages: "1 CPU", "1.5 CPUs", "0.25 CPUs" (two decimals at most)."""
    shown = f"{round(cpus, 2):g}" if cpus >= 0.01 else f"{cpus:.1g}"  # (0.001: a quota of 1 ms per second)
    return f"{shown} CPU" if shown == "1" else f"{shown} CPUs"


def usable_cpus() -> float:
    """CPUs' worth of time this process may use at once: the affinity mask's count, or the CPU quota if smaller."""
    limit = cgroup_cpu_limit()
    cpus = float(affinity_cpus())
    return cpus if limit is None else min(cpus, limit)


def threads_within_cpu_limit(threads: int) -> int:
    """`threads`, lowered to `threads_for_cpu_limit` of this process's CPU quota where one is set (>= 1)."""
    limit = cgroup_cpu_limit()
    return threads if limit is None else max(1, min(threads, threads_for_cpu_limit(limit)))
