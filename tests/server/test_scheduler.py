"""The scheduler without HTTP: parity with Engine.run, queue bounds, cancellation, abort, fused decode."""

from __future__ import annotations

import asyncio

import pytest
import torch
from server_harness import BACKEND

from solo.engine.engine import Engine
from solo.engine.sampling import SamplingParams
from solo.runtime.base import decode_spans_by_calls
from solo.server.scheduler import ABORT, QueueFullError, Scheduler, SchedulerStoppedError


@pytest.fixture(scope="module")
def engine(tiny_model) -> Engine:
    return Engine.load(tiny_model, dtype="float32", backend=BACKEND)


def make(engine: Engine, prompt: str, **params):
    return engine.make_request(prompt, SamplingParams(logprobs=0, **params))


async def drain(generation) -> dict[int, list]:
    out: dict[int, list] = {}
    async for index, event in generation.events():
        out.setdefault(index, []).append(event)
    return out


def lone(engine: Engine, prompt: str, **params) -> tuple[list[int], list[float]]:
    events = list(engine.run(make(engine, prompt, **params)))
    return [t for e in events for t in e.token_ids], [i.logprob for e in events for i in e.logprobs]


@pytest.mark.parametrize("decode_batching", ["isolated", "fused"])
def test_batched_requests_complete(engine, decode_batching):
    prompts = ["def f(x):", "class A:", "hello there", "import sys"]
    params = [dict(max_tokens=12, temperature=0.0), dict(max_tokens=7, temperature=0.9, seed=3),
              dict(max_tokens=20, temperature=0.0), dict(max_tokens=3, temperature=1.0, seed=4)]
    expected = [lone(engine, p, **kw, ignore_eos=True) for p, kw in zip(prompts, params, strict=True)]
    scheduler = Scheduler(engine.runtime, max_batch=2, max_queue=8, max_seq=256, decode_batching=decode_batching)
    scheduler.start()
    try:
        async def main():
            loop = asyncio.get_running_loop()
            gens = [scheduler.submit([make(engine, p, **kw, ignore_eos=True)], loop)
                    for p, kw in zip(prompts, params, strict=True)]
            return await asyncio.gather(*(drain(g) for g in gens))

        results = asyncio.run(main())
    finally:
        scheduler.stop()
    assert scheduler.peak_active == 2
    for (tokens, logprobs), result, kw in zip(expected, results, params, strict=True):
        events = result[0]
        got_tokens = [t for e in events for t in e.token_ids]
        assert len(got_tokens) == kw["max_tokens"] == len(tokens)
        if decode_batching == "isolated":  # the lone run's tokens, its logprobs up to float32 rounding
            assert got_tokens == tokens
            # Not bit for bit: a row's reused prefix (prefix caching) was computed by a prefill of another
            # length, and the BLAS picks its GEMM kernel by the number of rows; on some CPUs (an AMD EPYC
            # Zen 4) that moves logits in the last bits, as it does between two lone runs of the same request.
            torch.testing.assert_close([i.logprob for e in events for i in e.logprobs], logprobs,
                                       rtol=0, atol=1e-5)


def test_queue_bound_cancel_and_stop(engine):
    scheduler = Scheduler(engine.runtime, max_batch=1, max_queue=1, max_seq=256)
    scheduler.start()

    async def main():
        loop = asyncio.get_running_loop()
        long = dict(max_tokens=200, temperature=0.0, ignore_eos=True)
        first = scheduler.submit([make(engine, "a", **long)], loop)
        second = scheduler.submit([make(engine, "b", **long)], loop)
        # Whether or not the scheduler thread has admitted "a" yet: one in the row, one queued.
        with pytest.raises(QueueFullError, match=r"\(1 running or starting, 1 queued, queue limit 1\)"):
            scheduler.submit([make(engine, "c", **long)], loop)
        # Take one event from the first, then cancel both: the row frees, the queue empties.
        await anext(first.events())
        second.cancel()
        first.cancel()
        for _ in range(100):
            if scheduler.active == 0 and scheduler.waiting == 0:
                break
            await asyncio.sleep(0.01)
        assert (scheduler.active, scheduler.waiting) == (0, 0)
        # n choices are all or nothing: 3 do not fit in 1 row + 1 queued.
        with pytest.raises(QueueFullError, match="0 queued, queue limit 1; this request has 3 choices"):
            scheduler.submit([make(engine, "d", max_tokens=2) for _ in range(3)], loop)
        done = await drain(scheduler.submit([make(engine, "d", max_tokens=2) for _ in range(2)], loop))
        assert sorted(done) == [0, 1]

    try:
        asyncio.run(main())
    finally:
        scheduler.stop()
    with pytest.raises(SchedulerStoppedError):
        scheduler.submit([make(engine, "e", max_tokens=2)], asyncio.new_event_loop())


