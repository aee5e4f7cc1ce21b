"""Tool calling: formats detected from real chat templates, tools and tool-call history rendered exactly as
transformers renders them, the three output syntaxes parsed (whole and streamed), and forced calls that are
valid by construction on a tiny random checkpoint."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2
import jsonschema
import pytest
from checkpoints import QWEN3_CODER_TEMPLATE, make_checkpoint
from transformers.utils.chat_template_utils import render_jinja_template

from solo import Engine, SamplingParams
from solo.chat_template import ChatTemplate
from solo.engine.tool_calls import (
    ToolCallParser,
    arguments_as_objects,
    check_tools,
    complete_tool_calls,
    detect_tool_format,
    prefill_opens_call,
    supports_tools,
    tool_call_constraint,
)
from solo.errors import InvalidRequestError
from solo.tokenizer import _chat_template_source, _read_json, _token_text

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}}, "required": ["zone"],
    "additionalProperties": False}}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "abcdefghi", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
    {"role": "tool", "tool_call_id": "abcdefghi", "name": "get_weather", "content": "sunny"},
]

EXPECTED_FORMATS = {"Qwen2.5-Instruct": "hermes", "Qwen3-0.6B": "hermes", "SmolLM3-3B": "hermes",
                    "Llama-3.2-3B-Instruct": "llama3_json", "Mistral-7B-Instruct-v0.3": "mistral"}


# Phi-4-mini-instruct's prompt format (its template is not among the shared fixtures; this one renders the
# same text): the tools are a JSON string in the system message's "tools" key, every turn is
# <|role|>content<|end|>.
PHI4_MINI_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
                      "{% if m['role'] == 'system' and m['tools'] is defined %}<|tool|>{{ m['tools'] }}<|/tool|>"
                      "{% endif %}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
PHI4_MINI_SPECIAL = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>", "<|tool_call|>",
                     "<|/tool_call|>"]


def _template(folder: Path) -> tuple[str, dict]:
    config = _read_json(folder / "tokenizer_config.json")
    special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    for key, value in _read_json(folder / "special_tokens_map.json").items():
        if special.get(key) is None:
            special[key] = _token_text(value)
    return _chat_template_source(folder, config), {k: v for k, v in special.items() if v is not None}


def test_formats_detected_from_real_templates(shared_hf):
    for name, fmt in EXPECTED_FORMATS.items():
        assert detect_tool_format(_template(shared_hf / name)[0]) == fmt, name
    for name in ("Llama-2-7b-chat-hf", "Phi-3.5-mini-instruct"):
        template = _template(shared_hf / name)[0]
        assert detect_tool_format(template) is None
        with pytest.raises(InvalidRequestError, match="no tool support") as info:
            check_tools([WEATHER], "auto", template)
        assert info.value.param == "tools"


def test_a_template_that_takes_one_call_per_turn_gets_one(shared_hf, tmp_path, monkeypatch):
    # Llama 3.x's template raises on an assistant turn with several calls: a reply with several (tool_choice
    # "required", parallel_tool_calls left true) was refused when the agent sent it back (a trial found it).
    from solo.chat_template import ChatTemplate

    source, special = _template(shared_hf / "Llama-3.2-3B-Instruct")
    assert ChatTemplate(source, special).single_tool_call
    assert not ChatTemplate(_template(shared_hf / "Qwen2.5-Instruct")[0], {}).single_tool_call
    from checkpoints import make_checkpoint

    import solo.engine.engine as engine_module

    asked = []
    real = engine_module.output_constraint
    monkeypatch.setattr(engine_module, "output_constraint", lambda *args: asked.append(args[3]) or real(*args))
    engine = Engine.load(make_checkpoint(tmp_path, max_position_embeddings=2048), chat_template=source)
    engine.make_request([{"role": "user", "content": "t"}], {"max_tokens": 40}, tools=[WEATHER],
                        tool_choice="required")
    assert asked == [False]  # parallel_tool_calls, left true by the request


@pytest.mark.parametrize("name", sorted(EXPECTED_FORMATS))
def test_tools_and_history_render_as_transformers(shared_hf, name):
    template, special = _template(shared_hf / name)
    messages = arguments_as_objects(HISTORY)
    if name.startswith("Llama"):
        messages = [{"role": "system", "content": "Be brief."}, *messages]
    try:
        expected, _ = render_jinja_template([messages], tools=[WEATHER, TIME], chat_template=template,
                                            add_generation_prompt=True, **special)
    except jinja2.TemplateError:
        pytest.skip(f"{name}'s template rejects this conversation")
    rendered = ChatTemplate(template, special).render(messages, tools=[WEATHER, TIME])
    assert rendered == expected[0]
    assert "get_time" in rendered and "sunny" in rendered


def _feed_pieces(parser, text, special=None, size=3):
    streamed = ""
    for i in range(0, len(text), size):
        streamed += parser.feed(text[i:i + size], [])
    if special is not None:
        streamed += parser.feed("", [special])
    return streamed


def test_hermes_content_then_two_calls_streamed():
    text = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')
    parser = ToolCallParser("hermes", {})
    streamed = _feed_pieces(parser, text)
    content, calls, rest = parser.finish()
    assert streamed + rest == "Let me check. " == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris", "days": 2}),
                                                                  ("get_time", {"zone": "CET"})]
    assert all(c.id.startswith("call_") for c in calls)


def test_hermes_call_whose_argument_holds_the_closing_tag():
    # Code that writes tool calls: a string argument holding "</tool_call>" stays in its call (the tag after the
    # JSON closes it); the call was returned as text before.
    source = 'print("<tool_call>{}</tool_call>")'
    text = (f'<tool_call>\n{{"name": "write_file", "arguments": {{"path": "a.py", "text": {json.dumps(source)}}}}}\n'
            '</tool_call>\n<tool_call>\n{"name": "run", "arguments": {}}\n</tool_call>')
    parser = ToolCallParser("hermes", {})
    streamed = _feed_pieces(parser, text)
    content, calls, rest = parser.finish()
    assert streamed + rest == "" == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("write_file", {"path": "a.py", "text": source}), ("run", {})]
    # Its closing tag cut off (EOS, a stop string, max_tokens inside it): still the call.
    for end in ("", "\n</tool_"):
        text = f'<tool_call>{{"name": "w", "arguments": {{"s": "a</tool_call>b"}}}}{end}'
        calls, rest = complete_tool_calls("hermes", text)
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [("w", {"s": "a</tool_call>b"})] and rest == ""
    # A prefill that stops inside such a string opens a call (the reply would hold only its end).
    assert prefill_opens_call("hermes", '<tool_call>\n{"name": "w", "arguments": {"s": "a</tool_call>')
    assert not prefill_opens_call("hermes", '<tool_call>\n{"name": "w", "arguments": {}}\n</tool_call>')


@pytest.mark.parametrize("first_ok", [False, True])
def test_hermes_calls_are_the_same_however_the_tokens_come_in_events(first_ok):
    # A break test: a malformed block, then a good one, in events of several tokens (speculative steps) gave all
    # content or one call with the malformed block's text lost, by the number of tokens per event. The marker is a
    # token whose text shows (Qwen's <tool_call>), recognised by id.
    bad = '{"name": "get_weather", "arguments": {"n": }}'
    good = '{"name": "f", "arguments": {}}'
    pieces = [("<think>x</think>", 1), ("\n\n", 2), ("<tool_call>", 100), ("\n", 2),
              (good if first_ok else bad, 3), ("\n", 2), ("</tool_call>", 101), ("\n", 2), ("<tool_call>", 100),
              ("\n", 2), (good if not first_ok else bad, 3), ("\n", 2), ("</tool_call>", 101)]
    text = "".join(t for t, _ in pieces)
    results = set()
    for size in range(1, len(pieces) + 1):
        parser = ToolCallParser("hermes", {"<tool_call>": 100, "</tool_call>": 101})
        streamed = ""
        for k in range(0, len(pieces), size):
            group = pieces[k:k + size]
            streamed += parser.feed("".join(t for t, _ in group), [i for _, i in group])
        content, calls, rest = parser.finish()
        assert streamed + rest == content, size
        results.add((content, tuple((c.name, c.arguments) for c in calls)))
    assert len(results) == 1, results
    ((content, calls),) = results
    if first_ok:  # (the good call, and the text after it, the bad block, as content: never dropped)
        assert [name for name, _ in calls] == ["f"] and bad in content
    else:  # (a first call that does not parse: all of it is content, as vLLM's parser)
        assert calls == () and content == text


def test_hermes_without_calls_is_all_content():
    parser = ToolCallParser("hermes", {})
    text = "No tools <tool needed> here <tool_ca"
    streamed = _feed_pieces(parser, text, size=1)
    content, calls, rest = parser.finish()
    assert not calls and streamed + rest == text == content


def test_broken_call_comes_back_as_content():
    parser = ToolCallParser("hermes", {})
    text = 'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": '
    streamed = _feed_pieces(parser, text)
    content, calls, rest = parser.finish()
    assert not calls and streamed + rest == text


@pytest.mark.parametrize("tail", ["\n<tool_call>\n{\"name\": \"get_time\", \"argu", "\n<tool_", "\nand then"])
def test_complete_calls_are_kept_and_what_follows_is_content(tail):
    # A second call cut short by max_tokens (or any text after a call) comes back as content, not dropped.
    first = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    parser = ToolCallParser("hermes", {})
    streamed = _feed_pieces(parser, "Hi " + first + tail)
    content, calls, rest = parser.finish()
    assert [c.name for c in calls] == ["get_weather"]
    assert rest == tail and streamed + rest == "Hi " + tail == content


def test_text_between_calls_is_content_and_both_calls_count():
    first = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    second = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    parser = ToolCallParser("hermes", {})
    streamed = _feed_pieces(parser, "Hi " + first + "\nthen\n" + second + " bye")
    content, calls, rest = parser.finish()
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert streamed + rest == content == "Hi \nthen\n bye"


@pytest.mark.parametrize("cut", ["\n", "\n</", "\n</tool_call", "</tool_call "])
def test_last_call_without_its_closing_tag_or_with_it_cut_is_a_call(cut):
    # The call's JSON is whole; its closing tag never came (EOS, a stop string) or max_tokens cut it.
    parser = ToolCallParser("hermes", {})
    _feed_pieces(parser, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}' + cut)
    content, calls, rest = parser.finish()
    assert [c.name for c in calls] == ["get_time"] and content == rest == ""



@pytest.mark.parametrize("cut", ['\n<tool_call>\n{"name": "get_ti', "\n<tool_", "\n"])
def test_forced_calls_cut_short_are_left_out_never_content(cut):
    # tool_choice "required" / named: the output is held to calls, so a cut one is no text the model wrote.
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    parser = ToolCallParser("hermes", {}, forced=True)
    assert _feed_pieces(parser, call + cut) == ""
    content, calls, rest = parser.finish()
    assert [c.name for c in calls] == ["get_time"] and content == rest == "" and parser.cut.strip() == cut.strip()
    parser = ToolCallParser("hermes", {}, forced=True)  # no call complete: nothing at all
    assert _feed_pieces(parser, '<tool_call>\n{"name": "get_') == ""
    assert parser.finish() == ("", [], "") and parser.cut == '<tool_call>\n{"name": "get_'


def test_a_forced_call_cut_short_stays_in_completes_text():
    # From a break test of the Python API: complete() returned text "" and no calls for 10 tokens it generated,
    # so the caller could not see what was cut. The text keeps it; content (the server's) leaves it out.
    engine = Engine.load(None)  # the bundled model's template takes tools (Hermes syntax)
    messages = [{"role": "user", "content": "What time is it in Paris?"}]
    params = SamplingParams(max_tokens=16)
    result = engine.complete(messages, params, tools=[TIME], tool_choice="required")
    streamed = "".join(e.text for e in engine.generate(messages, params, tools=[TIME], tool_choice="required"))
    assert result.finish_reason == "length" and result.tool_calls is None and result.content == ""
    assert result.text == streamed and result.text.startswith("<tool_call>")
    assert result.text == engine.tokenizer.decode(result.token_ids)


@pytest.mark.parametrize("fmt, marker", [("mistral", "[TOOL_CALLS]"), ("phi4_mini", "<|tool_call|>")])
@pytest.mark.parametrize("forced", [False, True])
def test_an_array_of_calls_cut_short_keeps_its_complete_calls(fmt, marker, forced):
    # From a break test: a forced Mistral call array that max_tokens cut after nine whole calls came back with no
    # call at all (the array was read only once closed). As a cut Hermes block: the complete calls are calls, the
    # cut one is content (left out under a forced call, whose output is no text the model wrote).
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    cut = '{"name": "get_we'
    parser = ToolCallParser(fmt, {}, forced=forced)
    streamed = _feed_pieces(parser, f"{marker} [{call}, {call},\n {cut}")
    content, calls, rest = parser.finish()
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})] * 2
    assert streamed + rest == content == ("" if forced else cut)
    parser = ToolCallParser(fmt, {}, forced=forced)  # no call complete: all of it content, or nothing if forced
    streamed = _feed_pieces(parser, f"{marker} [{cut}")
    content, calls, rest = parser.finish()
    assert not calls and streamed + rest == content == ("" if forced else f"{marker} [{cut}")


def test_a_marker_token_whose_text_shows_inside_the_arguments_does_not_lose_the_call():
    # The marker decodes to nothing and shares its event with content: its text inside a value is no split point.
    parser = ToolCallParser("mistral", {"[TOOL_CALLS]": 99})
    text = 'Sure [{"name": "search", "arguments": {"q": "what is [TOOL_CALLS]"}}]'
    assert parser.feed(text, [5, 99, 6]) == ""
    content, calls, rest = parser.finish()
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("search", {"q": "what is [TOOL_CALLS]"})]
    assert content == rest == "Sure " and parser.lead == "Sure "


def test_content_ahead_of_a_marker_token_in_its_event_is_content_json_and_blanks_included():
    # The marker decodes to nothing and shares its event with content (a speculative step): JSON in that content
    # is no call, and a blank before the call stays, as token by token.
    parser = ToolCallParser("mistral", {"[TOOL_CALLS]": 5})
    assert parser.feed('x {"name": "g", "arguments": {}} y [{"name": "f", "arguments": {"a": 1}}]', [7, 8, 5, 9]) == ""
    content, calls, rest = parser.finish()
    assert [c.name for c in calls] == ["f"] and content == rest == 'x {"name": "g", "arguments": {}} y '
    parser = ToolCallParser("mistral", {"[TOOL_CALLS]": 5})
    streamed = parser.feed("Hello", [7]) + parser.feed(' [{"name": "f", "arguments": {"a": 1}}]', [7, 5, 9])
    content, calls, rest = parser.finish()
    assert [c.name for c in calls] == ["f"] and streamed + rest == content == "Hello "
    # The marker last in its event, Mistral v0.3's blank before the "[" in the next: the call was lost, its JSON
    # returned as content (a trial with the real tokenizer); the blank after the marker is no content.
    parser = ToolCallParser("mistral", {"[TOOL_CALLS]": 5})
    assert parser.feed("OK", [7, 5]) == ""
    parser.feed(' [{"name": "f", "arguments": {"a": 1}}]', [9, 10])
    content, calls, rest = parser.finish()
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1})] and content == rest == "OK"


def test_llama3_json_calls():
    parser = ToolCallParser("llama3_json", {"<|python_tag|>": 7})
    text = '{"name": "get_weather", "parameters": {"city": "Tokyo", "days": 1}}; {"name": "get_time", ' \
           '"parameters": {"zone": "JST"}}'
    assert _feed_pieces(parser, "  " + text) == ""
    _, calls, _ = parser.finish()
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": "Tokyo", "days": 1}
    prose = ToolCallParser("llama3_json", {})
    assert _feed_pieces(prose, "It is {sunny}.") + prose.finish()[2] == "It is {sunny}."


def test_mistral_marker_is_a_special_token():
    parser = ToolCallParser("mistral", {"[TOOL_CALLS]": 5})
    assert parser.feed("Sure.", [10]) == "Sure."
    assert parser.feed("", [5]) == ""  # the special token decodes to nothing
    parser.feed(' [{"name": "get_time", "arguments": {"zone": "UTC"}}]', [11])
    content, calls, _ = parser.finish()
    assert content == "Sure." and calls[0].name == "get_time" and len(calls[0].id) == 9


def test_tool_support_is_a_variable_the_template_reads():
    # Jinja's parser decides: "tools" in text, a comment or an unrendered message key shows no tool to the model.
    for source in ("{# no tools here #}{% for m in messages %}{{ m.content }}{% endfor %}",
                   "{% for m in messages %}Use your tools. {{ m.content }}{% endfor %}",
                   "{% for m in messages %}{% if m.tools %}x{% endif %}{{ m.content }}{% endfor %}"):
        assert not supports_tools(source), source
        with pytest.raises(InvalidRequestError, match="no tool support"):
            check_tools([WEATHER], "none", source)
    assert supports_tools("{% if tools %}{{ tools | tojson }}{% endif %}<tool_call>")
    assert detect_tool_format(PHI4_MINI_TEMPLATE) == "phi4_mini"


def test_phi4_mini_tools_go_in_the_system_message():
    template = ChatTemplate(PHI4_MINI_TEMPLATE, {})
    functions = json.dumps([WEATHER["function"], TIME["function"]], ensure_ascii=False)
    call = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}]<|/tool_call|>'
    history = ("<|user|>Weather in Paris?<|end|><|assistant|>" + call + "<|end|><|tool|>sunny<|end|><|assistant|>")
    # No system message: one with no text of its own carries the tools.
    assert (template.render(arguments_as_objects(HISTORY), tools=[WEATHER, TIME])
            == f"<|system|><|tool|>{functions}<|/tool|><|end|>" + history)
    # The caller's system message carries them; arguments sent as a JSON string are written as an object.
    messages = [{"role": "system", "content": "Be brief."}, *HISTORY]
    assert (template.render(messages, tools=[WEATHER, TIME])
            == f"<|system|>Be brief.<|tool|>{functions}<|/tool|><|end|>" + history)
    # Without tools the earlier calls still render, in the model's own syntax.
    assert template.render(messages) == "<|system|>Be brief.<|end|>" + history
    assert [m.get("tools") for m in messages] == [None] * 4  # the caller's messages are left as they were
    # A developer message is Phi-4's system message; only name, description and parameters are written.
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    developer = template.render([{"role": "developer", "content": "Be brief."}, HISTORY[0]], tools=[strict])
    assert developer.startswith(f"<|system|>Be brief.<|tool|>{json.dumps([WEATHER['function']])}<|/tool|>")
    # Microsoft's own way (a "tools" string on the system message) passes through; both at once is refused.
    own = [{"role": "system", "content": "", "tools": functions}, {"role": "user", "content": "Hi"}]
    assert template.render(own) == f"<|system|><|tool|>{functions}<|/tool|><|end|><|user|>Hi<|end|><|assistant|>"
    with pytest.raises(InvalidRequestError, match="once") as info:
        template.render(own, tools=[WEATHER])
    assert info.value.param == "messages"


def test_phi4_mini_calls_parsed():
    markers = {"<|tool_call|>": 9, "<|/tool_call|>": 10}
    parser = ToolCallParser("phi4_mini", markers)
    assert parser.feed("Checking.", [3]) == "Checking."
    assert parser.feed("", [9]) == ""  # the marker is a special token: it decodes to nothing
    parser.feed('[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, ', [4])
    parser.feed('{"name": "get_time", "arguments": {"zone": "CET"}}]', [5, 10])
    content, calls, rest = parser.finish()
    assert content == "Checking." and rest == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris", "days": 2}),
                                                                  ("get_time", {"zone": "CET"})]
    assert all(c.id.startswith("call_") for c in calls)
    # Markers kept in the text (skip_special_tokens off), calls outside a list, two blocks.
    text = ('<|tool_call|>{"name": "get_time", "arguments": {"zone": "UTC"}}<|/tool_call|>'
            '<|tool_call|>[{"name": "get_time", "arguments": {"zone": "JST"}}]<|/tool_call|>')
    parser = ToolCallParser("phi4_mini", markers)
    assert _feed_pieces(parser, text) == ""
    assert [json.loads(c.arguments)["zone"] for c in parser.finish()[1]] == ["UTC", "JST"]
    # Not a call: everything comes back as content.
    parser = ToolCallParser("phi4_mini", markers)
    streamed = parser.feed("Sure", [3]) + parser.feed("", [9]) + parser.feed("[oops", [4])
    content, calls, rest = parser.finish()
    assert not calls and content == streamed + rest == "Sure[oops"
    # Text after the calls (past the closing marker, which decodes to nothing) is content; the calls stay.
    parser = ToolCallParser("phi4_mini", markers)
    parser.feed("", [9])
    parser.feed('[{"name": "get_time", "arguments": {"zone": "CET"}}, {"name": "get_time", "arguments": {"zone": '
                '"UTC"}}]', [4])
    parser.feed(" Done.", [10, 5])
    content, calls, rest = parser.finish()
    assert content == rest == " Done." and [json.loads(c.arguments)["zone"] for c in calls] == ["CET", "UTC"]
    # The marker after other tokens of one event (a speculative step): their text is content, the call parses.
    parser = ToolCallParser("phi4_mini", markers)
    assert parser.feed("Checking [now].", [3, 4, 9]) == ""
    parser.feed('[{"name": "get_time", "arguments": {"zone": "CET"}}]', [5, 10])
    content, calls, rest = parser.finish()
    assert content == rest == "Checking [now]." and [c.name for c in calls] == ["get_time"]
    # A forced call is the JSON array that follows the marker (a grammar cannot write the special token).
    spec = tool_call_constraint("phi4_mini", [WEATHER, TIME], "required", parallel_tool_calls=False)
    assert spec.kind == "json_schema" and spec.value["type"] == "array" and spec.value["maxItems"] == 1


def test_tool_choice_naming_no_tool():
    with pytest.raises(InvalidRequestError, match="nope") as info:
        check_tools([WEATHER], {"type": "function", "function": {"name": "nope"}}, "{{ tools }}<tool_call>")
    assert info.value.param == "tool_choice"
    with pytest.raises(InvalidRequestError, match="unique"):
        check_tools([WEATHER, WEATHER], "auto", "{{ tools }}<tool_call>")


@pytest.mark.parametrize("parameters", [{"type": "string"}, {"type": "array", "items": {}},
                                        {"type": ["object", "null"]}])
def test_parameters_that_are_no_object_are_refused(parameters):
    # A forced call of such a tool was generated, then dropped by the call parser: the reply had no call.
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(InvalidRequestError, match='parameters must be a schema of "type": "object"') as info:
        check_tools([tool], {"type": "function", "function": {"name": "f"}}, "{{ tools }}<tool_call>")
    assert info.value.param == "tools"
    no_type = {"type": "function", "function": {"name": "f", "parameters": {"properties": {}}}}
    assert check_tools([no_type], "auto", "{{ tools }}<tool_call>")[1] == [no_type]  # (an object by default)


@pytest.mark.parametrize("choice, words", [
    ("Auto", "got 'Auto'"), ("always", "got 'always'"), (5, "got 5"), (["auto"], "got ['auto']"),
    ({"type": "function", "function": {"name": "get_weather"}, "mode": "x"}, "'mode'"),
    ({"type": "function", "function": {"name": "get_weather", "strict": True}}, "'strict'"),
])
def test_tool_choice_other_than_the_four_is_refused(choice, words):
    # An unknown tool_choice was taken as "required" (a grammar forcing a call); unknown keys were ignored.
    for tools in ([WEATHER], []):
        with pytest.raises(InvalidRequestError, match=re.escape(words)) as info:
            check_tools(tools, choice, "{{ tools }}<tool_call>")
        assert info.value.param == "tool_choice" and '"none", "auto", "required"' in str(info.value)


def test_engine_refuses_a_tool_choice_or_parallel_tool_calls_of_another_kind():
    engine = Engine.load(None)  # the bundled model's template takes tools (Hermes syntax)
    ask = [{"role": "user", "content": "t"}]
    with pytest.raises(InvalidRequestError, match="tool_choice"):
        engine.make_request(ask, {"max_tokens": 5}, tools=[TIME], tool_choice="Auto")
    with pytest.raises(InvalidRequestError, match="parallel_tool_calls must be true or false, got 'no'"):
        engine.make_request(ask, {"max_tokens": 5}, tools=[TIME], parallel_tool_calls="no")
    request = engine.make_request(ask, {"max_tokens": 5}, tools=[TIME], tool_choice="auto")
    assert not request.tool_call_forced and request.constraint is None


@pytest.fixture(scope="module")
def qwen_templated_engine(shared_hf, tmp_path_factory):
    """A tiny random model whose tokenizer carries Qwen2.5-Instruct's real (tool-aware) chat template."""
    folder = make_checkpoint(tmp_path_factory.mktemp("qwen-template") / "model", max_position_embeddings=2048)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = _template(shared_hf / "Qwen2.5-Instruct")[0]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return Engine.load(folder, backend="eager", dtype="float32")


