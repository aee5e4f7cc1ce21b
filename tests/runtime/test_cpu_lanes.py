"""The native CPU runtime for lane models (solo.runtime.cpu_lanes) against the eager LaneTransformer.

Tiny random lane configs cover several lane counts, delays 0/1/2, early all-reduce on and off, the per-layer
broadcast flags, sliding-window layers and each lm_head_type; decode must give eager's greedy tokens and
close logits in float32 and bfloat16, batched rows must be bit for bit their batch-1 selves, and prefill
fills the cache as eager does.
"""

from __future__ import annotations

import copy

import pytest
import torch
from _decode_helpers import greedy_steps
from checkpoints import lane_raw_config, make_lane_checkpoint

from solo.errors import SoloError
from solo.model.config import ModelConfig
from solo.model.lanes import LaneShard, LaneTransformer, build_random_lane_model
from solo.runtime import create_runtime
from solo.runtime.cpu_lanes import CpuLaneRuntime, cpu_lanes_unsupported_reason
from solo.runtime.eager import EagerRuntime

VOCAB = 384
PROMPT = [1, 17, 93, 5, 250, 31, 77, 8, 140, 66, 12, 301, 9, 44, 2, 180, 23]  # longer than the windows below
F32_ATOL = 1e-4  # float32: only the summation order of the matrix products and attention differs
# bfloat16: every rounding eager makes is made here too, but the matrix products sum in another order than
# PyTorch's and attention uses its own exp(), so a value can land one bf16 step away, and a lane model's
# residual update rounds three times (partial + (sum - old), then the residual add). Measured on these
# configs (logits of std 1.5-3.2): at most 0.31 apart, 0.005-0.03 on average, while eager bfloat16 itself is
# 0.17-0.33 (at most) from the float32 model; the test also checks that this runtime is no farther from
# float32 than eager bfloat16 is.
BF16_ATOL = 0.4
BF16_MEAN_ATOL = 0.05

# (name, config.json overrides): lanes L, delay d, early all-reduce, broadcast flags, windows, head types.
CONFIGS = [
    ("L4-d1", dict(num_lanes=4, delay=1)),
    ("L2-d0", dict(num_lanes=2, delay=0)),
    ("L1-d0", dict(num_lanes=1, delay=0)),
    ("L4-d2-no-early", dict(num_lanes=4, delay=2, use_early_comm=False)),
    ("L4-d1-old-flags", dict(num_lanes=4, delay=1, broadcast_attention_to_future=[True] * 4,
                             broadcast_mlp_to_future=[True] * 4)),
    ("L2-d1-no-early-mixed-flags", dict(num_lanes=2, delay=1, use_early_comm=False,
                                        broadcast_mlp_to_future=[True, False, True, False])),
    ("L4-d0-some-flags-off", dict(num_lanes=4, delay=0, broadcast_attention_to_future=[True, False, True, True])),
    ("L4-d2-window", dict(num_lanes=4, delay=2, sliding_window=3, sliding_window_n_layers=2)),
    ("L3-d1-replicate", dict(num_lanes=3, delay=1, num_attention_heads=6, num_key_value_heads=3,
                             intermediate_size=96)),
    ("L8-d2", dict(num_lanes=8, delay=2, num_key_value_heads=8)),
    ("L4-d1-pre-norm", dict(num_lanes=4, delay=1, lm_head_type="pre_norm_lane_agg")),
    ("L4-d1-lane-head", dict(num_lanes=4, delay=1, lm_head_type="lane")),
    ("L4-d2-vocab-parallel", dict(num_lanes=4, delay=2, lm_head_type="vocab_parallel")),
    ("L4-d1-vocab-parallel-tied", dict(num_lanes=4, delay=1, lm_head_type="vocab_parallel",
                                       tie_word_embeddings=True)),
    ("L2-d1-replicate-tied", dict(num_lanes=2, delay=1, tie_word_embeddings=True)),
    ("L4-d4-all-delayed", dict(num_lanes=4, delay=4)),
]
BF16_CONFIGS = ["L4-d1", "L2-d0", "L4-d2-no-early", "L4-d2-window", "L3-d1-replicate", "L4-d1-pre-norm",
                "L4-d1-lane-head", "L4-d2-vocab-parallel"]


