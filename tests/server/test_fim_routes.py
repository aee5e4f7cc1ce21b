"""Fill-in-the-middle through the server: OpenAI's completions `suffix` and Ollama's generate `suffix` give the
middle the FIM prompt gives as a raw prompt; /api/show lists "insert"; a suffix beside token ids is refused."""

from __future__ import annotations

import httpx
import ollama
import pytest
from checkpoints import make_checkpoint
from server_harness import MODEL_NAME, serving

QWEN_FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|endoftext|>")
PREFIX, SUFFIX = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("fim") / "model", extra_tokens=QWEN_FIM)
    with serving(folder, max_batch=2) as running:
        yield running


def test_suffix_fills_in_the_middle(server):
    client = server.client()
    raw = f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    want = client.completions.create(model=MODEL_NAME, prompt=raw, max_tokens=8, temperature=0).choices[0].text
    got = client.completions.create(model=MODEL_NAME, prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0)
    assert got.choices[0].text == want and got.usage.prompt_tokens == len(
        server.state.engine.tokenizer.encode(raw))
    streamed = client.completions.create(model=MODEL_NAME, prompt=PREFIX, suffix=SUFFIX, max_tokens=8,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want
    # Ollama's generate: suffix is FIM (its templates' .Suffix), capability "insert".
    host = server.base_url.removesuffix("/v1")
    reply = ollama.Client(host=host).generate(model=MODEL_NAME, prompt=PREFIX, suffix=SUFFIX,
                                              options={"num_predict": 8, "temperature": 0})
    assert reply.response == want
    assert "insert" in httpx.post(f"{host}/api/show", json={"model": MODEL_NAME}).json()["capabilities"]
    with pytest.raises(ollama.ResponseError, match="no place in a fill-in-the-middle prompt"):
        ollama.Client(host=host).generate(model=MODEL_NAME, prompt=PREFIX, suffix=SUFFIX, system="be brief")


def test_suffix_beside_token_ids_is_refused(server):
    reply = httpx.post(f"{server.base_url}/v1/completions",
                       json={"prompt": [1, 2, 3], "suffix": SUFFIX, "max_tokens": 2})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "suffix"
    assert "send the prompt as text" in reply.json()["error"]["message"]
    # An empty suffix is none (OpenAI's): a plain completion.
    plain = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": PREFIX, "suffix": "", "max_tokens": 2})
    assert plain.status_code == 200


def test_an_empty_prompt_without_a_suffix_is_the_tokenizers_bos_alone(server, monkeypatch):
    # As OpenAI's and vLLM's routes and `solo run` take it (a break test found it refused): the start of a text.
    # A tokenizer that adds no BOS leaves nothing to start from, which is said.
    ask = {"max_tokens": 3, "temperature": 0}
    empty = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "", **ask})
    bos = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": [1], **ask})
    assert empty.status_code == 200 and empty.json()["choices"][0]["text"] == bos.json()["choices"][0]["text"]
    assert empty.json()["usage"]["prompt_tokens"] == 1
    encode = server.state.engine.tokenizer.encode
    monkeypatch.setattr(server.state.engine.tokenizer, "encode", lambda text, **kw: encode(text, **kw) if text else [])
    for prompt in ("", ["x", ""]):
        refused = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": prompt, **ask})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"
        assert "the prompt is empty and this model's tokenizer adds no BOS" in refused.json()["error"]["message"]


def test_an_empty_prefix_is_the_start_of_a_file(server):
    # The cursor at the top of a file: OpenAI's route refused the empty prompt, Ollama's answered a load reply.
    client = server.client()
    want = client.completions.create(model=MODEL_NAME, prompt=f"<|fim_prefix|><|fim_suffix|>{SUFFIX}<|fim_middle|>",
                                     max_tokens=6, temperature=0).choices[0].text
    got = client.completions.create(model=MODEL_NAME, prompt="", suffix=SUFFIX, max_tokens=6, temperature=0)
    assert got.choices[0].text == want
    reply = ollama.Client(host=server.base_url.removesuffix("/v1")).generate(
        model=MODEL_NAME, prompt="", suffix=SUFFIX, think=False, options={"num_predict": 6, "temperature": 0})
    assert reply.response == want and reply.done_reason != "load"


def test_a_chat_that_mentions_a_marker_is_no_fim_prompt(server):
    # The chat route hands rendered ids on: a FIM marker in a message made the FIM end tokens stop the reply.
    pad = server.state.engine.tokenizer.backend.token_to_id("<|fim_pad|>")
    reply = server.client().chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "what does <|fim_middle|> mean?"}], max_tokens=3,
        temperature=0, logit_bias={str(pad): 100})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3


def test_an_empty_system_beside_a_suffix_is_none(server):
    # Editors send every field: an empty system (and think false) change nothing in a FIM prompt.
    reply = httpx.post(f"{server.base_url.removesuffix('/v1')}/api/generate", json={
        "model": MODEL_NAME, "prompt": PREFIX, "suffix": SUFFIX, "system": "", "think": False, "stream": False,
        "options": {"num_predict": 2}})
    assert reply.status_code == 200, reply.text
