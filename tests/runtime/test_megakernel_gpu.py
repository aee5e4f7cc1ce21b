"""GPU parity of the monokernel (skipped without CUDA): the interpreter kernel against the eager model.

bf16 throughout (the kernel's only dtype). Teacher-forced logits must stay within bf16 noise of the
eager model's; free-running greedy tokens may part from eager's only where eager's own top-2 margin is
within that noise. N tokens per launch must equal one token per launch exactly (same kernel, fixed
reduction order), and two runs must be bit-identical.
"""

from __future__ import annotations

import pytest
import torch
from _cuda_helpers import PROMPT, TinyCheckpoints, eager_greedy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

STEPS = 48


def _tolerance(ref: torch.Tensor) -> float:
    # bf16 logits: both sides round products and sums to bf16 at different points.
    return 0.03 * float(ref.abs().max()) + 0.03


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyCheckpoints:
    return TinyCheckpoints(tmp_path_factory.mktemp("mk-gpu"))


def _runtime(model, **kwargs):
    from solo.runtime.megakernel.runtime import MegakernelRuntime

    return MegakernelRuntime(model, **kwargs)


def _per_token(rt, prompt, steps):
    rt.reserve(1, len(prompt) + steps + 1)
    logits = rt.prefill(0, torch.tensor(prompt))
    tokens, all_logits = [int(logits.argmax())], [logits.float().cpu()]
    for i in range(steps - 1):
        logits = rt.decode(torch.tensor([0]), torch.tensor([tokens[-1]]), torch.tensor([len(prompt) + i]))[0]
        all_logits.append(logits.float().cpu())
        tokens.append(int(logits.argmax()))
    return tokens, all_logits


def _blocks(rt, prompt, steps, k, stop_ids=frozenset()):
    from solo.runtime.cuda.state import SamplingSpec

    rt.reserve(1, len(prompt) + steps + 1)
    first = int(rt.prefill(0, torch.tensor(prompt)).argmax())
    blocks = list(rt.iter_blocks(0, first, len(prompt), SamplingSpec(), stop_ids, steps - 1, k=k))
    return [first] + [t for b in blocks for t in b], blocks


def _assert_greedy_close(tokens, expected, expected_logits):
    for i, (a, b) in enumerate(zip(tokens, expected, strict=False)):
        if a != b:
            ref = expected_logits[i]
            margin = float(ref[b] - ref[a])
            assert margin <= _tolerance(ref), f"token {i}: got {a}, eager {b}; eager margin {margin:.3g}"
            return  # after a legitimate tie the sequences are different histories


@pytest.mark.timeout(300)
def test_teacher_forced_logits_track_eager(tiny):
    model = tiny.model("llama", "cuda", torch.bfloat16)
    expected, expected_logits = eager_greedy(model, PROMPT, STEPS)
    rt = _runtime(model)
    rt.reserve(1, len(PROMPT) + STEPS + 1)
    rt.prefill(0, torch.tensor(PROMPT))
    for i in range(STEPS - 1):
        logits = rt.decode(torch.tensor([0]), torch.tensor([expected[i]]), torch.tensor([len(PROMPT) + i]))[0]
        ref = expected_logits[i + 1].cuda()
        worst = float((logits - ref).abs().max())
        assert worst <= _tolerance(ref), f"step {i}: max |logit error| {worst:.3g}"


@pytest.mark.timeout(300)
def test_greedy_tokens_and_n_tokens_per_launch(tiny):
    model = tiny.model("llama", "cuda", torch.bfloat16)
    expected, expected_logits = eager_greedy(model, PROMPT, STEPS)
    rt = _runtime(model)
    tokens, _ = _per_token(rt, PROMPT, STEPS)
    _assert_greedy_close(tokens, expected, expected_logits)
    for k in (1, 7, 64):
        block_tokens, _ = _blocks(rt, PROMPT, STEPS, k)
        assert block_tokens == tokens, f"k={k}"  # the same kernel: N per launch == 1 per launch, exactly
    assert rt.launches > 0


@pytest.mark.timeout(300)
def test_bit_identical_across_runs(tiny):
    model = tiny.model("llama", "cuda", torch.bfloat16)
    rt = _runtime(model)
    _, first = _per_token(rt, PROMPT, 16)
    _, second = _per_token(rt, PROMPT, 16)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.timeout(300)
def test_stop_token_and_streaming(tiny):
    model = tiny.model("llama", "cuda", torch.bfloat16)
    rt = _runtime(model, max_launch_tokens=64)
    tokens, _ = _blocks(rt, PROMPT, 40, 64)
    stop = tokens[10]
    n = tokens[1:].index(stop) + 1
    stopped, _ = _blocks(rt, PROMPT, 40, 64, stop_ids=frozenset({stop}))
    assert stopped == tokens[:n + 1]
    # One host sync per launch (plus the prefill), not one per token.
    before = rt.host_syncs
    long_tokens, _ = _blocks(rt, PROMPT, 200, 64)
    assert len(long_tokens) == 200 and rt.host_syncs - before <= 6


@pytest.mark.timeout(300)
def test_engine_runs_on_the_megakernel(tiny):
    from solo import Engine, SamplingParams
    from solo.engine.block_decoding import run_in_blocks

    engine = Engine.load(tiny.folder("llama"), device="cuda", dtype="bfloat16", backend="megakernel")
    assert engine.runtime.name == "megakernel"
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    completion = engine.complete("def fibonacci(n):", params)
    request = engine.make_request("def fibonacci(n):", params)
    engine.runtime.reserve(1, len(request.prompt_ids) + request.max_new_tokens)
    logits = engine.runtime.prefill(0, torch.tensor(request.prompt_ids))
    events = list(run_in_blocks(engine.runtime, request, logits))
    assert [t for e in events for t in e.token_ids] == completion.token_ids
    sampled = engine.complete("def", SamplingParams(max_tokens=8, temperature=0.8, seed=3, ignore_eos=True))
    assert len(sampled.token_ids) == 8


@pytest.mark.timeout(400)
def test_llama_1b_shape_tracks_eager():
    from solo.bench.shapes import build_model, shape_config

    model = build_model(shape_config("Llama-3.2-1B"), torch.bfloat16, device="cuda")
    prompt = list(range(100, 228))
    expected, expected_logits = eager_greedy(model, prompt, 24)
    rt = _runtime(model)
    rt.reserve(1, len(prompt) + 64)
    rt.prefill(0, torch.tensor(prompt))
    for i in range(23):
        logits = rt.decode(torch.tensor([0]), torch.tensor([expected[i]]), torch.tensor([len(prompt) + i]))[0]
        ref = expected_logits[i + 1].cuda()
        worst = float((logits - ref).abs().max())
        assert worst <= _tolerance(ref), f"step {i}: max |logit error| {worst:.3g}"
    tokens, _ = _blocks(rt, prompt, 24, 64)
    _assert_greedy_close(tokens, expected, expected_logits)


@pytest.mark.timeout(300)
def test_temperature_sampling_on_device_is_seeded_by_position(tiny):
    from solo.runtime.cuda.state import SamplingSpec

    rt = _runtime(tiny.model("llama", "cuda", torch.bfloat16))
    rt.reserve(1, len(PROMPT) + 64)
    spec = SamplingSpec(temperature=1.0, seed=5)
    runs = []
    for k in (64, 5, 1):
        first = int(rt.prefill(0, torch.tensor(PROMPT)).argmax())
        runs.append([t for b in rt.iter_blocks(0, first, len(PROMPT), spec, frozenset(), 32, k=k) for t in b])
    assert runs[0] == runs[1] == runs[2] and len(runs[0]) == 32
