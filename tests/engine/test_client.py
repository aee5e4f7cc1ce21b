"""The engine interface the CLI and the server share: capabilities, backend, device, health."""

from __future__ import annotations

import pytest
import torch

from solo.engine.client import EngineClient, EngineDeadError, EngineInfo
from solo.engine.engine import Engine
from solo.runtime.base import runtime_capabilities


@pytest.mark.parametrize("backend", ["eager", "cpu"])
def test_an_engine_reports_what_its_runtime_declares(tiny_llama, backend):
    engine = Engine.load(tiny_llama, dtype="float32", backend=backend, speculative="auto")
    assert isinstance(engine, EngineInfo) and not isinstance(engine, EngineClient)  # synchronous streams
    caps = engine.capabilities
    assert engine.backend_name == caps.runtime.name == backend
    assert engine.device == torch.device("cpu")
    assert caps.runtime == runtime_capabilities(engine.runtime)
    assert caps.runtime.verify and caps.runtime.kv_snapshots and not caps.runtime.block_decoding
    assert caps.runtime.verify_matches_decode == (backend == "cpu")  # float32 on the native kernels
    assert caps.runtime.batch_invariant == (backend == "cpu")
    assert caps.prefix_cache and caps.prefix_cache_store
    assert caps.speculative == ("ngram" if backend == "cpu" else "off")  # "auto" only where it cannot lose
    assert engine.kv_cache_element_bytes == 4
    assert engine.is_running and not engine.errored
    engine.check_health()


def test_a_failed_runtime_makes_the_engine_unhealthy(tiny_llama):
    engine = Engine.load(tiny_llama, dtype="float32", backend="eager", prefix_cache_gb=None)
    assert not engine.capabilities.prefix_cache
    engine.runtime.failed = "rank 1 exited"  # what the tensor-parallel runtime sets when a rank dies
    assert engine.errored and not engine.is_running
    with pytest.raises(EngineDeadError, match="rank 1 exited"):
        engine.check_health()


def test_warm_up_leaves_the_prefix_cache_consistent(tiny_llama):
    engine = Engine.load(tiny_llama, dtype="float32", backend="cpu", speculative="off")
    first = engine.complete("def f(x):", {"max_tokens": 4, "temperature": 0.0})
    engine.warm_up()  # overwrites row 0: the cache must not reuse what it held
    again = engine.complete("def f(x):", {"max_tokens": 4, "temperature": 0.0})
    assert again.stats.cached_tokens == 0 and again.token_ids == first.token_ids


@pytest.mark.parametrize("backend", ["eager", "cpu"])
def test_warm_up_on_a_fresh_engine_and_beside_an_open_stream(tiny_llama, backend):
    # A fresh engine has no cache: warm_up reserves one (it failed, naming a 0 x 0 cache); beside an open
    # stream in the same thread it is refused (it overwrote the stream's KV cache and the prefix cache's row).
    from solo.errors import SoloError

    engine = Engine.load(tiny_llama, dtype="float32", backend=backend, speculative="off")
    engine.warm_up()
    params = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    alone = engine.complete("def f(x):", params).token_ids
    stream = engine.generate("def f(x):", params)
    streamed = [next(stream).token_ids[0] for _ in range(3)]
    with pytest.raises(SoloError, match="read the stream to the end or close"):
        engine.warm_up()
    streamed += [t for event in stream for t in event.token_ids]
    assert streamed == alone and engine.complete("def f(x):", params).token_ids == alone


