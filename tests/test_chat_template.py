"""Chat templates render exactly as transformers' apply_chat_template renders them."""

from __future__ import annotations

import jinja2
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from solo.chat_template import ChatTemplate
from solo.errors import InvalidRequestError
from solo.tokenizer import Tokenizer, _chat_template_source, _read_json, _token_text

CONVERSATION = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Japan? Answer in 日本語 too."},
    {"role": "assistant", "content": "Tokyo (東京)."},
    {"role": "user", "content": "Thanks!"},
]


def _template_folders(root):
    folders = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if _chat_template_source(folder, _read_json(folder / "tokenizer_config.json")):
            folders.append(folder)
    return folders


def _transformers_render(folder, messages, add_generation_prompt):
    """What transformers' apply_chat_template renders: its own renderer fed the named special tokens.

    AutoTokenizer cannot load every fixture (some ship only tokenizer_config.json), so the special tokens are
    read the way transformers reads them (tokenizer_config.json, then special_tokens_map.json).
    """
    config = _read_json(folder / "tokenizer_config.json")
    special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    for key, value in _read_json(folder / "special_tokens_map.json").items():
        if special.get(key) is None:
            special[key] = _token_text(value)
    special = {k: v for k, v in special.items() if v is not None}
    template = _chat_template_source(folder, config)
    rendered, _ = render_jinja_template([messages], chat_template=template,
                                        add_generation_prompt=add_generation_prompt, **special)
    return rendered[0], special, template


def test_every_fixture_template_matches_transformers(shared_hf):
    folders = _template_folders(shared_hf)
    assert len(folders) >= 8
    checked = 0
    for folder in folders:
        for add_generation_prompt in (True, False):
            try:
                expected, special, template = _transformers_render(folder, CONVERSATION, add_generation_prompt)
            except jinja2.TemplateError:
                # The template rejects this conversation (e.g. no system role): Solo must reject it too.
                template = _chat_template_source(folder, _read_json(folder / "tokenizer_config.json"))
                with pytest.raises(InvalidRequestError, match="chat template rejected"):
                    ChatTemplate(template, {}).render(CONVERSATION, add_generation_prompt)
                continue
            rendered = ChatTemplate(template, special).render(CONVERSATION, add_generation_prompt)
            assert rendered == expected, folder.name
            checked += 1
    assert checked >= 12


def test_apply_chat_template_parity_with_autotokenizer(shared_hf):
    from transformers import AutoTokenizer

    for name in ("Mistral-7B-Instruct-v0.3", "Phi-3-mini-4k-instruct", "Llama-2-7b-chat-hf"):
        folder = shared_hf / name
        hf = AutoTokenizer.from_pretrained(str(folder))
        ours = Tokenizer.from_folder(folder)
        messages = CONVERSATION[1:] if name != "Phi-3-mini-4k-instruct" else CONVERSATION
        assert ours.render_chat(messages) == hf.apply_chat_template(messages, tokenize=False,
                                                                     add_generation_prompt=True)


def test_bos_never_doubled(tiny_llama):
    tok = Tokenizer.from_folder(tiny_llama)
    bos = tok.token_id("bos_token")
    assert tok.encode("hello")[0] == bos  # plain prompts get BOS from the post-processor
    ids = tok.encode_chat([{"role": "user", "content": "hello"}])
    assert ids[0] == bos and ids.count(bos) == 1  # the template writes BOS itself


def test_messages_without_template_are_rejected(tmp_path):
    from checkpoints import write_tokenizer

    write_tokenizer(tmp_path, chat_template=False)
    tok = Tokenizer.from_folder(tmp_path)
    with pytest.raises(InvalidRequestError, match="no chat template"):
        tok.encode_chat([{"role": "user", "content": "hi"}])


def test_empty_messages_rejected(tiny_llama):
    with pytest.raises(InvalidRequestError, match="messages is empty"):
        Tokenizer.from_folder(tiny_llama).encode_chat([])


