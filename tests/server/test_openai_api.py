"""The OpenAI-compatible API driven by the official `openai` client: shapes, parity with the engine."""

from __future__ import annotations

import json

import openai
import pytest
from checkpoints import make_checkpoint
from server_harness import BACKEND, MODEL_NAME, start_server

from solo.engine.engine import Engine
from solo.engine.sampling import SamplingParams

MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fibonacci(n):"}]


@pytest.fixture(scope="module")
def engine(tiny_model) -> Engine:
    return Engine.load(tiny_model, dtype="float32", backend=BACKEND)


def test_chat_greedy_matches_engine(server, engine):
    expected = engine.complete(MESSAGES, SamplingParams(max_tokens=24, temperature=0.0))
    reply = server.client().chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=24,
                                                    temperature=0)
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == MODEL_NAME
    assert len(reply.choices) == 1
    choice = reply.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_chat_stream_matches_non_stream(server, engine):
    expected = engine.complete(MESSAGES, SamplingParams(max_tokens=20, temperature=0.0))
    stream = server.client().chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    content_chunks = [c for c in chunks if c.choices]
    assert all(c.choices[0].finish_reason is None for c in content_chunks[:-1])
    assert content_chunks[-1].choices[0].finish_reason == expected.finish_reason
    assert "".join(c.choices[0].delta.content or "" for c in content_chunks) == expected.text
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == len(expected.token_ids)
    assert all(c.usage is None for c in chunks[:-1])


def test_seeded_sampling_matches_engine_and_n_uses_seed_plus_i(server, engine):
    params = dict(max_tokens=16, temperature=0.9, top_p=0.95)
    reply = server.client().chat.completions.create(model=MODEL_NAME, messages=MESSAGES, n=3, seed=11, **params)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    for i, choice in enumerate(reply.choices):
        expected = engine.complete(MESSAGES, SamplingParams(seed=11 + i, **params))
        assert choice.message.content == expected.text
    assert reply.usage.prompt_tokens == len(engine.encode_prompt(MESSAGES))  # the prompt counts once


def test_completions_greedy_stop_and_stream(server, engine):
    prompt = "import os\nimport sys\n"
    expected = engine.complete(prompt, SamplingParams(max_tokens=30, temperature=0.0))
    client = server.client()
    reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=30, temperature=0)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=30, temperature=0, stream=True) if c.choices)
    assert streamed == expected.text
    # A stop string taken from the greedy text cuts it there, with finish_reason "stop".
    stop = expected.text.strip()[3:6] if len(expected.text.strip()) >= 6 else None
    if stop:
        stopped = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=30, temperature=0, stop=stop)
        assert stopped.choices[0].text == expected.text[: expected.text.index(stop)]
        assert stopped.choices[0].finish_reason == "stop"


