"""Overload: an honest Retry-After, priority in the queue, KV-cache memory accounting and refusal, and a lone
request that runs exactly Engine.run's calls whatever the batching machinery around it."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import BACKEND, MODEL_NAME, start_server

from solo.engine.engine import Engine
from solo.engine.sampling import SamplingParams
from solo.errors import SoloError
from solo.runtime.base import decode_spans_by_calls
from solo.server import kv_memory
from solo.server.scheduler import QueueFullError, Scheduler

LONG = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "count"}], "temperature": 0,
        "ignore_eos": True}


def metrics(http: httpx.Client) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if not sample.labels or set(sample.labels) == {"le"} and sample.labels["le"] == "+Inf":
                out[sample.name] = sample.value
    return out


@pytest.fixture(scope="module")
def engine(tiny_model) -> Engine:
    return Engine.load(tiny_model, dtype="float32", backend=BACKEND)


def test_retry_after_estimates_when_the_running_request_ends(long_model):
    running = start_server(long_model, max_batch=1, max_queue=1)
    try:
        with running.http() as http, httpx.Client(base_url=running.base_url, timeout=60) as a, \
                httpx.Client(base_url=running.base_url, timeout=60) as b:
            with a.stream("POST", "/v1/chat/completions", json={**LONG, "max_tokens": 400, "stream": True}) as first:
                lines = first.iter_lines()
                for _ in range(20):  # some decode steps, so the step time is measured
                    next(lines)
                with b.stream("POST", "/v1/chat/completions", json={**LONG, "max_tokens": 2, "stream": True}) as queued:
                    queued_lines = queued.iter_lines()
                    next(queued_lines)
                    refused = http.post("/v1/chat/completions", json={**LONG, "max_tokens": 2})
                    refused_at = time.monotonic()
                    assert refused.status_code == 503
                    retry_after = int(refused.headers["Retry-After"])
                    assert f"about {retry_after} s" in refused.json()["error"]["message"]
                    for _ in lines:  # the running request ends; its place goes to the queued one
                        pass
                    took = time.monotonic() - refused_at
                    # Honest: neither far below nor far above the real wait (whole seconds, shared CPUs).
                    assert retry_after >= math.floor(took / 2)
                    assert retry_after <= 2 * math.ceil(took) + 1
                    list(queued_lines)
            assert http.post("/v1/chat/completions", json={**LONG, "max_tokens": 2}).status_code == 200
    finally:
        running.stop()


def test_retry_after_takes_the_recent_time_per_token(engine):
    # A break test saw Retry-After jump between 1 and 158 s for one running request: a moving average of step
    # times moved with each stalled step, and a step's time was charged per token where drafts gave several.
    from types import SimpleNamespace

    scheduler = Scheduler(engine.runtime, max_batch=1, max_queue=0, max_seq=256)
    row = SimpleNamespace(request=SimpleNamespace(max_new_tokens=1000, output_ids=[0] * 100))
    scheduler._running.append(row)
    scheduler._free_rows.clear()  # its row
    assert scheduler.retry_after_s() == 1  # nothing timed yet
    for _ in range(2000):  # 20 s of steps of 10 ms, 1 token each; the window keeps the last 10 s
        scheduler._note_token_time(0.01, 1, 1)
    assert len(scheduler._token_s_window) == 1000 and scheduler.retry_after_s() == 9  # 900 tokens left x 10 ms
    scheduler._note_token_time(1.0, 1, 1)  # a stall of 1 s weighs its share of the 10 s
    assert scheduler.retry_after_s() == 10
    for _ in range(1000):  # drafts accepted in every other step: 10 tokens per 2 steps of 10 ms
        scheduler._note_token_time(0.01, 1, 1)
        scheduler._note_token_time(0.01, 1, 9)
    assert scheduler.retry_after_s() == 2  # 900 x 2 ms
    for _ in range(1000):  # two rows in each step, one token each: a row's token every 10 ms still
        scheduler._note_token_time(0.01, 2, 2)
    assert scheduler.retry_after_s() == 9


def test_waiting_requests_leave_by_priority(engine):
    scheduler = Scheduler(engine.runtime, max_batch=1, max_queue=3, max_seq=256)
    scheduler.start()
    order: list[str] = []

    async def main():
        loop = asyncio.get_running_loop()

        def submit(name: str, priority: int, max_tokens: int):
            request = engine.make_request(name, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
            return scheduler.submit([request], loop, priority)

        async def drain(name: str, generation) -> None:
            async for _ in generation.events():
                if name not in order:
                    order.append(name)

        first = submit("first", 0, 20)
        events = first.events()
        await anext(events)  # holds the only row
        batch_a, interactive, batch_b = submit("batch a", 5, 2), submit("interactive", -1, 2), submit("batch b", 5, 2)
        with pytest.raises(QueueFullError):
            submit("refused", -10, 2)  # priority orders the queue; it does not make room in it
        await asyncio.gather(drain("first", first), drain("batch a", batch_a), drain("interactive", interactive),
                             drain("batch b", batch_b))

    try:
        asyncio.run(main())
    finally:
        scheduler.stop()
    assert order == ["first", "interactive", "batch a", "batch b"]


def test_priority_field_is_accepted_and_checked(server):
    with server.http() as http:
        ok = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "a", "max_tokens": 2, "priority": -3})
        assert ok.status_code == 200
        bad = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "a", "priority": "high"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"


def test_kv_cache_bytes_in_metrics(server):
    engine, scheduler = server.state.engine, server.state.scheduler
    per_token = kv_memory.kv_bytes_per_token(engine.config, 4)  # the tiny model is served in float32
    assert scheduler.kv_bytes_per_token == per_token
    with server.http() as http:
        before = metrics(http)
        assert before["solo_kv_cache_capacity_bytes"] == 4 * server.state.max_model_len * per_token
        assert before["solo_kv_cache_used_bytes"] == 0
        with http.stream("POST", "/v1/completions", json={"model": MODEL_NAME, "prompt": [5, 6, 7], "max_tokens": 200,
                                                         "ignore_eos": True, "stream": True}) as stream:
            lines = stream.iter_lines()
            for _ in range(3):
                next(lines)
            held = metrics(http)["solo_kv_cache_used_bytes"]
            assert held > 3 * per_token and held % per_token == 0
            assert 0 < metrics(http)["solo_kv_cache_usage_ratio"] < 1
            list(lines)
        after = metrics(http)
        for _ in range(200):  # the scheduler frees the row right after the last event went out
            if after["solo_kv_cache_used_bytes"] == 0:
                break
            time.sleep(0.01)
            after = metrics(http)
        assert after["solo_kv_cache_used_bytes"] == 0
        assert after["solo_request_kv_cache_bytes_count"] == before.get("solo_request_kv_cache_bytes_count", 0) + 1
        assert after["solo_request_kv_cache_bytes_sum"] - before.get("solo_request_kv_cache_bytes_sum", 0) == \
            (3 + 200) * per_token


def test_prefix_store_is_preallocated_as_large_as_the_kv_cache(server):
    # The server decides the prefix cache's memory at start-up, like the KV cache (auto: as large as it,
    # at most 1 GB): the store is one pool, so serving requests never grows it.
    cache = server.state.engine.prefix_cache
    assert cache is not None and cache.preallocated
    pool = cache._pool
    with server.http() as http:
        m = metrics(http)
        kv = m["solo_kv_cache_capacity_bytes"]
        assert m["solo_prefix_cache_capacity_bytes"] == cache.capacity_bytes == pool.tokens * pool.token_bytes
        assert kv - pool.token_bytes < cache.capacity_bytes <= kv
        assert m["process_resident_memory_bytes"] > kv + cache.capacity_bytes
        pointer = pool.k.data_ptr()
        for i in range(6):  # unrelated prompts overwrite rows: the overwritten ones go to the store
            prompt = [5 + i] * 40
            r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 3})
            assert r.status_code == 200
        assert metrics(http)["solo_prefix_cache_stored_bytes"] == cache.stats.stored_bytes > 0
    assert cache._pool is pool and pool.k.data_ptr() == pointer


def test_prefix_cache_size_that_cannot_fit_is_refused_at_start(tiny_model, monkeypatch):
    monkeypatch.setattr(kv_memory, "available_memory_bytes", lambda device: 10**9)
    # More than the memory free before the load: refused before the server listens (ServerSettings.validate).
    with pytest.raises(SoloError, match="more than the 0.93 GiB this machine has free before the model loads"):
        start_server(tiny_model, max_batch=2, max_queue=4, prefix_cache_gb=5.0)
    # Within it, but not within 90% of what the KV cache leaves: refused once the KV cache is allocated.
    running = start_server(tiny_model, max_batch=2, max_queue=4, prefix_cache_gb=0.95)
    try:
        assert running.state.status == "failed"
        assert "--prefix-cache-gb 0.95" in str(running.state.error) and "lower --prefix-cache-gb" in \
            str(running.state.error)
    finally:
        running.stop()


def _per_token(model) -> int:
    from solo.model.config import ModelConfig

    return kv_memory.kv_bytes_per_token(ModelConfig.from_file(model), 4)


def test_kv_cache_too_big_for_memory_is_refused_at_start(tiny_model, monkeypatch):
    per_token = _per_token(tiny_model)
    monkeypatch.setattr(kv_memory, "available_memory_bytes",
                        lambda device: 4 * 64 * per_token + kv_memory.HEADROOM_BYTES)
    running = start_server(tiny_model, max_batch=4, max_model_len=200)
    running.thread.join(30)
    assert running.state.status == "failed"
    message = str(running.state.error)
    assert "KV cache" in message and "--max-model-len to at most" in message and "--max-batch to at most" in message


def test_default_slot_shrinks_to_memory_and_longer_requests_get_400(tiny_model, monkeypatch):
    per_token = _per_token(tiny_model)
    # Room for 2 slots of 64 tokens (the tiny model's context is 256).
    monkeypatch.setattr(kv_memory, "available_memory_bytes", lambda device: kv_memory.HEADROOM_BYTES
                        + math.ceil(2 * 64 * per_token / kv_memory.KV_MEMORY_FRACTION))
    running = start_server(tiny_model, max_batch=2)
    try:
        assert running.state.status == "ok" and running.state.max_model_len == 64
        with running.http() as http:
            too_long = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": [5] * 30, "max_tokens": 40})
            assert too_long.status_code == 400
            error = too_long.json()["error"]
            assert error["code"] == "context_length_exceeded" and "memory" in error["message"]
            assert http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": [5] * 30,
                                                      "max_tokens": 30}).status_code == 200
    finally:
        running.stop()


class _Counting:
    """A runtime wrapper that records every call and declares batch invariance (so "auto" fuses)."""

    batch_invariant = True

    def __init__(self, runtime) -> None:
        self.inner, self.calls = runtime, []
        self.name, self.config, self.device = runtime.name, runtime.config, runtime.device

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode_spans(self, rows, tokens, starts):  # through this wrapper's decode (and the inner verify)
        return decode_spans_by_calls(self, rows, tokens, starts)

    def reserve(self, rows, max_seq):
        self.inner.reserve(rows, max_seq)

    def prefill(self, row, ids, start_pos=0):
        self.calls.append(("prefill", ids.numel()))
        return self.inner.prefill(row, ids, start_pos)

    def decode(self, rows, ids, positions):
        self.calls.append(("decode", rows.numel()))
        # Row by row: the wrapper is truly batch-invariant, so the start-up probe agrees.
        import torch

        return torch.cat([self.inner.decode(rows[i:i + 1], ids[i:i + 1], positions[i:i + 1])
                          for i in range(rows.numel())])


def test_a_lone_request_makes_exactly_engine_runs_calls(engine):
    runtime = _Counting(engine.runtime)
    scheduler = Scheduler(runtime, max_batch=4, max_queue=8, max_seq=256)
    assert scheduler.decode_batching == "fused"
    runtime.calls.clear()
    scheduler.start()

    async def main():
        request = engine.make_request("def f(x):", SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))
        async for _ in scheduler.submit([request], asyncio.get_running_loop()).events():
            pass

    try:
        asyncio.run(main())
    finally:
        scheduler.stop()
    prompt = len(engine.make_request("def f(x):", SamplingParams(max_tokens=1)).prompt_ids)
    # One prefill of the whole prompt, then eight batch-1 decode steps: Engine.run's calls, nothing more.
    assert runtime.calls == [("prefill", prompt)] + [("decode", 1)] * 8


def test_queue_full_under_concurrent_load_never_5xx_but_503(long_model):
    # Many clients at once against 1 slot + 2 queued: every answer is 200 or a 503 with Retry-After.
    running = start_server(long_model, max_batch=1, max_queue=2)
    statuses: list[int] = []

    def client() -> None:
        with httpx.Client(base_url=running.base_url, timeout=60) as http:
            response = http.post("/v1/chat/completions", json={**LONG, "max_tokens": 20})
            statuses.append(response.status_code)
            if response.status_code == 503:
                assert int(response.headers["Retry-After"]) >= 1
                assert response.json()["error"]["code"] == "queue_full"

    try:
        threads = [threading.Thread(target=client) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(statuses) == 12 and set(statuses) <= {200, 503} and 200 in statuses and 503 in statuses
        assert running.state.scheduler.waiting == 0
    finally:
        running.stop()


def test_kv_memory_arithmetic():
    assert kv_memory.fit_slot_tokens(4, 1000, 100, None) == 1000  # unknown memory: taken as fitting
    assert kv_memory.fit_slot_tokens(4, 1000, 100, 10**7) == 1000
    fits = kv_memory.fit_slot_tokens(4, 1000, 100, 100_000)
    assert fits % 16 == 0 and 4 * fits * 100 <= 100_000 * kv_memory.KV_MEMORY_FRACTION < 4 * (fits + 16) * 100


def test_malloc_arenas_are_capped_unless_the_user_chose():
    import sys

    from solo.server.heap import limit_malloc_arenas

    assert limit_malloc_arenas({"MALLOC_ARENA_MAX": "4"}) is None  # the user's setting stands
    cap = limit_malloc_arenas({})
    if sys.platform.startswith("linux") and cap is not None:  # glibc (musl has no arenas to cap)
        import os

        assert cap == max(2, os.cpu_count() or 2)


def test_the_startup_heap_is_frozen_while_serving_and_given_back_at_stop(tiny_model):
    # An oldest-generation collection walked the whole startup heap (torch, transformers) and stopped every
    # thread for 155-270 ms under load; frozen, it walks only what the server made since.
    import gc

    gc.unfreeze()
    running = start_server(tiny_model, max_batch=2, max_queue=4)
    try:
        assert running.state.status == "ok" and gc.get_freeze_count() > 10_000
    finally:
        running.stop()
    assert gc.get_freeze_count() == 0


def test_the_decode_steps_workspace_is_set_aside_beside_the_kv_cache(tiny_model, monkeypatch):
    # From a break test: under a 400 MB container limit the cache took 90% of the memory and the prefix cache most
    # of the rest; then every request but the shortest got a 400 (the step's workspace did not fit), /health 200.
    per_token = _per_token(tiny_model)
    step = 64 * per_token  # as much as one 64-token slot
    monkeypatch.setattr(kv_memory, "available_memory_bytes", lambda device: kv_memory.HEADROOM_BYTES
                        + math.ceil(2 * 64 * per_token / kv_memory.KV_MEMORY_FRACTION) + step)
    reserved = []
    monkeypatch.setattr("solo.engine.engine.Engine.reserve_step_memory", lambda self, entries: reserved.append(entries))
    asked = []
    monkeypatch.setattr("solo.engine.engine.Engine.step_memory_bytes",
                        lambda self, rows, max_seq, entries: asked.append((rows, entries)) or step)
    running = start_server(tiny_model, max_batch=2, prefill_chunk=32)
    try:
        assert running.state.status == "ok" and running.state.max_model_len == 64  # the slots beside it
        config = running.state.engine.speculative_config
        draft = 0 if config is None else config.max_draft
        assert asked[0] == (2, 2 * (1 + draft) + 32)  # each slot's token and longest draft, and a prompt piece
        assert reserved == [asked[0][1]]  # and allocated at start-up, before the prefix store takes the rest
    finally:
        running.stop()


def test_a_workspace_that_takes_all_the_memory_names_max_batch(tiny_model, monkeypatch):
    # An audit: --max-batch 100000 was told to "free memory or use a smaller model"; its step's workspace, which
    # grows with the slots, had taken all the memory.
    monkeypatch.setattr(kv_memory, "available_memory_bytes", lambda device: kv_memory.HEADROOM_BYTES + 2**20)
    monkeypatch.setattr("solo.engine.engine.Engine.step_memory_bytes", lambda self, rows, max_seq, entries: 2**30)
    running = start_server(tiny_model, max_batch=64, max_model_len=64, wait=True)
    try:
        assert running.state.status != "ok"
        assert "or lower --max-batch (the decode step's workspace, 1.00 GiB, grows with it)" in str(running.state.error)
    finally:
        running.stop()


def test_a_step_that_finds_no_memory_is_a_503(tiny_model, monkeypatch):
    from solo.errors import KVCacheMemoryError
    from solo.server.errors import api_error_from

    error = api_error_from(KVCacheMemoryError("the decode step's workspace needs 6.1 MiB beside the KV cache"))
    assert error.status == 503 and error.code == "out_of_memory" and "Retry-After" in error.headers


def test_a_stream_that_finds_no_memory_logs_no_traceback(caplog):
    # From a break test: each streamed request that met out_of_memory logged "stream failed" and a traceback.
    from solo.errors import KVCacheMemoryError
    from solo.server.routes import _error_event

    with caplog.at_level("INFO", logger="solo"):
        event = _error_event(KVCacheMemoryError("the decode step's workspace needs 12.2 MiB"))
    assert '"out_of_memory"' in event and not [r for r in caplog.records if r.levelname == "ERROR"]
    with caplog.at_level("INFO", logger="solo"):
        _error_event(RuntimeError("a bug"))
    assert [r for r in caplog.records if r.levelname == "ERROR"]  # a 500 still does


def test_the_cpu_runtimes_step_memory_covers_its_largest_call(tiny_model):
    import torch

    from solo.model.config import ModelConfig
    from solo.model.weights import load_weights
    from solo.runtime.cpu import SPAN_CALL_TOKENS, CpuRuntime

    runtime = CpuRuntime(load_weights(tiny_model, ModelConfig.from_file(tiny_model), torch.float32))
    runtime.reserve(2, 256)
    small, large = runtime.step_memory_bytes(2, 256, 4), runtime.step_memory_bytes(2, 256, 600)
    assert small == runtime.step_memory_bytes(2, 256, SPAN_CALL_TOKENS) < large  # a span prefill's call at least
    assert runtime.step_memory_bytes(2, 128, 600) < large  # the split-KV parts grow with the cache's length
    runtime.decode_spans([0, 1], [[5] * 200, [7] * 200], [0, 0])
    assert 0 < runtime._workspace.numel() <= large
    runtime.reserve_step_memory(600)  # allocated at start-up: no step after it grows the workspace
    assert runtime._workspace.numel() == large
    runtime.decode_spans([0, 1], [[5] * 250, [7] * 250], [0, 0])
    assert runtime._workspace.numel() == large
