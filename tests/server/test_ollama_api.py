"""Ollama's API through Ollama's own Python client: chat and generate give what the chat and completions routes
give for the same request (whole and streamed as JSON lines), options map to sampling fields or are refused by
name, tool calls and their results convert both ways, a thinking model's block comes back as `thinking`, the
model listing routes describe the served model, and errors come in Ollama's shape."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import ollama
import openai
import pytest
from checkpoints import make_checkpoint
from server_harness import DEAD_SCHEMA, MODEL_NAME, start_server

from solo.errors import InvalidRequestError
from solo.server.ollama import NDJSON, _lines, _Reply, chat_messages, sampling_fields

ASK = [{"role": "user", "content": "def fibonacci(n):"}]
# (Its keys in the order Ollama's client writes them, so the rendered prompts can be compared.)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "required": ["city"], "properties": {"city": {"enum": ["Paris", "Tokyo"]}}}}}


@pytest.fixture(scope="module")
def server():
    running = start_server(None, max_batch=2, api_key="sesame")  # the bundled model: Hermes tool calls
    assert running.state.status == "ok", running.state.error
    yield running
    running.stop()


def _client(server, key="sesame"):
    return ollama.Client(host=server.base_url.removesuffix("/v1"), headers={"Authorization": f"Bearer {key}"})


@pytest.mark.slow
def test_chat_and_generate_equal_the_openai_routes(server):
    client, openai = _client(server), server.client(api_key="sesame")
    options = {"temperature": 0, "num_predict": 12}
    reply = client.chat(model=MODEL_NAME, messages=ASK, options=options, logprobs=True, top_logprobs=2)
    expected = openai.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=12, temperature=0,
                                              logprobs=True, top_logprobs=2)
    assert reply.message.content == expected.choices[0].message.content and reply.done_reason == "length"
    assert (reply.prompt_eval_count, reply.eval_count) == (expected.usage.prompt_tokens, 12)
    assert reply.total_duration >= reply.prompt_eval_duration + reply.eval_duration > 0
    assert [(p.token, round(p.logprob, 4), len(p.top_logprobs)) for p in reply.logprobs] == [
        (p.token, round(p.logprob, 4), 2) for p in expected.choices[0].logprobs.content]
    # Streamed by default: the pieces add up to the whole reply, the last object holds the statistics.
    parts = list(client.chat(model=f"{MODEL_NAME}:latest", messages=ASK, options=options, stream=True))
    assert {p.model for p in parts} == {f"{MODEL_NAME}:latest"}  # the name as the request gave it
    assert "".join(p.message.content for p in parts) == reply.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].eval_count == 12
    # Generate through the template is the chat with one user message (and the system one).
    generated = client.generate(model=MODEL_NAME, prompt=ASK[0]["content"], system="Be brief.", options=options)
    expected = openai.chat.completions.create(model=MODEL_NAME, max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, *ASK])
    assert generated.response == expected.choices[0].message.content
    # Raw: the prompt as it is (the completions route); without num_predict until EOS or the context's end.
    raw = client.generate(model=MODEL_NAME, prompt="def fibonacci(n):", raw=True, options=options, logprobs=True,
                          top_logprobs=2)
    assert [len(p.top_logprobs) for p in raw.logprobs] == [2] * 12  # (exactly the number asked, as Ollama)
    completion = openai.completions.create(model=MODEL_NAME, prompt="def fibonacci(n):", max_tokens=12, temperature=0)
    assert raw.response == completion.choices[0].text and raw.eval_count == 12
    unbounded = client.generate(model=MODEL_NAME, prompt="def fibonacci(n):", raw=True, options={"temperature": 0})
    assert unbounded.eval_count > 16 and unbounded.response.startswith(raw.response)
    streamed = list(client.generate(model=MODEL_NAME, prompt="def fibonacci(n):", raw=True, options=options,
                                    stream=True))
    assert "".join(p.response for p in streamed) == raw.response and streamed[-1].done_reason == "length"
    # num_predict is a cap: past the context, the reply runs to the context's end (as Ollama's).
    long = client.generate(model=MODEL_NAME, prompt="def fibonacci(n):", raw=True, options={
        "temperature": 0, "num_predict": 10**6})
    assert long.eval_count == unbounded.eval_count and long.response == unbounded.response
    # options.num_ctx smaller than the server's context bounds prompt + output.
    bounded = client.chat(model=MODEL_NAME, messages=ASK, options={"temperature": 0, "num_ctx": reply.prompt_eval_count
                                                                   + 3})
    assert bounded.eval_count == 3 and bounded.done_reason == "length"
    assert bounded.message.content == expected_prefix(openai, 3)
    # An assistant message last is continued (as Ollama does), as the chat route's continue_final_message.
    prefill = [*ASK, {"role": "assistant", "content": "    if n <"}]
    continued = client.chat(model=MODEL_NAME, messages=prefill, options=options)
    expected = openai.chat.completions.create(model=MODEL_NAME, messages=prefill, max_tokens=12, temperature=0,
                                              extra_body={"continue_final_message": True,
                                                          "add_generation_prompt": False})
    assert continued.message.content == expected.choices[0].message.content
    # format: a JSON schema holds the output.
    shaped = client.chat(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 40},
                         format={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    assert isinstance(json.loads(shaped.message.content)["a"], int)


def test_raw_logprobs_give_each_tokens_own_bytes_and_every_alternative(server):
    # From a break-test: raw generate read the completions shape, whose alternatives are keyed by text, so tokens
    # that are parts of one character (each shown as U+FFFD) came back with U+FFFD's bytes, and as one entry.
    from solo.server.logprobs import TokenPieces

    prompt, headers = 'x = "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9', {"Authorization": "Bearer sesame"}
    entries = httpx.post(f"{_host(server)}/api/generate", headers=headers, timeout=60, json={
        "model": MODEL_NAME, "prompt": prompt, "raw": True, "stream": False, "logprobs": True, "top_logprobs": 10,
        "options": {"temperature": 0, "num_predict": 6}}).json()["logprobs"]
    ids = httpx.post(f"{_host(server)}/completion", headers=headers, timeout=60, json={
        "prompt": prompt, "n_predict": 6, "temperature": 0, "return_tokens": True}).json()["tokens"]
    pieces = TokenPieces(server.state.engine.tokenizer)
    assert [(e["token"], e["bytes"]) for e in entries] == [(pieces.get(i)[0], list(pieces.get(i)[1])) for i in ids]
    alternatives = [a for e in entries for a in e["top_logprobs"]]
    assert [len(e["top_logprobs"]) for e in entries] == [10] * 6
    assert all(bytes(a["bytes"]).decode("utf-8", "replace") == a["token"] for a in alternatives)
    assert any(a["token"] == "\ufffd" and a["bytes"] != [239, 191, 189] for a in alternatives)  # (the case itself)


def expected_prefix(openai, tokens):
    return openai.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=tokens,
                                          temperature=0).choices[0].message.content


@pytest.mark.slow
def test_tool_history_reaches_the_template_as_the_chat_routes(server):
    client, openai = _client(server), server.client(api_key="sesame")
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    reply = client.chat(model=MODEL_NAME, messages=history, tools=[WEATHER], options={"temperature": 0,
                                                                                      "num_predict": 4})
    expected = openai.chat.completions.create(model=MODEL_NAME, max_tokens=4, temperature=0, tools=[WEATHER], messages=[
        history[0], {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call00100", "type": "function", "function": {"name": "get_weather",
                                                                "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call00100", "name": "get_weather", "content": "sunny"}])
    assert reply.prompt_eval_count == expected.usage.prompt_tokens
    assert reply.message.content == expected.choices[0].message.content


def test_tool_results_are_matched_to_their_calls_by_name():
    messages = chat_messages([
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": "", "thinking": "hmm", "tool_calls": [
            {"function": {"name": "a", "arguments": {"x": 1}}}, {"function": {"name": "b", "arguments": {}}}]},
        {"role": "tool", "content": "B", "tool_name": "b"}, {"role": "tool", "content": "A"}])
    assert messages[1]["reasoning_content"] == "hmm"
    assert [c["function"]["arguments"] for c in messages[1]["tool_calls"]] == ['{"x": 1}', "{}"]
    # (ids of 9 letters and digits, as Mistral's template requires, the same for the same history)
    assert [(m["tool_call_id"], m["name"]) for m in messages[2:]] == [("call00101", "b"), ("call00100", "a")]
    with pytest.raises(InvalidRequestError, match="images"):
        chat_messages([{"role": "user", "content": "?", "images": ["aGk="]}])
    with pytest.raises(InvalidRequestError, match="tool_calls"):
        chat_messages([{"role": "assistant", "content": "", "tool_calls": [{"name": "a"}]}])


def test_streamed_tool_calls_come_whole_with_arguments_as_objects():
    # The chat stream's chunks (role, text, a call's name then its arguments, the finish, usage) as Ollama's lines.
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"content": "Let me check."}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                                                                  "function": {"name": "get_weather",
                                                                               "arguments": ""}}]}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {
                  "arguments": '{"city": "Paris"}'}}]}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
              {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7}}]

    async def source():
        for chunk in chunks:
            yield chunk

    async def collect():
        from solo.server.ollama import _chat_object
        return [json.loads(line) async for line in _lines(source(), _Reply("m", 0), _chat_object)]

    lines = asyncio.run(collect())
    assert [line["message"]["content"] for line in lines] == ["Let me check.", ""]
    assert lines[-1]["message"]["tool_calls"] == [{"id": "call_x", "function": {
        "index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]
    assert (lines[-1]["done"], lines[-1]["done_reason"], lines[-1]["eval_count"]) == (True, "stop", 7)


def test_options_map_to_sampling_fields():
    assert sampling_fields({"temperature": 0.2, "repeat_penalty": 1.1, "num_predict": -1, "num_gpu": 99,
                            "num_thread": 4, "num_ctx": 4096, "mirostat": 0, "stop": ["\n"], "seed": 3}) == {
        "temperature": 0.2, "repetition_penalty": 1.1, "stop": ["\n"], "seed": 3}
    assert sampling_fields({"repeat_penalty": 1.3, "repeat_last_n": 0, "num_predict": 5}) == {
        "repetition_penalty": 1.3, "repeat_last_n": 0, "max_tokens": 5}  # (the window of 0 turns it off)
    assert sampling_fields({"repeat_last_n": 64}) == {"repeat_last_n": 64}
    for options, words in (({"mirostat": 2}, "mirostat"), ({"typical_p": 0.5}, "typical_p"),
                           ({"num_predict": 0}, "num_predict"),
                           ({"top_a": 1}, "not an option"), ([1], "must be an object")):
        with pytest.raises(InvalidRequestError, match=words):
            sampling_fields(options)


@pytest.mark.slow
def test_model_routes_describe_the_served_model(server):
    client = _client(server)
    (listed,) = client.list().models
    assert listed.model == f"{MODEL_NAME}:latest" and listed.details.family == "llama" and listed.size > 0
    # The listed name works on the OpenAI routes too (Ollama's own /v1 takes it), a wrong tag does not.
    openai_client = server.client(api_key="sesame")
    reply = openai_client.completions.create(model=listed.model, prompt="def", max_tokens=2, temperature=0)
    assert reply.choices[0].text is not None
    with pytest.raises(openai.NotFoundError):
        openai_client.completions.create(model=f"{MODEL_NAME}:7b", prompt="def", max_tokens=2)
    assert listed.details.quantization_level == "F32" and listed.details.parameter_size.endswith("M")
    shown = client.show(MODEL_NAME)
    assert shown.capabilities == ["completion", "tools"] and "<tool_call>" in shown.template
    assert shown.modelinfo["llama.context_length"] == server.state.max_model_len
    (loaded,) = client.ps().models
    assert loaded.context_length == server.state.max_model_len and loaded.size_vram == 0
    headers = {"Authorization": "Bearer sesame"}
    assert httpx.get(f"{_host(server)}/api/version", headers=headers).json()["version"]
    # No messages: Ollama's "load the model" call, answered at once.
    loaded = client.chat(model=MODEL_NAME, messages=[])
    assert (loaded.done, loaded.done_reason) == (True, "load")


def _host(server):
    return server.base_url.removesuffix("/v1")


@pytest.mark.slow
def test_errors_come_in_ollamas_shape(server):
    client = _client(server)
    ask = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]}
    for fields, status, words in (
            ({"model": "llama3.2"}, 404, "not found"),
            ({"options": {"mirostat": 2}}, 400, "mirostat"),
            ({"options": {"temperature": "hot"}}, 400, "options.temperature"),
            ({"think": "high"}, 400, "reasoning-effort"),
            ({"think": True}, 400, "does not support thinking"),
            ({"options": {"num_ctx": 3}}, 400, "num_ctx"),
            ({"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400, "text only"),
            ({"messages": [], "keep_alive": 0}, 400, "keeps its model loaded")):
        with pytest.raises(ollama.ResponseError) as info:
            client.chat(**{**ask, **fields})
        assert info.value.status_code == status and words in info.value.error, (fields, info.value.error)
    for fields, words in (({"suffix": "x"}, "fill-in-the-middle"), ({"context": [1, 2]}, "/api/chat"),
                          ({"template": "{{ .Prompt }}"}, "raw: true"), ({"raw": True, "system": "s"}, "raw")):
        with pytest.raises(ollama.ResponseError) as info:
            client.generate(model=MODEL_NAME, prompt="hi", **fields)
        assert info.value.status_code == 400 and words in info.value.error
    host, key = _host(server), {"Authorization": "Bearer sesame"}
    # Every field is checked (a "load" request with no messages too), and errors name Ollama's fields.
    for path, body, words in (
            ("chat", {**ask, "unknown_field": 1}, "unknown_field"),
            ("chat", {**ask, "format": "yaml"}, "format"),
            ("chat", {**ask, "messages": {}}, "messages must be a list"),
            ("chat", {**ask, "messages": [], "options": {"bogus": 1}}, "options.bogus"),
            ("chat", {**ask, "messages": [], "tools": "nope"}, "tools must be"),
            ("chat", {**ask, "messages": [], "options": {"num_ctx": "big"}}, "options.num_ctx"),
            ("chat", {**ask, "options": {"repeat_last_n": "lots"}}, "options.repeat_last_n"),
            ("chat", {**ask, "options": {"tmperature": None}}, "options.tmperature"),
            ("chat", {**ask, "logprobs": "yes"}, "logprobs must be true or false"),
            ("chat", {**ask, "logprobs": False, "top_logprobs": 2}, "top_logprobs needs logprobs"),
            ("chat", {**ask, "keep_alive": "forever"}, "keep_alive"),
            ("chat", {**ask, "options": {"stop": [""]}}, "options.stop"),
            ("chat", {**ask, "messages": [{"role": "user", "content": "hi", "tool_name": "f"}]}, "tool_name"),
            ("chat", {**ask, "messages": [{"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "f", "arguments": [1]}}]}, {"role": "user", "content": "?"}]}, "object"),
            ("chat", {**ask, "messages": [{"role": "user", "content": "hi"}] * 400, "options": {"num_predict": 5}},
             "options.num_predict 5"),
            ("generate", {"model": MODEL_NAME, "prompt": 0}, "prompt must be a string"),
            # (named as generate's fields, not as the chat messages they become)
            ("generate", {"model": MODEL_NAME, "prompt": "a\ud800"}, "prompt: Input should be valid Unicode"),
            ("generate", {"model": MODEL_NAME, "prompt": "a", "system": "\udfff"}, "system: Input should be valid"),
            ("generate", {"model": MODEL_NAME, "system": "s"}, "system without a prompt"),
            ("generate", {"model": MODEL_NAME, "prompt": "hi", "raw": True, "logprobs": True, "top_logprobs": 50},
             "top_logprobs"),
            ("show", {"model": 123}, "model must be a string"),
            ("show", {"model": MODEL_NAME, "verbose": True}, "verbose"),
            ("show", {"model": MODEL_NAME, "bogus": 1}, "bogus is not a field"),
            ("generate", {"model": MODEL_NAME, "prompt": "hi", "options": {"num_thread": "lots"}},
             "options.num_thread must be an integer"),
            ("chat", {**ask, "options": {"use_mmap": 1}}, "options.use_mmap must be true or false"),
            ("chat", {**ask, "options": {"num_thread": 4.5}}, "options.num_thread must be an integer"),
            ("show", {"model": MODEL_NAME, "system": "Be brief."}, "system: Solo shows the served model")):
        # (json.dumps escapes a lone surrogate, which httpx's json= cannot encode)
        refused = httpx.post(f"{host}/api/{path}", content=json.dumps(body), headers=key)
        assert refused.status_code == 400 and words in refused.json()["error"], (body, refused.json())
    # Ollama's own checks keep Ollama's names (its boolean logprobs is no top count); a raw prompt past the
    # context is the prompt's fault, not a num_predict the request never set (break-test finds).
    for path, body, starts, absent in (
            ("generate", {"model": MODEL_NAME, "prompt": "x", "logprobs": "yes"}, "logprobs must be", "top_logprobs"),
            ("chat", {**ask, "logprobs": "yes"}, "logprobs must be", "top_logprobs"),
            ("generate", {"model": MODEL_NAME, "prompt": "x " * 5000, "raw": True}, "the prompt is", "messages")):
        refused = httpx.post(f"{host}/api/{path}", json=body, headers=key)
        error = refused.json()["error"]
        assert refused.status_code == 400 and error.startswith(starts) and absent not in error, (body, error)
    # Ollama's own request shapes: a whole-number float for an integer option, show's empty fields.
    assert httpx.post(f"{host}/api/chat", headers=key, json={**ask, "stream": False, "options": {
        "num_thread": 4.0, "num_gpu": 1.0, "num_predict": 2}}).status_code == 200
    assert httpx.post(f"{host}/api/show", headers=key, json={"model": MODEL_NAME, "system": None, "template": "",
                                                             "options": {}}).status_code == 200
    # An empty system beside raw: true is none (front ends send it on every request).
    assert httpx.post(f"{host}/api/generate", headers=key, json={
        "model": MODEL_NAME, "prompt": "def", "raw": True, "system": "", "stream": False,
        "options": {"num_predict": 2}}).json()["done"]
    deep = httpx.post(f"{host}/api/chat", content=b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}", headers=key)
    assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]
    # Routes and methods Solo does not have, in Ollama's shape too; Ollama's CLI probes HEAD / and the version.
    assert httpx.get(f"{host}/api/chat", headers=key).json()["error"]
    assert httpx.post(f"{host}/api/blobs/sha256:00", headers=key).status_code == 404
    assert httpx.head(f"{host}/").status_code == 200 and httpx.get(f"{host}/api/version").status_code == 200
    for path in ("/api/version", "/api/tags", "/version", "/static/playground.js"):  # HEAD as GET: 405 before
        head = httpx.head(f"{host}{path}", headers=key)
        assert head.status_code == 200 and head.content == b"", path
    from solo import __version__  # vLLM's GET /version, open as Ollama's is

    assert httpx.get(f"{host}/version").json() == {"version": __version__}
    embeddings = httpx.post(f"{host}/v1/embeddings", json={"input": "x"}, headers=key)
    assert embeddings.status_code == 404 and "Solo serves no embeddings" in embeddings.json()["error"]["message"]
    pull = httpx.post(f"{host}/api/pull", json={"model": "x"}, headers={"Authorization": "Bearer sesame"})
    assert pull.status_code == 501 and "solo pull" in pull.json()["error"]
    # Scripts pull a model before using it: the served one is there (a trial found a 501 for it).
    assert client.pull(MODEL_NAME).status == "success"
    assert [p.status for p in client.pull(f"{MODEL_NAME}:latest", stream=True)] == ["success"]
    bad_stream = httpx.post(f"{host}/api/pull", json={"model": MODEL_NAME, "stream": "x"}, headers=key)
    assert bad_stream.status_code == 400 and "stream must be true or false" in bad_stream.json()["error"]
    # think false, which front ends send on every request, is taken beside raw: true (nothing to turn off).
    assert client.generate(model=MODEL_NAME, prompt="def", raw=True, think=False, options={"num_predict": 2}).done
    denied = httpx.post(f"{host}/api/chat", json=ask, headers={"Authorization": "Bearer wrong"})
    assert denied.status_code == 401 and "API key" in denied.json()["error"]
    # A stream's media type is Ollama's.
    with httpx.stream("POST", f"{host}/api/chat", json={**ask, "options": {"num_predict": 2}},
                      headers={"Authorization": "Bearer sesame"}) as streamed:
        assert streamed.headers["content-type"] == NDJSON
        assert json.loads(list(streamed.iter_lines())[-1])["done"] is True


THINKING_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<|Assistant|>"
                     "{{ m['content'].split('</think>')[-1] }}<|end|>{% else %}<|User|>{{ m['content'] }}{% endif %}"
                     "{% endfor %}{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}")


@pytest.mark.slow
def test_a_thinking_models_block_comes_back_as_thinking(tmp_path):
    folder = make_checkpoint(tmp_path / "model", max_position_embeddings=512)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": THINKING_TEMPLATE}))
    running = start_server(folder, max_batch=2)
    try:
        client = ollama.Client(host=_host(running))
        expected = running.client().chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=8,
                                                            temperature=0).choices[0].message
        reply = client.chat(model=MODEL_NAME, messages=ASK, think=True, options={"temperature": 0, "num_predict": 8})
        assert reply.message.thinking == expected.model_extra["reasoning_content"] and reply.message.content == ""
        parts = list(client.chat(model=MODEL_NAME, messages=ASK, options={"temperature": 0, "num_predict": 8},
                                 stream=True))
        assert "".join(p.message.thinking or "" for p in parts) == reply.message.thinking
        generated = client.generate(model=MODEL_NAME, prompt=ASK[0]["content"], options={"temperature": 0,
                                                                                       "num_predict": 8})
        assert generated.thinking == reply.message.thinking and generated.response == ""
        assert client.show(MODEL_NAME).capabilities == ["completion", "thinking"]
        with pytest.raises(ollama.ResponseError, match="no enable_thinking switch"):  # it cannot be turned off
            client.chat(model=MODEL_NAME, messages=ASK, think=False)
        # (Anthropic's thinking "disabled" the same way)
        refused = httpx.post(f"{_host(running)}/v1/messages", json={
            "model": MODEL_NAME, "max_tokens": 2, "messages": ASK, "thinking": {"type": "disabled"}})
        assert refused.status_code == 400 and "no enable_thinking switch" in refused.text
        refused = httpx.post(f"{_host(running)}/v1/responses", json={
            "model": MODEL_NAME, "max_output_tokens": 2, "input": "hi", "reasoning": {"effort": "none"}})
        assert refused.status_code == 400 and "no enable_thinking switch" in refused.text
    finally:
        running.stop()


def test_a_full_queue_is_answered_without_a_logged_traceback(caplog):
    # Every 503 queue_full on /api/* was logged as "request failed" with its traceback (71 in one burst); only
    # a bug (a 500 internal error) is.
    import asyncio

    from solo.server.ollama import _answer
    from solo.server.scheduler import QueueFullError

    class Body:
        async def json(self) -> dict:
            return {"model": "m"}

    async def answer(exc: Exception):
        async def handle(data: dict):
            raise exc
        return await _answer(Body(), handle)

    full = asyncio.run(answer(QueueFullError("every slot is busy", 2)))
    assert full.status_code == 503 and json.loads(full.body)["error"] == "every slot is busy"
    assert full.headers["retry-after"] == "2" and "request failed" not in caplog.text
    bug = asyncio.run(answer(KeyError("x")))
    assert bug.status_code == 500 and "request failed" in caplog.text


def test_durations_split_at_the_first_token_the_engine_generated():
    # A reply held back until its end (a stop string that might still match, a tool call until it closes) reached the
    # stream at once at the end: its generation time was reported as prompt evaluation (eval rate 330,000 tok/s).
    from types import SimpleNamespace

    from solo.server.ollama import _Reply

    start_ns = time.perf_counter_ns() - 50_000_000  # (the request came 50 ms ago)
    request = SimpleNamespace(start_time=start_ns / 1e9 + 0.001, stats=SimpleNamespace(ttft_s=0.004))
    reply = _Reply("m", start_ns, [request])
    reply.feed({"choices": [{"delta": {"content": "held back"}, "finish_reason": "stop"}]})  # (all at the end)
    final = reply.final()
    assert abs(final["prompt_eval_duration"] - 5_000_000) < 10_000  # 1 ms to the request, 4 ms to its first token
    assert final["prompt_eval_duration"] + final["eval_duration"] == final["total_duration"]
    unstarted = _Reply("m", start_ns, [SimpleNamespace(start_time=0.0, stats=SimpleNamespace(ttft_s=None))])
    assert unstarted.final()["eval_duration"] == 0  # (no token: nothing to split)


def test_generate_on_a_model_without_a_chat_template_sends_the_prompt_as_it_is(no_template_model):
    # From a user trial: /api/generate on a base model was refused ("this model has no chat template, so it
    # cannot take messages") though the user sent a prompt. Ollama's template for such a model is {{ .Prompt }}.
    running = start_server(no_template_model, max_batch=2)
    try:
        assert running.state.status == "ok", running.state.error
        options = {"temperature": 0, "num_predict": 6}
        with running.http() as http:
            body = {"model": MODEL_NAME, "prompt": "def fibonacci(n):", "stream": False, "options": options}
            generated = http.post("/api/generate", json=body)
            assert generated.status_code == 200, generated.text
            as_raw = http.post("/api/generate", json={**body, "raw": True}).json()
            assert generated.json()["response"] == as_raw["response"] and as_raw["eval_count"] == 6
            refused = http.post("/api/generate", json={**body, "system": "be brief"})
            assert refused.status_code == 400 and "has none" in refused.json()["error"]
    finally:
        running.stop()


def test_generate_on_a_model_whose_chat_template_does_not_compile_says_so(no_template_model, tmp_path):
    # A break test: a template that does not compile is no absent one; generate ran the prompt raw, silently.
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(no_template_model, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor {{ oops"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    running = start_server(folder, max_batch=2)
    try:
        with running.http() as http:
            answer = http.post("/api/generate", json={"model": MODEL_NAME, "prompt": "def", "stream": False})
            assert answer.status_code == 400 and "does not compile" in answer.json()["error"], answer.text
    finally:
        running.stop()


@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_a_grammar_that_runs_dead_is_named_as_this_api_names_it(server, route):
    # As the Messages API's test: the error named the chat route's response_format instead of format.
    body = {"model": MODEL_NAME, "format": DEAD_SCHEMA, "options": {"num_predict": 16},
            **({"messages": [{"role": "user", "content": "x"}]} if route == "/api/chat" else {"prompt": "x"})}
    headers = {"Authorization": "Bearer sesame"}
    with httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=60) as http:
        whole = http.post(route, json={**body, "stream": False}, headers=headers)
        streamed = http.post(route, json=body, headers=headers)
    assert whole.status_code == 400
    last = json.loads(streamed.text.splitlines()[-1])
    for message in (whole.json()["error"], last["error"]):
        assert "schema in format allows no next token" in message and "response_format" not in message
