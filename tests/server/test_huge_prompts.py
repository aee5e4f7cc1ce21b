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
    # /tokenize has no context limit, so this 1.2 MB prompt is really tokenized (about a second). Before, the
    # tokenizer held the GIL throughout and /health waited for all of it.
    text = "hello world " * 100_000
    with server.http() as http, server.http() as health:
        start = time.perf_counter()
        response, latencies = poll_health_while(lambda: http.post("/tokenize", json={"prompt": text}), health)
        took = time.perf_counter() - start
        assert response.status_code == 200 and response.json()["count"] > 100_000
    assert len(latencies) >= 3 and max(latencies) < took / 2, (took, latencies)
