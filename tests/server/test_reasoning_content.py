"""A thinking model's reasoning comes back as reasoning_content, whole and streamed, and --reasoning-parser none
leaves it in the content: a tiny random model behind a template that opens the <think> block in the prompt
(DeepSeek-R1's way), so every generated token is reasoning until a </think> that a random model never writes."""

from __future__ import annotations

import json

import httpx
import pytest
from checkpoints import make_checkpoint
from server_harness import MODEL_NAME, start_server

# DeepSeek-R1's shape: earlier replies lose their reasoning, the generation prompt opens a <think> block.
TEMPLATE = ("{% if tools %}Call tools as <tool_call>{...}</tool_call>: {{ tools | tojson }}{% endif %}"
            "{% for m in messages %}{% if m['role'] == 'assistant' %}<|Assistant|>"
            "{{ m['content'].split('</think>')[-1] }}<|end|>{% else %}<|User|>{{ m['content'] }}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}")
ASK = [{"role": "user", "content": "def f"}]


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("thinking") / "model", max_position_embeddings=512)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return folder


@pytest.mark.slow
def test_reasoning_content_whole_streamed_and_off(thinking_model):
    running = start_server(thinking_model, max_batch=2)
    try:
        client = running.client()
        whole = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=12, temperature=0)
        message = whole.choices[0].message
        reasoning = message.model_extra["reasoning_content"]
        assert reasoning and message.content == "" and whole.choices[0].finish_reason == "length"
        assert whole.usage.completion_tokens_details.reasoning_tokens == 12  # every token was the block's
        parts, content = [], ""
        for chunk in client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=12, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}):
            if chunk.usage is not None:
                assert chunk.usage.completion_tokens_details.reasoning_tokens == 12
            for choice in chunk.choices:
                parts.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
                content += choice.delta.content or ""
        assert "".join(parts) == reasoning and content == ""
        # The Responses API: a reasoning item only (no empty message beside it), streamed the same.
        response = running.client().responses.create(model=MODEL_NAME, input="def f", max_output_tokens=12,
                                                     temperature=0)
        assert [(item.type, item.content[0].text) for item in response.output] == [("reasoning", reasoning)]
        assert response.usage.output_tokens_details.reasoning_tokens == 12
        events = list(running.client().responses.create(model=MODEL_NAME, input="def f", max_output_tokens=12,
                                                        temperature=0, stream=True))
        final = events[-1].response
        assert events[-1].type == "response.incomplete" and [item.type for item in final.output] == ["reasoning"]
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
        # Strict functions under auto leave the text around calls free: the block is still split off.
        strict = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
            "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
        with_tools = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=12, temperature=0,
                                                    tools=[strict])
        assert with_tools.choices[0].message.model_extra["reasoning_content"]
        assert with_tools.choices[0].message.content in ("", None)
        # A grammar holds the output from its first token: nothing is taken for reasoning.
        constrained = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=12, temperature=0,
                                                     extra_body={"guided_regex": "[a-z ]+"})
        assert "reasoning_content" not in (constrained.choices[0].message.model_extra or {})
    finally:
        running.stop()
    running = start_server(thinking_model, max_batch=2, reasoning_parser="none")
    try:
        plain = running.client().chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=12,
                                                         temperature=0)
        assert plain.choices[0].message.content == reasoning
        assert "reasoning_content" not in (plain.choices[0].message.model_extra or {})
        assert plain.usage.completion_tokens_details is None  # nothing split: nothing counted
    finally:
        running.stop()


@pytest.fixture(scope="module")
def thinking_server(thinking_model):
    running = start_server(thinking_model, max_batch=2)
    yield running
    running.stop()


@pytest.mark.slow
def test_a_prefill_that_opens_a_thinking_block_is_continued_as_reasoning(thinking_server):
    prefill = [*ASK, {"role": "assistant", "content": "<think>\nLet me"}]
    reply = thinking_server.client().chat.completions.create(
        model=MODEL_NAME, messages=prefill, max_tokens=6, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"] and message.content == ""
    assert reply.usage.completion_tokens_details.reasoning_tokens == 6


# Qwen3's shape: the output opens the block, and thinking off writes an empty one into the prompt.
SWITCH_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].split('</think>')[-1] }}"
                   "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                   "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
                   "{% endif %}")


@pytest.mark.slow
def test_thinking_off_is_content_under_the_deepseek_r1_parser(thinking_model, tmp_path):
    # deepseek_r1 takes the output as reasoning from its first token (R1's replies may lack the opening tag);
    # a prompt whose block is already closed (thinking off) makes it content: it was all reasoning.
    template = tmp_path / "switch.jinja"
    template.write_text(SWITCH_TEMPLATE)
    running = start_server(thinking_model, max_batch=2, reasoning_parser="deepseek_r1", chat_template=str(template))
    try:
        client = running.client()
        on = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=6, temperature=0)
        assert on.choices[0].message.model_extra["reasoning_content"] and on.choices[0].message.content == ""
        off = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=6, temperature=0,
                                             extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert off.choices[0].message.content and not (off.choices[0].message.model_extra or {}).get(
            "reasoning_content")
        # llama-server's /apply-template renders what the chat route runs: reasoning_effort "none" is thinking
        # off there too (it was checked, then left out of the rendering).
        rendered = [httpx.post(running.base_url.removesuffix("/v1") + "/apply-template",
                               json={"messages": ASK, **fields}).json()["prompt"]
                    for fields in ({"reasoning_effort": "none"}, {"chat_template_kwargs": {"enable_thinking": False}},
                                   {})]
        assert rendered[0] == rendered[1] != rendered[2] and rendered[0].endswith("<think>\n\n</think>\n\n")
        # Off one way and on the other is refused (it ran with thinking off); reasoning text must be text.
        for fields, words in (({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}},
                               "send one of them"),
                              ({"messages": [*ASK, {"role": "assistant", "content": "ok", "reasoning_content": 5},
                                             {"role": "user", "content": "and?"}]}, "reasoning_content must be")):
            refused = httpx.post(running.base_url.removesuffix("/v1") + "/v1/chat/completions",
                                 json={"model": MODEL_NAME, "messages": ASK, "max_tokens": 2, **fields})
            assert refused.status_code == 400 and words in refused.json()["error"]["message"], refused.json()
    finally:
        running.stop()


@pytest.mark.slow
def test_responses_reasoning_effort_null_on_a_model_without_a_switch(thinking_server):
    # null means the default: on a thinking model without an enable_thinking switch it was taken as thinking off
    # asked (and refused).
    reply = thinking_server.client().responses.create(model=MODEL_NAME, input="def f", max_output_tokens=4,
                                                      temperature=0, reasoning={"effort": None})
    assert [item.type for item in reply.output] == ["reasoning"]