def test_abort_all_ends_streams_with_abort(engine):
    scheduler = Scheduler(engine.runtime, max_batch=1, max_queue=4, max_seq=256)
    scheduler.start()

    async def main():
        loop = asyncio.get_running_loop()
        long = dict(max_tokens=250, temperature=0.0, ignore_eos=True)
        running = scheduler.submit([make(engine, "a", **long)], loop)
        waiting = scheduler.submit([make(engine, "b", **long)], loop)
        await anext(running.events())
        scheduler.abort_all()
        ran, waited = await drain(running), await drain(waiting)
        assert ran[0][-1].finish_reason == ABORT and ran[0][-1].stats is not None
        assert waited[0][-1].finish_reason == ABORT

    try:
        asyncio.run(main())
    finally:
        scheduler.stop()
    assert scheduler.active == 0


def test_rejects_bad_sizes(engine):
    with pytest.raises(ValueError):
        Scheduler(engine.runtime, max_batch=0, max_queue=1, max_seq=256)
    with pytest.raises(ValueError):
        Scheduler(engine.runtime, max_batch=1, max_queue=1, max_seq=256, decode_batching="sometimes")  # type: ignore[arg-type]


class _Declared:
    """A runtime wrapper that declares batch invariance; `skew` perturbs batched logits to break it."""

    batch_invariant = True

    def __init__(self, runtime, skew: float = 0.0) -> None:
        self.inner, self.skew = runtime, skew
        self.name, self.config, self.device = runtime.name, runtime.config, runtime.device

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode_spans(self, rows, tokens, starts):  # through this wrapper's decode (and the inner verify)
        return decode_spans_by_calls(self, rows, tokens, starts)

    def reserve(self, rows, max_seq):
        self.inner.reserve(rows, max_seq)

    def prefill(self, row, ids, start_pos=0):
        return self.inner.prefill(row, ids, start_pos)

    def decode(self, rows, ids, positions):
        logits = self.inner.decode(rows, ids, positions)
        return logits + self.skew if rows.numel() > 1 else logits


def test_auto_batching_needs_a_declared_and_verified_invariant_runtime(engine):
    # The eager runtime declares nothing: one batch-1 call per row.
    assert Scheduler(engine.runtime, max_batch=4, max_queue=0, max_seq=64).decode_batching == "isolated"
    # Declared and true (batched calls of the wrapper go row by row through the same logits): fused.
    row_by_row = _Declared(engine.runtime)
    row_by_row.decode = lambda rows, ids, pos: torch.cat(  # noqa: E731
        [engine.runtime.decode(rows[i:i + 1], ids[i:i + 1], pos[i:i + 1]) for i in range(rows.numel())])
    assert Scheduler(row_by_row, max_batch=4, max_queue=0, max_seq=64).decode_batching == "fused"
    # Declared but false: the probe catches it.
    assert Scheduler(_Declared(engine.runtime, skew=1e-6), max_batch=4, max_queue=0,
                     max_seq=64).decode_batching == "isolated"
    # Forced modes are taken as given.
    assert Scheduler(engine.runtime, max_batch=4, max_queue=0, max_seq=64,
                     decode_batching="fused").decode_batching == "fused"


def test_a_failing_step_fails_its_requests_and_the_scheduler_goes_on(engine):
    class Flaky(_Declared):
        failures = 1

        def decode(self, rows, ids, positions):
            if self.failures:
                self.failures -= 1
                raise RuntimeError("device lost")
            return self.inner.decode(rows, ids, positions)

    scheduler = Scheduler(Flaky(engine.runtime), max_batch=1, max_queue=1, max_seq=256, decode_batching="isolated")
    scheduler.start()

    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(RuntimeError, match="device lost"):
            await drain(scheduler.submit([make(engine, "a", max_tokens=5)], loop))
        done = await drain(scheduler.submit([make(engine, "a", max_tokens=5, ignore_eos=True)], loop))
        assert sum(len(e.token_ids) for e in done[0]) == 5

    try:
        asyncio.run(main())
    finally:
        scheduler.stop()
    assert scheduler.error is None and scheduler.active == 0


def test_the_probe_tries_several_row_mixes(engine):
    # A runtime that differs from batch 1 only when a batch mixes rows 20+ tokens apart: the first,
    # historical probe shape (2, 5, 8, 11 tokens) passes; the random trials catch it.
    class MixSensitive(_Declared):
        def decode(self, rows, ids, positions):
            logits = self.inner.decode(rows, ids, positions)
            spread = int(positions.max() - positions.min()) if rows.numel() > 1 else 0
            return logits + 1e-6 if spread >= 20 else logits

    assert Scheduler(MixSensitive(engine.runtime), max_batch=4, max_queue=0, max_seq=64).decode_batching == "isolated"


