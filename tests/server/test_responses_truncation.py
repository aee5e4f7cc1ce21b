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


def test_an_agents_loop_on_one_task_keeps_the_task_and_whole_calls(server):
    # One user message, then many calls and outputs (Codex's and the Agents SDK's shape): the oldest calls go,
    # each with its output, and the task stays.
    client = server.client()
    items = [{"role": "user", "content": "list the files, then read each one"}]
    for turn in range(25):
        items += [{"type": "function_call", "call_id": f"c{turn}", "name": "read", "arguments": '{"path": "a.py"}'},
                  {"type": "function_call_output", "call_id": f"c{turn}", "output": f"x = {turn}\n" * 3}]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL_NAME, input=items, max_output_tokens=4)
    reply = client.responses.create(model=MODEL_NAME, input=items, max_output_tokens=4, truncation="auto")
    assert reply.usage.input_tokens + 4 <= server.state.max_model_len
    counted = client.post("/responses/input_tokens", cast_to=object, body={
        "model": MODEL_NAME, "input": items, "max_output_tokens": 4, "truncation": "auto"})
    assert counted["input_tokens"] == reply.usage.input_tokens  # (the prompt the request runs)
    for start in range(1, len(items), 2):  # the first call whose turn fits, with the task before it
        kept = [items[0], *items[start:]]
        count = client.post("/responses/input_tokens", cast_to=object, body={"model": MODEL_NAME, "input": kept})
        if count["input_tokens"] + 4 <= server.state.max_model_len:
            assert count["input_tokens"] == reply.usage.input_tokens
            break
    else:
        pytest.fail("no start fits")


def test_no_cut_leaves_a_call_without_its_output(server):
    # Parallel calls answered after an assistant note: a cut there would keep an output without its call.
    client = server.client()
    items = [{"role": "user", "content": "check both"}]
    for turn in range(20):
        items += [{"type": "function_call", "call_id": f"a{turn}", "name": "f", "arguments": "{}"},
                  {"type": "function_call", "call_id": f"b{turn}", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"a{turn}", "output": "x = 1\n" * 2},
                  {"role": "assistant", "content": "one more to come"},
                  {"type": "function_call_output", "call_id": f"b{turn}", "output": "y = 2\n" * 2}]
    reply = client.responses.create(model=MODEL_NAME, input=items, max_output_tokens=4, truncation="auto")
    assert reply.usage.input_tokens + 4 <= server.state.max_model_len
