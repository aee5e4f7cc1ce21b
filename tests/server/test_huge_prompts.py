"""A huge prompt neither takes long to reject nor stalls the server for other clients."""

from __future__ import annotations

import threading
import time

import pytest
from server_harness import MODEL_NAME, serving

HUGE = "hello world " * (20_000_000 // 12)  # 20 MB


@pytest.fixture(scope="module")
def server(tiny_model):
    """The tests' usual server, taking bodies up to 64 MiB (the default is 16: a 20 MB prompt would be a 413)."""
    with serving(tiny_model, max_batch=4, max_queue=16, max_body_mb=64) as running:
        yield running


def poll_health_while(work, http) -> tuple[object, list[float]]:
    """Run work() on a thread, polling /health until it returns; (its result, each poll's seconds)."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    latencies = []
    while thread.is_alive():
        start = time.perf_counter()
        assert http.get("/health").status_code == 200
        latencies.append(time.perf_counter() - start)
    thread.join()
    return result[0], latencies


def test_a_20mb_prompt_is_rejected_in_seconds(server):
    bodies = {"/v1/completions": {"model": MODEL_NAME, "prompt": HUGE},
              "/v1/chat/completions": {"model": MODEL_NAME, "messages": [{"role": "user", "content": HUGE}]}}
    with server.http() as http, server.http() as health:
        for route, body in bodies.items():
            start = time.perf_counter()
            response, _ = poll_health_while(lambda: http.post(route, json=body), health)  # noqa: B023
            assert time.perf_counter() - start < 5
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "context_length_exceeded"
            assert "at least 1250000 tokens" in error["message"] and "256 tokens" in error["message"]


def test_health_answers_while_a_long_prompt_is_tokenized(server):
    # /tokenize counts texts far past the context (up to 1 MiB here), so this 960 kB prompt is really
    # tokenized (about a second). Before, the tokenizer held the GIL throughout and /health waited for all of it.
    text = "hello world " * 80_000
    with server.http() as http, server.http() as health:
        start = time.perf_counter()
        response, latencies = poll_health_while(lambda: http.post("/tokenize", json={"prompt": text}), health)
        took = time.perf_counter() - start
        assert response.status_code == 200 and response.json()["count"] > 80_000
    assert len(latencies) >= 3 and max(latencies) < took / 2, (took, latencies)


def test_the_counting_routes_refuse_a_20mb_text_before_tokenizing_it(server):
    # A break test: /tokenize took ~20 s over a 15 MB text and left the server ~2 GB larger, with no bound.
    # Now each counting route takes at most max(1 MiB, 32 bytes per context token).
    message = [{"role": "user", "content": HUGE}]
    bodies = [("/tokenize", {"prompt": HUGE}, "prompt"), ("/tokenize", {"content": HUGE}, "content"),
              ("/tokenize", {"messages": message}, "messages"),
              ("/v1/responses/input_tokens", {"model": MODEL_NAME, "input": HUGE}, "input"),
              ("/v1/responses/input_tokens", {"model": MODEL_NAME, "input": HUGE, "truncation": "auto"}, "input"),
              ("/v1/messages/count_tokens", {"model": MODEL_NAME, "messages": message}, None)]
    with server.http() as http:
        for route, body, param in bodies:
            start = time.perf_counter()
            response = http.post(route, json=body)
            assert time.perf_counter() - start < 5
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert "at most 1048576 bytes" in error["message"] and "count it in parts" in error["message"]
            if param is not None:
                assert error["param"] == param
