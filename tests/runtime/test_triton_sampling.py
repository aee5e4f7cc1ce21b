"""On-device token choice: argmax, Gumbel-max sampling, the top-k/top-p/min-p threshold, stop tokens."""

from __future__ import annotations

# isort: off
from _triton_env import DEVICE, requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import pytest
import torch

from solo.engine.sampling import ResolvedSampling, TokenSampler
from solo.runtime.cuda import state as st

pytestmark = requires_triton


def _state(vocab, sampling=None, limit=100, stop=frozenset(), position=5):
    ds = st.DecodeState(vocab, 8, DEVICE)
    ds.start(token=0, position=position, row=0, limit=limit, sampling=sampling or st.SamplingSpec(), stop_ids=stop)
    return ds


def test_argmax_breaks_ties_towards_the_lowest_index_across_blocks():
    from solo.runtime.triton.sampling import SamplerPlan, argmax

    logits = torch.randn(1000, device=DEVICE)
    logits[417] = logits[10] = logits.max() + 1  # a tie across two vocabulary blocks
    assert int(argmax(logits, SamplerPlan(1000, DEVICE, block_v=128))) == 10
    logits[999] = 100.0  # the last, partial block
    assert int(argmax(logits, SamplerPlan(1000, DEVICE, block_v=128))) == 999


def test_greedy_step_advances_the_state_and_stops_at_a_stop_token():
    from solo.runtime.triton.sampling import MODE_GREEDY, SamplerPlan, sample_step

    vocab = 300
    ds = _state(vocab, limit=10, stop=frozenset({7}))
    plan = SamplerPlan(vocab, DEVICE, block_v=128)
    logits = torch.randn(vocab, device=DEVICE)
    logits[42] = 50.0
    sample_step(logits, ds.state, ds.params, ds.threshold, ds.stop_mask, ds.out_tokens, 0, MODE_GREEDY, plan)
    state = ds.state.tolist()
    assert ds.out_tokens[0] == 42 and state[st.STATE_TOKEN] == 42 and state[st.STATE_POS] == 6
    assert state[st.STATE_COUNT] == 1 and state[st.STATE_DONE] == 0
    logits[7] = 99.0
    sample_step(logits, ds.state, ds.params, ds.threshold, ds.stop_mask, ds.out_tokens, 1, MODE_GREEDY, plan)
    assert ds.out_tokens[1] == 7 and ds.state[st.STATE_DONE] == 1 and ds.state[st.STATE_POS] == 7
    # After the stop token: nothing is emitted and nothing advances.
    sample_step(logits, ds.state, ds.params, ds.threshold, ds.stop_mask, ds.out_tokens, 2, MODE_GREEDY, plan)
    assert ds.out_tokens[2] == -1 and ds.state[st.STATE_POS] == 7 and ds.state[st.STATE_COUNT] == 2


def test_limit_stops_emitting():
    from solo.runtime.triton.sampling import MODE_GREEDY, SamplerPlan, sample_step

    ds = _state(64, limit=1)
    plan = SamplerPlan(64, DEVICE)
    logits = torch.randn(64, device=DEVICE)
    for slot in range(3):
        sample_step(logits, ds.state, ds.params, ds.threshold, ds.stop_mask, ds.out_tokens, slot, MODE_GREEDY, plan)
    assert ds.out_tokens[:3].tolist()[1:] == [-1, -1] and ds.out_tokens[0] >= 0
    assert ds.state[st.STATE_COUNT] == 1 and ds.state[st.STATE_DONE] == 0


@pytest.mark.parametrize("top_k,top_p,min_p", [(0, 0.9, 0.0), (20, 1.0, 0.0), (20, 0.5, 0.0), (0, 1.0, 0.1),
                                               (5, 0.8, 0.05), (1, 1.0, 0.0)])
def test_filter_threshold_keeps_what_token_sampler_keeps(top_k, top_p, min_p):
    from solo.runtime.triton.sampling import filter_threshold

    vocab = 500
    torch.manual_seed(top_k + int(100 * top_p))
    logits = torch.randn(vocab, device=DEVICE) * 3
    spec = st.SamplingSpec(temperature=0.7, top_k=top_k, top_p=top_p, min_p=min_p, seed=1)
    ds = _state(vocab, spec)
    filter_threshold(logits, ds.state, ds.params, ds.threshold)
    sampler = TokenSampler(ResolvedSampling(0.7, top_k, top_p, min_p, 1.0, 0.0, 0.0, 1), [], vocab, DEVICE)
    kept_ref = torch.isfinite(sampler.process(logits))
    kept = (logits / 0.7) >= ds.threshold
    assert torch.equal(kept, kept_ref)


def test_sampling_follows_the_distribution_and_is_reproducible():
    from solo.runtime.triton.sampling import MODE_FILTERED, MODE_SAMPLE, SamplerPlan, filter_threshold, sample_step

    vocab = 16
    logits = torch.linspace(-2, 2, vocab, device=DEVICE)
    plan = SamplerPlan(vocab, DEVICE)
    draws = 400

    def sample(spec, mode, position):
        ds = _state(vocab, spec, position=position)
        if mode == MODE_FILTERED:
            filter_threshold(logits, ds.state, ds.params, ds.threshold)
        sample_step(logits, ds.state, ds.params, ds.threshold, ds.stop_mask, ds.out_tokens, 0, mode, plan)
        return int(ds.out_tokens[0])

    spec = st.SamplingSpec(temperature=0.8, seed=3)
    counts = torch.zeros(vocab)
    for i in range(draws):
        counts[sample(spec, MODE_SAMPLE, i)] += 1
    probs = torch.softmax(logits.cpu() / 0.8, 0)
    assert 0.5 * (counts / draws - probs).abs().sum() < 0.12  # total variation, ~4 sigma at 400 draws
    assert sample(spec, MODE_SAMPLE, 7) == sample(spec, MODE_SAMPLE, 7)  # (seed, position) fixes the draw
    top2 = st.SamplingSpec(temperature=0.8, top_k=2, seed=5)
    assert {sample(top2, MODE_FILTERED, i) for i in range(40)} == {vocab - 1, vocab - 2}


def test_sampling_spec_modes_and_penalties():
    assert st.SamplingSpec().mode == st.MODE_GREEDY
    assert st.SamplingSpec(temperature=1.0).mode == st.MODE_SAMPLE
    assert st.SamplingSpec(temperature=1.0, top_p=0.9).mode == st.MODE_FILTERED
    with pytest.raises(ValueError):
        st.SamplingSpec.from_resolved(ResolvedSampling(1.0, 0, 1.0, 0.0, 1.2, 0.0, 0.0, 1))
    spec = st.SamplingSpec.from_resolved(ResolvedSampling(0.5, 3, 0.9, 0.0, 1.0, 0.0, 0.0, 11))
    assert spec == st.SamplingSpec(0.5, 3, 0.9, 0.0, 11)