def test_queue_wait_limit_refuses_what_would_wait_too_long_for_a_row(engine):
    # --max-queue-wait: the wait for a row is predicted from the rate rows have been freeing; a request
    # predicted to wait longer than the limit gets QueueFullError (503 + Retry-After) instead of a place.
    scheduler = Scheduler(engine.runtime, max_batch=1, max_queue=8, max_seq=256, max_queue_wait_s=1.5)
    scheduler.start()

    async def main():
        loop = asyncio.get_running_loop()
        long = dict(max_tokens=200, temperature=0.0, ignore_eos=True)
        first = scheduler.submit([make(engine, "a", **long)], loop)
        await anext(first.events())  # holds the only row
        # Without a measured release rate only max_queue bounds the queue.
        assert scheduler.release_rate() is None
        queued = [scheduler.submit([make(engine, "b", max_tokens=2)], loop) for _ in range(2)]
        for g in queued:
            g.cancel()
        for _ in range(100):
            if scheduler.waiting == 0:
                break
            await asyncio.sleep(0.01)
        # Rows have been freeing once a second: one request waits about 1 s, a second one about 2 s.
        with scheduler._cond:
            scheduler._releases.clear()
            scheduler._releases.extend(float(t) for t in range(16))
        assert scheduler.release_rate() == pytest.approx(1.0)
        ok = scheduler.submit([make(engine, "c", max_tokens=2)], loop, priority=5)
        with pytest.raises(QueueFullError, match="queue-wait limit") as refused:
            scheduler.submit([make(engine, "d", max_tokens=2)], loop, priority=5)
        assert refused.value.retry_after_s == 1
        # A more urgent request counts only the waiting requests of its priority or better ahead of it.
        urgent = scheduler.submit([make(engine, "e", max_tokens=2)], loop, priority=-1)
        with pytest.raises(QueueFullError):
            scheduler.submit([make(engine, "f", max_tokens=2)], loop, priority=-1)
        first.cancel()
        await asyncio.gather(drain(ok), drain(urgent))

    try:
        asyncio.run(main())
    finally:
        scheduler.stop()
    with pytest.raises(ValueError, match="max_queue_wait_s"):
        Scheduler(engine.runtime, max_batch=1, max_queue=1, max_seq=256, max_queue_wait_s=-1)


def test_queue_wait_limit_counts_how_long_the_running_requests_have_left(engine):
    # After a burst of short requests the release rate predicted a slot within a fraction of a second
    # while one long request held the only row for 20 s more: the request was admitted and waited 24 s
    # against a 2 s limit, and those refused were told to retry in 2 s. Where the running requests are
    # enough for the rows needed, the median time by which they end counts too.
    from types import SimpleNamespace

    scheduler = Scheduler(engine.runtime, max_batch=1, max_queue=8, max_seq=4096, max_queue_wait_s=2.0)
    loop = asyncio.new_event_loop()
    try:
        def running(made: int, max_new_tokens: int):
            return SimpleNamespace(request=SimpleNamespace(output_ids=[0] * made, max_new_tokens=max_new_tokens))

        with scheduler._cond:
            scheduler._releases.extend(i * 0.05 for i in range(10))  # 10 short requests, 20 released a second
            scheduler._released_lengths.extend([2] * 10)
            scheduler._note_token_time(0.015, 1, 1)  # 15 ms per token
            scheduler._free_rows.clear()
            scheduler._running = [running(200, 1500)]  # outlived every recent request: even odds of 200 more
        assert scheduler.release_rate() == pytest.approx(20.0)
        with pytest.raises(QueueFullError, match="queue-wait limit") as refused:
            scheduler.submit([make(engine, "b", max_tokens=1)], loop)
        assert "about 3.1 s" in str(refused.value)  # 200 tokens x 15 ms, on a grid of x1.25 steps from 2 s
        assert refused.value.retry_after_s == 2  # less the 2 s limit
        # With a request already waiting (more rows ahead than run), the running one's end still bounds it.
        with scheduler._cond:
            scheduler._waiting.append(SimpleNamespace(priority=0, generation=None))
        with pytest.raises(QueueFullError, match="about 3.1 s"):
            scheduler.submit([make(engine, "b", max_tokens=1)], loop)
        # But where another running request is about to end, requests behind it flow through its row (two
        # waiting now, two running).
        with scheduler._cond:
            scheduler._running = [running(200, 1500), running(9, 10)]
            scheduler._waiting.append(SimpleNamespace(priority=0, generation=None))
        admitted = scheduler.submit([make(engine, "b", max_tokens=1)], loop)
        admitted.cancel()
        # Near its token budget it is certain to end within the limit: admitted.
        with scheduler._cond:
            scheduler._waiting.clear()
            scheduler._running = [running(1400, 1500)]
        admitted = scheduler.submit([make(engine, "c", max_tokens=1)], loop)
        admitted.cancel()
        # Recent requests as long as this one: the share of them that ended within the limit's tokens counts.
        with scheduler._cond:
            scheduler._waiting.clear()
            scheduler._released_lengths.clear()
            scheduler._released_lengths.extend([260] * 5 + [900] * 5)
            scheduler._running = [running(200, 1500)]
        admitted = scheduler.submit([make(engine, "d", max_tokens=1)], loop)  # half of them ended within 133
        admitted.cancel()
        with scheduler._cond:
            scheduler._waiting.clear()
            scheduler._released_lengths.clear()
            scheduler._released_lengths.extend([260] * 4 + [900] * 6)
        with pytest.raises(QueueFullError) as refused:
            scheduler.submit([make(engine, "e", max_tokens=1)], loop)
        assert "about 11.9 s" in str(refused.value)  # even odds at 700 more tokens x 15 ms = 10.5 s, on the grid
    finally:
        loop.close()
