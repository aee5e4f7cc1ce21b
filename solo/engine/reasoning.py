"""Reasoning output: a thinking model's `<think> ... </think>` block, split from the reply's content.

Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3 and other thinking models write their reasoning between
`<think>` and `</think>` before the answer. As vLLM's reasoning parsers (`--reasoning-parser qwen3`,
`deepseek_r1`) do, the server returns that text as the message's `reasoning_content` and the rest as its
`content`, streamed or whole, so an agent reads the answer (and its tool calls) without the thinking.

The reasoning starts either in the output (`<think>` first, as Qwen3 writes it) or in the prompt: templates
of DeepSeek-R1's family end the generation prompt with `<think>`, so the output begins inside the block and
only `</think>` ends it. Output without the block is all content (Qwen3 with `enable_thinking: false`,
whose template writes an empty block into the prompt). A block cut short by `max_tokens` is all reasoning.
"""

from __future__ import annotations

from solo.engine.tool_calls import partial_suffix

THINK_START, THINK_END = "<think>", "</think>"

REASONING_PARSERS = ("auto", "none", "qwen3", "deepseek_r1")
"""`--reasoning-parser` values: "auto" splits `<think>` blocks when the chat template writes them, "none" never;
vLLM's "qwen3" and "deepseek_r1" split them whatever the template; with "deepseek_r1" the output starts inside
the block whether or not the prompt opened it (DeepSeek-R1's replies may lack the opening tag), as vLLM's."""


def detect_reasoning(template_source: str | None, parser: str = "auto") -> bool:
    """Whether chat replies are split into reasoning and content.

    Args:
        template_source: the model's chat template, or None.
        parser: one of `REASONING_PARSERS`.

    Raises:
        ValueError: an unknown parser name.
    """
    if parser not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {parser!r}; choose one of {', '.join(REASONING_PARSERS)}")
    if parser == "none":
        return False
    if parser != "auto":
        return True
    return template_source is not None and THINK_END in template_source


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """Whether a rendered chat prompt ends inside an open `<think>` block (DeepSeek-R1's templates)."""
    start = prompt_text.rfind(THINK_START)
    return start >= 0 and THINK_END not in prompt_text[start:] and not prompt_text[start + len(THINK_START):].strip()


def prompt_closes_reasoning(prompt_text: str) -> bool:
    """Whether a rendered chat prompt ends with a closed `<think>` block.

    Qwen3's template with thinking off writes an empty one: the output starts after the reasoning, whatever
    the parser assumes.
    """
    return prompt_text.rstrip().endswith(THINK_END)


def has_thinking_switch(template_source: str | None) -> bool:
    """Whether a chat template reads `enable_thinking` (Qwen3's, SmolLM3's): thinking can be turned off."""
    from solo.chat_template import template_variables

    return template_source is not None and "enable_thinking" in template_variables(template_source)


def continues_reasoning(content: str) -> bool:
    """Whether a message the model continues (a prefill) ends inside a `<think>` block it opened."""
    start = content.rfind(THINK_START)
    return start >= 0 and THINK_END not in content[start:]


class ReasoningParser:
    """Splits one choice's output into reasoning and content as it streams.

    `feed(text)` returns the (reasoning, content) that can be sent now; text that may be the start of a
    marker is held back until the next piece settles it; `finish()` returns what was held.

    Args:
        in_reasoning: the prompt opened the block (`prompt_opens_reasoning`): the output starts inside it.
    """

    def __init__(self, in_reasoning: bool = False) -> None:
        self.opened = in_reasoning  # a reasoning block began (in the prompt or the output)
        self._state = "start"  # then "reasoning", then "content"
        self._held = ""
        self.reasoning = ""  # everything returned as reasoning so far
        self.content = ""  # everything returned as content so far

    @property
    def in_block(self) -> bool:
        """True while the output is inside the reasoning block."""
        return self._state == "reasoning" or (self._state == "start" and self.opened)

    def feed(self, text: str) -> tuple[str, str]:
        """Take the next piece of output; returns (reasoning delta, content delta)."""
        reasoning, content = "", ""
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._state == "start":  # (opened by the prompt, an opening marker written anyway is skipped)
                stripped = buffer.lstrip()
                if stripped.startswith(THINK_START):
                    self._state, buffer, self.opened = "reasoning", stripped[len(THINK_START):], True
                elif THINK_START.startswith(stripped):  # blanks, or a marker not complete yet
                    self._held = buffer
                    buffer = ""
                else:
                    self._state = "reasoning" if self.opened else "content"
            elif self._state == "reasoning":
                end = buffer.find(THINK_END)
                if end >= 0:
                    reasoning += buffer[:end]
                    self._state, buffer = "content", buffer[end + len(THINK_END):]
                else:
                    keep = partial_suffix(buffer, THINK_END)
                    reasoning += buffer[:len(buffer) - keep]
                    self._held = buffer[len(buffer) - keep:]
                    buffer = ""
            else:
                content += buffer
                buffer = ""
        self.reasoning += reasoning
        self.content += content
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """End of output: the held-back text, as (reasoning, content)."""
        held, self._held = self._held, ""
        if self.in_block:
            self.reasoning += held
            return held, ""
        self.content += held
        return "", held


def split_reasoning(text: str, in_reasoning: bool = False) -> tuple[str | None, str]:
    """A whole output as (reasoning, or None when there is no block; content)."""
    parser = ReasoningParser(in_reasoning)
    parser.feed(text)
    parser.finish()
    return (parser.reasoning if parser.opened else None), parser.content
