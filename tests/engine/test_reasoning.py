"""Reasoning output: a thinking model's <think> block split from the content, whole and streamed in any pieces,
with the block opened by the output (Qwen3) or by the prompt (DeepSeek-R1's templates), and before tool calls."""

from __future__ import annotations

import json

import pytest

from solo.chat_template import ChatTemplate
from solo.engine.output_reader import OutputReader
from solo.engine.reasoning import ReasoningParser, detect_reasoning, prompt_opens_reasoning, split_reasoning

CASES = [
    # (output, prompt opened the block, reasoning, content)
    ("<think>\nLet me see.\n</think>\n\nIt is 4.", False, "\nLet me see.\n", "\n\nIt is 4."),
    ("\n<think>a</think>b", False, "a", "b"),
    ("It is 4.", False, None, "It is 4."),  # no block: all content (Qwen3 with enable_thinking false)
    ("<thinking> is a tag", False, None, "<thinking> is a tag"),
    ("<think>cut short by max_tok", False, "cut short by max_tok", ""),  # a block cut short: all reasoning
    ("so 2 + 2 = 4</think>\n\nIt is 4.", True, "so 2 + 2 = 4", "\n\nIt is 4."),  # opened by the prompt
    ("still thinking", True, "still thinking", ""),
    ("<think>abc</think>ans", True, "abc", "ans"),  # inside a block already, the opening tag written anyway
    ("<think>x</think>a <think>b</think>", False, "x", "a <think>b</think>"),  # one block, at the start
]


@pytest.mark.parametrize("output, opened, reasoning, content", CASES)
def test_split_whole_and_in_every_piece_size(output, opened, reasoning, content):
    assert split_reasoning(output, opened) == (reasoning, content)
    for size in (1, 2, 3, 7):
        parser = ReasoningParser(opened)
        pieces = [parser.feed(output[i:i + size]) for i in range(0, len(output), size)] + [parser.finish()]
        assert "".join(r for r, _ in pieces) == (reasoning or "")
        assert "".join(c for _, c in pieces) == content
        assert parser.opened is (reasoning is not None)


def test_a_marker_split_over_pieces_is_held_not_leaked():
    parser = ReasoningParser()
    assert parser.feed("<thi") == ("", "")
    assert parser.feed("nk>abc</th") == ("abc", "")
    assert parser.feed("ink>\n\nAnswer") == ("", "\n\nAnswer")


def test_detection_from_real_templates(shared_hf):
    from solo.tokenizer import _chat_template_source, _read_json

    folder = shared_hf / "Qwen3-0.6B"
    source = _chat_template_source(folder, _read_json(folder / "tokenizer_config.json"))
    assert detect_reasoning(source) and not detect_reasoning(source, "none")
    qwen25 = shared_hf / "Qwen2.5-Instruct"
    assert not detect_reasoning(_chat_template_source(qwen25, _read_json(qwen25 / "tokenizer_config.json")))
    assert detect_reasoning(None, "deepseek_r1")
    with pytest.raises(ValueError, match="reasoning parser"):
        detect_reasoning(source, "r1")
    # Qwen3 writes <think> in its output; with enable_thinking false its template writes an empty block into
    # the prompt: neither leaves the prompt inside a block.
    template = ChatTemplate(source, {"eos_token": "<|im_end|>"})
    messages = [{"role": "user", "content": "2 + 2?"}]
    for thinking in (True, False):
        prompt = template.render(messages, enable_thinking=thinking)
        assert not prompt_opens_reasoning(prompt)
        assert ("<think>" in prompt) is not thinking
    assert prompt_opens_reasoning("<｜Assistant｜><think>\n")


def test_reasoning_then_a_tool_call():
    # The hermes parser reads the content after the block: thinking about a call does not make one.
    from solo.engine.tool_calls import ToolCallParser

    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    output = "<think>I could write <tool_call> here.</think>\n\n" + call
    reader = OutputReader(ReasoningParser(), ToolCallParser("hermes", {}))
    fed = [reader.feed(output[i:i + 5], []) for i in range(0, len(output), 5)]
    reasoning, content, calls = reader.finish()
    assert "".join(r for r, _ in fed) + reasoning == "I could write <tool_call> here."
    assert "".join(c for _, c in fed) + content == "\n\n"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {"zone": "CET"})]



@pytest.mark.parametrize("lead", ["Sure.", "Use {x} or <y>."])
@pytest.mark.parametrize("lead_in_marker_event", [False, True])
def test_the_end_of_a_reply_comes_in_its_order_content_calls_then_the_text_after(lead_in_marker_event, lead):
    """A stream sends what preceded the calls, the calls, then what followed them (a second call cut short);
    content in the marker's event ahead of it is kept whole, braces and all."""
    from solo.engine.tool_calls import ToolCallParser

    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    cut = '\n<tool_call>\n{"name": "get_ti'
    special = {"<tool_call>": 99}
    reader = OutputReader(None, ToolCallParser("hermes", special))
    if lead_in_marker_event:  # one event holds the lead and the marker token (a speculative step)
        streamed = reader.feed(lead + call + cut, [5, 99, 7])[1]
    else:
        streamed = reader.feed(lead, [5])[1] + reader.feed(call + cut, [99, 7])[1]
    reasoning, before, calls, after = reader.finish_in_order()
    assert reasoning == "" and streamed + before == lead
    assert [c.name for c in calls] == ["get_time"] and after == cut


