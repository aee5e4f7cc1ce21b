"""Speculative decoding from n-gram / suffix drafts: greedy identical to plain decoding, sampling unbiased."""

from __future__ import annotations

import math

import pytest
import torch

from solo.engine.engine import Engine
from solo.engine.request import Request
from solo.engine.sampling import SamplingParams
from solo.engine.speculative import (
    DraftProposer,
    SessionHistory,
    SpeculativeConfig,
    TokenIndex,
    resolve_speculative,
    speculative_step,
)
from solo.errors import SoloError
from solo.model.default_model import default_model_path
from solo.model.generation_config import GenerationDefaults
from solo.tokenizer import Tokenizer

# The bundled model (float32) repeats code from its context, as real models do: drafts get accepted.
# (Random tiny checkpoints produce text that never repeats.)
PROMPT = (
    "def dumps(obj, *, skipkeys=False, ensure_ascii=True, check_circular=True,\n"
    "        allow_nan=True, cls=None, indent=None, separators=None,\n"
    "        default=None, sort_keys=False, **kw):\n"
    "    if cls is None:\n        cls = JSONEncoder\n"
    "    return cls(\n        skipkeys=skipkeys, ensure_ascii=ensure_ascii,\n"
    "        check_circular=check_circular, allow_nan=allow_nan, indent=indent,\n"
    "        separators=separators, default=default, sort_keys=sort_keys,\n"
    "        **kw).encode(obj)\n\n\n# The same function, unchanged:\n"
)


TINY_PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"
GREEDY = dict(temperature=0.0, repetition_penalty=1.0, ignore_eos=True)
_ENGINES: dict[tuple, Engine] = {}


def _engines(folder, backend, modes=("off", "ngram", "suffix")):
    # One engine per (model, backend, mode) for the whole module: loading is much of these tests' time.
    for m in modes:
        if (folder, backend, m) not in _ENGINES:
            _ENGINES[folder, backend, m] = Engine.load(folder, dtype="float32", backend=backend,
                                                       prefix_cache_gb=None, speculative=m)
    return {m: _ENGINES[folder, backend, m] for m in modes}


def test_greedy_output_identical_to_plain_decoding_on_a_real_model():
    engines = _engines(None, "cpu")
    params = SamplingParams(max_tokens=48, **GREEDY)
    plain = engines["off"].complete(PROMPT, params)
    assert plain.stats.verify_steps == 0
    for mode in ("ngram", "suffix"):
        spec = engines[mode].complete(PROMPT, params)
        assert spec.token_ids == plain.token_ids and spec.text == plain.text
        assert spec.stats.verify_steps > 0 and spec.stats.acceptance_length > 1.5, mode
        assert spec.stats.completion_tokens == len(plain.token_ids)


@pytest.mark.parametrize("backend", ["eager", "cpu"])
def test_greedy_output_identical_to_plain_decoding(tiny_llama, backend):
    # A random tiny model's text never repeats, so n-gram drafts are rare; "suffix" drafts from the
    # session's earlier requests, so the second run of a prompt is drafted (almost) entirely.
    engines = _engines(tiny_llama, backend)
    params = SamplingParams(max_tokens=40, **GREEDY)
    plain = engines["off"].complete(TINY_PROMPT, params)
    for mode in ("ngram", "suffix", "suffix"):
        spec = engines[mode].complete(TINY_PROMPT, params)
        assert spec.token_ids == plain.token_ids and spec.text == plain.text
    assert spec.stats.acceptance_length > 4


@pytest.mark.parametrize("backend", ["eager", "cpu"])
def test_stops_inside_an_accepted_run_are_honoured(tiny_llama, backend):
    engines = _engines(tiny_llama, backend, ("off", "suffix"))
    free = engines["off"].complete(TINY_PROMPT, SamplingParams(max_tokens=40, **GREEDY))
    engines["suffix"].complete(TINY_PROMPT, SamplingParams(max_tokens=40, **GREEDY))  # into the session history
    ids = free.token_ids
    stop_id = next(t for i, t in enumerate(ids) if i >= 15 and t not in ids[:i])
    stop_text = engines["off"].tokenizer.decode(ids[25:27])
    cases = [
        SamplingParams(max_tokens=29, **GREEDY),  # max_tokens mid-run
        SamplingParams(max_tokens=40, stop_token_ids=[stop_id], **GREEDY),  # a stop id
        SamplingParams(max_tokens=40, stop=[stop_text], **GREEDY),  # a stop string
    ]
    for params in cases:
        plain = engines["off"].complete(TINY_PROMPT, params)
        spec = engines["suffix"].complete(TINY_PROMPT, params)
        assert (spec.token_ids, spec.text, spec.finish_reason) == (plain.token_ids, plain.text, plain.finish_reason)
        assert spec.stats.accepted_tokens > 10


def test_sampled_output_with_the_same_seed_is_identical_on_the_cpu_runtime(tiny_llama):
    # Every emitted token is the request's own sampler's draw from the target logits, and the CPU runtime's
    # verify logits are bit-identical to its decode logits: a seed gives the same text either way, penalties
    # included.
    engines = _engines(tiny_llama, "cpu", ("off", "suffix"))
    params = SamplingParams(max_tokens=40, temperature=0.8, top_k=50, repetition_penalty=1.1, seed=3,
                            ignore_eos=True)
    plain = engines["off"].complete(TINY_PROMPT, params)
    engines["suffix"].complete(TINY_PROMPT, params)
    spec = engines["suffix"].complete(TINY_PROMPT, params)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted_tokens > 10


