"""The native decode step's thread partitioning: rows shared out in chunks (stealing), the thread governor."""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_checkpoint

from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime.cpu import CpuRuntime, cpu_unsupported_reason
from solo.runtime.cpu_threads import ThreadGovernor

PROMPT = [1, 17, 93, 5, 250, 31, 77, 8, 140, 66, 12, 301, 9, 44, 2, 180, 23]


def _feed(gov, steps, late, seconds_at):
    """Report `steps` steps, each taking seconds_at[threads] seconds; the thread counts used."""
    used = []
    for _ in range(steps):
        used.append(gov.threads)
        gov.report(late, seconds_at[gov.threads])
    return used


def test_governor_keeps_fewer_threads_when_they_are_faster_beside_a_busy_core():
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=8, max_hold=32)
    hog = {2: 0.030, 1: 0.010}  # one thread on the free core beats two meeting a preempted one
    used = _feed(gov, 3, 1, hog)  # one long wait per step: noise, no try
    assert used == [2, 2, 2]
    used = _feed(gov, 60, 5, hog)
    assert used.count(1) > 45 and gov.threads in (1, 2)
    assert gov._up_hold == 32  # every try of 2 threads failed: the hold doubled to its cap
    # The other work stops: the next try of 2 threads is faster and stays.
    used = _feed(gov, 40, 0, {2: 0.05, 1: 0.10})
    assert used[-5:] == [2] * 5 and gov.threads == 2


def test_a_lone_step_with_late_waits_starts_no_try():
    # An idle VM: now and then one step has two late waits (the host ran something else for a moment), never two
    # steps in a row. Each used to start a try of one thread (4 steps at about half speed); now two in a row do.
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=8, max_hold=32)
    idle = {2: 0.030, 1: 0.055}
    for _ in range(10):
        assert _feed(gov, 1, 2, idle) + _feed(gov, 5, 0, idle) == [2] * 6
    assert gov.reduced_steps == 0
    assert _feed(gov, 3, 2, idle) == [2, 2, 1]  # two steps in a row: a try
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=8, max_hold=32, late_steps=1)
    assert _feed(gov, 3, 0, idle) + _feed(gov, 1, 2, idle) == [2] * 4 and gov.threads == 1  # one step was enough


def test_governor_goes_back_when_fewer_threads_are_slower():
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=8, max_hold=64)
    busy = {2: 0.05, 1: 0.09}  # late waits, but two threads are still faster
    used = _feed(gov, 100, 5, busy)
    assert used.count(1) <= 4 * 4  # a few tries, each 4 steps, the holds doubling between them
    assert gov.threads == 2 and gov._down_hold == 64


def test_governor_drops_a_pending_try_when_the_batch_changes_and_never_goes_below_one():
    gov = ThreadGovernor(3, enabled=True, late_waits=1, trial_steps=2, min_hold=2, max_hold=4)
    for _ in range(3):
        gov.report(5, 0.2, batch=1)
    assert gov.threads == 2
    gov.report(5, 0.2, batch=2)  # the try is abandoned
    assert gov.threads == 3
    for _ in range(200):
        gov.report(5, 0.1 * (4 - gov.threads), batch=2)
        assert 1 <= gov.threads <= 3


def test_a_long_prefill_step_needs_late_waits_in_proportion_to_its_length():
    # A 1.4 s span prefill on a noisy VM: ~12 late waits among its ~100 barriers cost it ~1%: no try of one
    # thread (which would prefill the next prompt of that length at half speed). Beside a busy loop nearly
    # every barrier waits: a try.
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=8, max_hold=32)
    assert _feed(gov, 10, 12, {2: 1.4, 1: 2.6}) == [2] * 10
    assert 1 in _feed(gov, 4, 90, {2: 1.4, 1: 2.6})
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=8, max_hold=32)
    assert 1 in _feed(gov, 4, 2, {2: 0.04, 1: 0.03})  # a decode step: two late waits are enough