def test_completions_default_max_tokens_is_16_and_token_prompts(server, engine):
    client = server.client()
    reply = client.completions.create(model=MODEL_NAME, prompt="hello", temperature=0, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 16 and reply.choices[0].finish_reason == "length"
    ids = engine.encode_prompt("hello")
    batch = client.completions.create(model=MODEL_NAME, prompt=[ids, ids], max_tokens=5, temperature=0, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert len({c.text for c in batch.choices}) == 1  # greedy: every choice of the same prompt agrees
    assert batch.usage.prompt_tokens == 2 * len(ids)


def test_chat_logprobs_shape(server, engine):
    expected = engine.complete(MESSAGES, SamplingParams(max_tokens=6, temperature=0.0, logprobs=3))
    reply = server.client().chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=6, temperature=0,
                                                    logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == len(expected.token_ids)
    for entry, info in zip(content, expected.logprobs, strict=True):
        assert entry.logprob == pytest.approx(info.logprob, abs=0)
        assert len(entry.top_logprobs) == 3
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token
    # Bytes rebuild the text exactly (one character may span several tokens).
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", errors="replace").endswith(
        reply.choices[0].message.content)


def test_completions_logprobs_shape_streamed(server):
    chunks = list(server.client().completions.create(model=MODEL_NAME, prompt="def f", max_tokens=5, temperature=0,
                                                     logprobs=2, stream=True))
    tokens, offsets = [], []
    for chunk in chunks:
        lp = chunk.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
        # The sampled token is always among them (up to logprobs + 1 entries, as OpenAI and vLLM return them).
        assert all(len(top) <= 3 and token in top for top, token in zip(lp.top_logprobs, lp.tokens, strict=True))
        tokens += lp.tokens
        offsets += lp.text_offset
    assert len(tokens) == 5
    assert offsets[0] == 0 and offsets == sorted(offsets)  # characters of the text (see the test below)


def test_completion_text_offsets_count_characters_of_the_text():
    # Byte-level BPE splits multi-byte characters over tokens: offsets index the returned text (a token that
    # ends inside a character adds nothing), whether the tokens come in one event or one per event.
    from solo.engine.request import TokenLogprob
    from solo.model.default_model import default_model_path
    from solo.server.logprobs import CompletionLogprobsBuilder, TokenPieces
    from solo.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(default_model_path())
    text = "héllo 日本🎉 ok"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text and len(ids) > len(text.split())
    infos = [TokenLogprob(i, -1.0) for i in ids]
    pieces = TokenPieces(tokenizer)
    whole = CompletionLogprobsBuilder(pieces).add(infos)
    builder = CompletionLogprobsBuilder(pieces)
    one_by_one = [builder.add([info]).text_offset[0] for info in infos]
    assert whole.text_offset == one_by_one
    for i, offset in enumerate(whole.text_offset):
        assert offset == len(b"".join(pieces.get(t)[1] for t in ids[:i]).decode("utf-8", errors="ignore"))
    assert whole.text_offset[-1] < len(text)
    assert whole.top_logprobs[0] == {whole.tokens[0]: -1.0}  # the sampled token, with no top ones asked
    # A special token the returned text leaves out (skip_special_tokens) adds nothing.
    special = next(iter(tokenizer.special_token_ids().values()))
    ids = tokenizer.encode("hi", add_special_tokens=False) + [special] + tokenizer.encode(" there",
                                                                                           add_special_tokens=False)
    offsets = CompletionLogprobsBuilder(pieces, skipped_ids=frozenset({special})).add(
        [TokenLogprob(i, -1.0) for i in ids]).text_offset
    assert offsets[ids.index(special) + 1] == offsets[ids.index(special)] == len("hi")


def test_models_tokenize_detokenize(server, engine):
    with server.http() as http:
        models = http.get("/v1/models").json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == [MODEL_NAME]
        assert models["data"][0]["object"] == "model"
        tokens = http.post("/tokenize", json={"prompt": "hello world"}).json()
        assert tokens["tokens"] == engine.tokenizer.encode("hello world")
        assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 256
        chat = http.post("/tokenize", json={"model": MODEL_NAME, "messages": MESSAGES}).json()
        assert chat["tokens"] == engine.encode_prompt(MESSAGES)
        text = http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()
        assert text["prompt"].endswith("hello world")
    assert server.client().models.list().data[0].id == MODEL_NAME


def test_models_retrieve(server):
    client = server.client()
    listed = client.models.list().data[0]
    card = client.models.retrieve(MODEL_NAME)
    assert (card.id, card.object, card.created, card.owned_by) == (MODEL_NAME, "model", listed.created, "solo")
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("org/other")  # sent percent-encoded; the route takes ids with slashes
    assert info.value.code == "model_not_found"
    with server.http() as http:
        error = http.get("/v1/models/gpt-4").json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "model", "model_not_found")
    assert "gpt-4" in error["message"]


def test_models_retrieve_needs_the_api_key_and_takes_hub_ids(tiny_model):
    running = start_server(tiny_model, max_batch=1, api_key="sesame", served_model_name="acme/tiny-chat")
    try:
        with pytest.raises(openai.AuthenticationError):
            running.client(api_key="wrong").models.retrieve("acme/tiny-chat")
        client = running.client(api_key="sesame")
        assert client.models.retrieve("acme/tiny-chat").id == "acme/tiny-chat"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("acme/other")
        with running.http(headers={"Authorization": "Bearer sesame"}) as http:
            assert 'solo_requests_total{route="/v1/models/{model}",status="200"}' in http.get("/metrics").text
    finally:
        running.stop()


