"""Stall-free batching on the native CPU runtime: prompts prefilled inside the decode step's `decode_spans`
call while other rows decode (solo/server/scheduler.py, `Scheduler._mixed_iteration`).

Every test checks the greedy tokens against the same request run alone (an isolated scheduler with one
row: `prefill`, then batch-1 decode steps, the calls `Engine.run` makes)."""

from __future__ import annotations

import asyncio
import math

import pytest

from solo.engine.engine import Engine
from solo.engine.sampling import SamplingParams
from solo.errors import SoloError
from solo.server.scheduler import PAUSE_TAIL_TOKENS, Scheduler, span_prefill_limit

PROMPTS = ["import os", "def add(a, b):\n    return a + b\n" * 3, "x = [i * i for i in range(10)]",
           "class Point:\n    def __init__(self, x, y):\n        self.x = x\n"]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(request, tiny_model) -> Engine:
    try:
        return Engine.load(tiny_model, dtype=request.param, backend="cpu", prefix_cache_gb=None)
    except SoloError as exc:
        pytest.skip(f"the cpu runtime is not available here: {exc}")


class _Spy:
    """The engine's runtime, logging its prefill and decode_spans calls; a hook runs after each span call."""

    def __init__(self, runtime) -> None:
        self.inner, self.calls, self.hook = runtime, [], None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def reserve(self, rows, max_seq):
        self.inner.reserve(rows, max_seq)

    def prefill(self, row, ids, start_pos=0):
        self.calls.append(("prefill", row, start_pos, ids.numel()))
        return self.inner.prefill(row, ids, start_pos)

    def decode_spans(self, rows, token_lists, starts, between=None):
        out = self.inner.decode_spans(rows, token_lists, starts, between=between)
        self.calls.append(("spans", tuple(zip(rows, map(len, token_lists), starts, strict=True))))
        if self.hook is not None:
            self.hook()
        return out


def request(engine: Engine, prompt: str, max_tokens: int = 8):
    return engine.make_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


async def collect(generation) -> list[int]:
    return [t async for _, e in generation.events() for t in e.token_ids]


def alone(engine: Engine, prompt: str, max_tokens: int = 8) -> list[int]:
    async def main():
        scheduler = Scheduler(engine.runtime, max_batch=1, max_queue=1, max_seq=256, decode_batching="isolated")
        scheduler.start()
        try:
            return await collect(scheduler.submit([request(engine, prompt, max_tokens)], asyncio.get_running_loop()))
        finally:
            await asyncio.to_thread(scheduler.stop)

    return asyncio.run(main())


def run_with_arrivals(engine: Engine, first: str, later: list[str], *, after_steps: int = 2,
                      prefill_chunk: int = 256, first_tokens: int = 30, span_limit: int | None = None):
    """`first` decodes alone; after its `after_steps`-th step every prompt of `later` arrives at once."""
    spy = _Spy(engine.runtime)
    scheduler = Scheduler(spy, max_batch=1 + len(later), max_queue=4, max_seq=256, decode_batching="fused",
                          prefill_chunk=prefill_chunk)
    if span_limit is not None:
        scheduler.span_prefill_positions = span_limit
    scheduler.pause_min_step_s = math.inf  # the calls these tests expect do not depend on the machine's speed
    spy.calls.clear()  # (the start-up probe's calls)
    late: list = []

    async def main():
        loop = asyncio.get_running_loop()

        def hook():
            if not late and scheduler.steps == after_steps:
                late.extend(scheduler.submit([request(engine, p)], loop) for p in later)

        spy.hook = hook
        head = scheduler.submit([request(engine, first, first_tokens)], loop)
        scheduler.start()
        out = await collect(head)
        return out, [await collect(g) for g in late]

    try:
        head, rest = asyncio.run(main())
    finally:
        scheduler.stop()
    return scheduler, spy.calls, head, rest


def test_only_runtimes_with_span_prefill_mix_prompts_into_steps(engine, tiny_model):
    assert span_prefill_limit(engine.runtime) == engine.runtime.span_prefill_positions > 0
    eager = Engine.load(tiny_model, dtype="float32", backend="eager", prefix_cache_gb=None)
    assert span_prefill_limit(eager.runtime) == 0
    scheduler = Scheduler(engine.runtime, max_batch=2, max_queue=1, max_seq=64, decode_batching="isolated")
    assert scheduler.span_prefill_positions == 0  # isolated steps stay one call per request
    scheduler = Scheduler(engine.runtime, max_batch=2, max_queue=1, max_seq=64, decode_batching="fused",
                          span_prefill="off")
    assert scheduler.span_prefill_positions == 0