def test_a_prompt_span_keeps_every_thread_unless_fewer_were_kept_for_a_clear_gain():
    # Decode steps on a noisy VM: a try of one thread 15% faster by chance is kept; the next prompt's span
    # prefill (compute-bound, ~2x slower on one thread) still runs on both. Beside a busy loop (3x faster on
    # one thread) it takes one too.
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=64, max_hold=64)
    _feed(gov, 8, 5, {2: 0.040, 1: 0.034})
    assert gov.threads == 1 and gov.threads_for(1) == 1 and gov.threads_for(128) == 2
    before = gov.reduced_steps
    gov.report(30, 1.4, batch=128)  # that span step ran on both threads, and is not timed as one thread's
    assert gov.reduced_steps == before and gov.threads == 1
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=64, max_hold=64)
    _feed(gov, 8, 5, {2: 0.030, 1: 0.010})
    assert gov.threads == 1 and gov.threads_for(128) == 1


def _feed_span(gov, steps, late, seconds_at, batch):
    """Like `_feed`, through `threads_for` (as the runtime calls it) at `batch` entries a step."""
    used = []
    for _ in range(steps):
        used.append(gov.threads_for(batch))
        gov.report(late, seconds_at[used[-1]], batch=batch)
    return used


def test_a_try_started_on_span_steps_is_judged_on_them():
    # Back-to-back long prompts beside a busy loop: the try of one thread runs on one thread and is judged;
    # kept on span steps themselves, later spans take one thread without the strong-gain rule.
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=64, max_hold=64)
    used = _feed_span(gov, 10, 200, {2: 1.2, 1: 1.0}, batch=128)
    assert used[:3] == [2, 2, 2] and used[3:] == [1] * 7 and gov.threads == 1
    assert gov._kept_gain < gov.strong_gain and gov.threads_for(128) == 1
    # Judged and found slower, it goes back to both threads.
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=64, max_hold=64)
    used = _feed_span(gov, 10, 200, {2: 1.2, 1: 2.4}, batch=128)
    assert used[3:7] == [1] * 4 and used[7:] == [2] * 3 and gov.threads == 2


def test_a_span_step_during_a_decode_try_runs_on_the_count_before_it():
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=64, max_hold=64)
    _feed_span(gov, 3, 5, {2: 0.04, 1: 0.03}, batch=1)
    assert gov.threads == 1 and gov.threads_for(1) == 1  # a try of one thread, on decode steps
    assert gov.threads_for(2) == 2  # a step of two entries: the count before the try, which ends
    gov.report(0, 0.08, batch=2)
    assert gov.threads == 2 and gov.reduced_steps == 0


def test_an_up_try_kept_drops_the_evidence_of_the_lower_count():
    gov = ThreadGovernor(3, enabled=True, late_waits=2, trial_steps=4, min_hold=4, max_hold=4)
    _feed_span(gov, 7, 5, {3: 0.030, 2: 0.010, 1: 0.010}, batch=1)
    assert gov.threads == 2 and gov._kept_gain >= gov.strong_gain and gov.threads_for(128) == 2
    _feed_span(gov, 7, 5, {3: 0.030, 2: 0.010, 1: 0.008}, batch=1)  # down to 1 by the margin only
    assert gov.threads == 1 and gov._kept_gain < gov.strong_gain and gov.threads_for(128) == 3
    used = _feed_span(gov, 8, 0, {3: 0.030, 2: 0.008, 1: 0.010}, batch=1)  # back up to 2, kept
    assert used[-1] == 2 and gov.threads == 2
    # 2 was kept by an up-try: the 3x evidence that first lowered the count to 2 is gone with it.
    assert gov._kept_batch == -1 and gov.threads_for(128) == 3


def test_governor_rejects_a_window_that_is_not_positive():
    with pytest.raises(ValueError, match="late_window_s"):
        ThreadGovernor(2, late_window_s=0)


def test_governor_disabled_keeps_every_thread(monkeypatch):
    monkeypatch.setenv("SOLO_CPU_ADAPT_THREADS", "0")
    gov = ThreadGovernor(4)
    for _ in range(10):
        assert gov.threads_for(128) == 4 and gov.threads_for(1) == 4
        gov.report(100, 1.0)
    assert gov.threads == 4 and gov.steps == 10