def test_a_closed_engine_generates_no_more(tiny_llama):
    from solo.errors import SoloError

    with Engine.load(tiny_llama, dtype="float32", backend="eager") as engine:
        engine.complete("def f", {"max_tokens": 2})
    assert not engine.is_running and not engine.errored
    with pytest.raises(EngineDeadError, match="closed"):
        engine.check_health()
    for call in (lambda: engine.complete("def f", {"max_tokens": 2}), engine.warm_up,
                 lambda: engine.make_request("def f", {"max_tokens": 2})):
        with pytest.raises(SoloError, match=r"Engine.load\(...\)"):
            call()
    engine.close()  # idempotent
    # A stream open when the engine closes stops at its next step (it ran on to max_tokens).
    engine = Engine.load(tiny_llama, dtype="float32", backend="eager")
    stream = engine.generate("def f", {"max_tokens": 20, "ignore_eos": True})
    next(stream)
    engine.close()
    with pytest.raises(SoloError, match=r"Engine.load\(...\)"):
        next(stream)
    # A generation waiting for another's lock when the engine closes runs no step either (it prefilled and
    # gave a token).
    import threading

    engine = Engine.load(tiny_llama, dtype="float32", backend="eager")
    first = engine.generate("def f", {"max_tokens": 200, "ignore_eos": True})
    next(first)  # (holds the engine's lock)
    waited: list = []

    def second() -> None:
        events = 0
        try:
            for _ in engine.generate("def g", {"max_tokens": 5}):
                events += 1
        except SoloError as exc:
            waited.append((events, str(exc)))

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(0.3)  # (waiting on the lock)
    engine.close()
    with pytest.raises(SoloError):
        next(first)
    first.close()
    thread.join(10)
    assert waited and waited[0][0] == 0 and "Engine.load" in waited[0][1]
    # warm_up() waiting the same way raises too (it ran a prefill and a decode step on the closed engine).
    engine = Engine.load(tiny_llama, dtype="float32", backend="eager")
    first = engine.generate("def f", {"max_tokens": 200, "ignore_eos": True})
    next(first)
    raised: list = []

    def warm() -> None:
        try:
            engine.warm_up()
        except SoloError as exc:
            raised.append(str(exc))

    thread = threading.Thread(target=warm)
    thread.start()
    thread.join(0.3)
    engine.close()
    first.close()
    thread.join(10)
    assert raised and "Engine.load" in raised[0]


def test_the_server_engine_is_an_engine_client(tiny_llama):
    from solo.server.async_engine import AsyncEngine

    engine = Engine.load(tiny_llama, dtype="float32", backend="cpu", speculative="off")
    client = AsyncEngine(engine, max_batch=2, max_queue=4, max_seq=128)
    assert isinstance(client, EngineClient)
    assert client.backend_name == "cpu" and client.capabilities == engine.capabilities
    assert client.decode_batching == "fused" and client.is_running
    client.check_health()


def test_continue_final_message_in_the_python_api():
    # vLLM's LLM.chat(continue_final_message=True): the text ends where the last message's content ends (a
    # prefill), not with its end-of-turn marker and a new assistant header.
    from solo.errors import InvalidRequestError

    engine = Engine.load(None)  # the bundled model: ChatML
    prefill = [{"role": "user", "content": "Write a function."}, {"role": "assistant", "content": "def add(a, b):"}]
    request = engine.make_request(prefill, {"max_tokens": 4}, continue_final_message=True)
    text = engine.tokenizer.render_chat(prefill, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("def add(a, b):")
    assert request.prompt_ids == engine.tokenizer.encode(text, add_special_tokens=False)
    assert engine.make_request(prefill, {"max_tokens": 4}).prompt_ids != request.prompt_ids  # a new turn
    greedy = {"max_tokens": 6, "temperature": 0}
    assert engine.complete(prefill, greedy, continue_final_message=True).token_ids == \
        engine.complete(request.prompt_ids, greedy).token_ids
    for prompt, extra, words in (
            ("def f", {}, "needs chat messages"),
            ([*prefill[:1], {**prefill[1], "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "f", "arguments": "{}"}}]}], {}, "holds tool calls"),
            (prefill, {"response_format": {"type": "json_object"}}, "cannot be combined with response_format")):
        with pytest.raises(InvalidRequestError, match=words):
            engine.make_request(prompt, {"max_tokens": 4, **extra}, continue_final_message=True)