def test_a_request_admitted_mid_run_rides_the_next_step_and_equals_its_lone_run(engine):
    scheduler, calls, head, (newcomer,) = run_with_arrivals(engine, PROMPTS[0], [PROMPTS[2]])
    n = len(request(engine, PROMPTS[2]).prompt_ids)
    # The first request's own prefill is a prefill call (nothing was decoding: the lone path); the newcomer's
    # whole prompt rides in the third step beside the first request's decode token, with no call of its own.
    assert [c for c in calls if c[0] == "prefill"] == [("prefill", 0, 0, len(request(engine, PROMPTS[0]).prompt_ids))]
    spans = [c[1] for c in calls if c[0] == "spans"]
    assert spans[2] == ((0, 1, spans[2][0][2]), (1, n, 0))
    assert all(len(s) == 2 and s[1][1] == 1 for s in spans[3:3 + 7])  # then both rows decode together
    assert scheduler.prefill_pieces == 1 and scheduler.prefill_piece_tokens == n
    assert head == alone(engine, PROMPTS[0], 30)
    assert newcomer == alone(engine, PROMPTS[2])


def test_a_long_prompt_is_chunked_under_the_step_budget(engine):
    budget = 7
    scheduler, calls, head, (newcomer,) = run_with_arrivals(engine, PROMPTS[0], [PROMPTS[1]], prefill_chunk=budget)
    n = len(request(engine, PROMPTS[1]).prompt_ids)
    assert n > 3 * budget
    steps = [c[1] for c in calls if c[0] == "spans"]
    pieces = [(k, start) for spans in steps for row, k, start in spans if row == 1 and start < n]
    with_pieces = [spans for spans in steps if any(row == 1 and start < n for row, _, start in spans)]
    assert all(len(spans) == 2 and spans[0][:2] == (0, 1) for spans in with_pieces)
    # Pieces of at most `budget` tokens, consecutive from position 0, one per step, each beside the running
    # row's decode token; then the newcomer decodes.
    assert [p for p, _ in pieces] == [min(budget, n - s) for s in range(0, n, budget)]
    assert [s for _, s in pieces] == list(range(0, n, budget))
    assert scheduler.prefill_piece_tokens == n
    assert head == alone(engine, PROMPTS[0], 30)
    assert newcomer == alone(engine, PROMPTS[1])


def test_nothing_sent_is_dropped_and_every_output_equals_its_lone_run(engine):
    # Three prompts arrive at once under a budget smaller than their sum: shortest first, the others' pieces
    # in later steps; none is lost or cut, and each gives its lone-run tokens (so does the running request).
    later = PROMPTS[1:]
    lengths = [len(request(engine, p).prompt_ids) for p in later]
    budget = max(lengths) - 2
    scheduler, calls, head, rest = run_with_arrivals(engine, PROMPTS[0], later, prefill_chunk=budget,
                                                     first_tokens=40)
    assert sum(lengths) > budget
    # Rows 1..3 were handed out in submission order (the first request holds row 0).
    steps = [c[1] for c in calls if c[0] == "spans"]
    per_step = [sum(k for row, k, start in spans if row > 0 and start < lengths[row - 1]) for spans in steps]
    assert sum(per_step) == scheduler.prefill_piece_tokens == sum(lengths)
    assert max(per_step) <= budget and sum(1 for t in per_step if t) >= 2
    assert not [c for c in calls[1:] if c[0] == "prefill"]
    assert head == alone(engine, PROMPTS[0], 40)
    assert rest == [alone(engine, p) for p in later]


def test_whole_prompts_mode_still_bounds_the_pieces_of_one_step(engine):
    # --prefill-chunk 0 (whole prompts): the pieces riding in one step's kernel call stay within one prompt's
    # worth of tokens (the span limit), whose memory grows with its tokens; nothing is lost.
    later = PROMPTS[1:]
    lengths = [len(request(engine, p).prompt_ids) for p in later]
    limit = max(lengths) + 1
    scheduler, calls, head, rest = run_with_arrivals(engine, PROMPTS[0], later, prefill_chunk=0, span_limit=limit,
                                                     first_tokens=40)
    assert sum(lengths) > limit
    steps = [c[1] for c in calls if c[0] == "spans"]
    per_step = [sum(k for row, k, start in spans if row > 0 and start < lengths[row - 1]) for spans in steps]
    assert sum(per_step) == sum(lengths) and max(per_step) <= limit
    assert rest == [alone(engine, p) for p in later]


