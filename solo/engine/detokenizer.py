"""Incremental detokenization for streaming: text deltas that never split a UTF-8 character.

Decoding token by token breaks on byte-fallback and byte-level tokenizers (one character may span several
tokens) and on SentencePiece's leading-space handling. As in vLLM and text-generation-inference, each
step decodes a short window of recent tokens twice (with and without the new ones) and emits the
difference, holding text back while it ends in an incomplete character (U+FFFD). A token-id prompt that ends
inside a character (a client continuing a cut generation) leaves that character to the token completing it.
"""

from __future__ import annotations

from collections.abc import Sequence

from solo.tokenizer import BYTE_FALLBACK_TOKEN, Tokenizer

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
        start, end = max(0, len(prompt_ids) - _CONTEXT_TOKENS), len(prompt_ids)
        lowest = max(0, start - 3)
        fallback = _byte_fallback_values(tokenizer, prompt_ids[lowest:])
        if fallback is not None:
            # SentencePiece's byte fallback decodes a run of byte tokens as a whole, and one byte that does not
            # fit (a continuation byte without its lead, a lead without its continuation) turns the whole run,
            # complete characters too, into U+FFFD. So the context starts at a character's first byte, and a
            # character the prompt leaves incomplete (a token-id prompt cut inside one) is left unread: the
            # token that completes it emits it whole.
            while start > lowest and _is_continuation(fallback[start - lowest]):
                start -= 1
            end -= _incomplete_tail(fallback)
        self.ids: list[int] = list(prompt_ids[start:])
        self.prefix_offset = 0
        self.read_offset = end - start
        self._unread_prompt = len(prompt_ids) - end  # (an incomplete character's byte tokens, until text comes)

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def _added_text(self, new_text: str) -> str:
        # The text the unread tokens add to the context's; `new_text`: the decoded context and unread tokens.
        prefix_text = self._decode(self.prefix_offset, self.read_offset)
        if self._unread_prompt:
            with_prompt = self._decode(self.prefix_offset, self.read_offset + self._unread_prompt)
            if new_text.startswith(with_prompt):  # nothing completed the prompt's character: its bytes stay its own
                prefix_text = with_prompt
        return _delta(prefix_text, new_text)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the text they complete (possibly "" while a character is incomplete)."""
        self.ids.extend(token_ids)
        new_text = self._decode(self.prefix_offset)
        delta = "" if new_text.endswith(_REPLACEMENT) else self._added_text(new_text)
        if delta:
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self._unread_prompt = 0
        return delta

    def flush(self) -> str:
        """Text still held back at the end of generation (an incomplete character decodes as U+FFFD)."""
        delta = self._added_text(self._decode(self.prefix_offset))
        self.prefix_offset = self.read_offset = len(self.ids)
        self._unread_prompt = 0
        return delta


def _delta(prefix_text: str, new_text: str) -> str:
    # The text new tokens add after the context's. Where the context (a token-id prompt) ends inside a character,
    # a byte-level tokenizer's text ends in a U+FFFD placeholder that the token completing the character turns
    # into that character: the delta starts where the two texts part, so it holds the completed character, as
    # vLLM's DecodeStream gives it (sliced at the old length, the character was lost). (A shorter text, a
    # skipped special token's, adds nothing.)
    if new_text.startswith(prefix_text) or not prefix_text.endswith(_REPLACEMENT):
        return new_text[len(prefix_text):]
    common = 0
    while common < min(len(prefix_text), len(new_text)) and prefix_text[common] == new_text[common]:
        common += 1
    return new_text[common:]


def _byte_fallback_values(tokenizer: Tokenizer, ids: Sequence[int]) -> list[int | None] | None:
    # Each id's byte where it is a byte-fallback token (<0xE2>), else None; None for a tokenizer without them.
    if "ByteFallback" not in tokenizer.decoder_types():
        return None
    return [int(m.group(1), 16) if (m := BYTE_FALLBACK_TOKEN.match(tokenizer.token_string(i))) else None for i in ids]


def _is_continuation(value: int | None) -> bool:
    return value is not None and 0x80 <= value < 0xC0


def _incomplete_tail(values: list[int | None]) -> int:
    # How many of the last byte tokens start a UTF-8 character without finishing it (0 when none do).
    continuations = 0
    while continuations < min(3, len(values)) and _is_continuation(values[-1 - continuations]):
        continuations += 1
    if continuations == len(values):
        return 0
    lead = values[-1 - continuations]
    if lead is None or lead < 0xC0:
        return 0
    length = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4 if lead < 0xF8 else 1
    return continuations + 1 if length > continuations + 1 else 0