@pytest.mark.slow
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_are_valid(qwen_templated_engine, tool_choice):
    messages = [{"role": "user", "content": "Weather in Tokyo?"}]
    for seed in range(1):
        result = qwen_templated_engine.complete(messages, SamplingParams(max_tokens=120, temperature=1.0, seed=seed),
                                                tools=[WEATHER, TIME], tool_choice=tool_choice,
                                                parallel_tool_calls=False)
        assert result.finish_reason == "tool_calls", result
        assert len(result.tool_calls) == 1
        call = result.tool_calls[0]
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.name]
        if isinstance(tool_choice, dict):
            assert call.name == "get_weather"
        jsonschema.validate(json.loads(call.arguments), tool["function"]["parameters"])


@pytest.mark.slow
def test_mistral_forced_call_with_real_tokenizer(shared_hf, tmp_path):
    """Mistral 7B v0.3's real tokenizer and template on a tiny random model: the forced call is the JSON array
    that follows [TOOL_CALLS], and its id is the 9 characters Mistral's template requires back."""
    import shutil

    import torch
    from checkpoints import hf_config
    from transformers import AutoModelForCausalLM

    source = shared_hf / "Mistral-7B-Instruct-v0.3"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(source / name, tmp_path / name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config("llama", 32768, max_position_embeddings=1024),
                                             attn_implementation="eager")
    model.save_pretrained(tmp_path)
    engine = Engine.load(tmp_path, backend="eager", dtype="float32")
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    result = engine.complete(messages, SamplingParams(max_tokens=80, temperature=1.0, seed=0), tools=[WEATHER, TIME],
                             tool_choice="required", parallel_tool_calls=False)
    assert result.finish_reason == "tool_calls", result
    call = result.tool_calls[0]
    assert len(call.id) == 9 and call.name in ("get_weather", "get_time")
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.name]
    jsonschema.validate(json.loads(call.arguments), tool["function"]["parameters"])
    # The call goes back through the template (which checks the id) with the tool's answer.
    history = [*messages, {"role": "assistant", "content": None, "tool_calls": [call.to_openai()]},
               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    assert engine.complete(history, SamplingParams(max_tokens=2), tools=[WEATHER, TIME]).stats.prompt_tokens > 0


@pytest.mark.slow
def test_phi4_mini_forced_call_and_history(tmp_path):
    """A tiny random model whose tokenizer has Phi-4-mini's turn and tool-call special tokens and its prompt
    format: a forced call is valid, goes back through the template with the tool's answer, and the prompt
    shows the model the tools."""
    import torch
    from checkpoints import hf_config, write_tokenizer
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    write_tokenizer(tmp_path)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    tokenizer.add_special_tokens(PHI4_MINI_SPECIAL)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": PHI4_MINI_TEMPLATE,
                                                                "eos_token": "<|end|>"}))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config("llama", tokenizer.get_vocab_size(),
                                                       max_position_embeddings=1024), attn_implementation="eager")
    model.save_pretrained(tmp_path)
    engine = Engine.load(tmp_path, backend="eager", dtype="float32")
    assert engine.tokenizer.chat_template.tool_format == "phi4_mini"
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = engine.tokenizer.render_chat(messages, tools=[WEATHER])
    assert prompt.startswith('<|system|><|tool|>[{"name": "get_weather"') and prompt.endswith("<|assistant|>")
    result = engine.complete(messages, SamplingParams(max_tokens=80, temperature=1.0, seed=0), tools=[WEATHER, TIME],
                             tool_choice="required", parallel_tool_calls=False)
    assert result.finish_reason == "tool_calls", result
    call = result.tool_calls[0]
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.name]
    jsonschema.validate(json.loads(call.arguments), tool["function"]["parameters"])
    history = [*messages, {"role": "assistant", "content": None, "tool_calls": [call.to_openai()]},
               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    ids = engine.make_request(history, tools=[WEATHER, TIME]).prompt_ids
    assert engine.tokenizer.special_token_ids()["<|tool_call|>"] in ids
    assert engine.complete(history, SamplingParams(max_tokens=2), tools=[WEATHER, TIME]).stats.prompt_tokens == len(ids)


@pytest.mark.parametrize("schema, words", [
    ({"not": {"type": "string"}}, "not"),  # no engine enforces it
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"allOf": [{"type": "integer"}, {"minimum": 5}]}, "allOf"),  # XGrammar's tool-call grammar would ignore it
    ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ({"type": "object", "required": ["zz"]}, "zz"),  # XGrammar would leave the undefined property out
    ({"type": "object", "properties": {"x": {"type": "integer"}}, "anyOf": [{"required": ["x"]}]}, "anyOf"),
    # A break test: XGrammar wrote the quote raw (no call came back), dropped the enum beside the $ref.
    ({"type": "string", "pattern": '^say "[a-z]{1,5}"$'}, "pattern"),
    ({"$ref": "#/$defs/s", "enum": ["red", "blue"]}, r"beside a \$ref \(enum\)"),
])
def test_forced_call_parameters_no_grammar_enforces_are_refused(schema, words):
    engine = Engine.load(None)  # the bundled model's template takes tools (Hermes syntax)
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": schema}, "required": ["a"], "additionalProperties": False,
        "$defs": {"s": {"type": "string"}}}}}
    messages = [{"role": "user", "content": "Weather?"}]
    with pytest.raises(InvalidRequestError, match=words) as info:
        engine.complete(messages, SamplingParams(max_tokens=4), tools=[tool], tool_choice="required")
    assert info.value.param == "tools"
    # Under "auto" nothing constrains the arguments (as in vLLM): the same tools are accepted.
    assert engine.complete(messages, SamplingParams(max_tokens=2), tools=[tool]).stats.prompt_tokens > 0


