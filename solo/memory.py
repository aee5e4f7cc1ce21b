"""Host memory free for new allocations, and the check a KV cache makes against it before allocating.

Linux overcommits memory: an anonymous mapping far larger than the machine succeeds, and the process is
killed by the kernel's OOM killer later, when the cache's pages are first written. So a host KV cache
(`solo.model.transformer.KVCache`) compares its bytes with what Linux says it can hand out before allocating,
and refuses with the numbers instead. The server checks its static cache against a share of the same figure
at start-up (solo.server.kv_memory).
"""

from __future__ import annotations

import os

from solo.errors import KVCacheMemoryError

KV_MEMORY_FIX = ("ask for fewer tokens (a shorter prompt or max_tokens, --max-model-len) or fewer concurrent sequences "
                 "(--max-batch), or free memory")
"""What a KV cache that does not fit in memory asks of the user (`KVCacheMemoryError`'s fix)."""


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


def check_kv_cache_fits(nbytes: int, rows: int, max_seq: int) -> None:
    """Refuse a host KV cache of `nbytes` bytes that the memory Linux can hand out cannot hold.

    Runtimes free their old cache before allocating a new one, so its memory counts as available. Swap is not
    counted: a KV cache decoded from swap would read every token's keys and values from disk.

    Raises:
        KVCacheMemoryError: `nbytes` is above `meminfo_available_bytes()`; the message gives both.
    """
    free = meminfo_available_bytes()
    if free is None or nbytes <= free:
        return
    raise KVCacheMemoryError(f"the KV cache of {rows} sequence(s) x {max_seq} tokens needs {size_text(nbytes)} but "
                             f"{size_text(free)} of memory is available; {KV_MEMORY_FIX}")


def size_text(nbytes: int) -> str:
    """Bytes as GiB with two decimals from 1 GiB up, else as MiB with one ("3.0 MiB")."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
