"""`solo serve` with no MODEL serves the bundled model, under its own name, with `solo run`'s output, and chats."""

from __future__ import annotations

import pytest
from server_harness import start_server

from solo import Engine, SamplingParams
from solo.errors import ModelNotFoundError
from solo.model.default_model import DEFAULT_MODEL_NAME, default_model_path


def test_serves_the_bundled_model_by_default():
    try:
        default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    running = start_server(None, served_model_name=None, dtype="auto", backend="auto", max_batch=2)
    try:
        assert running.state.status == "ok", running.state.error
        client = running.client()
        assert [m.id for m in client.models.list().data] == [DEFAULT_MODEL_NAME]
        reply = client.completions.create(model=DEFAULT_MODEL_NAME, prompt="def fibonacci(n):", max_tokens=24,
                                          temperature=0)
        expected = Engine.load(None).complete("def fibonacci(n):", SamplingParams(max_tokens=24, temperature=0))
        assert reply.choices[0].text == expected.text
        assert reply.usage.completion_tokens == len(expected.token_ids)
        # The bundled model chats too: the openai SDK's chat.completions works out of the box.
        messages = [{"role": "user", "content": "Write a Python function `add(a, b)`: Return the sum of a and b."}]
        chat = client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=messages, max_tokens=32,
                                              temperature=0)
        expected = Engine.load(None).complete(messages, SamplingParams(max_tokens=32, temperature=0))
        assert chat.choices[0].message.content == expected.text and expected.text
        _forced_calls_stream_in_the_replys_order(client)
    finally:
        running.stop()


def _forced_calls_stream_in_the_replys_order(client):
    # tool_choice "required": the model makes a call, then starts another that max_tokens cuts: left out, never
    # content (the output was held to calls); a call whose closing tag max_tokens cut is still a call; a reply
    # cut before any call is complete has neither.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ask = {"model": DEFAULT_MODEL_NAME, "messages": [{"role": "user", "content": "weather in paris"}],
           "tools": tools, "tool_choice": "required", "temperature": 0}
    for max_tokens in (100, 60):
        whole = client.chat.completions.create(max_tokens=max_tokens, **ask).choices[0]
        kinds, content = [], ""
        for chunk in client.chat.completions.create(max_tokens=max_tokens, stream=True, **ask):
            delta = chunk.choices[0].delta
            if delta.tool_calls:
                kinds.append("call")
            if delta.content:
                kinds.append("content")
                content += delta.content
        assert whole.message.tool_calls, (max_tokens, whole.message)
        assert whole.message.content is None and not content and "call" in kinds, (whole.message, kinds)
    cut = client.chat.completions.create(max_tokens=6, **ask).choices[0]
    assert (cut.message.content or None, cut.message.tool_calls, cut.finish_reason) == (None, None, "length")