def test_strict_functions_under_auto_hold_calls_to_their_schemas():
    import xgrammar as xgr

    from solo.engine.tool_calls import strict_tools_constraint

    engine = Engine.load(None)  # Hermes syntax
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    bad = call.replace('"days": 2', '"days": 9')  # above the schema's maximum
    # Nothing strict: no grammar (speculative drafts and token bans stay available).
    assert strict_tools_constraint("hermes", [WEATHER, TIME], "auto") is None
    assert strict_tools_constraint("hermes", [WEATHER, TIME], "auto", parallel_tool_calls=False) is None
    for parallel, text, accepted in [(True, "Let me look. " + call, True), (True, "Let me look. " + bad, False),
                                     (True, "no call at all", True), (True, call + "\n" + call, True),
                                     (False, call + "\n" + call, False)]:
        spec = strict_tools_constraint("hermes", [strict, TIME], "auto", parallel_tool_calls=parallel)
        matcher = xgr.GrammarMatcher(engine.constraints.compile(spec).grammar)
        assert matcher.accept_string(text) is accepted, (parallel, text)
    # The request takes it as its constraint, free text still allowed (not a forced call).
    request = engine.make_request([{"role": "user", "content": "Weather?"}], tools=[strict, TIME])
    assert request.constraint is not None and not request.tool_call_forced
    # Where calls are not marked apart from free text, strict under auto is refused, not ignored.
    with pytest.raises(InvalidRequestError, match="strict") as info:
        strict_tools_constraint("llama3_json", [strict], "auto")
    assert info.value.param == "tools"
    with pytest.raises(InvalidRequestError, match="strict"):
        check_tools([{**WEATHER, "function": {**WEATHER["function"], "strict": "yes"}}], "auto",
                    "{{ tools }}<tool_call>")
    # Beside a JSON response format, one grammar holds calls or the format's JSON (the test below).
    both = engine.make_request([{"role": "user", "content": "Weather?"}], SamplingParams(
        max_tokens=8, response_format={"type": "json_object"}), tools=[strict])
    assert both.constraint.compiled.backend == "xgrammar"


