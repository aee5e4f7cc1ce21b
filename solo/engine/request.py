"""One generation request's state: sampling, stop checks, streaming text, timings.

The single-request loop in `Engine` and the server's continuous-batching scheduler both drive requests
through the same `Request` object, so a request behaves the same alone or beside others.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from solo.engine.constraints import TokenConstraint
from solo.engine.detokenizer import IncrementalDetokenizer
from solo.engine.logits_processors import LogitsProcessors
from solo.engine.sampling import ResolvedSampling, TokenSampler
from solo.engine.stopping import StopStringMatcher
from solo.tokenizer import Tokenizer

_request_counter = itertools.count()


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one generated token under the model (before sampling transforms).

    Attributes:
        token_id: the generated token.
        logprob: its natural-log probability.
        top: the most likely tokens at that step as (token_id, logprob), best first.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class GenerationStats:
    """Timings and counts of one generation.

    Attributes:
        prompt_tokens: tokens in the prompt.
        completion_tokens: tokens generated (an EOS token included).
        ttft_s: time to first token, seconds from the start of the request.
        token_times_s: for each generated token, seconds since the previous one (the first: since the start).
        total_s: seconds from the start to the last token.
        cached_tokens: prompt tokens whose KV came from the prefix cache (not prefilled).
        verify_steps: speculative draft-and-verify steps run.
        draft_tokens: draft tokens proposed in them.
        accepted_tokens: draft tokens the model accepted.
        queue_s: server only: seconds from the start until the request got a KV-cache row (None elsewhere).
        prefill_start_s: server only: seconds from the start until its first prefill chunk began (after the
            queue, the scheduler step in progress and the prefills ahead of it); TTFT - this = its own
            prefill (and the choice of its first token).
    """

    prompt_tokens: int
    completion_tokens: int = 0
    ttft_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    total_s: float = 0.0
    cached_tokens: int = 0
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    queue_s: float | None = None
    prefill_start_s: float | None = None

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens emitted per speculative verify step (accepted drafts + the model's own), or None."""
        if not self.verify_steps:
            return None
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Decode speed after the first token, in tokens per second (None with fewer than 2 tokens)."""
        decode_s = sum(self.token_times_s[1:])
        if len(self.token_times_s) < 2 or decode_s <= 0:
            return None
        return (len(self.token_times_s) - 1) / decode_s

    @property
    def mean_itl_s(self) -> float | None:
        """Mean inter-token latency (TPOT) in seconds, or None with fewer than 2 tokens."""
        tps = self.decode_tokens_per_s
        return None if tps is None else 1.0 / tps


@dataclass
class GenerationEvent:
    """One streamed step of a generation.

    Attributes:
        text: new text since the previous event (may be "" while a character or a possible stop string
            is held back).
        token_ids: token ids generated since the previous event.
        finish_reason: None until the last event, then "stop" (EOS or stop string) or "length".
        logprobs: per new token, its log-probabilities (when requested), else None.
        stats: set on the last event.
        stop_reason: on a "stop" event, what stopped it besides the model's EOS (vLLM's field): the matched
            stop string, or the id of a `stop_token_ids` token (a stop string that is a special token: that
            string); None for EOS, a grammar's end or another reason.
    """

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    stats: GenerationStats | None = None
    stop_reason: str | int | None = None


@dataclass
class GenerationResult:
    """A finished generation.

    Attributes:
        text: the generated text (stop strings excluded).
        token_ids: generated token ids.
        finish_reason: "stop", "length", or "tool_calls" (tools were given and the output ended with calls).
        stats: timings and counts.
        prompt_token_ids: the prompt as the model saw it.
        logprobs: per generated token, when requested.
        tool_calls: tool calls parsed from the output (`solo.engine.tool_calls.ToolCall`), when tools were given.
        stop_reason: the stop string or stop token id that ended it (see `GenerationEvent.stop_reason`).
        reasoning_content: a thinking model's reasoning block (chat messages only; markers left out), as the
            server's reasoning_content; None when the output has none (or an empty one). `text` keeps the block
            as written.
        content: the reply without its reasoning block (and without its tool calls), as the server's message
            content; `text` itself where nothing was split off.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats
    prompt_token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list | None = None
    stop_reason: str | int | None = None
    reasoning_content: str | None = None
    content: str = ""