def test_metrics_count_requests_and_tokens(server):
    server.client().chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=3, temperature=0)
    with server.http() as http:
        text = http.get("/metrics").text
    for name in ("solo_requests_total{", "solo_time_to_first_token_seconds_bucket", "solo_inter_token_latency_seconds",
                 "solo_e2e_request_latency_seconds", "solo_request_decode_tokens_per_second",
                 "solo_prompt_tokens_total", "solo_generation_tokens_total", "solo_queue_depth", "solo_active_slots"):
        assert name in text, name
    assert 'solo_requests_total{route="/v1/chat/completions",status="200"}' in text


def test_generation_config_supplies_defaults(tmp_path):
    # do_sample=false in generation_config.json: a request without temperature decodes greedily...
    folder = make_checkpoint(tmp_path / "gc", generation_config={"do_sample": False, "eos_token_id": 2})
    engine = Engine.load(folder, dtype="float32", backend=BACKEND)
    expected = engine.complete("def", SamplingParams(max_tokens=12, temperature=0.0))
    running = start_server(folder, max_batch=2)
    try:
        reply = running.client().completions.create(model=MODEL_NAME, prompt="def", max_tokens=12)
        assert reply.choices[0].text == expected.text
        # ... but top_p asked without a temperature samples (at 1): greedy decoding would ignore it
        sampled = engine.complete("def", SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=7))
        reply = running.client().completions.create(model=MODEL_NAME, prompt="def", max_tokens=12, top_p=0.9, seed=7)
        assert reply.choices[0].text == sampled.text
    finally:
        running.stop()


def test_openai_default_temperature_is_one(server, engine):
    # No temperature anywhere: OpenAI's default 1.0 applies (the Python API's default is greedy).
    reply = server.client().completions.create(model=MODEL_NAME, prompt="def", max_tokens=12, seed=5)
    assert reply.choices[0].text == engine.complete("def", SamplingParams(max_tokens=12, temperature=1.0, seed=5)).text


def test_raw_sse_framing(server):
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "stream": True}
    with server.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    first = json.loads(lines[0][6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["finish_reason"] is None


def test_continue_final_message_continues_the_last_message(server, engine):
    """vLLM's continue_final_message: the prompt ends right after the last message's content (no end of turn),
    and the reply is what the model writes next: the completions route's on the same ids."""
    import httpx

    prefill = [*MESSAGES, {"role": "assistant", "content": "    if n <"}]
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    ids = httpx.post(server.base_url.removesuffix("/v1") + "/tokenize",
                     json={"messages": prefill, **extra}).json()["tokens"]
    text = engine.tokenizer.decode(ids, skip_special_tokens=False)
    assert text.endswith("    if n <")
    reply = server.client().chat.completions.create(model=MODEL_NAME, messages=prefill, max_tokens=12,
                                                    temperature=0, extra_body=extra)
    expected = server.client().completions.create(model=MODEL_NAME, prompt=ids, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == expected.choices[0].text
    assert reply.usage.prompt_tokens == len(ids)
    with pytest.raises(openai.BadRequestError, match="add_generation_prompt") as info:
        server.client().chat.completions.create(model=MODEL_NAME, messages=prefill, max_tokens=2,
                                                extra_body={"continue_final_message": True})
    assert info.value.body["param"] == "add_generation_prompt"  # (the field to change; it named messages)
    # What the continued text cannot carry on with is refused: its tool calls, an output grammar (it would start
    # over inside the text), and chat fields on a plain prompt to /tokenize.
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for messages, extra_fields, words in (
            ([*MESSAGES, {"role": "assistant", "content": "x", "tool_calls": [call]}], {}, "tool_calls"),
            (prefill, {"response_format": {"type": "json_object"}}, "response_format")):
        with pytest.raises(openai.BadRequestError, match=words):
            server.client().chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=2,
                                                    extra_body={**extra, **extra_fields})
    with pytest.raises(openai.BadRequestError, match="never reads"):  # (it would change nothing: refused)
        server.client().chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2,
                                                extra_body={"chat_template_kwargs": {"bogus": False}})
    # Thinking off, asked of a model that does not think (clients send it to every model): as asked already.
    for extra_fields in ({"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}):
        assert server.client().chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2,
                                                       extra_body=extra_fields).usage.completion_tokens == 2
    refused = httpx.post(server.base_url.removesuffix("/v1") + "/tokenize",
                         json={"prompt": "abc", "continue_final_message": True})
    assert refused.status_code == 400 and "continue_final_message goes with messages" in refused.text