def test_qwen3_coder_calls_parsed_with_typed_values():
    from solo.engine.tool_calls import tool_parameters

    assert detect_tool_format(QWEN3_CODER_TEMPLATE) == "qwen3_coder"
    # Another family's XML calls in their own wrapper (Seed-OSS's <seed:tool_call>) are not this syntax.
    assert detect_tool_format("{{ tools }}<seed:tool_call><function=f><parameter=x>") is None
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                               "hot": {"type": "boolean"}, "tags": {"type": "array"},
                                               "limit": {"anyOf": [{"type": "number"}, {"type": "null"}]}}}
    parameters = tool_parameters([{"type": "function", "function": {"name": "f", "parameters": schema}}])

    def call(name, **values):
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"

    text = ("Checking.\n" + call("f", city="3", days="3", hot="true", tags='["a", 1]', limit="null") + "\n"
            + call("g", x="7"))
    parser = ToolCallParser("qwen3_coder", {}, parameters=parameters)
    streamed = "".join(parser.feed(piece, []) for piece in text)  # one character per event
    content, calls, rest = parser.finish()
    assert streamed == "Checking.\n" and content == "Checking.\n" and rest == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("f", {"city": "3", "days": 3, "hot": True, "tags": ["a", 1], "limit": None}),  # a string stays text
        ("g", {"x": "7"})]  # no schema: text
    # A value that does not parse as its type stays text; a call cut short (max_tokens) is content.
    parser = ToolCallParser("qwen3_coder", {}, parameters=parameters)
    parser.feed(call("f", days="three") + "\n<tool_call>\n<function=f>\n<parameter=days>\n4", [])
    content, calls, rest = parser.finish()
    assert json.loads(calls[0].arguments) == {"days": "three"} and rest.startswith("\n<tool_call>")
    # Text among the parameters is not this syntax: the whole part comes back as content.
    parser = ToolCallParser("qwen3_coder", {})
    parser.feed("<tool_call>\n<function=f>\nhello\n</function>\n</tool_call>", [])
    assert parser.finish()[1] == []


