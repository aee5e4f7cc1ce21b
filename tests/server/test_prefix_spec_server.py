"""Prefix caching and speculative decoding through the server: usage.cached_tokens, /metrics, same output."""

from __future__ import annotations

import pytest
from server_harness import MODEL_NAME, start_server

SYSTEM = "You are a careful coding agent. Answer with code only. " * 3


def _chat(client, messages, **extra):
    return client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0,
                                          extra_body={"ignore_eos": True, **extra})


def _metric(running, name: str) -> float:
    text = running.http().get("/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


@pytest.fixture(scope="module")
def servers(tiny_model):
    cached = start_server(tiny_model, max_batch=2, max_queue=4)
    plain = start_server(tiny_model, max_batch=2, max_queue=4, prefix_cache_gb=None)
    yield cached, plain
    cached.stop()
    plain.stop()


def test_a_second_turn_reuses_the_first_and_reports_cached_tokens(servers):
    cached, plain = servers
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "def add(a, b):"}]
    results = {}
    for name, running in (("cached", cached), ("plain", plain)):
        client = running.client()
        first = _chat(client, turn1)
        turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "Tool output: 3 passed. Next?"}]
        second = _chat(client, turn2)
        results[name] = (first, second)
    (c1, c2), (p1, p2) = results["cached"], results["plain"]
    # Same greedy text with and without the cache (float32: rounding-level differences only).
    assert c1.choices[0].message.content == p1.choices[0].message.content
    assert c2.choices[0].message.content == p2.choices[0].message.content
    assert c1.usage.prompt_tokens_details.cached_tokens == 0
    assert c2.usage.prompt_tokens_details.cached_tokens > c1.usage.prompt_tokens // 2
    assert p2.usage.prompt_tokens_details.cached_tokens == 0
    assert _metric(cached, "solo_prefix_cache_hits_total") >= 1
    assert _metric(cached, "solo_prefix_cache_cached_tokens_total") == c2.usage.prompt_tokens_details.cached_tokens


def test_a_batch_of_prompts_reports_each_prompts_cached_tokens(servers):
    # A break test: with several prompts (and n choices each) cached_tokens was the largest prompt's hit alone,
    # where prompt_tokens and the metric add every prompt's.
    cached, _ = servers
    client = cached.client()
    prompts = ["import os\n" + "".join(f"def alpha_{i}(x):\n    return x * {i}\n" for i in range(6)),
               "import sys\n" + "".join(f"class Beta{i}:\n    pass\n" for i in range(6))]
    alone = []
    for prompt in prompts:
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1)  # (fills the cache)
        alone.append(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1)
                     .usage.prompt_tokens_details.cached_tokens)
    assert all(alone)
    before = _metric(cached, "solo_prefix_cache_cached_tokens_total")
    batch = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=1, n=2)
    assert len(batch.choices) == 4 and batch.usage.prompt_tokens_details.cached_tokens == sum(alone)
    assert _metric(cached, "solo_prefix_cache_cached_tokens_total") - before >= sum(alone)
    chat = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": prompts[0]}],
                                          max_tokens=1, n=3)
    again = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": prompts[0]}],
                                           max_tokens=1, n=3)
    assert 0 < again.usage.prompt_tokens_details.cached_tokens < chat.usage.prompt_tokens  # (once, not 3 times)


def test_speculative_decoding_in_the_server_keeps_the_output(tiny_model):
    # "suffix" drafts from the session's earlier requests: the second identical request is drafted.
    spec = start_server(tiny_model, backend="cpu", speculative="suffix", max_batch=2, max_queue=4)
    plain = start_server(tiny_model, backend="cpu", speculative="off", max_batch=2, max_queue=4)
    try:
        if spec.state.error is not None:
            pytest.skip(f"the cpu runtime is not available here: {spec.state.error}")
        messages = [{"role": "user", "content": "def fibonacci(n):"}]
        expected = _chat(plain.client(), messages).choices[0].message.content
        for _ in range(2):
            assert _chat(spec.client(), messages).choices[0].message.content == expected
        assert _metric(spec, "solo_spec_decode_accepted_tokens_total") > 5
        assert _metric(spec, "solo_spec_decode_acceptance_length_count") >= 1  # requests that drafted
        assert _metric(plain, "solo_spec_decode_verify_steps_total") == 0
    finally:
        spec.stop()
        plain.stop()
