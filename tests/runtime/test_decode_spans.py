"""`decode_spans`: a decode step whose rows feed 1..k tokens (a speculative draft) in one call.

The server's scheduler runs every step through it. Its contract: a row's logits are those its separate call
gives (`decode` for one token, `verify` for a longer span), and on the native CPU runtime bit for bit the same
alone or beside any other rows' spans (`spans_batch_invariant`), so a greedy request's output never depends on
the load. Checked on tiny random checkpoints (the per-head attention kernel at head_dim 16, the grouped one at
head_dim 64, sliding windows and soft-capping) and on the bundled model, in float32 and bfloat16.
"""

from __future__ import annotations

import ctypes
import random

import pytest
import torch
from checkpoints import make_checkpoint

from solo.errors import SoloError
from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime.base import decode_spans, decode_spans_by_calls, runtime_capabilities
from solo.runtime.cpu import CpuRuntime, cpu_unsupported_reason
from solo.runtime.eager import EagerRuntime

SHAPES = {
    "llama": ("llama", {}),
    "gemma2": ("gemma2", {}),  # sliding windows and soft-capping: the per-head attention kernel
    "gqa64": ("llama", dict(hidden_size=384, num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                            intermediate_size=256, num_hidden_layers=2)),  # the grouped attention kernel
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def folder(request, tmp_path_factory):
    arch, overrides = SHAPES[request.param]
    return make_checkpoint(tmp_path_factory.mktemp(request.param), arch, **overrides)


def _cpu(folder, dtype, rows=12, max_seq=200):
    model = load_weights(folder, ModelConfig.from_file(folder), dtype)
    reason = cpu_unsupported_reason(model)
    if reason is not None:
        pytest.skip(f"the native CPU runtime is not available here: {reason}")
    runtime = CpuRuntime(model)
    runtime.reserve(rows, max_seq)
    return runtime


def _fill(runtime, rows, lengths, seed):
    # The same random prompt into each of a row's twins (one runs alone, the other in a mixed batch).
    rng = random.Random(seed)
    vocab = runtime.config.vocab_size
    for twins, n in zip(rows, lengths, strict=True):
        prompt = torch.tensor([rng.randrange(vocab) for _ in range(n)])
        for row in twins:
            runtime.prefill(row, prompt)


def _cache(runtime, row, upto):
    return [(k[row, :, :upto].clone(), v[row, :, :upto].clone()) for k, v in zip(runtime.cache.k, runtime.cache.v,
                                                                                  strict=True)]


def _spans_alone(runtime, twins, tokens, lengths):
    """Each twin pair's first row's span, run in a call of its own: float32 [k_i, vocab] per row."""
    return [runtime.decode_spans([a], [t], [n])[0] for (a, _), t, n in zip(twins, tokens, lengths, strict=True)]


def _assert_together_equals_alone(runtime, twins, tokens, lengths):
    # Twin rows hold the same KV: the second rows' spans in one call must equal the first rows' run alone.
    alone = _spans_alone(runtime, twins, tokens, lengths)
    together = runtime.decode_spans([b for _, b in twins], tokens, lengths)
    for i, k in enumerate(len(t) for t in tokens):
        assert torch.equal(together[i], alone[i]), f"row {i} ({k} tokens)"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_rows_span_is_bit_identical_alone_and_in_any_mixed_batch(folder, dtype):
    runtime = _cpu(folder, dtype)
    caps = runtime_capabilities(runtime)
    assert caps.decode_spans and caps.spans_batch_invariant
    rng = random.Random(1)
    vocab = runtime.config.vocab_size
    lengths = [rng.randint(3, 120) for _ in range(6)]
    spans = [rng.choice([1, 1, 2, 5, 9]) for _ in lengths]
    spans[0], spans[1] = 1, 7  # one plain row and one with a draft at least
    twins = [(i, 6 + i) for i in range(6)]  # rows 0..5 run alone, rows 6..11 together
    _fill(runtime, twins, lengths, seed=2)
    tokens = [[rng.randrange(vocab) for _ in range(k)] for k in spans]
    alone = _spans_alone(runtime, twins, tokens, lengths)
    # Several orders, so each span lands at other offsets of the kernel's sequence tiles and beside others (the
    # mixed rows run again at the same positions: their cache slots are rewritten with the same tokens).
    for trial in range(3):
        order = list(range(6))
        random.Random(trial).shuffle(order)
        together = runtime.decode_spans([twins[i][1] for i in order], [tokens[i] for i in order],
                                        [lengths[i] for i in order])
        for j, i in enumerate(order):
            assert together[j].shape == (spans[i], vocab) and together[j].dtype == torch.float32
            assert torch.equal(together[j], alone[i]), f"row {i} ({spans[i]} tokens) changed in a mixed batch"
    for (a, b), n, k in zip(twins, lengths, spans, strict=True):
        for (ka, va), (kb, vb) in zip(_cache(runtime, a, n + k), _cache(runtime, b, n + k), strict=True):
            assert torch.equal(ka, kb) and torch.equal(va, vb)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_spans_equal_the_separate_decode_and_verify_calls(folder, dtype):
    # One-token rows: the batch-1 decode step; longer rows: verify on the row alone; bit for bit.
    runtime = _cpu(folder, dtype)
    rng = random.Random(3)
    vocab = runtime.config.vocab_size
    lengths = [5, 40, 17, 90]
    spans = [1, 6, 1, 3]
    twins = [(i, 4 + i) for i in range(4)]
    _fill(runtime, twins, lengths, seed=4)
    tokens = [[rng.randrange(vocab) for _ in range(k)] for k in spans]
    fused = runtime.decode_spans([b for _, b in twins], tokens, lengths)
    separate = decode_spans_by_calls(runtime, [a for a, _ in twins], tokens, lengths)
    for i, (f, s) in enumerate(zip(fused, separate, strict=True)):
        assert torch.equal(f, s), f"row {i} ({spans[i]} tokens)"
    # A step of one-token rows only is the batched decode itself.
    ids = [[rng.randrange(vocab)] for _ in twins]
    steps = runtime.decode(torch.tensor([a for a, _ in twins]), torch.tensor([t[0] for t in ids]),
                           torch.tensor([n + k for n, k in zip(lengths, spans, strict=True)]))
    spanned = runtime.decode_spans([b for _, b in twins], ids, [n + k for n, k in zip(lengths, spans, strict=True)])
    assert torch.equal(torch.cat(spanned), steps)


def test_spans_past_one_attention_block_stay_bit_identical(tmp_path):
    # Rows past 512 positions take the split-KV attention (fixed 512-position blocks): still batch-invariant.
    folder = make_checkpoint(tmp_path / "m", "llama", **SHAPES["gqa64"][1], max_position_embeddings=1024)
    runtime = _cpu(folder, torch.bfloat16, rows=6, max_seq=700)
    rng = random.Random(5)
    vocab = runtime.config.vocab_size
    lengths, spans = [600, 30, 505], [4, 1, 12]  # the last span crosses the block boundary at 512
    twins = [(i, 3 + i) for i in range(3)]
    _fill(runtime, twins, lengths, seed=6)
    tokens = [[rng.randrange(vocab) for _ in range(k)] for k in spans]
    _assert_together_equals_alone(runtime, twins, tokens, lengths)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_bundled_model_spans_are_batch_invariant(dtype):
    from solo.model.default_model import default_model_path

    try:
        folder = default_model_path()
    except Exception as exc:  # a source checkout without the trained model
        pytest.skip(str(exc))
    runtime = _cpu(folder, dtype, rows=16, max_seq=700)
    rng = random.Random(7)
    vocab = runtime.config.vocab_size
    lengths = [rng.randint(10, 300) for _ in range(7)] + [560]
    spans = [1, 5, 1, 17, 2, 1, 9, 3]
    twins = [(i, 8 + i) for i in range(8)]
    _fill(runtime, twins, lengths, seed=8)
    tokens = [[rng.randrange(vocab) for _ in range(k)] for k in spans]
    _assert_together_equals_alone(runtime, twins, tokens, lengths)


def test_the_eager_runtime_runs_spans_as_separate_calls(folder):
    model = load_weights(folder, ModelConfig.from_file(folder), torch.float32)
    runtime = EagerRuntime(model)
    runtime.reserve(4, 64)
    caps = runtime_capabilities(runtime)
    assert caps.decode_spans and not caps.spans_batch_invariant
    for row in range(4):
        runtime.prefill(row, torch.tensor([3, 9, 27, 81, 50][: 2 + row]))
    spans = runtime.decode_spans([0, 1, 2], [[4], [5, 6, 7], [8]], [2, 3, 4])
    assert [tuple(s.shape) for s in spans] == [(1, runtime.config.vocab_size), (3, runtime.config.vocab_size),
                                                (1, runtime.config.vocab_size)]
    # Rows 0 and 2 went in one batched decode, row 1 through verify: recompute them the same way.
    runtime.prefill(3, torch.tensor([3, 9, 27]))  # row 1's prompt again, in row 3
    assert torch.equal(spans[1], runtime.verify(3, torch.tensor([5, 6, 7]), 3))


def test_decode_spans_without_a_native_method_falls_back_to_separate_calls():
    calls = []

    class Plain:  # decode only: no verify, no decode_spans
        name = "plain"

        def decode(self, rows, token_ids, positions):
            calls.append(rows.tolist())
            return torch.zeros(rows.numel(), 3)

    out = decode_spans(Plain(), [2, 0], [[1], [1]], [4, 5])
    assert calls == [[2, 0]] and [tuple(o.shape) for o in out] == [(1, 3), (1, 3)]
    with pytest.raises(SoloError, match="has no verify"):
        decode_spans(Plain(), [0], [[1, 2]], [4])


def test_bad_spans_are_refused_with_the_fix(folder):
    runtime = _cpu(folder, torch.float32, rows=2, max_seq=16)
    for rows, tokens, starts, match in [
        ([0, 1], [[1]], [0, 0], "2 rows, 1 token lists and 2 start positions"),
        ([0], [[]], [0], "empty token list"),
        ([1, 1], [[1], [2]], [0, 1], "got a row twice"),
        ([0], [[1, 2, 3]], [15], "out of range"),  # past the reserved cache
    ]:
        with pytest.raises(SoloError, match=match):
            runtime.decode_spans(rows, tokens, starts)
    assert runtime.decode_spans([], [], []) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_step_paused_between_layers_gives_the_same_bits_and_calls_in_between_run_alone(folder, dtype):
    runtime = _cpu(folder, dtype)
    assert runtime_capabilities(runtime).pausable_steps
    rng = random.Random(3)
    vocab = runtime.config.vocab_size
    lengths = [rng.randint(3, 60) for _ in range(4)]
    twins = [(i, 6 + i) for i in range(4)]  # rows 0..3: whole steps; 6..9: paused ones
    _fill(runtime, twins, lengths, seed=4)
    _fill(runtime, [(4, 5)], [20], seed=5)  # rows 4 and 5: the call made in the pauses, and it alone
    tokens = [[rng.randrange(vocab) for _ in range(k)] for k in (1, 4, 1, 2)]
    whole = runtime.decode_spans([a for a, _ in twins], tokens, lengths)
    inside: list[torch.Tensor] = []

    def between():
        inside.append(runtime.decode_spans([4], [[7, 8]], [20])[0])  # another row's span, on another workspace
        with pytest.raises(ValueError, match="does not nest"):
            runtime.decode_spans([5], [[7]], [20], between=lambda: None)

    paused = runtime.decode_spans([b for _, b in twins], tokens, lengths, between=between)
    points = runtime.pause_points()
    layers = runtime.config.num_layers
    assert points[0][0] == 0 and points[-1] == (layers, layers + 1) and len(inside) == len(points) - 1
    assert all(a[1] == b[0] for a, b in zip(points, points[1:], strict=False))
    for a, b in zip(whole, paused, strict=True):
        assert torch.equal(a, b)
    alone = runtime.decode_spans([5], [[7, 8]], [20])[0]
    assert all(torch.equal(x, alone) for x in inside)  # row 4 rewritten with the same tokens each time
    for (a, b), n, t in zip(twins, lengths, tokens, strict=True):
        for (ka, va), (kb, vb) in zip(_cache(runtime, a, n + len(t)), _cache(runtime, b, n + len(t)), strict=True):
            assert torch.equal(ka, kb) and torch.equal(va, vb)
    # The kernel refuses ranges it cannot resume (the Python side never makes them).
    lib = runtime._lib
    for l0, l1 in ((-1, 1), (2, 1), (0, layers + 2)):
        assert lib.solo_decode_span_layers(ctypes.byref(runtime._struct), 0, None, None, None, None, None, None,
                                           None, 1, 0, l0, l1) == -1
