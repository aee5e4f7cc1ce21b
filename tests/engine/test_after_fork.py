"""A child process forked from one holding a loaded engine generates (on one thread) instead of hanging."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable

import pytest
import torch

from solo import Engine, SamplingParams
from solo.engine.constraints import TokenConstraint
from solo.errors import SoloError

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="needs os.fork (Linux)")

PROMPTS = ["def fibonacci(n):", "import os\n" + "x = 1\n" * 200]  # the second's prefill is 1000+ positions


def _in_a_forked_child(work: Callable[[], dict]) -> dict:
    """work()'s JSON result, run in a child made by os.fork() (a hang or a crash fails the test)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(60)
            os.close(read)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                os.write(write, json.dumps(work()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the forked child failed or hung (status {status})"
    return json.loads(out)


def _in_child(engine: Engine) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        texts = [engine.complete(p, SamplingParams(max_tokens=12)).text for p in PROMPTS]
        again = engine.complete(PROMPTS[0], SamplingParams(max_tokens=12)).text
    return {"texts": texts, "again": again, "warnings": [str(w.message) for w in caught],
            "torch_threads": torch.get_num_threads(), "runtime_threads": getattr(engine.runtime, "num_threads", None)}


def test_a_forked_child_generates_on_one_thread_and_says_so():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the parent's kernels start their thread pools: what a child inherits broken
    try:
        engine = Engine.load()
        threads = engine.runtime.num_threads
        expected = [engine.complete(p, SamplingParams(max_tokens=12)).text for p in PROMPTS]
        child = _in_a_forked_child(lambda: _in_child(engine))
        assert child["texts"] == expected  # greedy: the same tokens on one thread as on two
        assert child["again"] == expected[0]
        assert child["torch_threads"] == 1 and child["runtime_threads"] == 1
        if threads > 1:  # said once, naming the fix
            assert len(child["warnings"]) == 1 and "spawn" in child["warnings"][0], child["warnings"]
        # The parent keeps its threads and still generates.
        assert engine.runtime.num_threads == threads and torch.get_num_threads() == 2
        assert engine.complete(PROMPTS[0], SamplingParams(max_tokens=12)).text == expected[0]
    finally:
        torch.set_num_threads(before)


SCHEMA = {"type": "json_schema", "json_schema": {"name": "p", "schema": {
    "type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}}}


def test_structured_output_in_a_forked_child_with_the_mask_on_its_own_thread(monkeypatch):
    # From a break test: the grammar masks' thread pool did not survive the fork; the child's first constrained
    # token waited for it for ever (the mask runs on its own thread on CUDA, and wherever a core is spare).
    monkeypatch.setattr(TokenConstraint, "overlap", True)
    engine = Engine.load()
    params = SamplingParams(max_tokens=20, response_format=SCHEMA)
    expected = engine.complete("person:", params).text
    child = _in_a_forked_child(lambda: {"text": engine.complete("person:", params).text})
    assert child["text"] == expected and json.loads(expected)["age"] is not None


def test_a_child_forked_during_another_threads_generation_refuses_instead_of_hanging():
    # From a break test: the engine's lock was copied held by a thread that does not exist in the child.
    engine = Engine.load()
    started, done = threading.Event(), threading.Event()

    def generate() -> None:
        for i, _ in enumerate(engine.generate("def main():", SamplingParams(max_tokens=400, ignore_eos=True))):
            if i == 3:
                started.set()
                done.wait(60)

    thread = threading.Thread(target=generate)
    thread.start()
    try:
        assert started.wait(60)

        def child() -> dict:
            try:
                engine.complete("import os", SamplingParams(max_tokens=4))
            except SoloError as exc:
                return {"error": str(exc)}
            return {"error": None}

        result = _in_a_forked_child(child)
    finally:
        done.set()
        thread.join(60)
    assert result["error"] and "forked while another thread was generating" in result["error"]
    assert engine.complete("import os", SamplingParams(max_tokens=4)).finish_reason  # the parent's engine is fine


def test_the_engine_is_free_once_the_last_event_is_out():
    # From a break test: a reader that stopped at the event with finish_reason (without the StopIteration after
    # it) kept the engine held: another thread's call waited, this thread's was refused after a second.
    engine = Engine.load()
    stream = engine.generate("def a():", SamplingParams(max_tokens=5))
    for event in stream:
        if event.finish_reason is not None:
            break
    other: list[str] = []
    thread = threading.Thread(target=lambda: other.append(engine.complete("import os", SamplingParams(max_tokens=3))
                                                          .finish_reason), daemon=True)
    thread.start()
    thread.join(30)
    assert other == ["length"]
    assert engine.complete("import re", SamplingParams(max_tokens=3)).finish_reason == "length"  # this thread too
    assert list(stream) == []  # and the stream ends as before
