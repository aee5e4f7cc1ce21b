"""Reasoning output: a thinking model's <think> block split from the content, whole and streamed in any pieces,
with the block opened by the output (Qwen3) or by the prompt (DeepSeek-R1's templates), and before tool calls."""

from __future__ import annotations

import json

import pytest

from solo.chat_template import ChatTemplate
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
    from solo.server.routes import _ChoiceReader

    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    output = "<think>I could write <tool_call> here.</think>\n\n" + call
    reader = _ChoiceReader(ReasoningParser(), ToolCallParser("hermes", {}))
    fed = [reader.feed(output[i:i + 5], []) for i in range(0, len(output), 5)]
    reasoning, content, calls = reader.finish()
    assert "".join(r for r, _ in fed) + reasoning == "I could write <tool_call> here."
    assert "".join(c for _, c in fed) + content == "\n\n"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {"zone": "CET"})]


def test_reasoning_tokens_are_the_blocks():
    # usage's reasoning_tokens: every token of the block, its markers included, none of the answer's.
    from solo.server.routes import _ChoiceReader

    reader = _ChoiceReader(ReasoningParser(), None)
    for text, ids in (("<think>", [1]), ("abc", [2]), ("</think>", [3]), ("\n\nIt is", [4, 5]), (" 4.", [6])):
        reader.feed(text, ids)
    assert reader.reasoning_tokens == 3
    opened = _ChoiceReader(ReasoningParser(in_reasoning=True), None)
    for text, ids in (("so 4", [1, 2]), ("</think>4", [3, 4])):
        opened.feed(text, ids)
    assert opened.reasoning_tokens == 4  # the event that closes the block is counted whole
