"""Scheduling for TTFT: chunked prefill on a fixed grid, prefill before decode (shortest prompt first), a new
request admitted in the middle of an isolated step, and the automatic slot count."""

from __future__ import annotations

import asyncio

import pytest
from server_harness import BACKEND, start_server

from solo.engine.engine import Engine
from solo.engine.sampling import SamplingParams
from solo.runtime.base import decode_spans_by_calls
from solo.server import kv_memory
from solo.server.scheduler import ABORT, Scheduler


@pytest.fixture(scope="module")
def engine(tiny_model) -> Engine:
    return Engine.load(tiny_model, dtype="float32", backend=BACKEND, prefix_cache_gb=None)


class _Logged:
    """A runtime that logs its calls and can run a hook after one (from the scheduler thread)."""

    def __init__(self, runtime) -> None:
        self.inner, self.calls, self.hook = runtime, [], None
        self.name, self.config, self.device = runtime.name, runtime.config, runtime.device

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode_spans(self, rows, tokens, starts):  # through this wrapper's decode (and the inner verify)
        return decode_spans_by_calls(self, rows, tokens, starts)

    def reserve(self, rows, max_seq):
        self.inner.reserve(rows, max_seq)

    def _after(self, call):
        self.calls.append(call)
        if self.hook is not None:
            self.hook(call)

    def prefill(self, row, ids, start_pos=0):
        out = self.inner.prefill(row, ids, start_pos)
        self._after(("prefill", row, start_pos, ids.numel()))
        return out

    def decode(self, rows, ids, positions):
        out = self.inner.decode(rows, ids, positions)
        self._after(("decode", tuple(rows.tolist())))
        return out


def request(engine: Engine, prompt: str, max_tokens: int = 6):
    return engine.make_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


def tokens_of(events) -> list[int]:
    return [t for _, e in events for t in e.token_ids]


async def collect(generation) -> list:
    return [item async for item in generation.events()]


LONG = "def long_function(a, b, c):\n    return a + b * c - a / b\n" * 4
SHORT = "import os"


def test_a_long_prompt_is_prefilled_in_chunks_on_a_fixed_grid(engine):
    runtime = _Logged(engine.runtime)
    scheduler = Scheduler(runtime, max_batch=2, max_queue=4, max_seq=256, decode_batching="isolated",
                          prefill_chunk=16)
    n = len(request(engine, LONG).prompt_ids)
    assert n > 48
    scheduler.start()
    try:
        async def main():
            loop = asyncio.get_running_loop()
            return await collect(scheduler.submit([request(engine, LONG)], loop))

        alone = asyncio.run(main())
    finally:
        scheduler.stop()
    prefills = [c for c in runtime.calls if c[0] == "prefill"]
    # 16-token chunks from position 0, the last one shorter; then the decode steps.
    assert [(c[2], c[3]) for c in prefills] == [(s, min(16, n - s)) for s in range(0, n, 16)]
    assert runtime.calls[len(prefills):] == [("decode", (0,))] * 5
    assert len(tokens_of(alone)) == 6


