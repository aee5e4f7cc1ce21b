"""Tensor parallelism over torch.distributed (gloo, CPU): --tp N gives one process's greedy tokens.

Each test spawns its ranks (rank 0 is the test process), so they are marked slow.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
from checkpoints import make_checkpoint, make_lane_checkpoint, make_longrope_checkpoint

from solo import Engine, SamplingParams
from solo.errors import EngineFailedError, SoloError

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n"
pytestmark = pytest.mark.slow


def _greedy(engine, n=16):
    result = engine.complete(PROMPT, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    return result.token_ids


def _check_same(folder, tp, kv_heads_in_memory=None, **load):
    one = Engine.load(folder, dtype="float32", backend="eager", **load)
    expected = _greedy(one)
    ids = one.encode_prompt(PROMPT)
    one.runtime.reserve(1, len(ids))
    ref_logits = one.runtime.prefill(0, torch.tensor(ids))
    engine = Engine.load(folder, dtype="float32", tp=tp, **load)
    try:
        assert engine.runtime.name == f"eager-tp{tp}"
        if kv_heads_in_memory is not None:  # what the server sizes the KV cache with (all ranks share this host)
            assert engine.kv_heads_in_memory == kv_heads_in_memory
        assert _greedy(engine) == expected
        engine.runtime.reserve(1, len(ids))
        assert torch.allclose(engine.runtime.prefill(0, torch.tensor(ids)), ref_logits, atol=1e-4, rtol=0)
    finally:
        engine.runtime.close()


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    # Bias on q/k/v (Qwen2) exercises the column-parallel bias; 4 KV heads split over 2 and 4 ranks.
    return make_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2", num_key_value_heads=4)


@pytest.mark.parametrize("tp", [2, 4])
def test_dense_tp_matches_one_process(dense, tp):
    _check_same(dense, tp)


@pytest.mark.parametrize("arch", ["gemma3", "smollm3"])
def test_per_layer_rope_under_tp(tmp_path, arch):
    # Gemma 3's local and global tables, SmolLM3's NoPE layer: every rank picks each layer's own.
    _check_same(make_checkpoint(tmp_path / arch, arch), 2)


def test_partial_rotary_under_tp(tmp_path):
    # Phi-4-mini's layout: each rank's q/k rows keep the per-head order the loader gave them (weights.rope_row_order).
    _check_same(make_checkpoint(tmp_path / "phi4", "phi4"), 2)


def test_fewer_kv_heads_than_ranks_are_copied_to_each_rank(tmp_path):
    # One KV head (Gemma-3-1B, multi-query attention) on 2 ranks: each holds a copy, as vLLM does; its own query
    # heads' share of everything else. Qwen2's k/v biases go with the copied rows.
    # The host's memory holds a copy per rank: the server sizes the KV cache with 2 heads, not the model's 1.
    _check_same(make_checkpoint(tmp_path / "gemma3", "gemma3", num_key_value_heads=1), 2, kv_heads_in_memory=2)
    _check_same(make_checkpoint(tmp_path / "qwen2", "qwen2", num_key_value_heads=1), 2)
    # Two KV heads on 4 ranks: ranks 0-1 copy head 0, ranks 2-3 head 1 (and its k/v bias rows).
    _check_same(make_checkpoint(tmp_path / "qwen2-2kv", "qwen2", num_key_value_heads=2), 4, kv_heads_in_memory=4)


def test_kv_heads_in_memory_counts_copies_on_the_cpu_and_rank_0s_share_on_cuda():
    from solo.distributed.sharding import kv_heads_in_memory
    from solo.model.config import ModelConfig
    from solo.server import kv_memory

    def config(kv):
        return ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 64,
                                      "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 8,
                                      "num_key_value_heads": kv})

    assert kv_heads_in_memory(config(4), 2, "cpu") == 4  # split: the host holds the model's heads
    assert kv_heads_in_memory(config(4), 2, "cuda") == 2  # rank 0's GPU holds its half
    assert kv_heads_in_memory(config(1), 4, "cpu") == 4  # copied: once per rank
    assert kv_heads_in_memory(config(1), 4, "cuda") == 1
    assert kv_heads_in_memory(config(2), 8, "cpu", local_ranks=4) == 4  # torchrun: 4 of the 8 ranks on this host
    assert kv_heads_in_memory(config(4), 8, "cpu", local_ranks=2) == 2
    # The bytes the server's --max-batch auto and start-up check count (bf16, head_dim 8, 3 layers).
    assert kv_memory.kv_bytes_per_token(config(1), 2, kv_heads=4) == 4 * kv_memory.kv_bytes_per_token(config(1), 2)


def test_a_kv_head_count_that_does_not_divide_the_ranks_is_refused(tmp_path):
    from solo.distributed.sharding import check_tp
    from solo.model.config import ModelConfig

    config = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 64,
                                    "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 6,
                                    "num_key_value_heads": 2})
    check_tp(config, 2)
    with pytest.raises(SoloError, match="nor is it a multiple of it"):
        check_tp(config, 3)
    check_tp(config, 6)  # six ranks, three to each KV head
    moe = ModelConfig.from_dict({"architectures": ["MixtralForCausalLM"], "vocab_size": 64, "hidden_size": 64,
                                 "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2})
    with pytest.raises(SoloError, match="mixture-of-experts"):
        check_tp(moe, 2)


def test_phi3_tp_followers_take_rank_0s_longrope_factors(tmp_path):
    # The followers load the config themselves: the context rank 0 was given must pick their factors too.
    _check_same(make_longrope_checkpoint(tmp_path / "phi3"), 2, context_length=128)


@pytest.mark.parametrize("tp, overrides", [
    (2, dict(delay=2, lm_head_type="vocab_parallel")),
    (4, dict(delay=1, sliding_window=4, sliding_window_n_layers=2)),
    (2, dict(delay=1, lm_head_type="lane", use_early_comm=False)),
])
def test_lane_tp_matches_one_process(tmp_path, tp, overrides):
    _check_same(make_lane_checkpoint(tmp_path / "lanes", **overrides), tp)


def test_tp_that_does_not_divide_is_refused(tmp_path):
    folder = make_lane_checkpoint(tmp_path / "lanes", num_lanes=4)
    with pytest.raises(SoloError, match="--tp 3 does not divide"):
        Engine.load(folder, tp=3)


def test_a_dead_rank_fails_fast_instead_of_hanging(tmp_path):
    folder = make_lane_checkpoint(tmp_path / "lanes", delay=1)
    engine = Engine.load(folder, dtype="float32", tp=2)
    runtime = engine.runtime
    runtime.exit_on_failure = False  # the test process is rank 0: do not end it
    try:
        assert len(_greedy(engine, 4)) == 4
        assert runtime.followers
        for proc in runtime.followers:
            proc.kill()
            proc.wait(timeout=10)
        start = time.monotonic()
        with pytest.raises(EngineFailedError, match="tensor parallelism stopped") as info:
            _greedy(engine, 4)
        assert time.monotonic() - start < 60
        assert runtime.failed is not None
        # Not the request's fault: a server answers 500 (clients retry a 5xx), never 400.
        from solo.server.errors import api_error_from

        error = api_error_from(info.value)
        assert (error.status, error.type, error.code) == (500, "server_error", "engine_failed")
    finally:
        runtime.close()



_CLOSE_SCRIPT = """
import gc, sys, weakref
from solo import Engine, SamplingParams
engine = Engine.load(sys.argv[1], dtype="float32", tp=2)
engine.complete("def f(x):", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
group = weakref.ref(engine.runtime.control)
engine.runtime.close()
gc.collect()
print("released" if group() is None else "alive")
"""


def test_a_closed_tp_engine_lets_the_next_one_load(tmp_path):
    # Without close() the second engine's process group failed to start ("initialize the default process
    # group twice"); Engine is a context manager that closes its runtime.
    folder = make_checkpoint(tmp_path / "llama", "llama")
    with Engine.load(folder, dtype="float32", tp=2) as first:
        expected = _greedy(first, 4)
    with Engine.load(folder, dtype="float32", tp=2) as second:
        assert _greedy(second, 4) == expected
    second.close()  # idempotent


def test_close_releases_the_process_group(tmp_path):
    # A process group that outlives close() keeps gloo's worker threads into interpreter shutdown, where
    # one releasing a tensor aborts rank 0 ("terminate called without an active exception") after its
    # output was printed. A fresh interpreter, as `solo run --tp 2` is: what torch imports lazily during
    # the load must not pin the group either.
    folder = make_lane_checkpoint(tmp_path / "lanes", delay=1)
    proc = subprocess.run([sys.executable, "-c", _CLOSE_SCRIPT, str(folder)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["released"]


def test_the_tp_bench_runs_partial_rotary_shapes_on_standard_tp_only():
    # Lane models rotate interleaved pairs of the whole head: Phi-4-mini's DTP variants failed deep in LaneRotary.
    from solo.bench.shapes import shape_config
    from solo.distributed.bench import variant_configs

    assert [label for label, _ in variant_configs(shape_config("Phi-4-mini"), 2)] == ["standard TP (Megatron, dense)"]
    assert len(variant_configs(shape_config("Phi-3-mini"), 2)) == 3  # standard TP, DTP d=1, d=2
