"""Speculative decoding without a draft model: drafts come from text the session has already seen.

Agents' answers repeat their context (code being edited, file contents, earlier answers). When the last
few generated tokens also occur earlier, the tokens that followed there are a cheap guess for what comes
next (prompt lookup decoding, Saxena 2023; vLLM's and TensorRT-LLM's n-gram speculation; SuffixDecoding,
Oliaro et al. 2024, over earlier requests too). One forward pass (`runtime.verify`) scores the guess and
the target model keeps the longest agreeing run, plus one token of its own.

Modes:

- "ngram": the current request's prompt and output. The longest earlier match (at least `min_match`,
  at most `max_match` tokens) of the sequence's tail proposes the tokens that followed it.
- "suffix": the same over the current request and the session's earlier requests (`SessionHistory`),
  with longer matches (up to 64 tokens) counted; the draft is longer the longer the match.

A match in the sequence's own text may run off its end (the text is in a loop whose period is shorter
than the draft: a list, a repeated line, a small model's degenerate run of "#" lines): the draft then
repeats the text since the match, as the continuation of a loop would, instead of stopping after one
period (it stopped at 2 tokens per step on the bundled model's edit-loop trace, whose answers are mostly
such loops).

Drafts adapt: k grows while whole drafts are accepted and shrinks to what was accepted otherwise; after
drafts that were rejected outright, proposing pauses for a growing number of steps, so text that does
not repeat costs a dictionary lookup per token.

Acceptance (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding"; Chen et
al. 2023): with a draft distribution q and target p, a draft token x is accepted with probability
min(1, p(x) / q(x)), else the token is drawn from norm(max(0, p - q)). Here q is a point mass on the
draft token d, so d is accepted with probability p(d) and a rejection draws from p restricted to tokens
other than d. Drawing x ~ p with the request's own sampler and accepting iff x == d has exactly that
law, and that is how it runs (`speculative_step`): every emitted token is the sampler's own choice from
the target logits at its position (greedy: the argmax), so greedy output equals plain decoding and
sampled output keeps the target distribution (penalties, seeds and any logits processing included).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from solo.engine.request import GenerationEvent, Request
from solo.errors import SoloError
from solo.runtime.base import DecodeRuntime, supports_verify

SPECULATIVE_MODES = ("auto", "off", "ngram", "suffix")
"""Values of `--speculative`: auto (see `resolve_speculative`), off, ngram or suffix."""


def resolve_speculative(mode: str, runtime: DecodeRuntime) -> str:
    """The speculative mode to run for a requested one.

    "auto" becomes "ngram" on runtimes that declare `speculative_auto` (the native CPU runtime: its verify
    is the decode kernel over k positions, measured faster on the agent traces in benchmarks/results/, and
    a dictionary lookup per token when nothing matches), else "off": the eager runtime is the reference
    rather than a speed path, and GPU block decoding was not measured against it. Greedy output equals
    plain decoding bit for bit where `verify_matches_decode` (the CPU runtime, every weight format); where
    it does not hold a near-tied token can flip.

    Raises:
        SoloError: an unknown mode, or a speculative mode asked of a runtime without `verify`.
    """
    if mode not in SPECULATIVE_MODES:
        raise SoloError(f"unknown speculative mode {mode!r}; choose one of {', '.join(SPECULATIVE_MODES)}")
    if mode == "auto":
        return "ngram" if supports_verify(runtime) and getattr(runtime, "speculative_auto", False) else "off"
    if mode != "off" and not supports_verify(runtime):
        raise SoloError(f"--speculative {mode} needs a runtime with multi-token verify; the "
                        f"{getattr(runtime, 'name', '?')} runtime has none; use --speculative off")
    return mode


@dataclass(frozen=True)
class SpeculativeConfig:
    """How drafts are proposed.

    Attributes:
        mode: "ngram" or "suffix".
        min_match: fewest tokens of the sequence's tail that must match to propose.
        max_match: longest match measured (longer ones count as this long).
        max_draft: most tokens proposed per step.
        start_draft: the first draft's length (k adapts from there).
    """

    mode: str = "ngram"
    min_match: int = 2
    max_match: int = 4
    max_draft: int = 16
    start_draft: int = 4

    @classmethod
    def for_mode(cls, mode: str) -> SpeculativeConfig | None:
        """The settings of a resolved mode ("off" -> None)."""
        if mode == "off":
            return None
        if mode == "suffix":
            return cls(mode="suffix", min_match=2, max_match=64, max_draft=16, start_draft=4)
        return cls()


class TokenIndex:
    """Token ids with an index from every `key_len`-gram to the positions right after it.

    Args:
        key_len: n-gram length indexed.
        tokens: initial ids.
    """

    def __init__(self, key_len: int, tokens: Sequence[int] = ()) -> None:
        self.key_len = key_len
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], list[int]] = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ids and index the n-grams they complete."""
        n, toks = self.key_len, self.tokens
        for t in tokens:
            toks.append(int(t))
            if len(toks) >= n:
                self.after.setdefault(tuple(toks[-n:]), []).append(len(toks))

    def __len__(self) -> int:
        return len(self.tokens)


