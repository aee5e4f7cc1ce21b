"""OpenAI's Responses API through the official client: the same generation as the chat route for the same
conversation (instructions, messages, function calls and their outputs), streamed events that add up to the
unstreamed response, function calls as items, and what Solo cannot honour refused by name."""

from __future__ import annotations

import json

import openai
import pytest
from server_harness import DEAD_SCHEMA, MODEL_NAME, start_server

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}},
                          "required": ["city"], "additionalProperties": False}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}


@pytest.fixture(scope="module")
def server():
    running = start_server(None, max_batch=2)  # the bundled model: its template takes tools (Hermes syntax)
    assert running.state.status == "ok", running.state.error
    yield running
    running.stop()


@pytest.mark.slow
def test_text_equals_the_chat_routes_and_streams_the_same(server):
    client = server.client()
    reply = client.responses.create(model=MODEL_NAME, instructions="Be brief.", input="def fibonacci(n):",
                                    max_output_tokens=12, temperature=0)
    chat = client.chat.completions.create(model=MODEL_NAME, max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "def fibonacci(n):"}])
    assert reply.output_text == chat.choices[0].message.content
    assert reply.usage.input_tokens == chat.usage.prompt_tokens and reply.usage.output_tokens == 12
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.id.startswith("resp_") and [item.type for item in reply.output] == ["message"]
    assert reply.output[0].status == "incomplete"  # the item a max_output_tokens cut ends, as OpenAI marks it
    events = list(client.responses.create(model=MODEL_NAME, instructions="Be brief.", input="def fibonacci(n):",
                                          max_output_tokens=12, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == reply.output_text
    assert events[-1].response.output_text == reply.output_text and events[-1].response.usage.output_tokens == 12
    assert events[-1].response.output[0].status == "incomplete" and events[-1].response.model == MODEL_NAME
    assert events[0].response.model == MODEL_NAME


@pytest.mark.slow
def test_function_calls_round_trip(server):
    client = server.client()
    reply = client.responses.create(model=MODEL_NAME, input="Weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", parallel_tool_calls=False, max_output_tokens=120)
    calls = [item for item in reply.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Tokyo") and reply.status == "completed"
    # Named, streamed: the call's item and its arguments as events.
    events = list(client.responses.create(model=MODEL_NAME, input="Weather in Paris?", tools=[WEATHER],
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          parallel_tool_calls=False, max_output_tokens=120, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert len(done) == 1 and done[0].arguments == arguments and json.loads(arguments)["city"] in ("Paris", "Tokyo")
    # The call and its output sent back: the same prompt as the chat route's tool_calls + tool message.
    call = calls[0]
    history = client.responses.create(model=MODEL_NAME, tools=[WEATHER], max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    chat = client.chat.completions.create(model=MODEL_NAME, tools=[CHAT_WEATHER], max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "Weather in Paris?"},
                                                    {"role": "assistant", "content": None, "tool_calls": [
                                                        {"id": call.call_id, "type": "function", "function": {
                                                            "name": call.name, "arguments": call.arguments}}]},
                                                    {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}])
    assert history.usage.input_tokens == chat.usage.prompt_tokens
    assert history.output_text == (chat.choices[0].message.content or "")


@pytest.mark.slow
@pytest.mark.parametrize("fields, param, words", [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "does not keep"),
    ({"reasoning": {"effort": "low"}}, "reasoning", "reasoning"),
    ({"tools": [{"type": "web_search"}]}, "tools", "function tools only"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input", "text only"),
    ({"input": [{"type": "computer_call"}]}, "input", "computer_call"),
    ({"input": [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": None}]}]}, "input",
     "reasoning item"),
    ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ({"max_output_tokens": 10**6}, "max_output_tokens", "max_output_tokens"),  # the chat route's check, renamed
    ({"background": True}, "background", "background"),
    ({"tool_choice": {"type": "function"}}, "tool_choice", '"type": "function", "name"'),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate", "frobnicate"),
    ({"text": {"verbosity": "low"}}, "text", "text.verbosity 'low' is not supported"),  # (it was ignored)
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "[1, 2]"},
                {"type": "function_call_output", "call_id": "c1", "output": "x"}]}, "input",
     "input[0].arguments must be a JSON object string"),
    ({"text": {"format": {"type": "text"}, "bogus": 1}}, "text", "text.bogus"),
    # the chat route's terms put in the Responses API's (flat tools, flat json_schema format)
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text", 'needs "name" and "schema" beside its type'),
    ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools", "tools[0].name must be 1-64 letters"),
    ({"include": ["file_search_call.results"]}, "include", "'file_search_call.results' is not supported"),
    ({"top_logprobs": 21}, "top_logprobs", "top_logprobs"),
    # from a break test: in words, without pydantic's tags ("input.str"); no-effect fields checked all the same
    ({"input": 123}, "input", "input: Input should be a string or a list of input items"),
    ({"tool_choice": 5}, "tool_choice", 'Input should be "none", "auto", "required" or an object'),
    ({"max_tool_calls": -1}, "max_tool_calls", "max_tool_calls must be an integer >= 0"),
    ({"stream_options": {"continuous_usage_stats": True}, "stream": True}, "stream_options",
     "stream_options.continuous_usage_stats is not an option"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options", "only allowed when stream is true"),
])
def test_what_solo_cannot_honour_is_refused(server, fields, param, words):
    # (null is a field's default here as on the other routes)
    assert server.client().responses.create(model=MODEL_NAME, input="hi", max_output_tokens=2,
                                            extra_body={"stream": None}).usage.output_tokens == 2
    # A stateless client's ask for the reasoning to send back (Codex, the Agents SDK with store=False) is as
    # asked: Solo's reasoning items carry it in the clear.
    assert server.client().responses.create(model=MODEL_NAME, input="hi", max_output_tokens=2, store=False,
                                            include=["reasoning.encrypted_content"]).usage.output_tokens == 2
    with pytest.raises(openai.BadRequestError) as info:
        server.client().responses.create(**{"model": MODEL_NAME, "input": "hi", **fields})
    assert words in info.value.message and info.value.body["param"] == param



def test_a_stored_response_cannot_be_fetched_and_the_404_says_why(server):
    for call in (lambda c: c.responses.retrieve("resp_1"), lambda c: c.responses.delete("resp_1")):
        with pytest.raises(openai.NotFoundError, match="Solo stores no responses"):
            call(server.client())


@pytest.mark.slow
def test_input_tokens_counts_what_a_response_would_run(server):
    # POST /v1/responses/input_tokens was taken for a stored response's id (a 404).
    client = server.client()
    fields = {"model": MODEL_NAME, "instructions": "Be brief.", "input": "Weather?", "tools": [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}]}
    counted = client.responses.input_tokens.count(**fields)
    reply = client.responses.create(**fields, max_output_tokens=2)
    assert counted.input_tokens == reply.usage.input_tokens and counted.object == "response.input_tokens"
    assert client.responses.input_tokens.count(model=MODEL_NAME, input="Weather?").input_tokens < counted.input_tokens
    with pytest.raises(openai.BadRequestError, match="max_output_tokens"):
        client.responses.input_tokens.count(model=MODEL_NAME, input="hi", extra_body={"max_output_tokens": -1})

def test_a_reasoning_item_without_its_reply_is_a_thinking_only_message():
    """A reply cut short inside its block comes back as a reasoning item alone: re-sent, it is an assistant turn
    of thinking only (not dropped); the next reply starts after it."""
    from solo.server.responses import ResponsesRequest, chat_request

    reasoning = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think more"}]}
    for items in ([{"role": "user", "content": "q"}, reasoning, {"role": "user", "content": "go on"}],
                  [{"role": "user", "content": "q"}, reasoning]):
        messages = chat_request(ResponsesRequest.model_validate({"input": items})).messages
        assert [(m.role, m.content, (m.model_extra or {}).get("reasoning_content")) for m in messages][:2] == [
            ("user", "q", None), ("assistant", "", "think more")]
    # Between a reply's text and its call, the reasoning joins that reply (not a turn between call and result).
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    items = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "let me"}, reasoning, call,
             {"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    messages = chat_request(ResponsesRequest.model_validate({"input": items})).messages
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert messages[1].model_extra["reasoning_content"] == "think more" and messages[1].model_extra["tool_calls"]


def test_outputs_and_calls_must_pair_up_as_on_openais_api():
    from solo.errors import InvalidRequestError
    from solo.server.responses import ResponsesRequest, chat_request

    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    for items, words in (
            ([{"role": "user", "content": "q"}, {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
             "input[1].call_id 'c1' answers no function_call item before it (unanswered call_ids: none)"),
            ([{"role": "user", "content": "q"}, call, {"type": "function_call_output", "call_id": "c2", "output": "x"}],
             "(unanswered call_ids: 'c1')"),
            ([{"role": "user", "content": "q"}, call, {"type": "function_call_output", "call_id": "c1", "output": "x"},
              {"type": "function_call_output", "call_id": "c1", "output": "x"}], "input[3].call_id 'c1' answers no"),
            ([{"role": "user", "content": "q"}, call], "input[1] is a function_call ('c1') with no "
                                                       "function_call_output item after it"),
            # (break-test finds: a result apart from its call, a tool message, empty names, a call id twice)
            ([{"role": "user", "content": "q"}, call, {"role": "user", "content": "and?"}],
             "input[2] is a user message after the function_call 'c1' (input[1]) and before its function_call_output"),
            ([{"role": "user", "content": "q"}, call, {"role": "user", "content": "and?"},
              {"type": "function_call_output", "call_id": "c1", "output": "x"}], "input[2] is a user message after"),
            ([{"role": "tool", "content": "result with no call"}], 'input[0] is a message of role "tool"'),
            ([{"role": "user", "content": "q"}, {**call, "name": ""}], "needs a non-empty name"),
            ([{"role": "user", "content": "q"}, call, call], "a call_id no other unanswered call has"),
            ([{"role": "user", "content": "q"}, {"type": "reasoning", "summary": ["abc"]}],
             "not a list of text parts")):
        with pytest.raises(InvalidRequestError) as info:
            chat_request(ResponsesRequest.model_validate({"input": items}))
        assert words in str(info.value) and info.value.param == "input"


def test_fields_are_typed_strictly_and_an_empty_reasoning_item_adds_no_turn():
    # Break-test finds: "stream": "yes" streamed, max_output_tokens true meant 1, metadata took numbers; and an
    # item of OpenAI's with no text (only encrypted_content) put an empty assistant turn into the prompt.
    from pydantic import ValidationError

    from solo.server.responses import ResponsesRequest, chat_request

    for fields in ({"stream": "yes"}, {"max_output_tokens": True}, {"max_output_tokens": "5"},
                   {"temperature": "1.5"}, {"parallel_tool_calls": "no"}, {"store": "yes"}, {"metadata": {"a": 5}},
                   {"top_logprobs": 2.0}):
        with pytest.raises(ValidationError):
            ResponsesRequest.model_validate({"input": "hi", **fields})
    plain = chat_request(ResponsesRequest.model_validate({"input": [{"role": "user", "content": "hi"}]})).messages
    empty = chat_request(ResponsesRequest.model_validate({"input": [
        {"role": "user", "content": "hi"}, {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"}]}))
    assert [m.role for m in empty.messages] == [m.role for m in plain] == ["user"]


def test_reasoning_effort_none_turns_thinking_off():
    from solo.server.responses import ResponsesRequest, chat_request

    body = ResponsesRequest.model_validate({"input": "hi", "reasoning": {"effort": "none"}})
    assert chat_request(body).chat_template_kwargs == {"enable_thinking": False}
    assert chat_request(body, thinking_switch=False).chat_template_kwargs is None  # (a model that does not think)
    summarised = ResponsesRequest.model_validate({"input": "hi", "reasoning": {"effort": "none", "summary": "auto"}})
    assert chat_request(summarised).chat_template_kwargs == {"enable_thinking": False}


def test_calls_before_a_max_output_tokens_cut_stay_completed():
    # From a verification round: a call array max_output_tokens cut kept its complete calls, but the last of them
    # was marked "incomplete", which a client may take for a call not to run. A cut call is left out (or is text).
    from solo.server.responses import output_items

    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    items = output_items({"content": None, "tool_calls": [call, {**call, "id": "call_2"}]}, "length")
    assert [(i["type"], i["status"]) for i in items] == [("function_call", "completed")] * 2
    items = output_items({"content": "and then", "tool_calls": [call]}, "length", after_calls="and then")
    assert [(i["type"], i["status"]) for i in items] == [("function_call", "completed"), ("message", "incomplete")]


def test_a_reply_the_server_cut_short_has_failed():
    # A shutdown ends a reply with the chat route's finish_reason "abort": it was reported "completed".
    from solo.server.responses import ResponsesRequest, output_items, response_object

    body = ResponsesRequest(input="hi")
    items = output_items({"content": "def f"}, "abort")
    cut = response_object(body, "resp_1", 0, MODEL_NAME, items, "abort", None)
    assert cut["status"] == "failed" and "shutting down" in cut["error"]["message"]
    assert items[-1]["status"] == "incomplete"
    done = response_object(body, "resp_1", 0, MODEL_NAME, output_items({"content": "x"}), "stop", None)
    assert done["status"] == "completed" and done["error"] is None
    # Streamed: the last event is response.failed, the message item incomplete.
    import asyncio

    from solo.server.responses import _events

    async def events(finish_reason: str) -> list[dict]:
        async def lines():
            for chunk in ({"choices": [{"index": 0, "delta": {"content": "def f"}}]},
                          {"choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]}):
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"
        return [json.loads(e.split("data: ", 1)[1]) async for e in _events(body, lines(), "resp_1", 0, MODEL_NAME)]

    last = asyncio.run(events("abort"))[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["output"][-1]["status"] == "incomplete"
    assert asyncio.run(events("stop"))[-1]["type"] == "response.completed"



def test_text_after_a_call_opens_its_message_item_after_the_calls_item_is_done():
    # The chat stream sends text that followed the calls after them: each item ends before the next starts.
    import asyncio

    from solo.server.responses import ResponsesRequest, _events

    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    chunks = ({"choices": [{"index": 0, "delta": {"content": "Sure."}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
              {"choices": [{"index": 0, "delta": {"content": "\n<tool_call>"}, "finish_reason": "length"}]})

    async def events() -> list[dict]:
        async def lines():
            for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"
        body = ResponsesRequest(input="hi")
        return [json.loads(e.split("data: ", 1)[1]) async for e in _events(body, lines(), "resp_1", 0, MODEL_NAME)]

    items = [(e["type"], e["output_index"]) for e in asyncio.run(events())
             if e["type"] in ("response.output_item.added", "response.output_item.done")]
    assert items == [("response.output_item.added", 0), ("response.output_item.done", 0),
                     ("response.output_item.added", 1), ("response.output_item.done", 1),
                     ("response.output_item.added", 2), ("response.output_item.done", 2)]

def test_reasoning_effort_null_is_the_default(server):
    # null means a field's default (the README): {"effort": null} was refused as a reasoning setting.
    reply = server.client().responses.create(model=MODEL_NAME, input="def f", max_output_tokens=2,
                                             reasoning={"effort": None})
    assert reply.status == "incomplete"


@pytest.mark.slow
def test_output_text_logprobs_as_the_chat_route_gives_them(server):
    # The Agents SDK sends include ["message.output_text.logprobs"] and top_logprobs with ModelSettings(top_logprobs):
    # both were refused (a trial found it).
    client = server.client()
    chat = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    want = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
            for t in chat.choices[0].logprobs.content]
    reply = client.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=6, temperature=0, top_logprobs=2,
                                    include=["message.output_text.logprobs"])
    part = reply.output[0].content[0]
    assert part.text == chat.choices[0].message.content
    assert [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in part.logprobs] == want
    deltas = []
    with client.responses.stream(model=MODEL_NAME, input="hi", max_output_tokens=6, temperature=0,
                                 top_logprobs=2) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas += [(t.token, t.logprob) for t in event.logprobs]
    assert deltas == [(token, logprob) for token, logprob, _ in want]
    plain = client.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=2)
    assert plain.output[0].content[0].logprobs is None  # (only when asked, as before)


@pytest.mark.slow
def test_streamed_logprobs_keep_the_tokens_of_held_back_text(server):
    # A token that ends inside a UTF-8 character (byte 0xF0, id 175 of the bundled model) comes with no text: the
    # streamed reply dropped its logprob (1 of 4 kept), where the unstreamed one and the chat stream keep all.
    client = server.client()
    fields = dict(model=MODEL_NAME, input="print('hi')", max_output_tokens=4, temperature=0, top_logprobs=1,
                  include=["message.output_text.logprobs"], extra_body={"logit_bias": {"175": 100}})
    reply = client.responses.create(**fields)
    want = [(t.token, t.logprob) for t in reply.output[0].content[0].logprobs]
    assert len(want) == reply.usage.output_tokens == 4
    deltas, final = [], None
    for event in client.responses.create(**fields, stream=True):
        if event.type == "response.output_text.delta":
            deltas += [(t.token, t.logprob) for t in event.logprobs]
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    # (the same tokens; the logprobs within a prefix-cache hit's last bits)
    assert [t for t, _ in deltas] == [t for t, _ in want]
    assert deltas == [(t, pytest.approx(lp, abs=1e-3)) for t, lp in want]
    assert [(t.token, t.logprob) for t in final.output[0].content[0].logprobs] == deltas
    # A reply of no text at all (the EOS, id 1, at once): its one token's logprob in a delta too.
    fields["extra_body"] = {"logit_bias": {"1": 100}}
    assert len(client.responses.create(**fields).output[0].content[0].logprobs) == 1
    deltas = [t for event in client.responses.create(**fields, stream=True)
              if event.type == "response.output_text.delta" for t in event.logprobs]
    assert len(deltas) == 1


def test_a_grammar_that_runs_dead_mid_stream_fails_in_this_apis_terms(server):
    # A break test: the streamed failure named the chat route's field (response_format) and said server_error.
    body = {"model": MODEL_NAME, "input": "x", "stream": True, "max_output_tokens": 16,
            "text": {"format": {"type": "json_schema", "name": "dead", "schema": DEAD_SCHEMA}}}
    with server.http() as http:
        lines = [line for line in http.post("/v1/responses", json=body).text.splitlines() if line.startswith("data: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    error = next(e for e in events if e["type"] == "error")
    failed = next(e for e in events if e["type"] == "response.failed")
    assert error["param"] == "text.format" and "schema in text.format allows no next token" in error["message"]
    assert "response_format" not in error["message"] and failed["response"]["error"]["code"] == "invalid_prompt"