def _model(overrides: dict, dtype: torch.dtype, seed: int = 3) -> LaneTransformer:
    overrides = dict(overrides)
    lanes, delay = overrides.pop("num_lanes"), overrides.pop("delay")
    config = ModelConfig.from_dict(lane_raw_config(VOCAB, num_lanes=lanes, delay=delay, **overrides))
    return build_random_lane_model(config, dtype, seed=seed, std=0.2)


def _greedy(runtime, prompt, steps, forced=None):
    return greedy_steps(runtime, prompt, steps, forced, with_prefill=True)


@pytest.mark.parametrize("name,overrides", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_float32_decode_matches_eager(name, overrides):
    model = _model(overrides, torch.float32)
    eager_tokens, eager_logits = _greedy(EagerRuntime(model), PROMPT, 24)
    runtime = CpuLaneRuntime(model)
    tokens, logits = _greedy(runtime, PROMPT, 24)
    assert tokens == eager_tokens
    torch.testing.assert_close(logits, eager_logits, atol=F32_ATOL, rtol=0)


@pytest.mark.parametrize("name", BF16_CONFIGS)
def test_bfloat16_decode_matches_eager(name):
    model = _model(dict(CONFIGS)[name], torch.bfloat16)
    reference = copy.deepcopy(model).float()
    eager_tokens, eager_logits = _greedy(EagerRuntime(model), PROMPT, 24)
    # Teacher forcing on eager's tokens keeps both runs on the same path, so every step is compared.
    tokens, logits = _greedy(CpuLaneRuntime(model), PROMPT, 24, forced=eager_tokens)
    _, f32_logits = _greedy(EagerRuntime(reference), PROMPT, 24, forced=eager_tokens)
    torch.testing.assert_close(logits, eager_logits, atol=BF16_ATOL, rtol=0)
    assert float((logits - eager_logits).abs().mean()) < BF16_MEAN_ATOL
    assert (logits - f32_logits).abs().mean() <= 1.1 * (eager_logits - f32_logits).abs().mean()
    top2 = eager_logits.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * BF16_ATOL  # argmax must agree wherever eager's is not a near-tie
    assert bool((logits.argmax(-1) == eager_logits.argmax(-1))[clear].all())
    assert tokens[0] == eager_tokens[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grouped_attention_widths_match_eager(dtype):
    """head_dim 64 takes the grouped attention kernels (the tiny configs above take the per-head one)."""
    overrides = dict(num_lanes=2, delay=2, hidden_size=128, intermediate_size=256, num_attention_heads=8,
                     num_key_value_heads=2, head_dim=64, sliding_window=12, sliding_window_n_layers=1)
    model = _model(overrides, dtype)
    prompt = [(7 * i + 3) % 380 + 3 for i in range(40)]
    eager_tokens, eager_logits = _greedy(EagerRuntime(model), prompt, 8)
    tokens, logits = _greedy(CpuLaneRuntime(model), prompt, 8, forced=eager_tokens)
    torch.testing.assert_close(logits, eager_logits, atol=F32_ATOL if dtype == torch.float32 else BF16_ATOL, rtol=0)
    if dtype == torch.float32:
        assert tokens == eager_tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_prefill_fills_the_cache_as_eager(dtype):
    model = _model(dict(CONFIGS)["L4-d2-window"], dtype)
    eager, cpu = EagerRuntime(model), CpuLaneRuntime(model)
    for runtime in (eager, cpu):
        runtime.reserve(1, 40)
    first = PROMPT[:9]
    assert torch.equal(cpu.prefill(0, torch.tensor(first)), eager.prefill(0, torch.tensor(first)))
    # A continuation chunk (start_pos > 0) over the cache the first one left.
    rest = torch.tensor(PROMPT[9:])
    assert torch.equal(cpu.prefill(0, rest, len(first)), eager.prefill(0, rest, len(first)))
    for layer in range(model.config.num_layers):
        assert torch.equal(cpu.cache.k[layer][:, :, :len(PROMPT)], eager.cache.k[layer][:, :, :len(PROMPT)])
        assert torch.equal(cpu.cache.v[layer][:, :, :len(PROMPT)], eager.cache.v[layer][:, :, :len(PROMPT)])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["L4-d2-window", "L4-d1-lane-head", "L4-d2-vocab-parallel"])
def test_batched_decode_is_bit_identical_to_batch_1(name, dtype):
    from solo.server.scheduler import runtime_is_batch_invariant

    runtime = CpuLaneRuntime(_model(dict(CONFIGS)[name], getattr(torch, dtype)), rows=4, max_seq=80)
    assert runtime.batch_invariant
    assert runtime_is_batch_invariant(runtime, rows=4)
    assert runtime_is_batch_invariant(runtime, rows=3)  # an odd batch: a partial kernel tile


def test_more_threads_than_cores_give_the_same_bits():
    model = _model(dict(CONFIGS)["L4-d2-no-early"], torch.bfloat16)
    one = _greedy(CpuLaneRuntime(model, num_threads=1), PROMPT, 6)
    many = _greedy(CpuLaneRuntime(model, num_threads=5), PROMPT, 6)
    assert one[0] == many[0] and torch.equal(one[1], many[1])


def test_verify_and_kv_snapshots():
    from solo.runtime.base import supports_kv_snapshots, supports_verify

    model = _model(dict(CONFIGS)["L4-d2-window"], torch.float32)
    runtime = CpuLaneRuntime(model, rows=2, max_seq=64)
    assert supports_verify(runtime) and supports_kv_snapshots(runtime) and runtime.verify_matches_decode
    tokens, logits = _greedy(runtime, PROMPT, 6)
    # verify over the generated tokens gives every position's decode logits bit for bit (float32).
    runtime.prefill(0, torch.tensor(PROMPT))
    scored = runtime.verify(0, torch.tensor(tokens), len(PROMPT))
    assert torch.equal(scored, logits[1:])
    # A snapshot of row 0 imported into row 1 decodes the same next step.
    snap = runtime.export_kv(0, len(PROMPT) + 3)
    runtime.import_kv(1, snap, len(PROMPT) + 3)
    step = [runtime.decode(torch.tensor([row]), torch.tensor([tokens[3]]), torch.tensor([len(PROMPT) + 3]))[0]
            for row in (0, 1)]
    assert torch.equal(step[0], step[1]) and torch.equal(step[0], logits[4])
    # The prefix cache imports only the positions a row lacks (start=): row 1 already holds the prompt.
    runtime.import_kv(1, snap, len(PROMPT) + 3, start=len(PROMPT))
    again = runtime.decode(torch.tensor([1]), torch.tensor([tokens[3]]), torch.tensor([len(PROMPT) + 3]))[0]
    assert torch.equal(again, logits[4])


def test_create_runtime_picks_the_native_runtime_for_lane_models(tmp_path):
    model = _model(dict(CONFIGS)["L4-d1"], torch.bfloat16)
    assert isinstance(create_runtime(model, "auto", torch.device("cpu")), CpuLaneRuntime)
    assert isinstance(create_runtime(model, "cpu", torch.device("cpu")), CpuLaneRuntime)
    assert isinstance(create_runtime(model, "eager", torch.device("cpu")), EagerRuntime)
    with pytest.raises(SoloError, match="cuda-graph backend cannot run lane models"):
        create_runtime(model, "cuda-graph", torch.device("cpu"))
    # float16 weights: the eager runtime under auto, a clear error under --backend cpu.
    half = model.to(torch.float16)
    assert "float16" in cpu_lanes_unsupported_reason(half)
    assert isinstance(create_runtime(half, "auto", torch.device("cpu")), EagerRuntime)
    with pytest.raises(SoloError, match="cpu backend cannot run this model: torch.float16"):
        create_runtime(half, "cpu", torch.device("cpu"))
    # A tensor-parallel shard (some of the lanes) is refused with its reason.
    config = model.config
    with torch.device("meta"):
        shard = LaneTransformer(config, LaneShard(0, 2, 0, config.vocab_size))
    assert "tensor-parallel shard" in cpu_lanes_unsupported_reason(shard)


def test_engine_decodes_a_lane_checkpoint_on_the_native_runtime(tmp_path):
    from solo import Engine, SamplingParams

    folder = make_lane_checkpoint(tmp_path / "m", delay=2, sliding_window=4, sliding_window_n_layers=2)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    fast = Engine.load(folder, dtype="float32")
    assert fast.runtime.name == "cpu"
    eager = Engine.load(folder, dtype="float32", backend="eager")
    assert fast.complete("def f(x):", params).token_ids == eager.complete("def f(x):", params).token_ids


def test_out_of_range_decode_is_refused():
    runtime = CpuLaneRuntime(_model(dict(CONFIGS)["L4-d1"], torch.float32), rows=1, max_seq=8)
    with pytest.raises(SoloError, match="out of range"):
        runtime.decode(torch.tensor([1]), torch.tensor([3]), torch.tensor([0]))
    with pytest.raises(SoloError, match="out of range"):
        runtime.decode(torch.tensor([0]), torch.tensor([VOCAB]), torch.tensor([0]))
    with pytest.raises(SoloError, match="outside the reserved cache"):
        runtime.prefill(0, torch.arange(9))


# A subset of the tests above reruns under every other ISA level this CPU runs: tests/runtime/test_cpu_isa.py.


@pytest.mark.parametrize("name", ["L4-d1", "L4-d1-lane-head", "L4-d1-vocab-parallel-tied"])
def test_runtime_streams_what_the_roofline_counts(name):
    from solo.bench.roofline import decode_bytes

    model = _model(dict(CONFIGS)[name], torch.bfloat16)
    assert CpuLaneRuntime(model).weight_nbytes() == decode_bytes(model.config, 2, 0).weights


def test_the_dense_peer_shape_reads_the_same_bytes():
    from solo.bench.roofline import decode_bytes
    from solo.bench.shapes import shape_config

    lane, dense = shape_config("Laneformer-2B"), shape_config("Laneformer-2B-dense")
    assert lane.lanes is not None and dense.lanes is None
    assert lane.num_parameters() == dense.num_parameters() == 2_320_069_632
    assert decode_bytes(lane, 2, 1000) == decode_bytes(dense, 2, 1000)  # windows (2048) do not bite at 1000


def test_a_cache_that_does_not_fit_leaves_the_lane_runtime_usable(monkeypatch):
    from _decode_helpers import scarce_huge_pages

    from solo.errors import KVCacheMemoryError

    runtime = CpuLaneRuntime(_model(dict(CONFIGS)["L4-d1"], torch.float32))
    runtime.reserve(1, 16)
    scarce_huge_pages(monkeypatch)
    with pytest.raises(KVCacheMemoryError):
        runtime.reserve(4000, 4096)
    assert (runtime.rows, runtime.max_seq, runtime.cache) == (1, 16, None)
    runtime.reserve(1, 32)
    assert (runtime.rows, runtime.max_seq) == (1, 32)
    tokens, _ = _greedy(runtime, PROMPT, 4)
    assert tokens == _greedy(EagerRuntime(runtime.model), PROMPT, 4)[0]
