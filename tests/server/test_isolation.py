"""One request never changes another's output: the same text and logprobs alone or beside others."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from server_harness import MODEL_NAME, serving, start_server

# Different prompts, seeds, sampling settings and lengths; several run past EOS so they overlap long.
CASES = [
    ("def fibonacci(n):", dict(max_tokens=40, temperature=0)),
    ("class Stack:", dict(max_tokens=25, temperature=0.8, seed=1)),
    ("The quick brown fox", dict(max_tokens=60, temperature=1.0, seed=2, top_k=20)),
    ("import os", dict(max_tokens=10, temperature=0, presence_penalty=0.5)),
    ("Hello, world!", dict(max_tokens=35, temperature=0.7, top_p=0.9, seed=4)),
    ("What is the capital of France?", dict(max_tokens=50, temperature=1.2, seed=5, min_p=0.05,
                                             repetition_penalty=1.2)),
    ("for i in range(10):", dict(max_tokens=30, temperature=0, stop=["\n\n"])),
    ("café, naïve, 你好世界", dict(max_tokens=45, temperature=0.9, seed=7, frequency_penalty=0.5)),
]
EXTENSIONS = ("top_k", "min_p", "repetition_penalty")


def run_one(client, prompt: str, params: dict) -> tuple[str, list[float], str | None]:
    params = dict(params)
    extra = {k: params.pop(k) for k in EXTENSIONS if k in params}
    extra["ignore_eos"] = "stop" not in params
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": prompt}], stream=True, logprobs=True,
        extra_body=extra, **params,
    )
    text, logprobs, finish = [], [], None
    for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            if choice.logprobs and choice.logprobs.content:
                logprobs += [t.logprob for t in choice.logprobs.content]
            finish = choice.finish_reason or finish
    return "".join(text), logprobs, finish


def run_together(server) -> list:
    """Every case at once, each from its own client thread."""
    together: list = [None] * len(CASES)
    barrier = threading.Barrier(len(CASES))

    def worker(i: int) -> None:
        barrier.wait()
        try:
            together[i] = run_one(server.client(timeout=120), *CASES[i])
        except Exception as exc:  # re-raised below, in the test's thread
            together[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(CASES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for result in together:
        if isinstance(result, Exception):
            raise result
    return together


@pytest.fixture(scope="module")
def server(tiny_model):
    # Bit-for-bit isolation is a property of batching. The prefix cache reuses KV that other requests left
    # behind (equal up to rounding: tests/engine/test_prefix_cache.py), so it is off here.
    with serving(tiny_model, max_batch=4, max_queue=16, prefix_cache_gb=None) as running:
        yield running


def test_concurrent_streams_equal_their_lone_runs(server):
    client = server.client(timeout=120)
    alone = [run_one(client, prompt, params) for prompt, params in CASES]
    assert server.state.scheduler.peak_active == 1

    together = run_together(server)
    # 8 requests on 4 slots: they decoded together (how many at once depends on timing), and the queued
    # ones joined as others finished.
    assert server.state.scheduler.decode_batching == "isolated"  # the eager runtime is not batch-invariant
    assert server.state.scheduler.peak_active >= 2
    for i, (one, other) in enumerate(zip(alone, together, strict=True)):
        assert other == one, f"request {i} changed when run beside others: {one} != {other}"
    for _ in range(200):  # the scheduler frees the rows right after the last events went out
        if server.state.scheduler.active == 0:
            break
        time.sleep(0.01)
    assert server.state.scheduler.active == 0


@contextlib.contextmanager
def fused_cpu_server(tiny_model):
    """A server on the native CPU runtime with one batched decode call per step (skips where it cannot run)."""
    running = start_server(tiny_model, backend="cpu", decode_batching="fused", max_batch=4, max_queue=16,
                           prefix_cache_gb=None)
    try:
        if running.state.error is not None:
            pytest.skip(f"the cpu runtime is not available here: {running.state.error}")
        yield running
    finally:
        running.stop()


def test_fused_batching_on_a_batch_invariant_runtime(tiny_model):
    # The native CPU runtime computes each sequence with its batch-1 reduction order, so one batched decode
    # call per step keeps every request bit-identical to its lone run.
    # Speculative decoding stays on (auto: n-gram drafts on this runtime): drafts come from a request's own
    # tokens and verify runs on its own row, so it keeps isolation too.
    with fused_cpu_server(tiny_model) as running:
        assert running.state.scheduler.decode_batching == "fused"
        client = running.client(timeout=120)
        alone = [run_one(client, prompt, params) for prompt, params in CASES]
        together = run_together(running)
        assert running.state.scheduler.peak_active >= 2
        for i, (one, other) in enumerate(zip(alone, together, strict=True)):
            assert other == one, f"request {i} changed when run beside others: {one} != {other}"


DEAD_END = {"type": "regex", "regex": r"ab[^\s\S]"}  # its grammar allows no token after "ab"


def _run_beside_a_dead_grammar(running) -> None:
    # Break test: a grammar that ran dead mid-output raised inside the shared step, and every request of that
    # step was ended with a 500. Now that request alone ends, with a 400 naming its field.
    import openai

    client = running.client(timeout=120)
    victims = CASES[:3]
    alone = [run_one(client, prompt, params) for prompt, params in victims]
    results: list = [None] * len(victims)

    def worker(i: int) -> None:
        try:
            results[i] = run_one(running.client(timeout=120), *victims[i])
        except Exception as exc:  # re-raised below
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(victims))]
    for t in threads:
        t.start()
    for _ in range(500):  # the victims decode before the bad request arrives
        if running.state.scheduler.active >= 2:
            break
        time.sleep(0.01)
    with pytest.raises(openai.BadRequestError, match="allows no next token") as info:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], max_tokens=8,
                                       response_format=DEAD_END)
    assert info.value.body["param"] == "response_format"
    with pytest.raises(openai.APIError, match="allows no next token"):
        for _ in client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "y"}],
                                                max_tokens=8, response_format=DEAD_END, stream=True):
            pass
    for t in threads:
        t.join(120)
    for one, other in zip(alone, results, strict=True):
        if isinstance(other, Exception):
            raise other
        assert other == one


def test_a_grammar_that_runs_dead_ends_its_request_alone(server):
    _run_beside_a_dead_grammar(server)


def test_a_grammar_that_runs_dead_ends_its_request_alone_in_a_fused_step(tiny_model):
    with fused_cpu_server(tiny_model) as running:
        _run_beside_a_dead_grammar(running)