@pytest.mark.parametrize("fmt, marker", [("mistral", "[TOOL_CALLS]"), ("phi4_mini", "<|tool_call|>")])
def test_a_marker_token_after_the_block_closed_still_starts_a_call(fmt, marker):
    # One token per event: the marker decodes to nothing after </think>; it was taken for reasoning and dropped.
    reader = OutputReader.for_reply(fmt, {marker: 5}, split=True)
    events = [("<think>", [1]), ("hm", [2]), ("</think>", [3]), ("", [5]),
              ('[{"name": "f", "arguments": {"a": 1}}]', [9])]
    streamed = "".join(reader.feed(text, ids)[1] for text, ids in events)
    reasoning, before, calls, after = reader.finish_in_order()
    assert streamed + before + after == "" and [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}')]

def test_reasoning_tokens_are_the_blocks():
    # usage's reasoning_tokens: every token of the block, its markers included, none of the answer's.
    reader = OutputReader(ReasoningParser(), None)
    for text, ids in (("<think>", [1]), ("abc", [2]), ("</think>", [3]), ("\n\nIt is", [4, 5]), (" 4.", [6])):
        reader.feed(text, ids)
    assert reader.reasoning_tokens == 3
    opened = OutputReader(ReasoningParser(in_reasoning=True), None)
    for text, ids in (("so 4", [1, 2]), ("</think>4", [3, 4])):
        opened.feed(text, ids)
    assert opened.reasoning_tokens == 4  # the event that closes the block is counted whole


# DeepSeek-R1's shape: the generation prompt opens a <think> block; tools shown in Hermes syntax.
R1_TEMPLATE = ("{% if tools %}Call tools as <tool_call>{...}</tool_call>: {{ tools | tojson }}{% endif %}"
               "{% for m in messages %}{% if m['role'] == 'assistant' %}<|Assistant|>"
               "{{ m['content'].split('</think>')[-1] }}<|end|>"
               "{% else %}<|User|>{{ m['content'] }}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}")
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def r1_engine(tmp_path_factory):
    from checkpoints import make_checkpoint

    from solo import Engine

    folder = make_checkpoint(tmp_path_factory.mktemp("r1") / "model", max_position_embeddings=512)
    return Engine.load(folder, backend="eager", dtype="float32", chat_template=R1_TEMPLATE)


def test_complete_splits_reasoning_as_the_server(r1_engine):
    # Engine.complete gives a thinking model's block as reasoning_content (text keeps it as written); a random
    # model never closes the block its prompt opened, so all of it is reasoning.
    ask = [{"role": "user", "content": "def f"}]
    result = r1_engine.complete(ask, {"max_tokens": 8, "temperature": 0})
    assert result.reasoning_content == result.text and result.text and result.content == ""
    plain = r1_engine.complete("def f", {"max_tokens": 8, "temperature": 0})  # no chat: nothing split
    assert plain.reasoning_content is None and plain.content == plain.text
    # An output grammar holds the output from its first token: nothing is split (as the server).
    constrained = r1_engine.complete(ask, {"max_tokens": 8, "response_format": {"type": "regex", "regex": "[ab]{3}"}})
    assert constrained.reasoning_content is None and constrained.content == constrained.text


def test_complete_reads_tool_calls_after_the_block_only(r1_engine, monkeypatch):
    # A call written while thinking is reasoning, never a call to run; the one after the block is parsed, and
    # text keeps the block as written and what is left of the content.
    from solo.engine.request import GenerationEvent, GenerationStats

    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    for output, calls in ((f"I could {call} here.</think>\n\n{call}", 1), (f"I could {call}</think>\n\nNo.", 0)):
        pieces = [output[i:i + 7] for i in range(0, len(output), 7)]
        events = [GenerationEvent(text=p, token_ids=[5]) for p in pieces[:-1]]
        events.append(GenerationEvent(text=pieces[-1], token_ids=[5], finish_reason="stop",
                                      stats=GenerationStats(prompt_tokens=3)))
        monkeypatch.setattr(r1_engine, "run", lambda request, events=events: iter(events))
        result = r1_engine.complete([{"role": "user", "content": "time?"}], {"max_tokens": 64}, tools=[TOOL])
        assert result.reasoning_content == f"I could {call}" + (" here." if calls else "")
        assert len(result.tool_calls or []) == calls
        assert result.finish_reason == ("tool_calls" if calls else "stop")
        assert result.text == (output[:-len(call)] if calls else output)
        assert result.content == ("\n\n" if calls else "\n\nNo.")
    # An empty block is no reasoning (None, as the server sends it); the answer after it is the content.
    events = [GenerationEvent(text="</think>", token_ids=[5]),
              GenerationEvent(text="It is 4.", token_ids=[6], finish_reason="stop", stats=GenerationStats(1))]
    monkeypatch.setattr(r1_engine, "run", lambda request: iter(events))
    result = r1_engine.complete([{"role": "user", "content": "2 + 2?"}], {"max_tokens": 64})
    assert result.reasoning_content is None and result.content == "It is 4." and result.text == "</think>It is 4."


def test_a_continued_prefill_that_opens_a_block_is_reasoning(r1_engine):
    # Engine.complete(continue_final_message=True) continues the last message (vLLM's LLM.chat flag); a prefill
    # opening <think> is continued as reasoning, as the server continues it.
    prefill = [{"role": "user", "content": "def f"}, {"role": "assistant", "content": "<think>\nLet me"}]
    result = r1_engine.complete(prefill, {"max_tokens": 6, "temperature": 0}, continue_final_message=True)
    assert result.reasoning_content == result.text and result.content == ""
