"""llama-server's own API on `solo serve`: /infill (llama.vim's and llama.vscode's requests) gives the middle the
same layout gives on /v1/completions, with other files, fitting, n_indent, t_max_predict_ms and response_fields;
/completion in llama-server's shape, streamed and not; fields Solo cannot honour are refused by name."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from checkpoints import make_checkpoint
from server_harness import DEAD_SCHEMA, MODEL_NAME, serving

from solo.engine.request import GenerationEvent
from solo.server.llama_server import _Ask, _Reply, indent_cut

FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|endoftext|>",
              "<|repo_name|>", "<|file_sep|>")
PREFIX, SUFFIX = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
GREEDY = {"temperature": 0, "n_predict": 8}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("llama-server") / "model", extra_tokens=FIM_TOKENS)
    with serving(folder, max_batch=2) as running:
        yield running


def _openai_text(server, prompt, max_tokens: int = 8) -> dict:
    reply = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                              "temperature": 0})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_infill_gives_the_middle_of_the_fim_layout(server):
    want = _openai_text(server, f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>")
    reply = httpx.post(f"{server.base_url}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, **GREEDY})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["content"] == want["choices"][0]["text"] and body["stop"] is True
    assert body["tokens_evaluated"] == want["usage"]["prompt_tokens"]
    assert body["tokens_predicted"] == want["usage"]["completion_tokens"]
    assert body["stop_type"] == ("limit" if want["choices"][0]["finish_reason"] == "length" else "eos")
    assert body["truncated"] is False and body["model"] == MODEL_NAME
    assert body["generation_settings"]["n_ctx"] == server.state.max_model_len
    assert {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
            "predicted_per_second"} <= set(body["timings"])


def test_llama_vim_request_with_other_files_and_response_fields(server):
    # llama.vim's FIM request, field for field (its defaults), with two chunks of other files.
    # (llama.vim's chunks carry the time it saw them: the editor's bookkeeping)
    extra = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n", "time": [1738000000, 5]},
             {"filename": "main.py", "text": "import util\n", "time": [1738000001, 7]}]
    request = {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": extra,
               "prompt": "return", "n_predict": 6, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90,
               "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
               "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "model": "",  # (llama.vim before 2026-04)
               "response_fields": ["content", "timings/prompt_n", "timings/predicted_per_second", "truncated",
                                   "tokens_cached", "generation_settings/temperature"]}
    reply = httpx.post(f"{server.base_url}/infill", json=request)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert set(body) == {"content", "timings/prompt_n", "timings/predicted_per_second", "truncated", "tokens_cached",
                         "generation_settings/temperature"}
    assert body["truncated"] is False
    assert body["generation_settings/temperature"] == 1.0  # (no "temperature" among the samplers: plain sampling)
    # llama.vscode's: n_cmpl completions (3 by default) as a list, each with its index.
    several = httpx.post(f"{server.base_url}/infill", json={**request, "n_cmpl": 3, "response_fields": None})
    assert several.status_code == 200, several.text
    assert [c["index"] for c in several.json()] == [0, 1, 2]
    assert all(c["generation_settings"]["top_k"] == 40 and c["generation_settings"]["n_cmpl"] == 3
               for c in several.json())
    # The layout: the repository form (Qwen2.5-Coder's); prompt (the cursor's line so far) after the prefix, as
    # llama-server lays it out.
    laid_out = ("<|repo_name|>myproject\n<|file_sep|>util.py\ndef sub(a, b):\n    return a - b\n"
                "<|file_sep|>main.py\nimport util\n<|file_sep|>filename\n"
                f"<|fim_prefix|>{PREFIX}return<|fim_suffix|>{SUFFIX}<|fim_middle|>")
    tokenizer = server.state.engine.tokenizer
    full = httpx.post(f"{server.base_url}/infill", json={**request, "response_fields": None, **GREEDY}).json()
    assert full["prompt"] == tokenizer.decode(tokenizer.encode(laid_out), skip_special_tokens=False)
    assert full["tokens_evaluated"] == len(tokenizer.encode(laid_out))
    # llama.vim's warm-up: n_predict 0 evaluates the prompt and writes nothing; [""] names no field.
    warm = httpx.post(f"{server.base_url}/infill", json={**request, "n_predict": 0, "response_fields": [""]})
    assert warm.status_code == 200 and warm.json() == {}
    # An empty list is no projection (llama-server's), not an empty reply.
    every = httpx.post(f"{server.base_url}/infill", json={**request, "n_predict": 0, "response_fields": []}).json()
    assert {"content", "tokens_predicted", "stop_type", "generation_settings"} <= set(every)
    nothing = httpx.post(f"{server.base_url}/infill", json={**request, "n_predict": 0, "response_fields": None}).json()
    assert nothing["content"] == "" and nothing["tokens_predicted"] == 0 and nothing["stop_type"] == "limit"


def test_infill_fits_the_context_oldest_files_first(server):
    context = server.state.max_model_len
    files = [{"filename": f"f{i}.py", "text": "x = 1\n" * 8} for i in range(9)]
    body = httpx.post(f"{server.base_url}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                                       "input_extra": files, **GREEDY}).json()
    assert body["truncated"] is True and body["tokens_evaluated"] + 8 <= context
    assert "f8.py" in body["prompt"] and "f0.py" not in body["prompt"]  # (the newest kept)
    # A prefix longer than the context loses its start; the cursor's side is kept.
    long_prefix = "y = 2\n" * 200 + PREFIX
    body = httpx.post(f"{server.base_url}/infill", json={"input_prefix": long_prefix, "input_suffix": SUFFIX,
                                                       **GREEDY}).json()
    assert body["truncated"] is True and body["prompt"].endswith(f"{SUFFIX}<|fim_middle|>")
    assert PREFIX in body["prompt"] and body["tokens_evaluated"] <= context


def test_completion_in_llama_servers_shape(server):
    want = _openai_text(server, "def add(a, b):")
    body = httpx.post(f"{server.base_url}/completion", json={"prompt": "def add(a, b):", **GREEDY}).json()
    assert body["content"] == want["choices"][0]["text"]
    assert body["tokens_evaluated"] == want["usage"]["prompt_tokens"] and body["stop"] is True
    # Streamed: the pieces, then a last event with stop true and the statistics.
    with httpx.stream("POST", f"{server.base_url}/completion",
                      json={"prompt": "def add(a, b):", "stream": True, **GREEDY}) as stream:
        events = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: ")]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == want["choices"][0]["text"]
    assert events[-1]["tokens_predicted"] == want["usage"]["completion_tokens"]
    # Token ids, or ids and text mixed (BOS only before a leading text).
    ids = server.state.engine.tokenizer.encode("def add(a, b):")
    mixed = httpx.post(f"{server.base_url}/completion", json={"prompt": [*ids[:3], "(a, b):"], **GREEDY}).json()
    assert mixed["tokens_evaluated"] == len(ids[:3]) + len(server.state.engine.tokenizer.encode(
        "(a, b):", add_special_tokens=False))


def test_stop_words_and_bans(server):
    text = _openai_text(server, "def add(a, b):")["choices"][0]["text"]
    word = text[2:4]
    body = httpx.post(f"{server.base_url}/completion",
                      json={"prompt": "def add(a, b):", "stop": [word], **GREEDY}).json()
    assert body["stop_type"] == "word" and body["stopping_word"] == word and word not in body["content"]
    engine = server.state.engine
    first = engine.complete("def add(a, b):", {"max_tokens": 1, "temperature": 0}).token_ids[0]
    banned = httpx.post(f"{server.base_url}/completion", json={"prompt": "def add(a, b):",
                                                             "logit_bias": [[first, False]], **GREEDY}).json()
    assert banned["content"] != text


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"mirostat": 2}, "mirostat", "no mirostat sampling"),
    ({"n_probs": 3}, "n_probs", "logprobs"),
    ({"samplers": ["top_k", "magic"]}, "samplers", "not a sampler"),
    ({"frobnicate": 1}, "frobnicate", "not a field"),
    ({"repeat_penalty": 1.1, "repeat_last_n": -2}, "repeat_last_n", "greater than or equal to -1"),
    ({"n_predict": -2}, "n_predict", "n_predict must be"),
    ({"logit_bias": [["hello", 1.0]]}, "logit_bias", "token ids"),
    ({"logit_bias": [[1.5, 1.0]]}, "logit_bias", "a token id is an integer, got 1.5"),
    ({"logit_bias": [[5, 1.0], ["5", -1.0]]}, "logit_bias", "names token 5 twice"),
    ({"grammar": ""}, "grammar", "grammar must be a non-empty grammar string"),
    ({"prompt": ["one", "two"]}, "prompt", "one prompt per request"),
    ({"temperature": 3}, "temperature", "temperature"),
    ({"n_cmpl": 0}, "n_cmpl", "at least 1"),
    ({"n_cmpl": 1000}, "n_cmpl", "n_cmpl"),
    ({"grammar": "root ::= ("}, "grammar", "grammar"),
])
def test_what_solo_cannot_honour_is_refused_by_name(server, fields, param, words):
    reply = httpx.post(f"{server.base_url}/completion", json={"prompt": "x = 1", **GREEDY, **fields})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_turning_penalties_off_turns_off_the_models_default_too(server, monkeypatch):
    # From a break test: repeat_last_n 0, or samplers without "penalties", dropped the request's penalty fields, so
    # the model's default repetition penalty (the bundled model's is 1.3) still applied; a window other than -1 / 0
    # was ignored beside a default penalty.
    import dataclasses

    engine = server.state.engine
    monkeypatch.setattr(engine, "defaults", dataclasses.replace(engine.defaults, repetition_penalty=1.8))
    prompt = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n"

    def completion(route: str = "/completion", **fields) -> dict:
        body = ({"prompt": prompt, "temperature": 0, "n_predict": 24, **fields} if route == "/completion" else
                {"model": MODEL_NAME, "prompt": prompt, "raw": True, "stream": False,
                 "options": {"temperature": 0, "num_predict": 24, **fields}})
        reply = httpx.post(f"{server.base_url}{route}", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()

    plain = completion(repeat_penalty=1.0)["content"]
    assert completion()["content"] != plain  # (the default penalty changes this output)
    for fields in ({"repeat_last_n": 0}, {"samplers": ["top_k", "temperature"]}, {"samplers": "t"}):
        reply = completion(**fields)
        assert reply["content"] == plain, fields
    assert completion(samplers="kt")["generation_settings"]["repeat_penalty"] == 1.0
    assert completion(repeat_last_n=0)["generation_settings"]["repeat_last_n"] == 0
    assert completion("/api/generate", repeat_last_n=0)["response"] == completion("/api/generate",
                                                                                 repeat_penalty=1.0)["response"]
    # A window: as the engine runs it, on every route.
    windowed = engine.complete(prompt, {"temperature": 0, "max_tokens": 24, "repeat_last_n": 4}).text
    assert completion(repeat_last_n=4)["content"] == windowed
    assert completion("/api/generate", repeat_last_n=4)["response"] == windowed
    chat_route = httpx.post(f"{server.base_url}/v1/completions", json={
        "prompt": prompt, "temperature": 0, "max_tokens": 24, "repeat_last_n": 4}).json()
    assert chat_route["choices"][0]["text"] == windowed


def test_infill_on_a_model_without_fim_tokens_is_refused(server, monkeypatch):
    monkeypatch.setattr(server.state.engine, "fim", None)
    reply = httpx.post(f"{server.base_url}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "input_suffix"
    assert "needs a model with fill-in-the-middle tokens" in reply.json()["error"]["message"]


def test_props_and_apply_template(server):
    props = httpx.get(f"{server.base_url}/props").json()
    assert props["default_generation_settings"]["n_ctx"] == server.state.max_model_len
    assert props["total_slots"] == 2 and props["chat_template"]  # (max_batch: the server's slots)
    assert props["default_generation_settings"]["params"]["temperature"] == 1.0  # (no generation config: OpenAI's)
    messages = [{"role": "user", "content": "Hi"}]
    reply = httpx.post(f"{server.base_url}/apply-template", json={"messages": messages, "tool_choice": "auto",
                                                                "temperature": 0.8})
    assert reply.status_code == 200, reply.text
    assert reply.json()["prompt"] == server.state.engine.tokenizer.render_chat(messages, True)


def test_n_indent_ends_the_middle_at_a_shallower_line():
    # llama-server's rule: the first line is the cursor's; each later one needs n_indent blanks.
    assert indent_cut("a + b\n    return x\n", 4) is None
    assert indent_cut("a + b\n    return x\nprint(1)", 4) == len("a + b\n    return x\n")
    assert indent_cut("a + b\n  ", 4) is None  # (still being written)
    assert indent_cut("a + b\n\n", 4) == len("a + b\n")  # (a blank line ends a block too)
    assert indent_cut("x\ny", 0) is None


def test_t_max_predict_ms_ends_after_a_complete_line():
    reply = _Reply(_Ask({"t_max_predict_ms": 1}, infill=True), 0, time.perf_counter())
    assert reply.feed(GenerationEvent("a = 1", [7])) == ("a = 1", [7]) and not reply.done  # (no newline yet)
    time.sleep(0.01)
    assert reply.feed(GenerationEvent("\nb", [8, 9])) == ("\nb", [8, 9]) and reply.done and reply.cut
    assert reply.feed(GenerationEvent("more", [10])) == ("", []) and reply.predicted == 3


def test_counts_and_tokens_of_a_reply_ended_early(server):
    # n_indent ends a reply inside the route: its tokens still count (llama.vim shows them).
    tokenizer = server.state.engine.tokenizer
    body = httpx.post(f"{server.base_url}/completion", json={
        "prompt": "def f(x):\n", "n_predict": 40, "temperature": 0, "n_indent": 40, "return_tokens": True}).json()
    assert body["tokens_predicted"] == len(body["tokens"]) == body["timings"]["predicted_n"]
    if body["stop_type"] == "limit" and "\n" in body["content"]:
        assert body["tokens_predicted"] > 0
    assert body["content"] == tokenizer.decode(body["tokens"])[:len(body["content"])]
    # Streamed: each event's tokens, and the running count.
    with httpx.stream("POST", f"{server.base_url}/completion",
                      json={"prompt": "def f(x):\n", "stream": True, **GREEDY}) as stream:
        events = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: ")]
    tokens = [t for e in events[:-1] for t in e["tokens"]]
    assert events[-2]["tokens_predicted"] == len(tokens) == events[-1]["tokens_predicted"]


def test_tokenize_and_detokenize_in_llama_servers_form(server):
    tokenizer = server.state.engine.tokenizer
    reply = httpx.post(f"{server.base_url}/tokenize", json={"content": "def f(x):"}).json()
    assert reply["tokens"] == tokenizer.encode("def f(x):", add_special_tokens=False)  # (add_special: false)
    with_bos = httpx.post(f"{server.base_url}/tokenize", json={"content": "def f(x):", "add_special": True}).json()
    assert with_bos["tokens"] == tokenizer.encode("def f(x):")
    pieces = httpx.post(f"{server.base_url}/tokenize", json={"content": "é<|fim_prefix|>", "with_pieces": True}).json()
    assert [p["id"] for p in pieces["tokens"]] == tokenizer.encode("é<|fim_prefix|>", add_special_tokens=False)
    assert pieces["tokens"][-1]["piece"] == "<|fim_prefix|>"
    joined = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode()
                      for p in pieces["tokens"])
    assert joined == "é<|fim_prefix|>".encode()
    plain = httpx.post(f"{server.base_url}/tokenize", json={"content": "<|fim_prefix|>", "parse_special": False}).json()
    assert len(plain["tokens"]) > 1  # (the marker's text read as text)
    text = httpx.post(f"{server.base_url}/detokenize", json={"tokens": reply["tokens"]}).json()
    assert text["content"] == text["prompt"] == "def f(x):"
    refused = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "x", "with_pieces": True})
    assert refused.status_code == 400 and "goes with content" in refused.text


def test_infill_extra_chunks_need_text_and_the_context_end_is_truncation(server):
    reply = httpx.post(f"{server.base_url}/infill", json={"input_prefix": PREFIX, "input_extra": [{"filename": "a"}]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "input_extra"
    # n_predict -1 runs to the context's end: truncated, as llama-server says it.
    body = httpx.post(f"{server.base_url}/completion", json={"prompt": "x = 1", "n_predict": -1, "ignore_eos": True,
                                                           "temperature": 0}).json()
    assert body["truncated"] is True and body["tokens_evaluated"] + body["tokens_predicted"] == \
        server.state.max_model_len
    # A reply n_indent ends still says what the prefix cache gave.
    ask = {"input_prefix": PREFIX * 4, "input_suffix": SUFFIX, "n_predict": 30, "temperature": 0, "n_indent": 50,
           "ignore_eos": True}
    httpx.post(f"{server.base_url}/infill", json=ask)
    again = httpx.post(f"{server.base_url}/infill", json=ask).json()
    assert again["tokens_cached"] > 0 and again["timings"]["cache_n"] == again["tokens_cached"]


def test_llama_vims_instruction_request_on_the_chat_route(server):
    # llama.vim's instructions go to /v1/chat/completions with llama-server's own fields.
    request = {"id_slot": 3, "messages": [{"role": "user", "content": "rename x to y"}], "min_p": 0.1,
               "temperature": 0.1, "samplers": ["min_p", "temperature"], "stream": True, "cache_prompt": True,
               "n_predict": 4, "repeat_penalty": 1.0}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=request) as stream:
        assert stream.status_code == 200
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("length", "stop")
    # The samplers left out are off: the request's values as llama-server means them.
    from solo.server.protocol import ChatCompletionRequest

    body = ChatCompletionRequest(**{k: v for k, v in request.items() if k != "stream"})
    assert (body.top_k, body.top_p, body.min_p, body.temperature, body.max_tokens) == (-1, 1.0, 0.1, 0.1, 4)
    letters = ChatCompletionRequest(messages=request["messages"], samplers="kt", top_p=0.5)  # (llama.cpp's letters)
    assert (letters.top_p, letters.min_p) == (1.0, 0.0)
    assert ChatCompletionRequest(messages=request["messages"], n_predict=None, max_tokens=3).max_tokens == 3
    for fields, param in (({"n_predict": 0}, "n_predict"), ({"n_predict": 3, "max_tokens": 3}, "n_predict"),
                          ({"repeat_last_n": 0, "repeat_penalty": "abc"}, "repetition_penalty"),
                          ({"samplers": ["temperature"], "top_k": "x"}, "top_k"), ({"samplers": "kz"}, "samplers"),
                          ({"samplers": ["mirostat"]}, "samplers"),
                          ({"repeat_penalty": 1.2, "repeat_last_n": -3}, "repeat_last_n")):
        reply = httpx.post(f"{server.base_url}/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": "hi"}], **fields})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, (fields, reply.text)


def test_a_grammar_that_runs_dead_is_named_as_this_api_names_it(server):
    # As the Messages API's test: the error named vLLM's guided_json instead of json_schema.
    body = {"prompt": "x", "n_predict": 16, "json_schema": DEAD_SCHEMA}
    with server.http() as http:
        whole = http.post("/completion", json=body)
        streamed = http.post("/completion", json={**body, "stream": True})
    assert whole.status_code == 400 and whole.json()["error"]["param"] == "json_schema"
    last = json.loads(streamed.text.strip().splitlines()[-1].removeprefix("data: "))
    for message in (whole.json()["error"]["message"], last["error"]["message"]):
        assert "schema in json_schema allows no next token" in message and "guided_json" not in message