def test_qwen3_coder_values_typed_by_refs_enums_and_python_literals():
    from solo.engine.tool_calls import tool_parameters

    schema = {"type": "object", "$defs": {"Loc": {"type": "object", "properties": {"lat": {"type": "number"}}}},
              "properties": {"loc": {"$ref": "#/$defs/Loc"}, "wrapped": {"allOf": [{"$ref": "#/$defs/Loc"}]},
                             "level": {"enum": [1, 2]}, "on": {"const": True}, "flag": {"type": "boolean"},
                             "n": {"type": ["integer", "null"]}, "maybe": {"anyOf": [{"type": "string"},
                                                                                     {"type": "null"}]},
                             "x": True, "big": {"type": "number"}, "free": {}}}
    parameters = tool_parameters([{"type": "function", "function": {"name": "f", "parameters": schema}}])
    values = {"loc": '{"lat": 1.5}', "wrapped": '{"lat": 2}', "level": "2", "on": "true", "flag": "True",
              "n": "None", "maybe": '"hi"', "x": "anything", "big": "1e400", "free": "3"}
    text = "<tool_call>\n<function=f>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n"
                                                   for k, v in values.items()) + "</function>\n</tool_call>"
    parser = ToolCallParser("qwen3_coder", {}, parameters=parameters)
    parser.feed(text, [])
    (call,) = parser.finish()[1]
    assert json.loads(call.arguments) == {
        "loc": {"lat": 1.5}, "wrapped": {"lat": 2}, "level": 2, "on": True, "flag": True, "n": None,
        "maybe": '"hi"',  # a string allowed: the text as written
        "x": "anything", "big": "1e400", "free": "3"}  # (no schema; not a finite number; untyped: text)