def _match(source: TokenIndex, tail: list[int], max_match: int, exclude_end: int | None
           ) -> tuple[int, int]:
    """(match length, position after it) of the longest earlier occurrence of `tail`'s end in `source`."""
    key = tuple(tail[-source.key_len:])
    ends = source.after.get(key)
    if not ends:
        return 0, -1
    best_len, best_pos = 0, -1
    toks = source.tokens
    for end in reversed(ends[-8:]):  # the most recent occurrences
        if end == exclude_end or end >= len(toks):  # the tail itself, or nothing after it
            continue
        n = source.key_len
        while n < max_match and n < len(tail) and end - n - 1 >= 0 and toks[end - n - 1] == tail[-n - 1]:
            n += 1
        if n > best_len:
            best_len, best_pos = n, end
    return best_len, best_pos


class SessionHistory:
    """The session's recent sequences (prompt + output), indexed for "suffix" drafts.

    A sequence that extends a kept one replaces it (an agent's next prompt contains its previous turns).

    Args:
        key_len: n-gram length indexed.
        max_tokens: tokens kept in all (oldest sequences dropped first).
    """

    def __init__(self, key_len: int = 2, max_tokens: int = 1 << 18) -> None:
        self.key_len = key_len
        self.max_tokens = max_tokens
        self.sequences: deque[TokenIndex] = deque()

    def add(self, ids: Sequence[int]) -> None:
        """Keep a finished sequence."""
        ids = list(ids)
        if len(ids) < self.key_len:
            return
        self.sequences = deque(s for s in self.sequences
                               if not (len(s) <= len(ids) and s.tokens == ids[:len(s)]))
        self.sequences.append(TokenIndex(self.key_len, ids))
        while sum(len(s) for s in self.sequences) > self.max_tokens and len(self.sequences) > 1:
            self.sequences.popleft()


class DraftProposer:
    """Proposes draft tokens for one request from its own tokens (and the session's, in "suffix" mode).

    Args:
        config: the proposal settings.
        request: the request drafted for (its prompt and output ids are read at each proposal).
        history: earlier sequences ("suffix" mode), or None.
    """

    def __init__(self, config: SpeculativeConfig, request: Request, history: SessionHistory | None = None) -> None:
        self.config = config
        self.request = request
        self.history = history if config.mode == "suffix" else None
        self.index: TokenIndex | None = None  # built at the first proposal, after the first token is out
        self.k = config.start_draft
        self._pause = 0
        self._misses = 0

    def _sync(self) -> TokenIndex:
        r = self.request
        if self.index is None:
            self.index = TokenIndex(self.config.min_match, r.prompt_ids)
        done = len(self.index) - len(r.prompt_ids)
        if done < len(r.output_ids):
            self.index.extend(r.output_ids[done:])
        return self.index

    def propose(self, budget: int) -> list[int]:
        """Up to min(k, budget) draft tokens to follow the request's last token ([] when nothing matches)."""
        index = self._sync()
        if budget <= 0:
            return []
        if self._pause > 0:
            self._pause -= 1
            return []
        cfg = self.config
        tail = index.tokens[-cfg.max_match:]
        if len(tail) < cfg.min_match:
            return []
        best_len, best_pos, best_src = _match(index, tail, cfg.max_match, len(index)) + (index,)
        if self.history is not None:
            for seq in reversed(self.history.sequences):
                n, pos = _match(seq, tail, cfg.max_match, None)
                if n > best_len:
                    best_len, best_pos, best_src = n, pos, seq
        if best_len < cfg.min_match:
            return []
        k = min(self.k, budget)
        if cfg.mode == "suffix":
            k = min(k, max(2, best_len))  # a longer match earns a longer draft (SuffixDecoding)
        draft = best_src.tokens[best_pos:best_pos + k]
        if best_src is index:
            # A match in the sequence's own recent text can run off its end: the text since the match is a
            # period that the prediction repeats (token len + i follows the one at best_pos + i, itself a
            # draft token once past the end). Without this a loop with period p drafts only p tokens.
            period = len(index) - best_pos
            while len(draft) < k:
                draft.append(draft[len(draft) - period])
        return draft

    def record(self, drafted: int, accepted: int) -> None:
        """Adapt k to a verify step's outcome: `accepted` of `drafted` draft tokens were kept."""
        cfg = self.config
        if accepted == drafted:
            self.k = min(cfg.max_draft, self.k * 2)
        else:
            self.k = max(1, accepted + 1)
        if accepted == 0:
            self._misses += 1
            self._pause = min(1 << self._misses, 32) if self._misses >= 2 else 0
        else:
            self._misses = 0


