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
    finally:
        running.stop()