def test_qwen3_coder_tolerances_and_closing_tags_inside_values():
    def parse(text):
        parser = ToolCallParser("qwen3_coder", {})
        assert parser.feed(text, []) == ""
        return parser.finish()

    # A value holding this syntax's own closing tags (code that writes it) stays one value.
    code = "print('</parameter>')\n</function> is a tag"
    _, calls, rest = parse(f"<tool_call>\n<function=write>\n<parameter=body>\n{code}\n</parameter>\n"
                           "</function>\n</tool_call>")
    assert json.loads(calls[0].arguments) == {"body": code} and rest == ""
    # As vLLM's parser: a parameter without its </parameter>, a function without its </function>.
    _, calls, _ = parse("<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</tool_call>")
    assert json.loads(calls[0].arguments) == {"a": "1", "b": "2"}
    # The <tool_call> wrapper left out (Qwen3-Coder's models sometimes do): still a call, whole and streamed.
    bare = "Sure.\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\nDone."
    parser = ToolCallParser("qwen3_coder", {})
    streamed = "".join(parser.feed(piece, []) for piece in bare)
    content, calls, rest = parser.finish()
    assert streamed == "Sure.\n" and json.loads(calls[0].arguments) == {"a": "1"} and rest == "\nDone."
    # Prose that names the syntax without a whole element is content, all of it.
    prose = "Write <function=NAME> then its parameters."
    parser = ToolCallParser("qwen3_coder", {})
    shown = parser.feed(prose, [])
    content, calls, rest = parser.finish()
    assert (calls, content, shown + rest) == ([], prose, prose)
    # Cut short by max_tokens at any point: no call, all of it content.
    whole = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"
    function_end = whole.index("</function>") + len("</function>")
    for cut in range(1, len(whole) + 1):
        content, calls, rest = parse(whole[:cut])
        if cut < function_end:
            assert (calls, content) == ([], whole[:cut]), cut
        else:  # the function is whole: a call, whatever of its closing tag came
            assert len(calls) == 1 and content == rest == "", cut