def test_a_cpu_quota_caps_the_decode_steps_not_a_prompts_steps():
    # In a container with a 1-CPU quota two threads decoding back to back spend it in spins and wait for the next
    # period; a prompt's step after an idle spell finds the period's quota there (solo/cpus.py).
    gov = ThreadGovernor(2, enabled=True, trial_steps=2, min_hold=2, decode_threads=1)
    used = _feed(gov, 40, 0, {1: 0.05, 2: 0.03})  # never tries two on decode steps, however fast they would be
    assert used == [1] * 40
    assert gov.threads_for(64) == 2 and gov.threads_for(1) == 1
    gov = ThreadGovernor(4, enabled=False, decode_threads=2)
    assert gov.threads_for(1) == 2 and gov.threads_for(64) == 4
    assert ThreadGovernor(2, decode_threads=8).decode_threads == 2


def _runtime(folder, num_threads):
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
    reason = cpu_unsupported_reason(model)
    if reason is not None:
        pytest.skip(f"the native CPU runtime is not available here ({reason})")
    return CpuRuntime(model, num_threads=num_threads)


def _decode_logits(runtime, steps=5):
    runtime.reserve(2, len(PROMPT) + steps + 1)
    runtime.prefill(0, torch.tensor(PROMPT))
    runtime.prefill(1, torch.tensor(PROMPT[::-1]))
    out = []
    for i in range(steps):
        pos = len(PROMPT) + i
        out.append(runtime.decode(torch.tensor([0]), torch.tensor([3 + i]), torch.tensor([pos])))
        out.append(runtime.decode(torch.tensor([0, 1]), torch.tensor([7, 11 + i]), torch.tensor([pos, pos])))
    return out


def test_chunked_rows_stealing_and_thread_changes_keep_the_bits(tmp_path):
    """Whichever thread computes a chunk of rows (its own run, stolen, the static split; 1-3 threads, a count
    changed between steps by the governor; chunks taken one or several at a time) the logits are bit for bit
    the same."""
    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16, hidden_size=128, head_dim=32,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=352)
    reference = None
    for num_threads, knobs, governed in [(1, {}, False), (2, {}, False), (3, {"chunk_kb": 1}, False),
                                         (2, {"chunk_kb": 1, "static_rows": 1}, False), (2, {"chunk_kb": 1}, True),
                                         (2, {"chunk_kb": 1, "ahead_kb": 64, "ahead_hint": 1, "spin_pause": 0}, False),
                                         (2, {"chunk_kb": 1, "claim_chunks": 1}, False),
                                         (2, {"chunk_kb": 1, "claim_chunks": 3}, False),
                                         (1, {"chunk_kb": 1, "claim_chunks": 2}, False)]:
        runtime = _runtime(folder, num_threads)
        lib = runtime._lib
        try:
            for name, value in knobs.items():
                assert lib.solo_set_knob(name.encode(), value) == 0
            if governed:  # tries of 1 thread now and then (every step is "late")
                runtime.threads = ThreadGovernor(2, enabled=True, late_waits=0, trial_steps=2, min_hold=1,
                                                 max_hold=1)
            logits = _decode_logits(runtime)
        finally:
            lib.solo_set_knob(b"chunk_kb", 128)
            lib.solo_set_knob(b"claim_chunks", 4)
            lib.solo_set_knob(b"static_rows", 0)
            lib.solo_set_knob(b"ahead_kb", 0)
            lib.solo_set_knob(b"ahead_hint", 0)
            lib.solo_set_knob(b"spin_pause", 1)
        if reference is None:
            reference = logits
        else:
            for a, b in zip(reference, logits, strict=True):
                assert torch.equal(a, b), (num_threads, knobs, governed)
    assert runtime._lib.solo_set_knob(b"no such knob", 1) == -1


