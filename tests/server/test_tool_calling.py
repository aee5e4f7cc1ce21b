"""The official openai client round-trips structured output and a tool call against a real server: the call
(whole and as streamed deltas), the tool result sent back, and the final answer."""

from __future__ import annotations

import json

import jsonschema
import pytest
from checkpoints import QWEN3_CODER_TEMPLATE, make_checkpoint
from server_harness import MODEL_NAME, start_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                           "score": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["answer", "score"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_server(shared_hf, tmp_path_factory):
    """A tiny random model with Qwen2.5-Instruct's real chat template (hermes tool calls)."""
    folder = make_checkpoint(tmp_path_factory.mktemp("tool-server") / "model", max_position_embeddings=2048)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = json.loads((shared_hf / "Qwen2.5-Instruct" / "tokenizer_config.json").read_text()
                                         )["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    running = start_server(folder, max_batch=2, max_queue=4)
    assert running.state.status == "ok", running.state.error
    yield running
    running.stop()


@pytest.mark.slow
def test_openai_client_tool_call_round_trip(tool_server):
    client = tool_server.client()
    first = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=100, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])

    # The same request streamed: the deltas add up to the same call.
    stream = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=[WEATHER], tool_choice="required",
                                            max_tokens=100, temperature=0, stream=True)
    name, arguments, ids, finish = "", "", set(), None
    for chunk in stream:
        for c in chunk.choices:
            for delta in c.delta.tool_calls or []:
                assert delta.index == 0
                ids.add(delta.id) if delta.id else None
                name += delta.function.name or "" if delta.function else ""
                arguments += delta.function.arguments or "" if delta.function else ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and len(ids) == 1
    assert name == "get_weather" and json.loads(arguments) == json.loads(call.function.arguments)

    # The tool's result goes back; the model answers in text.
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 C"}]
    final = client.chat.completions.create(model=MODEL_NAME, messages=history, tools=[WEATHER], tool_choice="none",
                                           max_tokens=8, temperature=0)
    assert final.choices[0].message.content and final.choices[0].message.tool_calls is None
    assert final.choices[0].finish_reason in ("stop", "length")


@pytest.mark.slow
def test_openai_client_json_schema_and_named_tool(tool_server):
    client = tool_server.client()
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, max_tokens=60, temperature=1.0, seed=3, n=2,
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}})
    for choice in reply.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    named = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=[WEATHER], max_tokens=100, temperature=1.0, seed=1,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"
    # OpenAI's API (and vLLM) end a reply whose tool_choice named the function with "stop", not "tool_calls".
    assert named.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=[WEATHER], max_tokens=100, temperature=1.0, seed=1, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert [c.finish_reason for chunk in stream for c in chunk.choices if c.finish_reason] == ["stop"]
    cut = client.chat.completions.create(  # a forced call max_tokens cuts is left out: no text either (not "")
        model=MODEL_NAME, messages=ASK, tools=[WEATHER], max_tokens=3, tool_choice="required")
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content is None
    assert not cut.choices[0].message.tool_calls
    with tool_server.http() as http:
        completion = http.post("/v1/completions", json={"prompt": "Answer:", "max_tokens": 20,
                                                        "guided_choice": ["alpha", "beta"]}).json()
        assert completion["choices"][0]["text"] in ("alpha", "beta")
        bad = http.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER], "tool_choice": {
            "type": "function", "function": {"name": "nope"}}})
        assert bad.status_code == 400 and "nope" in bad.json()["error"]["message"]
        # Token bans beside a forced tool call are refused by name, and the message names tool_choice.
        refused = http.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER], "min_tokens": 2,
                                                          "tool_choice": "required"}).json()["error"]
        assert refused["param"] == "min_tokens" and "tool_choice" in refused["message"], refused
        both = http.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER], "tool_choice": "required",
                                                       "guided_regex": "a+"}).json()["error"]
        assert both["param"] == "guided_regex" and "tool_choice" in both["message"], both


@pytest.mark.slow
def test_auto_tool_choice_streams_the_same_reply(tool_server):
    """With tool_choice auto the model writes freely: streamed deltas add up to the non-streamed reply."""
    client = tool_server.client()
    kwargs = dict(model=MODEL_NAME, messages=ASK, tools=[WEATHER], max_tokens=24, temperature=1.0, seed=5,
                  logprobs=True)
    whole = client.chat.completions.create(**kwargs).choices[0]
    content, calls, finish, logprobs = "", [], None, 0
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
            logprobs += len(c.logprobs.content) if c.logprobs and c.logprobs.content else 0
            finish = c.finish_reason or finish
    assert content == (whole.message.content or "") and finish == whole.finish_reason
    assert bool(calls) == bool(whole.message.tool_calls)
    assert logprobs == len(whole.logprobs.content)


@pytest.mark.slow
def test_qwen3_coder_calls_come_back_typed(tmp_path):
    """Qwen3-Coder's XML call syntax through the chat route: a forced call's integer parameter comes back as a
    JSON number (typed by the tool's schema), whole and streamed, and goes back through the template."""
    folder = make_checkpoint(tmp_path / "model", max_position_embeddings=2048)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": QWEN3_CODER_TEMPLATE}))
    running = start_server(folder, max_batch=2)
    try:
        client = running.client()
        ask = {"model": MODEL_NAME, "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
               "max_tokens": 200, "temperature": 0}
        call = client.chat.completions.create(**ask).choices[0].message.tool_calls[0]
        arguments = json.loads(call.function.arguments)
        assert call.function.name == "get_weather" and isinstance(arguments["days"], int)
        assert arguments["city"] in ("Paris", "Tokyo")
        streamed = "".join(d.function.arguments or "" for chunk in client.chat.completions.create(**ask, stream=True)
                           for c in chunk.choices for d in c.delta.tool_calls or [] if d.function)
        assert json.loads(streamed) == arguments
        history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                   {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        assert client.chat.completions.create(model=MODEL_NAME, messages=history, tools=[WEATHER], max_tokens=2,
                                              temperature=0).usage.prompt_tokens > 0
    finally:
        running.stop()