def test_prompts_past_the_span_limit_keep_their_own_chunk_calls(engine):
    # A prompt longer than the limit is prefilled by prefill calls on the fixed grid, as before; a short one
    # arriving with it still rides in the step.
    long_prompt, short_prompt = PROMPTS[1], PROMPTS[2]
    n_long = len(request(engine, long_prompt).prompt_ids)
    n_short = len(request(engine, short_prompt).prompt_ids)
    scheduler, calls, head, (out_long, out_short) = run_with_arrivals(
        engine, PROMPTS[0], [long_prompt, short_prompt], prefill_chunk=16, span_limit=n_long - 1)
    chunk_calls = [c for c in calls[1:] if c[0] == "prefill"]
    assert [(c[2], c[3]) for c in chunk_calls] == [(s, min(16, n_long - s)) for s in range(0, n_long, 16)]
    assert scheduler.prefill_piece_tokens == n_short
    assert head == alone(engine, PROMPTS[0], 30)
    assert out_long == alone(engine, long_prompt)
    assert out_short == alone(engine, short_prompt)


def test_a_burst_on_an_idle_server_makes_one_prefill_call_and_the_rest_ride_the_first_step(engine):
    spy = _Spy(engine.runtime)
    scheduler = Scheduler(spy, max_batch=3, max_queue=3, max_seq=256, decode_batching="fused")
    scheduler.pause_min_step_s = math.inf
    spy.calls.clear()
    prompts = [PROMPTS[1], PROMPTS[0], PROMPTS[2]]
    lengths = [len(request(engine, p).prompt_ids) for p in prompts]

    async def main():
        loop = asyncio.get_running_loop()
        gens = [scheduler.submit([request(engine, p)], loop) for p in prompts]
        scheduler.start()  # all three wait when the first iteration admits them
        return [await collect(g) for g in gens]

    try:
        outs = asyncio.run(main())
    finally:
        scheduler.stop()
    # The shortest prompt (row 1) by a prefill call of its own; the other two whole in the first step, beside
    # its first decode token.
    assert spy.calls[0] == ("prefill", 1, 0, lengths[1])
    assert spy.calls[1] == ("spans", ((1, 1, lengths[1]), (2, lengths[2], 0), (0, lengths[0], 0)))
    assert not [c for c in spy.calls[1:] if c[0] == "prefill"]
    assert outs == [alone(engine, p) for p in prompts]


def test_before_mode_prefills_the_new_prompts_in_one_call_ahead_of_the_step(engine):
    spy = _Spy(engine.runtime)
    scheduler = Scheduler(spy, max_batch=3, max_queue=3, max_seq=256, decode_batching="fused", span_prefill="before")
    scheduler.pause_min_step_s = math.inf
    spy.calls.clear()
    late: list = []
    lengths = [len(request(engine, p).prompt_ids) for p in PROMPTS[:3]]

    async def main():
        loop = asyncio.get_running_loop()

        def hook():
            if not late and scheduler.steps == 2:
                late.extend(scheduler.submit([request(engine, p)], loop) for p in PROMPTS[1:3])

        spy.hook = hook
        head = scheduler.submit([request(engine, PROMPTS[0], 20)], loop)
        scheduler.start()
        out = await collect(head)
        return out, [await collect(g) for g in late]

    try:
        head, rest = asyncio.run(main())
    finally:
        scheduler.stop()
    spans = [c[1] for c in spy.calls if c[0] == "spans"]
    # Two decode steps, then both new prompts whole in one call (shortest first), then a step of all three.
    assert spans[2] == ((2, lengths[2], 0), (1, lengths[1], 0))
    assert [r for r, _, _ in spans[3]] == [0, 1, 2] and all(k == 1 for _, k, _ in spans[3])
    assert head == alone(engine, PROMPTS[0], 20) and rest == [alone(engine, p) for p in PROMPTS[1:3]]
    with pytest.raises(ValueError, match="span_prefill"):
        Scheduler(engine.runtime, max_batch=1, max_queue=1, max_seq=64, span_prefill="sometimes")