def test_step_profile_covers_every_phase_and_leaves_the_logits_alone(tmp_path):
    from solo.bench.cpu_profile import PHASES, profile, report

    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16, hidden_size=128, head_dim=32,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=352)
    runtime = _runtime(folder, 2)
    runtime.reserve(1, 64)
    result = profile(runtime, steps=3, context=8)
    assert set(result["phases"]) == set(PHASES)
    assert all(len(v) == 2 and min(v) >= 0 for v in result["phases"].values())
    assert sum(result["phases"]["qkv"]) > 0 and result["matrix_bytes"]["head"] > 0
    assert "GB/s" in report(result)
    # The profile knob is off again, and profiling changes no bit.
    plain = runtime.decode(torch.tensor([0]), torch.tensor([5]), torch.tensor([30]))
    runtime._lib.solo_set_knob(b"profile", 1)
    try:
        profiled = runtime.decode(torch.tensor([0]), torch.tensor([5]), torch.tensor([30]))
    finally:
        runtime._lib.solo_set_knob(b"profile", 0)
    assert torch.equal(plain, profiled)


def test_governor_counts_the_steps_it_ran_on_fewer_threads():
    gov = ThreadGovernor(2, enabled=True, late_waits=1, trial_steps=2, min_hold=3, max_hold=3)
    _feed(gov, 10, 2, {2: 0.03, 1: 0.01})
    assert gov.steps == 10 and 0 < gov.reduced_steps < 10


def test_governor_keeps_every_thread_when_fewer_are_faster_only_by_noise():
    # A VM whose memory speed moves: late waits, and a try of one thread that ran 5% faster by chance.
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=8, max_hold=32)
    used = _feed(gov, 100, 5, {2: 0.100, 1: 0.095})
    assert gov.threads == 2 and used.count(1) <= 4 * 4  # only the tries themselves, each dropped
    # Back from fewer threads: more threads that are within the margin of as fast stay.
    gov = ThreadGovernor(2, enabled=True, late_waits=2, trial_steps=4, min_hold=4, max_hold=4)
    assert _feed(gov, 30, 5, {2: 0.030, 1: 0.010}).count(1) > 15
    used = _feed(gov, 30, 0, {2: 0.105, 1: 0.100})  # the busy loop gone; two threads now 5% slower: kept
    assert used[-5:] == [2] * 5


def _thread_masks() -> dict[int, set[int]]:
    import os

    return {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_getaffinity"), reason="needs Linux thread affinity")
def test_the_workers_keep_off_the_callers_cpu_for_the_call(tmp_path):
    """After an idle spell Linux woke the OpenMP worker on the caller's own CPU, and the step's barriers spun
    while the two shared one core (6-8 ms per region instead of 0.1 ms on a 2-vCPU VM; ~100 ms decode calls on
    the bundled model). During a kernel call its workers' affinity now leaves out the caller's CPU; after it they
    have their masks back (the pool is PyTorch's too: a worker held off the caller's CPU after the call kept
    torch's own regions on one core when the caller moved there). The logits are one thread's bits."""
    import os

    full = os.sched_getaffinity(0)
    if len(full) < 2:
        pytest.skip("one CPU: nothing to keep apart")
    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16, hidden_size=128, head_dim=32,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=352)
    reference = _decode_logits(_runtime(folder, 1))
    runtime = _runtime(folder, 2)
    runtime.threads = ThreadGovernor(2, enabled=False)
    masks = _thread_masks()
    logits = _decode_logits(runtime)
    for a, b in zip(reference, logits, strict=True):
        assert torch.equal(a, b)
    assert runtime._lib.solo_placement_probe(2) == 1  # the worker, inside the call (recorded by the steps)
    assert all(_thread_masks().get(tid, full) == mask for tid, mask in masks.items())  # given back after it
    assert all(mask == full for mask in _thread_masks().values())


def test_worker_placement_turns_off(tmp_path):
    """SOLO_CPU_PLACE_WORKERS=0 leaves the workers' affinity alone (a process of its own: the setting is read
    once)."""
    import os
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing to keep apart")
    script = (
        "from solo.runtime.cpu_build import load_library\n"
        "lib = load_library()\n"
        "lib.solo_placement_probe(2)\n"  # records the worker
        "print(lib.solo_placement_probe(2))\n"
    )
    for setting, expected in (("0", 0), ("1", 1)):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "SOLO_CPU_PLACE_WORKERS": setting})
        assert out.returncode == 0, out.stderr[-2000:]
        assert int(out.stdout.split()[-1]) == expected, (setting, out.stdout)
