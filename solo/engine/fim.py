"""Fill-in-the-middle (FIM): a code model writes what goes between a prefix and a suffix.

Copilots complete code inside a file, not only at its end: they send the text before the cursor and the text
after it, and the model, trained with FIM (Bavarian et al. 2022, "Efficient Training of Language Models to
Fill in the Middle"), writes the middle. The prompt is the prefix-suffix-middle layout of its FIM tokens:
`PRE prefix SUF suffix MID`, and the model writes the middle, then one of its end tokens.

The format is found from the vocabulary, as llama.cpp finds its FIM tokens: the first of `FIM_FORMATS` whose
three markers are all tokens of the model. OpenAI's completions `suffix`, Ollama's generate `suffix` and
`Engine.complete(prefix, suffix=...)` use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FimFormat:
    """A model family's FIM tokens.

    Attributes:
        name: the family's name.
        prefix, suffix, middle: the markers written before the prefix, the suffix and the middle.
        ends: tokens that end a middle besides the model's EOS (padding and file separators the model may
            write after it), where the vocabulary has them.
    """

    name: str
    prefix: str
    suffix: str
    middle: str
    ends: tuple[str, ...] = ()

    def prompt(self, prefix: str, suffix: str) -> str:
        """The prompt text whose continuation is the middle (prefix-suffix-middle order)."""
        return f"{self.prefix}{prefix}{self.suffix}{suffix}{self.middle}"


FIM_FORMATS = (
    # Qwen2.5-Coder, Qwen3-Coder, CodeGemma
    FimFormat("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
              ("<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|endoftext|>", "<|file_separator|>")),
    # StarCoder, StarCoder2, SantaCoder, Granite Code
    FimFormat("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
              ("<fim_pad>", "<file_sep>", "<|endoftext|>")),
    # DeepSeek-Coder
    FimFormat("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", ("<|EOT|>", "<｜end▁of▁sentence｜>")),
)


@dataclass(frozen=True)
class Fim:
    """A model's FIM format, the ids of its end tokens and of its middle marker (see `detect_fim`).

    `end_ids` also holds the three markers: a middle never contains one, and a model writing one starts
    another FIM layout (where the vocabulary keeps them as plain added tokens, as Qwen's does, they would
    show in the text).
    """

    format: FimFormat
    end_ids: tuple[int, ...]
    middle_id: int


def detect_fim(token_id: Callable[[str], int | None]) -> Fim | None:
    """The model's FIM format, or None when its vocabulary has no complete set of FIM markers.

    Args:
        token_id: a token's text -> its id, or None when the vocabulary lacks it (added tokens included).
    """
    for fmt in FIM_FORMATS:
        markers = [token_id(marker) for marker in (fmt.prefix, fmt.suffix, fmt.middle)]
        if all(i is not None for i in markers):
            ends = tuple(dict.fromkeys(i for i in [*map(token_id, fmt.ends), *markers] if i is not None))
            return Fim(fmt, ends, markers[2])  # type: ignore[arg-type]
    return None
