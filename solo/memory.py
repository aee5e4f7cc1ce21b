"""Host memory free for new allocations, and the check a KV cache makes against it before allocating.

Linux overcommits memory: an anonymous mapping far larger than the machine succeeds, and the process is
killed by the kernel's OOM killer later, when the cache's pages are first written. So a host KV cache
(`solo.model.transformer.KVCache`) compares its bytes with what Linux says it can hand out before allocating,
and refuses with the numbers instead. The server checks its static cache against a share of the same figure
at start-up (solo.server.kv_memory). In a container the cgroup's memory limit counts too: its OOM killer acts
on the container's limit whatever the host has free.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from solo.cgroup import CGROUP_ROOT, SELF_CGROUP, cgroup_folders
from solo.errors import KVCacheMemoryError

KV_MEMORY_FIX = ("ask for fewer tokens (a shorter prompt or max_tokens, --max-model-len) or fewer concurrent sequences "
                 "(--max-batch), or free memory")
"""What a KV cache that does not fit in memory asks of the user (`KVCacheMemoryError`'s fix)."""

_CGROUP_V1_NO_LIMIT = 1 << 60
"""cgroup v1 writes "no limit" as a huge page-aligned number (9223372036854771712 on x86-64)."""


class HostMemory(NamedTuple):
    """Bytes the host can hand out now, and which limit gave them.

    Attributes:
        available_bytes: the smaller of `MemAvailable` and the container's room, or None where neither can be read.
        source: "MemAvailable", "the container's memory limit" or "unknown".
    """

    available_bytes: int | None
    source: str


def meminfo_available_bytes() -> int | None:
    """Bytes Linux can hand out without swapping, or None where it cannot be read.

    `MemAvailable` of /proc/meminfo, else the free physical pages (sysconf).
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def cgroup_room_bytes(root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> int | None:
    """Bytes this process may still take before a cgroup's OOM killer acts, or None where no limit is set.

    Per cgroup with a limit: the limit minus what it uses, its inactive file pages not counted as used (the
    kernel reclaims them before it kills: the "working set" of container runtimes). Read for this process's
    cgroup (its path in `self_cgroup`, under `root`) and each parent up to `root`, since a parent's limit (a
    systemd slice's MemoryMax=, a container's) binds too; the smallest room wins. cgroup v2: `memory.max`,
    `memory.current`, `memory.stat`'s inactive_file; v1 (under `root`/memory): `memory.limit_in_bytes`,
    `memory.usage_in_bytes`, `memory.stat`'s total_inactive_file. None where no limit is set or nothing can be
    read. The folders: `solo.cgroup.cgroup_folders`.
    """
    folders = cgroup_folders("memory", root, self_cgroup)
    rooms = [room for folder in folders.v2
             if (room := _read_cgroup(folder, "memory.max", "memory.current", "inactive_file")) is not None]
    rooms += [room for folder in folders.v1
              if (room := _read_cgroup(folder, "memory.limit_in_bytes", "memory.usage_in_bytes",
                                       "total_inactive_file")) is not None]
    return min(rooms) if rooms else None


def _read_cgroup(folder: Path, limit_name: str, usage_name: str, inactive_key: str) -> int | None:
    try:
        limit = (folder / limit_name).read_text(encoding="ascii").strip()
        if limit == "max" or int(limit) >= _CGROUP_V1_NO_LIMIT:
            return None
        used = int((folder / usage_name).read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    inactive = 0
    try:
        for line in (folder / "memory.stat").read_text(encoding="ascii").splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
                break
    except (OSError, ValueError):
        pass
    return max(0, int(limit) - max(0, used - inactive))


def host_memory() -> HostMemory:
    """What the host can hand out for a new allocation: `MemAvailable`, within the container's limit where set."""
    free, room = meminfo_available_bytes(), cgroup_room_bytes()
    if room is not None and (free is None or room < free):
        return HostMemory(room, "the container's memory limit")
    return HostMemory(free, "MemAvailable" if free is not None else "unknown")


def check_kv_cache_fits(nbytes: int, rows: int, max_seq: int) -> None:
    """Refuse a host KV cache of `nbytes` bytes that the memory Linux can hand out cannot hold.

    Runtimes free their old cache before allocating a new one, so its memory counts as available. Swap is not
    counted: a KV cache decoded from swap would read every token's keys and values from disk.

    Raises:
        KVCacheMemoryError: `nbytes` is above `host_memory()`; the message gives both and which limit it is.
    """
    free, source = host_memory()
    if free is None or nbytes <= free:
        return
    raise KVCacheMemoryError(f"the KV cache of {rows} sequence(s) x {max_seq} tokens needs {size_text(nbytes)} but "
                             f"{size_text(free)} of memory is available ({source}); {KV_MEMORY_FIX}")


def size_text(nbytes: int) -> str:
    """Bytes as GiB with two decimals from 1 GiB up, else as MiB with one ("3.0 MiB")."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