class _FixedRuntime:
    # Logits that depend on nothing: every position's target distribution is softmax(LOGITS).
    name = "fixed"
    device = torch.device("cpu")
    LOGITS = torch.tensor([1.0, 0.5, 0.0, -1.0])

    def verify(self, row, token_ids, start_pos):  # noqa: ANN001, ANN201
        return self.LOGITS.expand(token_ids.numel(), -1).clone()


class _FixedDraft:
    # Always proposes "0 1", whatever the context.
    def propose(self, budget):  # noqa: ANN001, ANN201
        return [0, 1][:budget]

    def record(self, drafted, accepted):  # noqa: ANN001, ANN201
        pass


def test_rejection_sampling_keeps_the_target_distribution():
    # Drafts that ignore the target: the first emitted token must still follow p, the draft "0" must be
    # accepted with probability p[0], and the token after an accepted "0" must again follow p (chi-square).
    tokenizer = Tokenizer.from_folder(default_model_path())
    p = torch.softmax(_FixedRuntime.LOGITS, -1)
    trials = 2000
    first, after_zero = torch.zeros(4), torch.zeros(4)
    for seed in range(trials):
        sampling = SamplingParams(temperature=1.0, seed=seed).resolve(GenerationDefaults())
        request = Request([3, 2], sampling, max_new_tokens=4, eos_ids=set(), stop=[], tokenizer=tokenizer,
                          vocab_size=4)
        request.append(2)  # the token chosen from the prefill logits
        events = speculative_step(_FixedRuntime(), 0, request, _FixedDraft(), last_token=2)
        emitted = [t for e in events for t in e.token_ids]
        assert request.stats.draft_tokens == 2 and request.stats.accepted_tokens == len(emitted) - 1
        first[emitted[0]] += 1
        if emitted[0] == 0:
            after_zero[emitted[1]] += 1

    def chi2(counts: torch.Tensor) -> float:
        n = float(counts.sum())
        return float((((counts - n * p) ** 2) / (n * p)).sum())

    assert chi2(first) < 16.3, first / trials  # df = 3, p-value 0.001
    assert chi2(after_zero) < 16.3, after_zero / after_zero.sum()
    rate = float(first[0]) / trials
    assert abs(rate - float(p[0])) < 4 * math.sqrt(float(p[0] * (1 - p[0])) / trials)


def test_proposals_come_from_the_longest_recent_match_and_adapt():
    index = TokenIndex(2, [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2])
    assert index.after[(1, 2)] == [2, 7, 12]
    config = SpeculativeConfig(min_match=2, max_match=4, max_draft=8, start_draft=4)

    class _R:  # the request fields a proposer reads
        prompt_ids = [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 8, 2, 3]
        output_ids: list[int] = []

    proposer = DraftProposer(config, _R())  # type: ignore[arg-type]
    # Tail "2 3" occurs after "1 2 3" twice; the most recent (followed by 5 7) wins.
    assert proposer.propose(10) == [5, 7, 8, 2]
    proposer.record(4, 4)
    assert proposer.k == 8
    proposer.record(8, 1)
    assert proposer.k == 2
    proposer.record(2, 0)
    proposer.record(2, 0)
    assert proposer.propose(10) == []  # paused after drafts rejected outright


def test_a_loop_in_the_sequence_itself_drafts_past_its_end():
    class _R:
        prompt_ids = [5, 6, 7, 8, 7, 8, 7, 8]
        output_ids: list[int] = []

    config = SpeculativeConfig(min_match=2, max_match=4, max_draft=16, start_draft=4)
    # "7 8" last occurred 2 tokens back: the text since then (7 8) is a period the draft repeats.
    assert DraftProposer(config, _R()).propose(10) == [7, 8, 7, 8]  # type: ignore[arg-type]
    assert DraftProposer(config, _R()).propose(3) == [7, 8, 7]  # type: ignore[arg-type]


def test_suffix_mode_drafts_from_earlier_requests():
    history = SessionHistory()
    history.add([10, 11, 12, 13, 14, 15, 16, 17])

    class _R:
        prompt_ids = [1, 2, 12, 13]
        output_ids: list[int] = []

    proposer = DraftProposer(SpeculativeConfig.for_mode("suffix"), _R(), history)  # type: ignore[arg-type]
    assert proposer.propose(3) == [14, 15]  # k is capped by the match length (2) at first
    ngram = DraftProposer(SpeculativeConfig.for_mode("ngram"), _R(), history)  # type: ignore[arg-type]
    assert ngram.propose(3) == []  # n-gram mode looks at the request itself only


def test_modes_resolve_honestly(tiny_llama):
    cpu = Engine.load(tiny_llama, dtype="float32", backend="cpu", prefix_cache_gb=None)
    eager = Engine.load(tiny_llama, dtype="float32", backend="eager", prefix_cache_gb=None)
    assert cpu.speculative == "ngram" and eager.speculative == "off"  # auto: on where output never changes
    assert resolve_speculative("suffix", eager.runtime) == "suffix"
    with pytest.raises(SoloError, match="unknown speculative mode"):
        Engine.load(tiny_llama, speculative="medusa")