@pytest.mark.slow
def test_qwen3_coder_forced_and_strict_calls_and_history(tmp_path):
    """A tiny random model behind Qwen3-Coder's prompt format: a forced call is valid against its schema (the
    grammar writes XML parameters), strict functions under auto hold calls to their schemas, and a call goes
    back through the template with its typed arguments."""
    import xgrammar as xgr

    from solo.engine.tool_calls import strict_tools_constraint

    folder = make_checkpoint(tmp_path / "model", max_position_embeddings=2048)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": QWEN3_CODER_TEMPLATE}))
    engine = Engine.load(folder, backend="eager", dtype="float32")
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    for seed, tool_choice in enumerate(("required", {"type": "function", "function": {"name": "get_weather"}})):
        result = engine.complete(messages, SamplingParams(max_tokens=200, temperature=1.0, seed=seed),
                                 tools=[WEATHER, TIME], tool_choice=tool_choice, parallel_tool_calls=False)
        assert result.finish_reason == "tool_calls", result
        (call,) = result.tool_calls
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.name]
        # (The grammar allows a few blanks next to the tags, which a string value keeps: only one newline each
        # side is the syntax's, as vLLM reads it. A trained model writes none.)
        arguments = {k: v.strip() if isinstance(v, str) else v for k, v in json.loads(call.arguments).items()}
        jsonschema.validate(arguments, tool["function"]["parameters"])
    history = [*messages, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "days": 2}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    prompt = engine.tokenizer.render_chat(arguments_as_objects(history), tools=[WEATHER])
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>" in prompt
    # Strict functions under auto: free text, then calls held to the schema (days at most 7).
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    good = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n" \
           "</parameter>\n</function>\n</tool_call>"
    spec = strict_tools_constraint("qwen3_coder", [strict, TIME], "auto")
    for text, accepted in (("Let me look. " + good, True), ("no call at all", True),
                           ("Let me look. " + good.replace(">\n2\n<", ">\n9\n<"), False)):
        matcher = xgr.GrammarMatcher(engine.constraints.compile(spec).grammar)
        assert matcher.accept_string(text) is accepted, text


