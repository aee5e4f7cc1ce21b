"""The process heap of a long-running server: glibc's malloc arenas, the garbage collector's startup heap."""

from __future__ import annotations

M_ARENA_MAX = -8
"""glibc's mallopt() parameter for the most malloc arenas (malloc.h)."""


def limit_malloc_arenas(environ: dict[str, str] | None = None) -> int | None:
    """Cap glibc's malloc arenas at the CPU count (at least 2) for a long-running server; None if not done.

    glibc gives each thread that contends for the heap its own arena, up to 8 per core, and an arena keeps
    the memory freed into it. A server's threads (the scheduler, the event loop, torch's and the HTTP
    workers) then hold several partly used heaps: in a 150-second soak at a fixed 12 req/s (bundled
    model, benchmarks/results/load-soak-rss-drift.md) two arenas on 2 cores ended 36 MiB lower and flat
    from 55 s on (drift +0.92% against +2.04%; one run each on a shared machine). Left alone where the
    user set MALLOC_ARENA_MAX (glibc reads it at start) and off glibc.

    Returns:
        The cap set, or None.
    """
    import ctypes
    import ctypes.util
    import os
    import sys

    environ = os.environ if environ is None else environ
    if "MALLOC_ARENA_MAX" in environ or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or no libc found: nothing to cap
        return None
    cap = max(2, os.cpu_count() or 2)
    return cap if mallopt(M_ARENA_MAX, cap) == 1 else None


def freeze_startup_heap() -> int:
    """Move every object alive now out of the cyclic garbage collector's sight (`gc.freeze`); returns their count.

    Called once the model is loaded and the scheduler runs. The startup heap (torch, transformers, the
    tokenizer, the model's Python objects: millions of container objects) lives as long as the process,
    yet every oldest-generation collection walked all of it: on the bundled model under the chat workload
    at 30 req/s (2-core Zen 5) four such collections of 155-270 ms each stopped every thread in a 45-second
    phase, and the requests that arrived during them were the p99 of TTFT. Frozen, a collection walks only
    what the server made since. vLLM's engine core freezes its startup heap for the same reason, and so does
    `solo bench --load`'s load generator (its collections held every stream's reads).
    """
    import gc

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze_heap() -> None:
    """Give the frozen heap back to the collector (`gc.unfreeze`) when the server stops in a process that goes on.

    Frozen objects that became garbage since are collected again (a cycle among them is otherwise never freed).
    """
    import gc

    gc.unfreeze()