class Request:
    """State of one generation from prefill to finish.

    Args:
        prompt_ids: prompt token ids.
        sampling: resolved sampling values.
        max_new_tokens: stop with "length" after this many tokens.
        eos_ids: token ids that end generation with "stop" (empty when EOS is ignored).
        stop: stop strings.
        tokenizer: for streaming text.
        vocab_size: logits width.
        logprobs: None, or the number of top alternatives to report per token.
        device: device of the logits.
        start_time: `time.perf_counter()` at arrival (TTFT counts from here); now when None.
        constraint: the output grammar's matcher (structured output), or None.
        include_stop_str: keep a matched stop string at the end of the text.
        logits_processors: token bans and biases (`solo.engine.logits_processors`), or None.
        skip_special_tokens: leave special tokens out of the text.
    """

    def __init__(
        self,
        prompt_ids: list[int],
        sampling: ResolvedSampling,
        max_new_tokens: int,
        eos_ids: set[int],
        stop: list[str],
        tokenizer: Tokenizer,
        vocab_size: int,
        logprobs: int | None = None,
        device: torch.device | str = "cpu",
        start_time: float | None = None,
        constraint: TokenConstraint | None = None,
        include_stop_str: bool = False,
        logits_processors: LogitsProcessors | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self.request_id = next(_request_counter)
        self.prompt_ids = list(prompt_ids)
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self.eos_ids = eos_ids
        self.sampler = TokenSampler(sampling, self.prompt_ids, vocab_size, device)
        self.detokenizer = IncrementalDetokenizer(tokenizer, self.prompt_ids, skip_special_tokens)
        self.stop_matcher = StopStringMatcher(stop, include_stop_str)
        self.logprobs = logprobs
        self.output_ids: list[int] = []
        self.finish_reason: str | None = None
        self.start_time = time.perf_counter() if start_time is None else start_time
        self._last_time = self.start_time
        self.stats = GenerationStats(prompt_tokens=len(self.prompt_ids))
        self.constraint = constraint
        self.logits_processors = logits_processors if logits_processors is not None and logits_processors.active \
            else None
        self._min_tokens = 0 if self.logits_processors is None else self.logits_processors.min_tokens
        self.stop_token_reasons: dict[int, str | int] = {}  # a user's stop token -> its `stop_reason` (make_request)
        self.stop_reason: str | int | None = None
        self.tool_call_format: str | None = None  # set by Engine.make_request when the output may hold tool calls
        self.tool_call_forced = False  # the output is constrained to tool calls
        self.parallel_tool_calls = True  # several calls in a reply (parallel_tool_calls, unless the template takes one)
        self.tool_parameters: dict[str, dict] | None = None  # function name -> parameters schema (typed XML values)
        self.reasoning_split = False  # set by Engine.make_request: a thinking model's block is split off
        self.in_reasoning = False  # ... and the prompt opened it (the output starts inside it)

    @property
    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None

    @property
    def next_position(self) -> int:
        """Position of the next token fed to the model (prompt plus generated so far)."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def needs_host_logits(self) -> bool:
        """True when every token needs `choose` on the host (no device sampling, no batched argmax).

        That is, with penalties, log-probabilities, an output constraint or logits processors.
        """
        return (self.sampling.needs_penalties or self.logprobs is not None or self.constraint is not None
                or self.logits_processors is not None)

    def choose(self, logits: torch.Tensor) -> tuple[int, TokenLogprob | None]:
        """Pick the next token.

        The logits processors (bans, biases) and then an output constraint's mask change `logits` in place
        before sampling; a token that is the only one the constraint allows is taken without sampling.

        Args:
            logits: float32 [vocab] raw logits at the last position (modified in place by the logits processors
                and a constraint).

        Returns:
            (token id, its log-probabilities when requested): natural-log log_softmax of the raw logits
            (before penalties, warpers and the constraint's mask), with the `logprobs` most likely alternatives.
        """
        logp = torch.log_softmax(logits, dim=-1) if self.logprobs is not None else None
        if self.logits_processors is not None:
            self.logits_processors.apply(logits, self.output_ids)
        forced = self.constraint.apply(logits) if self.constraint is not None else None
        token = self.sampler.sample(logits) if forced is None else forced
        info = None
        if logp is not None:
            top = torch.topk(logp, self.logprobs) if self.logprobs > 0 else None
            info = TokenLogprob(
                token_id=token,
                logprob=float(logp[token]),
                # (ties in id order, as the argmax takes the first: the greedy token heads its own tie)
                top=() if top is None else tuple(sorted(
                    ((int(i), float(v)) for v, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)),
                    key=lambda pair: (-pair[1], pair[0]))),
            )
        return token, info

    def restart_clock(self) -> None:
        """Count TTFT (and the first token's time) from now: the request starts being served only now."""
        self.start_time = self._last_time = time.perf_counter()

    def append(self, token: int, info: TokenLogprob | None = None, now: float | None = None) -> GenerationEvent:
        """Record a generated token; returns the event to stream (finish_reason set when it ends).

        Args:
            token: the generated token id.
            info: its log-probabilities, when requested.
            now: `time.perf_counter()` seconds when the token was ready (default: now).
        """
        now = time.perf_counter() if now is None else now
        self.stats.token_times_s.append(now - self._last_time)
        if self.stats.ttft_s is None:
            self.stats.ttft_s = now - self.start_time
        self._last_time = now
        self.output_ids.append(token)
        self.sampler.observe(token)
        self.stats.completion_tokens = len(self.output_ids)
        if self.constraint is not None and token not in self.eos_ids:
            self.constraint.accept(token)
        text = ""
        armed = len(self.output_ids) > self._min_tokens  # stop strings may end the output (min_tokens)
        if token in self.eos_ids:
            self.finish_reason = "stop"
            self.stop_reason = self.stop_token_reasons.get(token)
            if self.stop_matcher.include:  # vLLM keeps the stop token's text then (empty for a skipped special token)
                text = self.stop_matcher.feed(self.detokenizer.add([token]), armed=False)
        else:
            text = self.stop_matcher.feed(self.detokenizer.add([token]), armed=armed)
            if self.stop_matcher.stopped or self.constraint is not None and self.constraint.terminated:
                self.finish_reason = "stop"
            elif len(self.output_ids) >= self.max_new_tokens:
                self.finish_reason = "length"
        if self.finish_reason is not None and not self.stop_matcher.stopped:
            text += self.stop_matcher.feed(self.detokenizer.flush(), armed=armed)
            if self.stop_matcher.stopped:
                self.finish_reason = "stop"
            else:
                text += self.stop_matcher.flush()
        if self.stop_matcher.stopped:
            self.stop_reason = self.stop_matcher.matched
        event = GenerationEvent(text=text, token_ids=[token], finish_reason=self.finish_reason,
                                logprobs=None if info is None else [info], stop_reason=self.stop_reason)
        if self.finish_reason is not None:
            self.stats.total_s = now - self.start_time
            event.stats = self.stats
        return event

    def abort(self, reason: str = "abort") -> None:
        """End the request early (client gone); no further tokens are produced."""
        if self.finish_reason is None:
            self.finish_reason = reason