def test_messages_from_python_are_checked_not_dropped():
    # What the server's ChatMessage refuses is refused from Python too (a non-text part used to render as
    # an empty turn); text parts are joined, as the server joins them.
    from solo.chat_template import template_messages
    from solo.errors import InvalidRequestError

    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert template_messages(parts) == [{"role": "user", "content": "a\nb"}]  # one part per line, as vLLM joins
    assistant = {"role": "assistant", "tool_calls": [{"id": "1"}]}  # content may be left out here
    assert template_messages([assistant]) == [assistant]
    for messages, words in [([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "text only"),
                            ([{"role": "user", "content": 5}], "got int"), ([{"role": "user"}], "needs a content"),
                            ([{"role": "bogus", "content": "x"}], "bogus")]:
        with pytest.raises(InvalidRequestError, match=words):
            template_messages(messages)


def test_template_expression_errors_are_the_requests():
    # A template's own expression failing on what a message holds is a 400 naming the messages, not a crash.
    from solo.errors import InvalidRequestError

    template = ChatTemplate("{% for m in messages %}{{ 'turn: ' + m['content'] + m['extra'] }}{% endfor %}", {})
    with pytest.raises(InvalidRequestError, match="TypeError") as info:
        template.render([{"role": "user", "content": "hi", "extra": 5}])
    assert info.value.param == "messages"


def test_continue_final_message_as_transformers(shared_hf):
    """A last assistant message continued (a prefill): the text ends right after its content, as transformers'
    apply_chat_template(continue_final_message=True) ends it, on every fixture template AutoTokenizer loads."""
    from transformers import AutoTokenizer

    prefill = [*CONVERSATION[1:4], {"role": "assistant", "content": "Tokyo, which in 日本語 is"}]
    checked = 0
    for folder in _template_folders(shared_hf):
        try:
            hf = AutoTokenizer.from_pretrained(str(folder))
            expected = hf.apply_chat_template(prefill, tokenize=False, continue_final_message=True)
        except Exception:  # noqa: BLE001 (a fixture AutoTokenizer cannot load, or whose template refuses this)
            continue
        _, special, source = _transformers_render(folder, prefill, False)  # (the special tokens as transformers')
        ours = ChatTemplate(source, special).render(prefill, add_generation_prompt=False, continue_final_message=True)
        assert ours == expected, folder.name
        assert expected.endswith("日本語 is")
        checked += 1
    assert checked >= 5
    template = ChatTemplate("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}", {})
    with pytest.raises(InvalidRequestError, match="add_generation_prompt"):
        template.render(prefill, add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(InvalidRequestError, match="needs text"):
        template.render([*prefill[:-1], {"role": "assistant", "content": ""}], False, continue_final_message=True)
    # A content that also occurs in the end-of-turn marker is cut where it ends, not inside the marker.
    chatml = ChatTemplate("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                          "{% endfor %}", {})
    for content in ("<", "end", "|", "im_end", "x "):
        cut = chatml.render([prefill[0], {"role": "assistant", "content": content}], False, continue_final_message=True)
        assert cut == f"<|im_start|>user\n{prefill[0]['content']}<|im_end|>\n<|im_start|>assistant\n{content}", content
    # Qwen3's real template rewrites a <think> block (and writes reasoning_content as one): the cut is where the
    # message ends as the template writes it; a message of thinking only is continued after its block.
    import json as _json

    qwen3 = ChatTemplate(_json.loads((shared_hf / "Qwen3-0.6B" / "tokenizer_config.json").read_text())["chat_template"],
                         {})
    ask = [{"role": "user", "content": "hi"}]
    assert qwen3.render([*ask, {"role": "assistant", "content": "<think>\nok</think>\n\nThe answer"}], False,
                        continue_final_message=True).endswith("<think>\nok\n</think>\n\nThe answer")
    assert qwen3.render([*ask, {"role": "assistant", "content": "", "reasoning_content": "ok"}], False,
                        continue_final_message=True).endswith("<think>\nok\n</think>\n\n")
    assert qwen3.render([*ask, {"role": "assistant", "content": None, "reasoning_content": "ok"}], False,
                        continue_final_message=True).endswith("<think>\nok\n</think>\n\n")  # (Anthropic's form)
    with pytest.raises(InvalidRequestError, match="leaves thinking out"):  # (not silently dropped)
        template.render([*ask, {"role": "assistant", "content": "", "reasoning_content": "ok"}], False,
                        continue_final_message=True)
    trims = ChatTemplate("{% for m in messages %}[{{ m['content'] | trim }}]{% endfor %}", {})
    assert trims.render([{"role": "assistant", "content": " go on "}], False, continue_final_message=True) == "[go on"
    hidden = ChatTemplate("{% for m in messages %}{{ m['role'] }}\n{% endfor %}", {})
    with pytest.raises(InvalidRequestError, match="nothing to continue"):
        hidden.render(prefill, False, continue_final_message=True)


def test_mistral_template_gets_nine_character_call_ids(shared_hf):
    # From a break test: Mistral v0.3's template raises on any tool-call id but 9 letters or digits, so a history
    # with OpenAI's (call_...), Anthropic's (toolu_...) or the Responses API's ids was a 400. They are rewritten
    # for it, a call and its result alike; 9-character ids pass as they are.
    import json as _json
    import re

    config = shared_hf / "Mistral-7B-Instruct-v0.3" / "tokenizer_config.json"
    source = _json.loads(config.read_text())["chat_template"]
    template = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"})
    assert template.nine_char_call_ids

    def history(first: str, second: str) -> list[dict]:
        calls = [{"id": i, "type": "function", "function": {"name": "get_weather", "arguments": {"city": c}}}
                 for i, c in ((first, "Paris"), (second, "Rome"))]
        return [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": first, "content": "sunny"},
                {"role": "tool", "tool_call_id": second, "content": "rain"}]

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    text = template.render(history("call_abc123def456", "toolu_01XyZ"), tools=tools)
    ids = re.findall(r'"call_id": "([^"]*)"', text)
    assert ids and all(len(i) == 9 and i.isalnum() for i in ids), text
    assert text.count(ids[0]) == 2 and text.count(ids[1]) == 2 and ids[0] != ids[1]  # each call and its result
    same = template.render(history("abcdefghi", "123456789"), tools=tools)
    assert "abcdefghi" in same and "123456789" in same


def test_a_developer_message_is_a_system_message_where_the_template_does_not_name_the_role(shared_hf):
    # OpenAI's newer name for "system": Qwen2.5's template dropped it (and put its default system prompt in its
    # place), Mistral's refused the conversation; llama.cpp's server maps it to system.
    developer = [{**CONVERSATION[0], "role": "developer"}, *CONVERSATION[1:]]
    for folder in _template_folders(shared_hf):
        _, special, template = _transformers_render(folder, CONVERSATION[1:], True)
        chat = ChatTemplate(template, special)
        try:
            expected = chat.render(CONVERSATION, True)
        except InvalidRequestError:  # (no system role at all)
            with pytest.raises(InvalidRequestError, match="chat template rejected"):
                chat.render(developer, True)
            continue
        assert chat.render(developer, True) == expected, folder.name
    # A template that names the role keeps it.
    named = ChatTemplate("{% for m in messages %}{% if m.role == 'developer' %}[dev]{% endif %}{{ m.role }}: "
                         "{{ m.content }}\n{% endfor %}", {})
    assert named.render(developer[:2], False) == "[dev]developer: You are a concise assistant.\nuser: What is the " \
                                                 "capital of France?\n"


def test_a_chat_template_may_be_a_path_and_nothing_else_odd(tmp_path):
    # Engine.load(chat_template=Path(...)) was a TypeError ("argument of type 'PosixPath' is not iterable").
    from pathlib import Path

    from solo.chat_template import read_chat_template
    from solo.errors import SoloError

    (tmp_path / "t.jinja").write_text("{{ messages[0].content }}")
    assert read_chat_template(Path(tmp_path / "t.jinja")) == "{{ messages[0].content }}"
    for bad in (5, b"{{ x }}"):
        with pytest.raises(SoloError, match="chat_template must be the template text or a file's path"):
            read_chat_template(bad)
