"""Log-probabilities in OpenAI's two shapes, and the text and bytes of single tokens.

A token's `bytes` are its exact UTF-8 bytes, so a client can rebuild text even when one character spans
several tokens (OpenAI returns them for that reason). They are recovered from the vocabulary entry:
byte-level BPE (GPT-2, Llama 3, Qwen) maps each byte to a printable character, which is inverted here;
SentencePiece byte-fallback tokens are spelled `<0xHH>`, and its word-boundary marker U+2581 is a space.
A token's `token` string is those bytes decoded as UTF-8 (an incomplete character becomes U+FFFD).
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from functools import lru_cache

from solo.engine.request import TokenLogprob
from solo.server.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from solo.tokenizer import BYTE_FALLBACK_TOKEN, Tokenizer

_SENTENCEPIECE_SPACE = "\u2581"
_MIN_LOGPROB = -9999.0  # what OpenAI reports for a token with zero probability; JSON has no -inf


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    # Byte-level BPE's reversible byte -> character table (Radford et al., GPT-2, 2019): printable
    # Latin-1 bytes stand for themselves; the other 68 bytes map to code points from 256 on, in order.
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class TokenPieces:
    """Text and UTF-8 bytes of single token ids (cached).

    Args:
        tokenizer: the model's tokenizer.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._byte_level = "ByteLevel" in tokenizer.decoder_types()
        self._added = {i: t.content for i, t in tokenizer.backend.get_added_tokens_decoder().items()}
        self._cache: dict[int, tuple[str, bytes]] = {}

    def _bytes(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        piece = self.tokenizer.backend.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level:
            table = _byte_level_alphabet()
            return b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in piece)
        if match := BYTE_FALLBACK_TOKEN.match(piece):
            return bytes([int(match.group(1), 16)])
        return piece.replace(_SENTENCEPIECE_SPACE, " ").encode("utf-8")

    def get(self, token_id: int) -> tuple[str, bytes]:
        """(text, UTF-8 bytes) of one token; an incomplete character shows as U+FFFD in the text."""
        cached = self._cache.get(token_id)
        if cached is None:
            raw = self._bytes(token_id)
            cached = self._cache[token_id] = (raw.decode("utf-8", errors="replace"), raw)
        return cached


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _MIN_LOGPROB


def chat_logprobs(pieces: TokenPieces, infos: Sequence[TokenLogprob]) -> ChatLogprobs:
    """Chat-shaped logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""
    content = []
    for info in infos:
        text, raw = pieces.get(info.token_id)
        top = []
        for token_id, logprob in info.top:
            top_text, top_raw = pieces.get(token_id)
            top.append(TopLogprob(token=top_text, logprob=_finite(logprob), bytes=list(top_raw)))
        content.append(ChatTokenLogprob(token=text, logprob=_finite(info.logprob), bytes=list(raw), top_logprobs=top))
    return ChatLogprobs(content=content)


class CompletionLogprobsBuilder:
    """Completions-shaped logprobs of one choice, built event by event.

    `text_offset` counts characters of the choice's returned text: a token that ends inside a character
    (byte-level BPE splits multi-byte characters) adds nothing until the token that completes it, as the
    text itself is streamed. Each token's `top_logprobs` holds its sampled token besides the top ones (up
    to logprobs + 1 entries, as OpenAI and vLLM return them).

    Args:
        pieces: token text lookup.
        text_offset: character offset of the first token (the echoed prompt's length, else 0).
        skipped_ids: tokens the returned text leaves out (its special tokens, with `skip_special_tokens`): they
            add nothing to the offsets.
    """

    def __init__(self, pieces: TokenPieces, text_offset: int = 0, skipped_ids: frozenset[int] = frozenset()) -> None:
        self.pieces = pieces
        self.text_offset = text_offset
        self.skipped_ids = skipped_ids
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, infos: Sequence[TokenLogprob]) -> CompletionLogprobs:
        """The next tokens' logprobs (their offsets follow the tokens added before)."""
        tokens, logprobs, tops, offsets = [], [], [], []
        for info in infos:
            text, raw = self.pieces.get(info.token_id)
            tokens.append(text)
            logprobs.append(_finite(info.logprob))
            top = {self.pieces.get(t)[0]: _finite(lp) for t, lp in info.top}
            top.setdefault(text, _finite(info.logprob))
            tops.append(top)
            offsets.append(self.text_offset)
            if info.token_id not in self.skipped_ids:
                self.text_offset += len(self._utf8.decode(raw))
        return CompletionLogprobs(tokens=tokens, token_logprobs=logprobs, top_logprobs=tops, text_offset=offsets)


def completion_logprobs(pieces: TokenPieces, infos: Sequence[TokenLogprob], text_offset: int = 0,
                        skipped_ids: frozenset[int] = frozenset()) -> CompletionLogprobs:
    """Completions-shaped logprobs for one choice's consecutive tokens (see `CompletionLogprobsBuilder`).

    Args:
        pieces: token text lookup.
        infos: the tokens' log-probabilities, in order.
        text_offset: character offset of the first token in the choice's returned text.
        skipped_ids: tokens the returned text leaves out.
    """
    return CompletionLogprobsBuilder(pieces, text_offset, skipped_ids).add(infos)
