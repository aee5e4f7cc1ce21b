"""Incremental detokenization for streaming: text deltas that never split a UTF-8 character.

Decoding token by token breaks on byte-fallback and byte-level tokenizers (one character may span several
tokens) and on SentencePiece's leading-space handling. As in vLLM and text-generation-inference, each
step decodes a short window of recent tokens twice (with and without the new ones) and emits the
difference, holding text back while it ends in an incomplete character (U+FFFD).
"""

from __future__ import annotations

from collections.abc import Sequence

from solo.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
# Prompt tokens decoded as left context, so the first generated token keeps its leading space.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Args:
        tokenizer: the model's tokenizer.
        prompt_ids: the prompt's ids (only its last few are used as decoding context).
        skip_special_tokens: leave special tokens (EOS, chat markers) out of the text.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the text they complete (possibly "" while a character is incomplete)."""
        self.ids.extend(token_ids)
        prefix_text = self._decode(self.prefix_offset, self.read_offset)
        new_text = self._decode(self.prefix_offset)
        delta = "" if new_text.endswith(_REPLACEMENT) else _delta(prefix_text, new_text)
        if delta:
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
        return delta

    def flush(self) -> str:
        """Text still held back at the end of generation (an incomplete character decodes as U+FFFD)."""
        prefix_text = self._decode(self.prefix_offset, self.read_offset)
        new_text = self._decode(self.prefix_offset)
        self.prefix_offset = self.read_offset = len(self.ids)
        return _delta(prefix_text, new_text)


def _delta(prefix_text: str, new_text: str) -> str:
    # The text new tokens add after the context's. Where the context (a token-id prompt) ends inside a character,
    # its text ends in U+FFFD placeholders (one per byte for byte-fallback tokenizers) that the token completing
    # the character turns into that one character: the delta starts where the placeholders did and holds the
    # completed character, as vLLM's DecodeStream gives it (sliced at the old length, the character and, for
    # byte fallback, as many characters after it as it had bytes less one were lost).
    # (A shorter text, a skipped special token's, adds nothing.)
    if new_text.startswith(prefix_text) or not prefix_text.endswith(_REPLACEMENT):
        return new_text[len(prefix_text):]
    return new_text[len(prefix_text.rstrip(_REPLACEMENT)):]
