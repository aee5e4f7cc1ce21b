"""One reply's output read as it streams: a thinking model's reasoning block split off, then tool calls parsed.

The server's chat route and `Engine.complete` read replies the same way: the `<think>` block first
(`solo.engine.reasoning`), then tool calls from what follows it only (`solo.engine.tool_calls`), so a call the
model merely wrote while thinking is never run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from solo.engine.reasoning import ReasoningParser
from solo.engine.tool_calls import ToolCall, ToolCallParser


def splits_reasoning(thinks: bool, constrained_source: str | None, forced: bool) -> bool:
    """Whether a reply's reasoning block is split off.

    Args:
        thinks: the model writes a reasoning block (`solo.engine.reasoning.detect_reasoning`).
        constrained_source: the output grammar's source ("tools" for strict functions under tool_choice auto,
            another name for a response_format), or None without one.
        forced: the output is constrained to tool calls.

    A grammar holds the output from its first token, so nothing is split under one, except the strict
    functions' grammar under auto, which leaves the text around calls free.
    """
    return thinks and (constrained_source is None or (not forced and constrained_source == "tools"))


class OutputReader:
    """Splits one reply into reasoning, content and tool calls, streamed or whole.

    Args:
        reasoning: the reasoning splitter, or None when the reply is not split.
        tools: the tool-call parser, or None when the reply holds no calls.
    """

    def __init__(self, reasoning: ReasoningParser | None, tools: ToolCallParser | None) -> None:
        self.reasoning, self.tools = reasoning, tools
        self.reasoning_tokens = 0  # tokens of the block, its markers included (usage's reasoning_tokens)
        self.raw_content = ""  # the output after the block, before tool calls were taken out

    @classmethod
    def for_reply(cls, tool_format: str | None, special_token_ids: Mapping[str, int], forced: bool = False,
                  parameters: Mapping[str, Mapping[str, Any]] | None = None, split: bool = False,
                  in_reasoning: bool = False) -> OutputReader:
        """A reader for one reply.

        Args:
            tool_format: the tool-call syntax (`ToolCallParser`), or None when the reply holds no calls.
            special_token_ids: the tokenizer's special tokens (text -> id).
            forced, parameters: as `ToolCallParser` takes them.
            split: a thinking model's block is split off (`splits_reasoning`).
            in_reasoning: the prompt opened the block (the output starts inside it).
        """
        tools = None if tool_format is None else ToolCallParser(tool_format, special_token_ids, forced=forced,
                                                                parameters=parameters)
        return cls(ReasoningParser(in_reasoning) if split else None, tools)

    def feed(self, text: str, token_ids: Sequence[int]) -> tuple[str, str]:
        """Take one event's text and tokens; returns the (reasoning, content) deltas that can be sent now."""
        reasoning = ""
        if self.reasoning is not None:
            inside = self.reasoning.in_block
            reasoning, text = self.reasoning.feed(text)
            if inside or reasoning or self.reasoning.in_block:
                self.reasoning_tokens += len(token_ids)
                if not text:
                    token_ids = ()  # all reasoning: a call marker among its tokens was written while thinking
        self.raw_content += text
        if self.tools is not None:
            text = self.tools.feed(text, token_ids)
        return reasoning, text

    def finish(self) -> tuple[str, str, list[ToolCall]]:
        """End of output: (reasoning, content) held back until now, and the tool calls."""
        reasoning, before, calls, after = self.finish_in_order()
        return reasoning, before + after, calls

    def finish_in_order(self) -> tuple[str, str, list[ToolCall], str]:
        """End of output in the reply's order: held-back reasoning and content before the calls, the calls, after.

        Returns:
            (reasoning, content before the calls) held back until now, the tool calls, then the content after
            them (text between and after calls, a call cut short); with no calls, all content comes before.
        """
        reasoning, content = self.reasoning.finish() if self.reasoning is not None else ("", "")
        self.raw_content += content
        if self.tools is None:
            return reasoning, content, [], ""
        before = self.tools.feed(content, []) if content else ""
        _, calls, rest = self.tools.finish()
        if not calls:
            return reasoning, before + rest, [], ""
        lead = self.tools.lead
        return reasoning, before + lead, calls, rest[len(lead):]