@pytest.mark.parametrize("fmt, text", [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": 1e400}}\n</tool_call>'),
    ("llama3_json", '{"name": "f", "parameters": {"x": -Infinity}}'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": NaN}"}\n</tool_call>'),  # (as a string)
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": "{\\"x\\": 1e999}"}]'),
])
def test_arguments_that_are_not_json_are_no_call(fmt, text):
    # Python's json reads NaN, Infinity and 1e400 (inf): re-serialised, the client's arguments were not JSON.
    parser = ToolCallParser(fmt, {})
    parser.feed(text, [1])
    content, calls, _ = parser.finish()
    assert calls == [] and content == text


def test_tools_beside_a_json_format_under_auto_allow_calls_or_the_json():
    # Agent frameworks send tools and a final answer's schema together (the Agents SDK's output_type with its
    # strict function tools): that was a 400, or, with non-strict tools, a grammar that ruled calls out.
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    from solo.engine.constraints import StructuredOutput
    from solo.engine.tool_calls import output_constraint

    answer = StructuredOutput("json_schema", {"type": "object", "properties": {"answer": {"type": "string"}},
                                              "required": ["answer"], "additionalProperties": False})
    strict_weather = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    for tools, loose_call_ok in (([strict_weather], False), ([WEATHER], True)):
        spec, forced = output_constraint("hermes", tools, "auto", True, answer)
        grammar = xgr.Grammar.from_structural_tag(spec.value)
        assert not forced and _is_grammar_accept_string(grammar, '{"answer": "hi"}')
        assert _is_grammar_accept_string(grammar, call) and not _is_grammar_accept_string(grammar, "hello")
        loose = call.replace('"Paris"', '"Rome"')  # (outside the strict schema's enum)
        assert _is_grammar_accept_string(grammar, loose) is loose_call_ok
    # A forced call has no room for the format: the call's grammar alone, as OpenAI's API takes the pair.
    assert output_constraint("hermes", [WEATHER], "required", True, answer) == \
        (tool_call_constraint("hermes", [WEATHER], "required", True), True)
    # A call that starts with a special token (Mistral) cannot share one grammar with text: said, not dropped.
    with pytest.raises(InvalidRequestError, match='response_format beside tools under tool_choice "auto"') as info:
        output_constraint("mistral", [WEATHER], "auto", True, answer)
    assert info.value.param == "response_format"


@pytest.mark.parametrize("tools", [WEATHER, ["get_weather"], "get_weather", [None], [5]])
def test_tools_that_are_not_a_list_of_objects_are_named(tools):
    # (a lone tool object, names, None: a ValueError / TypeError from dict() before)
    from solo.engine.tool_calls import check_tools

    with pytest.raises(InvalidRequestError, match="tools must be a list of tool objects") as info:
        check_tools(tools, None, "{{ tools }}")
    assert info.value.param == "tools"
