"""Logits processors that ban or bias tokens before sampling.

vLLM's `allowed_token_ids`, `bad_words` and `min_tokens`, OpenAI's `logit_bias`. They act on one
request's raw logits before the penalties, the temperature and the warpers of `solo.engine.sampling`, in
vLLM's order (its V1 sampler: allowed token ids, bad words, then min_tokens and logit bias, then
penalties). A request that uses any of them needs its logits on the host at every token, so it takes the
per-token path (no block decoding on the device, no batched argmax shortcut): `Request.needs_host_logits`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from solo.errors import InvalidRequestError
from solo.tokenizer import Tokenizer


def bad_word_token_ids(bad_words: Sequence[str], tokenizer: Tokenizer) -> list[list[int]]:
    """The token id sequences that spell each bad word, as vLLM derives them.

    A word is tokenized as written (its leading whitespace stripped) and with one leading space, since
    most tokenizers spell a word differently at the start of the text and after a space; the spaced form
    is kept when its first token differs and it has as many tokens (it is the same word, not a split).

    Args:
        bad_words: non-empty strings.
        tokenizer: the model's tokenizer.

    Returns:
        Token id sequences (each non-empty), in order.
    """
    sequences: list[list[int]] = []
    for word in bad_words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if plain:
            sequences.append(plain)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            sequences.append(spaced)
    return sequences


class LogitsProcessors:
    """One request's token bans and biases, applied in place to its raw logits.

    Args:
        vocab_size: logits width.
        stop_ids: the ids that end the request (EOS unless ignored, `stop_token_ids`, special-token stop
            strings): banned while fewer than `min_tokens` tokens have been generated.
        min_tokens: see above; 0 disables.
        logit_bias: {token id: bias} added to the logits (OpenAI's `logit_bias`).
        allowed_token_ids: the only ids that may be generated, or None.
        bad_word_ids: token id sequences never generated: the last token of a sequence is banned when the
            output ends with the tokens before it (a one-token sequence is always banned).
        device: device of the logits.

    Raises:
        InvalidRequestError: an id outside [0, vocab_size) (the message names the field), or bans that
            leave no token to generate.
    """

    def __init__(self, vocab_size: int, stop_ids: Iterable[int] = (), min_tokens: int = 0,
                 logit_bias: dict[int, float] | None = None, allowed_token_ids: Sequence[int] | None = None,
                 bad_word_ids: Sequence[Sequence[int]] = (), device: torch.device | str = "cpu") -> None:
        for name, ids in (("logit_bias", list(logit_bias or ())), ("allowed_token_ids", allowed_token_ids or ())):
            outside = [t for t in ids if not 0 <= t < vocab_size]
            if outside:
                raise InvalidRequestError(
                    f"{name} holds token id {outside[0]}, outside this model's vocabulary [0, {vocab_size})",
                    param=name)
        self.min_tokens = min_tokens
        self._device = torch.device(device)
        self._stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device) if min_tokens else None
        self._bias_ids = self._bias_values = None
        if logit_bias:
            self._bias_ids = torch.tensor(list(logit_bias), dtype=torch.long, device=device)
            self._bias_values = torch.tensor(list(logit_bias.values()), dtype=torch.float32, device=device)
        self._stop_set = set(stop_ids)
        self._always = sorted({seq[-1] for seq in bad_word_ids if len(seq) == 1})
        # Multi-token bad words by the length of the tokens before their last one, then by those tokens: a token
        # costs one lookup per length, however many words (20,000 of them slowed every other request 6x).
        self._tails: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for seq in bad_word_ids:
            if len(seq) > 1:
                self._tails.setdefault(len(seq) - 1, {}).setdefault(tuple(seq[:-1]), []).append(seq[-1])
        self._banned: torch.Tensor | None = None  # bool [vocab]: outside allowed_token_ids
        self._allowed_left: set[int] | None = None  # allowed_token_ids less the one-token bad words
        if allowed_token_ids is not None:
            allowed = set(allowed_token_ids)
            self._banned = torch.ones(vocab_size, dtype=torch.bool, device=device)
            self._banned[torch.tensor(sorted(allowed), dtype=torch.long, device=device)] = False
            self._allowed_left = allowed - set(self._always)
            if not self._allowed_left:
                raise InvalidRequestError("bad_words bans every token of allowed_token_ids: nothing could be "
                                          "generated", param="bad_words")
            if min_tokens and not self._allowed_left - self._stop_set:
                raise InvalidRequestError(
                    "allowed_token_ids holds only tokens that end the output, which min_tokens bans: nothing "
                    "could be generated; allow other tokens or leave min_tokens out", param="min_tokens")

    def _move(self, device: torch.device) -> None:
        # The logits may live elsewhere than the runtime (a CPU sampler for a GPU runtime's logits).
        for name in ("_stop_ids", "_bias_ids", "_bias_values", "_banned"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        self._device = device

    @property
    def active(self) -> bool:
        """True when any processor can change a logit."""
        return bool(self.min_tokens or self._bias_ids is not None or self._banned is not None or self._always
                    or self._tails)

    def apply(self, logits: torch.Tensor, output_ids: Sequence[int]) -> None:
        """Ban and bias tokens in place.

        Args:
            logits: float32 [vocab] raw logits of the next token (modified in place).
            output_ids: the tokens generated so far (bad words and min_tokens look at them).
        """
        with torch.inference_mode():  # the runtimes' logits are inference tensors
            self._apply(logits, output_ids)

    def _apply(self, logits: torch.Tensor, output_ids: Sequence[int]) -> None:
        neg_inf = float("-inf")
        if logits.device != self._device:
            self._move(logits.device)
        if self._banned is not None:
            logits.masked_fill_(self._banned, neg_inf)
        early = self._stop_ids is not None and len(output_ids) < self.min_tokens
        n = len(output_ids)
        completing = [last for length, words in self._tails.items() if n >= length
                      for last in words.get(tuple(output_ids[n - length:]), ())]
        if completing and self._allowed_left is not None and not (
                self._allowed_left - set(completing) - (self._stop_set if early else set())):
            # These bans would leave no token allowed_token_ids permits: a multi-token bad word gives way for
            # this one token rather than the request sampling from nothing.
            completing = []
        banned = self._always + completing
        if banned:
            logits[banned] = neg_inf
        if early and self._stop_ids.numel():
            logits[self._stop_ids] = neg_inf
        if self._bias_ids is not None:
            logits.index_add_(0, self._bias_ids, self._bias_values)