def newcomer_arrives(engine, prompt: str, *, mid_step: bool = False, prefill_chunk: int = 256):
    """Row 0 decodes 12 tokens in pausable steps (a tiny model's steps are short); `prompt` arrives after the
    second step's last pause point (the spy's hook runs after each call), or with `mid_step` at a pause of
    the third step. Returns (scheduler, span calls, row 0's tokens, the newcomer's, the steps seen at pauses)."""
    spy = _Spy(engine.runtime)
    scheduler = Scheduler(spy, max_batch=2, max_queue=2, max_seq=256, decode_batching="fused",
                          prefill_chunk=prefill_chunk)
    assert scheduler.pausable_steps
    scheduler.pause_min_step_s = 0.0
    spy.calls.clear()
    late: list = []
    serve = scheduler._serve_arrivals_mid_step
    steps_seen: list[int] = []

    async def main():
        loop = asyncio.get_running_loop()

        def arrive(step: int) -> None:
            if not late and scheduler.steps == step:
                late.append(scheduler.submit([request(engine, prompt)], loop))

        def arrive_then_serve():
            steps_seen.append(scheduler.steps)
            arrive(3)
            serve()

        if mid_step:
            scheduler._serve_arrivals_mid_step = arrive_then_serve
        else:
            spy.hook = lambda: arrive(2)
        head = scheduler.submit([request(engine, PROMPTS[2], 12)], loop)
        scheduler.start()
        out = await collect(head)
        return out, await collect(late[0])

    try:
        head, rest = asyncio.run(main())
    finally:
        scheduler.stop()
    return scheduler, [c[1] for c in spy.calls if c[0] == "spans"], head, rest, steps_seen


@pytest.mark.parametrize("newcomer", [0, 1], ids=["short-tail", "long-prompt"])
def test_a_short_tail_arriving_mid_step_is_served_inside_the_paused_step(engine, newcomer):
    # The newcomer arrives at a pause of the third step.
    prompt = PROMPTS[newcomer]
    n = len(request(engine, prompt).prompt_ids)
    assert (n <= PAUSE_TAIL_TOKENS) == (newcomer == 0)
    scheduler, spans, head, rest, steps_seen = newcomer_arrives(engine, prompt, mid_step=True)
    if newcomer == 0:
        # Its whole prompt in a call of its own inside the third step (logged before the step, which ends after).
        assert scheduler.mid_step_prefills == 1
        assert spans[2] == ((1, n, 0),) and spans[3][0][0] == 0 and len(spans[3]) == 1
        assert [r for r, _, _ in spans[4]] == [0, 1]  # then both rows decode together
    else:
        assert scheduler.mid_step_prefills == 0  # admitted mid-step; its prompt rides the next step
        assert spans[3] == ((0, 1, spans[3][0][2]), (1, n, 0))
    assert max(steps_seen) > 3  # the later steps paused too, with nothing to serve
    assert head == alone(engine, PROMPTS[2], 12) and rest == alone(engine, prompt)


@pytest.mark.parametrize("newcomer", [0, 1], ids=["short-tail", "long-prompt"])
def test_a_short_tail_arriving_after_the_last_pause_is_served_before_the_next_step(engine, newcomer):
    # At the next iteration a short tail gets a call of its own before the (pausable) step, as at a pause, and
    # then decodes in that step; a longer prompt rides the step as a piece.
    prompt = PROMPTS[newcomer]
    n = len(request(engine, prompt).prompt_ids)
    assert (n <= PAUSE_TAIL_TOKENS) == (newcomer == 0)
    scheduler, spans, head, rest, _ = newcomer_arrives(engine, prompt)
    if newcomer == 0:
        assert scheduler.step_start_prefills == 1 and scheduler.mid_step_prefills == 0
        assert spans[2] == ((1, n, 0),)
        assert [(r, k) for r, k, _ in spans[3]] == [(0, 1), (1, 1)]  # then it decodes in that step
    else:
        assert scheduler.step_start_prefills == 0
        assert spans[2] == ((0, 1, spans[2][0][2]), (1, n, 0))
    assert head == alone(engine, PROMPTS[2], 12) and rest == alone(engine, prompt)


def test_a_chunked_prompts_short_last_piece_rides_the_step(engine):
    # Only new requests' tails get a call before a pausable step: the last piece of a prompt whose earlier
    # pieces rode earlier steps rides its step too (the decode rows would otherwise wait for one more call).
    prompt = PROMPTS[1]
    n = len(request(engine, prompt).prompt_ids)
    assert n > 8 and n % 8
    scheduler, spans, head, rest, _ = newcomer_arrives(engine, prompt, prefill_chunk=8)
    assert scheduler.step_start_prefills == 0
    assert all(any(r == 0 for r, _, _ in call) for call in spans[2:2 + -(-n // 8)])  # every piece beside row 0
    assert head == alone(engine, PROMPTS[2], 12) and rest == alone(engine, prompt)