def propose_draft(request: Request, proposer: DraftProposer) -> list[int]:
    """The draft for a request's next step: up to k tokens, leaving room for the target's own token.

    Returns:
        Draft token ids ([] when nothing matches or the budget is spent: the step is a plain decode).
    """
    budget = request.max_new_tokens - len(request.output_ids) - 1  # room for the target's own token
    return proposer.propose(budget)


def accept_draft(request: Request, proposer: DraftProposer, draft: list[int], logits: torch.Tensor
                 ) -> list[GenerationEvent]:
    """Emit the tokens a verify pass over [last token, *draft] yields, and adapt the proposer.

    Args:
        request: the request (its last token and the draft were fed at its next position onward).
        proposer: the request's draft proposer (told how many draft tokens were accepted).
        draft: the d draft tokens verified.
        logits: float32 [d + 1, vocab]: row i predicts the token after the i-th token fed.

    Returns:
        The events of the tokens emitted (at least one: every accepted draft token and the target's own
        next token, cut at EOS, a stop string or max_tokens).
    """
    events: list[GenerationEvent] = []
    accepted = 0
    # Plain greedy (no penalties, logprobs, constraint or logits processors): `choose` is the argmax of each row,
    # so one argmax over all rows gives the same tokens (the first maximum, as torch.argmax of one row).
    argmax = (logits.argmax(dim=-1).tolist() if request.sampling.greedy and not request.needs_host_logits
              else None)
    for i in range(len(draft) + 1):
        token, info = (argmax[i], None) if argmax is not None else request.choose(logits[i])
        events.append(request.append(token, info))
        if request.finished or i == len(draft) or token != draft[i]:
            break
        accepted += 1
    proposer.record(len(draft), accepted)
    stats = request.stats
    stats.verify_steps += 1
    stats.draft_tokens += len(draft)
    stats.accepted_tokens += accepted
    return events


def speculative_step(runtime: DecodeRuntime, row: int, request: Request, proposer: DraftProposer,
                     last_token: int) -> list[GenerationEvent] | None:
    """One draft-and-verify step of a request whose `last_token` is not yet in the KV cache.

    `propose_draft`, one `runtime.verify` call on the request's row, then `accept_draft`. (The server's
    scheduler runs the same two halves around one `decode_spans` call for all its rows.)

    Args:
        runtime: a runtime with `verify`.
        row: the request's cache row.
        request: the request (its next position is where `last_token` goes).
        proposer: the request's draft proposer.
        last_token: the newest generated token (fed together with the draft).

    Returns:
        The events of the tokens emitted (see `accept_draft`), or None when there is no draft (the caller
        runs a plain decode step).
    """
    draft = propose_draft(request, proposer)
    if not draft:
        return None
    logits = runtime.verify(row, torch.tensor([last_token, *draft], dtype=torch.long), request.next_position - 1)
    return accept_draft(request, proposer, draft, logits)