def test_short_prompts_go_first_and_decode_steps_run_between_chunks(engine):
    runtime = _Logged(engine.runtime)
    scheduler = Scheduler(runtime, max_batch=3, max_queue=4, max_seq=256, decode_batching="isolated",
                          prefill_chunk=16)
    short_len = len(request(engine, SHORT).prompt_ids)
    long_len = len(request(engine, LONG).prompt_ids)

    async def main(together: bool):
        loop = asyncio.get_running_loop()
        gens = [scheduler.submit([request(engine, LONG)], loop)]
        if together:
            gens.append(scheduler.submit([request(engine, SHORT, max_tokens=40)], loop))
        if not scheduler._thread.is_alive():
            scheduler.start()  # both are waiting when the first iteration admits them
        return await asyncio.gather(*(collect(g) for g in gens))

    try:
        together = asyncio.run(main(True))
        calls = list(runtime.calls)
        alone = asyncio.run(main(False))
    finally:
        scheduler.stop()
    # The short prompt (admitted with the long one) is prefilled first and decodes while the long one's
    # chunks run, one chunk per step: its first token does not wait for the long prefill.
    assert calls[0] == ("prefill", 1, 0, short_len)
    first_long_chunk = calls.index(("prefill", 0, 0, 16))
    assert calls[1] == ("decode", (1,)) and first_long_chunk == 2
    long_chunks = [i for i, c in enumerate(calls) if c[0] == "prefill" and c[1] == 0]
    assert len(long_chunks) == -(-long_len // 16)
    for a, b in zip(long_chunks, long_chunks[1:], strict=False):
        assert any(c[0] == "decode" for c in calls[a + 1:b])  # a decode step between consecutive chunks
    # The chunk grid does not depend on the load: the long request's tokens are those it gets alone.
    assert tokens_of(together[0]) == tokens_of(alone[0])


def test_isolated_step_stops_for_a_new_request_with_a_free_row(engine):
    runtime = _Logged(engine.runtime)
    scheduler = Scheduler(runtime, max_batch=4, max_queue=4, max_seq=256, decode_batching="isolated")
    late: list = []
    newcomer_len = len(request(engine, "x = 1").prompt_ids)

    async def main():
        loop = asyncio.get_running_loop()

        def hook(call):
            # During the first decode step, after the first row: a new request arrives (a free row is left).
            if call[0] == "decode" and not late and scheduler.steps == 1:
                late.append(scheduler.submit([request(engine, "x = 1", max_tokens=3)], loop))

        runtime.hook = hook
        gens = [scheduler.submit([request(engine, p)], loop) for p in ("a = 1", "b = 2", "c = 3")]
        scheduler.start()
        results = await asyncio.gather(*(collect(g) for g in gens))
        while not late:
            await asyncio.sleep(0.01)
        return results, await collect(late[0])

    try:
        results, newcomer = asyncio.run(main())
    finally:
        scheduler.stop()
    decodes = [i for i, c in enumerate(runtime.calls) if c[0] == "decode"]
    first = decodes[0]
    # The step stopped after one row; the newcomer was prefilled next (its first token out), then the two
    # rows not decoded yet went first.
    assert runtime.calls[first + 1][0] == "prefill" and runtime.calls[first + 1][3] == newcomer_len
    assert [c[1][0] for c in runtime.calls[first + 2:first + 4]] == [1, 2]
    assert all(len(tokens_of(r)) == 6 for r in results) and len(tokens_of(newcomer)) == 3
    assert [tokens_of(r) for r in results] == [tokens_of(asyncio.run(_alone(engine, p))) for p in ("a = 1", "b = 2",
                                                                                                    "c = 3")]


def test_a_request_arriving_during_a_prefill_is_prefilled_before_the_next_step(engine):
    # Admission is rechecked after the iteration's prefills: the newcomer does not wait a whole decode step.
    runtime = _Logged(engine.runtime)
    scheduler = Scheduler(runtime, max_batch=2, max_queue=2, max_seq=256, decode_batching="fused")
    late: list = []
    newcomer_len = len(request(engine, "x = 1").prompt_ids)

    async def main():
        loop = asyncio.get_running_loop()

        def hook(call):
            if call[0] == "prefill" and not late:  # the first request's prefill ran: another one arrives
                late.append(scheduler.submit([request(engine, "x = 1", max_tokens=3)], loop))

        runtime.hook = hook
        first = scheduler.submit([request(engine, SHORT)], loop)
        scheduler.start()
        result = await collect(first)
        return result, await collect(late[0])

    try:
        result, newcomer = asyncio.run(main())
    finally:
        scheduler.stop()
    assert runtime.calls[0][0] == "prefill" and runtime.calls[1] == ("prefill", runtime.calls[1][1], 0, newcomer_len)
    assert runtime.calls[2][0] == "decode" and len(runtime.calls[2][1]) == 2  # both rows in the first step
    assert len(tokens_of(result)) == 6 and len(tokens_of(newcomer)) == 3
    assert tokens_of(result) == tokens_of(asyncio.run(_alone(engine, SHORT)))


def test_whole_short_prompts_never_wait_for_a_decode_step(engine):
    # Two prompts within one chunk each but over the chunk budget together: both before the first step (the
    # budget still holds back a long prompt's chunks: test_short_prompts_go_first_and_decode_steps_run_between_chunks).
    a, b = len(request(engine, SHORT).prompt_ids), len(request(engine, "x = 1").prompt_ids)
    runtime = _Logged(engine.runtime)
    scheduler = Scheduler(runtime, max_batch=2, max_queue=2, max_seq=256, decode_batching="isolated",
                          prefill_chunk=max(a, b))
    assert a + b > scheduler.prefill_chunk

    async def main():
        loop = asyncio.get_running_loop()
        gens = [scheduler.submit([request(engine, p)], loop) for p in (SHORT, "x = 1")]
        scheduler.start()
        return await asyncio.gather(*(collect(g) for g in gens))

    try:
        asyncio.run(main())
    finally:
        scheduler.stop()
    assert [c[0] for c in runtime.calls[:3]] == ["prefill", "prefill", "decode"]


async def _alone(engine: Engine, prompt: str):
    scheduler = Scheduler(engine.runtime, max_batch=1, max_queue=1, max_seq=256, decode_batching="isolated")
    scheduler.start()
    try:
        return await collect(scheduler.submit([request(engine, prompt)], asyncio.get_running_loop()))
    finally:
        await asyncio.to_thread(scheduler.stop)


def test_cancel_during_a_chunked_prefill_frees_the_row(engine):
    runtime = _Logged(engine.runtime)
    scheduler = Scheduler(runtime, max_batch=1, max_queue=1, max_seq=256, prefill_chunk=8)
    generation: list = []

    def hook(call):
        if call[0] == "prefill" and call[2] == 8:  # the second chunk ran: the client goes away
            generation[0].cancel()

    runtime.hook = hook

    async def main():
        generation.append(scheduler.submit([request(engine, LONG)], asyncio.get_running_loop()))
        scheduler.start()
        return await collect(generation[0])

    try:
        events = asyncio.run(main())
    finally:
        scheduler.stop()
    assert events[-1][1].finish_reason == ABORT and tokens_of(events) == []
    assert len([c for c in runtime.calls if c[0] == "prefill"]) == 2 and scheduler.active == 0


def test_prefill_chunk_zero_prefills_whole_prompts(engine):
    runtime = _Logged(engine.runtime)
    scheduler = Scheduler(runtime, max_batch=1, max_queue=1, max_seq=256, prefill_chunk=0)
    scheduler.start()
    try:
        async def main():
            return await collect(scheduler.submit([request(engine, LONG)], asyncio.get_running_loop()))

        asyncio.run(main())
    finally:
        scheduler.stop()
    assert [c for c in runtime.calls if c[0] == "prefill"] == [("prefill", 0, 0, len(request(engine, LONG).prompt_ids))]
    with pytest.raises(ValueError, match="prefill_chunk"):
        Scheduler(engine.runtime, max_batch=1, max_queue=1, max_seq=256, prefill_chunk=-1)


def test_auto_slots_from_free_memory():
    per_token, tokens = 4096, 2048  # the bundled model: 8 MiB per full-length slot
    assert kv_memory.auto_slots(tokens, per_token, None) == 8
    assert kv_memory.auto_slots(tokens, per_token, 2**40) == 32
    assert kv_memory.auto_slots(tokens, per_token, 4 * 8 * 2**20 * 12) == 12  # a quarter holds 12 slots
    assert kv_memory.auto_slots(tokens, per_token, 2**20) == 8  # fewer fit: 8, the slot length shrinks later


def test_server_reports_its_automatic_slot_count(tiny_model):
    running = start_server(tiny_model, max_queue=4)
    try:
        assert running.state.status == "ok", running.state.error
        slots = running.state.settings.max_batch
        assert kv_memory.AUTO_SLOTS[0] <= slots <= kv_memory.AUTO_SLOTS[1]
        assert running.state.scheduler.max_batch == slots
        with running.http() as http:
            assert f"solo_slots {float(slots)}" in http.get("/metrics").text
    finally:
        running.stop()


def test_serve_flags(tiny_model):
    import argparse

    from solo.server.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--max-batch", "auto", "--prefill-chunk", "0"])
    assert args.max_batch is None and args.prefill_chunk == 0
    assert parser.parse_args(["--max-batch", "3"]).max_batch == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-batch", "many"])


def test_a_dynamic_ntk_model_prefills_whole_prompts(tmp_path):
    # From a trial: dynamic NTK rotates a prompt with its whole length's frequencies (transformers); a chunk of
    # --prefill-chunk took the length at its end, so a prompt past the trained context came out wrong.
    from checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "dynamic", "llama", max_position_embeddings=32,
                             rope_parameters={"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0})
    lone = Engine.load(folder, dtype="float32", backend=BACKEND)
    ids = [(7 * i) % 300 + 3 for i in range(50)]  # past the trained 32 positions
    expected = lone.complete(ids, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)).text
    server = start_server(folder, max_batch=2, prefill_chunk=16)
    try:
        assert server.state.settings.prefill_chunk == 0
        with server.http() as http:
            reply = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 8, "temperature": 0,
                                                       "ignore_eos": True}).json()
        assert reply["choices"][0]["text"] == expected
    finally:
        server.stop()
