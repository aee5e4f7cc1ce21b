"""Token bans and biases: OpenAI's logit_bias, vLLM's min_tokens, allowed_token_ids and bad_words.

The processors are checked against transformers' own (SequenceBias, NoBadWords, MinNewTokensLength) on random
logits, then end to end on a tiny checkpoint: per-token engine, speculative decoding (whose batched-argmax
shortcut must step aside) and the stop-string rule of min_tokens.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from solo import Engine, SamplingParams
from solo.engine.logits_processors import LogitsProcessors, bad_word_token_ids
from solo.engine.stopping import StopStringMatcher
from solo.errors import InvalidRequestError

VOCAB = 64
PROMPT = "def fibonacci(n):"
GREEDY = dict(temperature=0.0, repetition_penalty=1.0)


@pytest.fixture()
def logits():
    torch.manual_seed(0)
    return torch.randn(VOCAB) * 3


def _applied(processors: LogitsProcessors, logits: torch.Tensor, output_ids=()) -> torch.Tensor:
    out = logits.clone()
    processors.apply(out, list(output_ids))
    return out


def test_logit_bias_matches_transformers_sequence_bias(logits):
    bias = {3: 2.5, 10: -100.0, 63: 100.0}
    expected = SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()})(
        torch.tensor([[1, 2]]), logits[None].clone())[0]
    assert torch.equal(_applied(LogitsProcessors(VOCAB, logit_bias=bias), logits), expected)


@pytest.mark.parametrize("output_ids", [[], [7], [7, 8], [1, 7, 8], [8, 7]])
def test_bad_words_match_transformers(logits, output_ids):
    bad = [[5], [7, 8, 9], [8, 11]]
    processors = LogitsProcessors(VOCAB, bad_word_ids=bad)
    expected = NoBadWordsLogitsProcessor(bad, eos_token_id=None)(
        torch.tensor([[0, *output_ids]]), logits[None].clone())[0]
    assert torch.equal(_applied(processors, logits, output_ids), expected)


@pytest.mark.parametrize("generated", [0, 1, 2, 3, 4])
def test_min_tokens_matches_transformers(logits, generated):
    prompt = [4, 4, 4]
    output = list(range(20, 20 + generated))
    expected = MinNewTokensLengthLogitsProcessor(len(prompt), 3, eos_token_id=[2, 6])(
        torch.tensor([prompt + output]), logits[None].clone())[0]
    got = _applied(LogitsProcessors(VOCAB, stop_ids={2, 6}, min_tokens=3), logits, output)
    assert torch.equal(got, expected)


def test_allowed_token_ids_keep_only_those(logits):
    got = _applied(LogitsProcessors(VOCAB, allowed_token_ids=[4, 9, 9]), logits)
    assert torch.isfinite(got).nonzero().view(-1).tolist() == [4, 9]
    assert torch.equal(got[[4, 9]], logits[[4, 9]])


def test_a_bad_word_gives_way_rather_than_leave_no_token(logits):
    # allowed {4, 9}; "9 4" and "9 9" are bad words: after a 9, both would be banned.
    processors = LogitsProcessors(VOCAB, allowed_token_ids=[4, 9], bad_word_ids=[[9, 4], [9, 9]])
    assert torch.isfinite(_applied(processors, logits, [9])).sum() == 2
    assert torch.isfinite(_applied(processors, logits, [4])).sum() == 2  # nothing completes a bad word
    one = LogitsProcessors(VOCAB, allowed_token_ids=[4, 9], bad_word_ids=[[9, 4]])
    assert torch.isfinite(_applied(one, logits, [9])).nonzero().view(-1).tolist() == [9]


@pytest.mark.parametrize("kwargs, param", [
    (dict(logit_bias={VOCAB: 1.0}), "logit_bias"),
    (dict(allowed_token_ids=[1, VOCAB + 5]), "allowed_token_ids"),
    (dict(allowed_token_ids=[1, 2], bad_word_ids=[[1], [2]]), "bad_words"),
    (dict(allowed_token_ids=[2], stop_ids={2}, min_tokens=1), "min_tokens"),
])
def test_impossible_or_out_of_vocabulary_controls_are_refused(kwargs, param):
    with pytest.raises(InvalidRequestError) as info:
        LogitsProcessors(VOCAB, **kwargs)
    assert info.value.param == param


@pytest.mark.parametrize("kwargs, message", [
    (dict(min_tokens=-1), "min_tokens must be an integer >= 0"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens (5) must be <= max_tokens (4)"),
    (dict(logit_bias={1: 101}), "biases in [-100, 100]"),
    (dict(logit_bias={-1: 1}), "token ids (integers >= 0)"),
    (dict(allowed_token_ids=[]), "a non-empty list of token ids"),
    (dict(bad_words=[" "]), "a list of words (strings with some non-whitespace text)"),
    (dict(skip_special_tokens=1), "skip_special_tokens must be true or false"),
    (dict(ignore_eos="no"), "ignore_eos must be true or false"),  # (the Python API: "no" was truthy)
])
def test_values_are_checked(kwargs, message):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert message in str(info.value)


def test_stop_strings_count_only_once_armed():
    matcher = StopStringMatcher(["\n", "ab"])
    assert matcher.feed("x\ny a", armed=False) == "x\ny "  # a complete "\n" does not stop; "a" may start "ab"
    assert not matcher.stopped
    assert matcher.feed("b!", armed=True) == "x"[:0] and matcher.stopped  # "ab" began unarmed, ended armed
    kept = StopStringMatcher(["\n"])
    assert kept.feed("1\n", armed=False) == "1\n" and kept.feed("2\n3") == "2" and kept.stopped


def test_engine_honours_each_control(tiny_llama):
    engine = Engine.load(tiny_llama, prefix_cache_gb=None)
    base = engine.complete(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, **GREEDY))
    first = base.token_ids[0]
    biased = engine.complete(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, logit_bias={first: -100},
                                                    **GREEDY))
    assert first not in biased.token_ids
    forced = engine.complete(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True, logit_bias={7: 100}, **GREEDY))
    assert forced.token_ids == [7] * 6
    allowed = engine.complete(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, seed=1,
                                                     allowed_token_ids=[base.token_ids[2], 11]))
    assert set(allowed.token_ids) <= {base.token_ids[2], 11}
    word = next(w for w in (engine.tokenizer.decode([t]).strip() for t in base.token_ids) if w)
    spellings = bad_word_token_ids([word], engine.tokenizer)
    banned = engine.complete(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, bad_words=[word], **GREEDY))
    assert banned.token_ids != base.token_ids and not any(
        banned.token_ids[i:i + len(s)] == s for s in spellings for i in range(len(banned.token_ids)))
    # min_tokens: a stop string the first token completes ends nothing before min_tokens tokens.
    text0 = engine.tokenizer.decode([first])
    stop = text0[:1]
    if not stop or stop == "\ufffd":
        pytest.skip("the tiny model's first token has no usable stop string")
    assert engine.complete(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop],
                                                  **GREEDY)).stats.completion_tokens == 1
    late = engine.complete(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop], min_tokens=4,
                                                  **GREEDY))
    assert late.stats.completion_tokens > 4 and late.token_ids == base.token_ids[:len(late.token_ids)]
    # As vLLM's V1 engine counts: the token that ends the output comes after min_tokens tokens, for a stop
    # string as for a stop token, so with min_tokens 1 the first token's stop string does not end it.
    assert engine.complete(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop], min_tokens=1,
                                                  **GREEDY)).stats.completion_tokens > 1


def test_min_tokens_bans_the_stop_ids_until_reached(tiny_llama):
    engine = Engine.load(tiny_llama, prefix_cache_gb=None)
    base = engine.complete(PROMPT, SamplingParams(max_tokens=8, ignore_eos=True, **GREEDY))
    stop_id = base.token_ids[0]  # as a stop id, it would end the output at once
    assert engine.complete(PROMPT, SamplingParams(max_tokens=8, stop_token_ids=[stop_id], **GREEDY)).token_ids == [
        stop_id]
    held = engine.complete(PROMPT, SamplingParams(max_tokens=8, stop_token_ids=[stop_id], min_tokens=3, **GREEDY))
    assert stop_id not in held.token_ids[:3] and len(held.token_ids) >= 3


def test_speculative_decoding_applies_the_controls(tiny_llama):
    # The verify step's batched argmax must not skip the processors.
    plain = Engine.load(tiny_llama, dtype="float32", backend="cpu", prefix_cache_gb=None)
    spec = Engine.load(tiny_llama, dtype="float32", backend="cpu", prefix_cache_gb=None, speculative="suffix")
    params = SamplingParams(max_tokens=24, ignore_eos=True, **GREEDY)
    spec.complete(PROMPT, params)  # the suffix proposer now drafts this output
    banned = plain.complete(PROMPT, params).token_ids[5]
    controlled = params.copy(logit_bias={banned: -100})
    want = plain.complete(PROMPT, controlled)
    got = spec.complete(PROMPT, controlled)
    assert got.token_ids == want.token_ids and banned not in got.token_ids


def test_controls_need_the_host_and_refuse_a_grammar(tiny_llama):
    engine = Engine.load(tiny_llama, prefix_cache_gb=None)
    assert not engine.make_request(PROMPT, SamplingParams(max_tokens=4)).needs_host_logits
    for kwargs in (dict(min_tokens=1), dict(logit_bias={3: 1.0}), dict(allowed_token_ids=[3]),
                   dict(bad_words=["x"])):
        assert engine.make_request(PROMPT, SamplingParams(max_tokens=4, **kwargs)).needs_host_logits, kwargs
    assert not engine.make_request(PROMPT, SamplingParams(max_tokens=4, min_tokens=0, bad_words=[])).needs_host_logits
    with pytest.raises(InvalidRequestError, match="bad_words cannot be combined with response_format") as info:
        engine.make_request(PROMPT, SamplingParams(max_tokens=4, bad_words=["x"],
                                                   response_format={"type": "json_object"}))
    assert info.value.param == "bad_words"
    # logit_bias stays finite, so it composes with a grammar.
    engine.make_request(PROMPT, SamplingParams(max_tokens=4, logit_bias={3: -100},
                                               response_format={"type": "json_object"}))


def test_skip_special_tokens_false_keeps_them_in_the_text(tiny_llama):
    engine = Engine.load(tiny_llama, prefix_cache_gb=None)
    special = engine.tokenizer.special_token_ids()
    name, token = next((n, t) for n, t in sorted(special.items()) if t not in engine.eos_ids)
    params = SamplingParams(max_tokens=2, ignore_eos=True, logit_bias={token: 100}, **GREEDY)
    assert name not in engine.complete(PROMPT, params).text
    assert engine.complete(PROMPT, params.copy(skip_special_tokens=False)).text == name * 2
    # A special token as a stop string ends the output; vLLM keeps its text with include_stop_str_in_output.
    stopped = params.copy(stop=[name], skip_special_tokens=False)
    assert engine.complete(PROMPT, stopped).text == ""
    assert engine.complete(PROMPT, stopped.copy(include_stop_str_in_output=True)).text == name


def test_bad_words_sharing_their_first_tokens_are_all_banned():
    # (the multi-token words are looked up by the tokens before their last one, not scanned one by one)
    processors = LogitsProcessors(16, bad_word_ids=[[1, 2, 3], [1, 2, 4], [2, 5], [9]])
    for output, banned in (([7, 1, 2], {3, 4, 5, 9}), ([2], {5, 9}), ([1], {9}), ([], {9})):
        logits = torch.zeros(16)
        processors.apply(logits, output)
        assert set(torch.nonzero(logits == float("-inf")).flatten().tolist()) == banned, output
