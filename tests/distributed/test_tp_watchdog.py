"""The tensor-parallel watchdog on a fake store: a rank whose heartbeat stands still while a call waits fails the
runtime; a long call with beating ranks, or a pause of the whole process group, does not."""

from __future__ import annotations

import threading
import time

import pytest

from solo.distributed import runtime as tp_runtime
from solo.distributed.runtime import TPRuntime


class _Store:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + amount
            return self.counts[key]


def _rank0(monkeypatch) -> TPRuntime:
    monkeypatch.setattr(tp_runtime, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(tp_runtime, "STALL_S", 0.5)
    runtime = object.__new__(TPRuntime)  # (no process group: only what the watchdog reads)
    runtime.world, runtime.failed, runtime._closed, runtime.exit_on_failure = 2, None, False, False
    runtime._call_since = time.monotonic()  # a call waits for the whole test
    return runtime


def _watch(runtime: TPRuntime, store: _Store, seconds: float, beating: bool) -> None:
    watchdog = threading.Thread(target=runtime._watchdog, args=(store,), daemon=True)
    watchdog.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end and runtime.failed is None:
        if beating:
            store.add(tp_runtime._beat_key(1), 1)
        time.sleep(0.05)
    runtime._closed = True
    watchdog.join(2)


def test_a_rank_whose_heartbeat_stands_still_fails_the_runtime(monkeypatch):
    runtime, store = _rank0(monkeypatch), _Store()
    store.add(tp_runtime._beat_key(1), 3)  # it beat before
    _watch(runtime, store, 3.0, beating=False)
    assert runtime.failed and "rank 1 stopped answering" in runtime.failed


@pytest.mark.parametrize("beat_before", [0, 3])
def test_a_long_call_with_beating_ranks_or_a_rank_that_never_beat_is_fine(monkeypatch, beat_before):
    runtime, store = _rank0(monkeypatch), _Store()
    store.add(tp_runtime._beat_key(1), beat_before)
    _watch(runtime, store, 1.5, beating=beat_before > 0)  # three STALL_S of a call; a rank that never beat
    assert runtime.failed is None  # (another launcher's) is not watched


def test_a_pause_of_this_process_too_says_nothing_of_a_rank(monkeypatch):
    # A review: Ctrl+Z / fg (or a paused container) stops every rank; on resume the watchdog may run before the
    # follower's heartbeat thread.
    runtime, store = _rank0(monkeypatch), _Store()
    store.add(tp_runtime._beat_key(1), 3)
    real_sleep, slept = time.sleep, []

    def sleep(seconds: float) -> None:
        if threading.current_thread().name == "watchdog":
            slept.append(seconds)
            if len(slept) == 3:  # after it saw the rank's count: the whole group stands still for 2 x STALL_S
                real_sleep(1.0)
        real_sleep(seconds)

    monkeypatch.setattr(tp_runtime.time, "sleep", sleep)
    watchdog = threading.Thread(target=runtime._watchdog, args=(store,), daemon=True, name="watchdog")
    watchdog.start()
    real_sleep(1.3)  # the watchdog runs again first, then the follower beats
    assert len(slept) >= 4
    store.add(tp_runtime._beat_key(1), 1)
    for _ in range(6):
        real_sleep(0.05)
        store.add(tp_runtime._beat_key(1), 1)
    runtime._closed = True
    watchdog.join(2)
    assert runtime.failed is None
