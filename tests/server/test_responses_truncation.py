"""The Responses API's `truncation: "auto"`: a conversation longer than the context runs with its oldest turns
left out (the instructions and leading system messages kept, the rest starting at a user message); without it
the same request is refused; `max_tool_calls` (OpenAI's built-in tools' bound) changes nothing."""

from __future__ import annotations

import openai
import pytest
from checkpoints import make_checkpoint
from server_harness import MODEL_NAME, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = start_server(make_checkpoint(tmp_path_factory.mktemp("truncation") / "model"), max_batch=1)
    assert running.state.status == "ok", running.state.error
    yield running
    running.stop()


def _conversation(turns: int) -> list[dict]:
    items = [{"role": "system", "content": "Answer in one word."}]
    for turn in range(turns):
        items += [{"role": "user", "content": f"question {turn}: what is x = {turn} + 1 in code?"},
                  {"role": "assistant", "content": f"x = {turn + 1}"}]
    return [*items, {"role": "user", "content": "and the last one?"}]


def test_auto_truncation_drops_the_oldest_turns(server):
    client = server.client()
    items = _conversation(30)  # (well past the tiny model's 256 tokens)
    with pytest.raises(openai.BadRequestError, match="maximum context length") as refused:
        client.responses.create(model=MODEL_NAME, input=items, max_output_tokens=4)
    assert "max_output_tokens 4" in str(refused.value) and "max_tokens" not in str(refused.value)
    reply = client.responses.create(model=MODEL_NAME, input=items, max_output_tokens=4, truncation="auto",
                                    temperature=0, extra_body={"max_tool_calls": 3})
    assert reply.truncation == "auto" and reply.status in ("completed", "incomplete")
    assert reply.usage.input_tokens + 4 <= server.state.max_model_len
    # The fewest turns were dropped: the kept conversation is the longest that fits, and it keeps the system
    # message and the last question.
    tokenizer = server.state.engine.tokenizer
    kept = [m for m in items[1:] if m["role"] == "user"]
    for start in range(len(kept)):
        first = items.index(kept[start])
        messages = [items[0], *items[first:]]
        length = len(tokenizer.encode(tokenizer.render_chat(messages, True), add_special_tokens=False))
        if length + 4 <= server.state.max_model_len:
            assert reply.usage.input_tokens == length
            break
    else:
        pytest.fail("no start fits")
    # A conversation that fits is unchanged.
    short = _conversation(1)
    same = client.responses.create(model=MODEL_NAME, input=short, max_output_tokens=2, truncation="auto")
    plain = client.responses.create(model=MODEL_NAME, input=short, max_output_tokens=2)
    assert same.usage.input_tokens == plain.usage.input_tokens
