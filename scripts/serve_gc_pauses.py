"""Run `solo serve` and report, at exit, the garbage collector's pauses and the decode steps' times.

Measurement only (a wrapper around the CLI): every collection after the first decode step is timed through
`gc.callbacks`, every native `decode_spans` call by the clock, and the summary goes to stderr when the
server stops (Ctrl-C / SIGINT). With SOLO_NO_GC_FREEZE=1 the server does not freeze its startup heap
(`solo.server.heap.freeze_startup_heap`), for a before/after in one checkout:

    SOLO_NO_GC_FREEZE=1 python scripts/serve_gc_pauses.py serve solo/assets/solo-code-16m --port 8765 &
    solo bench --load chat --url http://127.0.0.1:8765 --rates 20 --duration 60 --verify 16
    kill -INT %1
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import time

import solo.runtime.cpu as cpu_runtime
import solo.server.state as server_state
from solo.cli import main

if os.environ.get("SOLO_NO_GC_FREEZE"):
    server_state.freeze_startup_heap = lambda: 0

steps_s: list[float] = []
pauses: list[tuple[float, int]] = []  # (seconds, generation)
_started = [0.0]
_decode_spans = cpu_runtime.CpuRuntime.decode_spans


def _timed_decode_spans(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    start = time.perf_counter()
    try:
        return _decode_spans(self, *args, **kwargs)
    finally:
        steps_s.append(time.perf_counter() - start)


def _on_collection(phase: str, info: dict) -> None:
    if not steps_s:  # start-up: loading and warming up
        return
    if phase == "start":
        _started[0] = time.perf_counter()
    elif _started[0]:
        pauses.append((time.perf_counter() - _started[0], info["generation"]))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _report() -> None:
    ms = [s * 1e3 for s in steps_s]
    print(f"decode steps: {len(ms)}, p50/p90/p99/max {_percentile(ms, .5):.1f}/{_percentile(ms, .9):.1f}/"
          f"{_percentile(ms, .99):.1f}/{max(ms, default=0):.1f} ms, over 50 ms: {sum(m > 50 for m in ms)}",
          file=sys.stderr)
    oldest = [p * 1e3 for p, g in pauses if g == 2]
    young = [p * 1e3 for p, g in pauses if g < 2]
    print(f"collections while serving: {len(pauses)}, {sum(oldest) + sum(young):.0f} ms in all; oldest generation "
          f"{len(oldest)} ({', '.join(f'{p:.1f}' for p in oldest) or '-'} ms); younger at most "
          f"{max(young, default=0):.1f} ms", file=sys.stderr)


cpu_runtime.CpuRuntime.decode_spans = _timed_decode_spans
gc.callbacks.append(_on_collection)
atexit.register(_report)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
