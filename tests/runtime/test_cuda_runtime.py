"""The CUDA-graph runtime's logic without graphs: the same step functions and block loop.

On a CPU-only machine the torch step runs as plain torch ops and the Triton step and the on-device
sampler run in Triton's interpreter; on a GPU machine the same tests run on the GPU, still without
graphs. Graph capture itself is covered by the GPU tests (test_cuda_gpu.py).
"""

from __future__ import annotations

# isort: off
from _triton_env import DEVICE, ON_GPU, requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import pytest
import torch
from _cuda_helpers import (
    ARCHS,
    LONGROPE,
    PROMPT,
    TinyCheckpoints,
    eager_greedy,
    record_block_sizes,
    runtime_greedy,
    scheduler_tokens,
)

from solo.errors import SoloError
from solo.runtime import BACKENDS, create_runtime
from solo.runtime.cuda.runtime import CudaGraphRuntime
from solo.runtime.cuda.state import SamplingSpec

pytestmark = requires_triton


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyCheckpoints:
    return TinyCheckpoints(tmp_path_factory.mktemp("cuda-runtime"))


@pytest.mark.parametrize("arch", ARCHS)
def test_torch_step_matches_eager_per_token_and_in_blocks(tiny, arch):
    steps = 12
    expected, expected_logits = eager_greedy(tiny.model(arch, DEVICE), PROMPT, steps)
    rt = CudaGraphRuntime(tiny.model(arch, DEVICE), step="torch", use_graphs=False)
    tokens, logits = runtime_greedy(rt, PROMPT, steps, "token")
    assert tokens == expected
    for a, b in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert runtime_greedy(rt, PROMPT, steps, "block", k=5)[0] == expected


@pytest.mark.parametrize("arch", [
    "llama", "gemma2", LONGROPE, "gemma3", "smollm3", "phi4",
    pytest.param("qwen3", marks=pytest.mark.slow), pytest.param("qwen2", marks=pytest.mark.slow),
    pytest.param("mistral", marks=pytest.mark.slow), pytest.param("phi3", marks=pytest.mark.slow),
])
def test_triton_step_matches_eager(tiny, arch):
    steps = 4
    expected, expected_logits = eager_greedy(tiny.model(arch, DEVICE), PROMPT, steps)
    rt = CudaGraphRuntime(tiny.model(arch, DEVICE), step="triton", use_graphs=False)
    tokens, logits = runtime_greedy(rt, PROMPT, steps, "token")
    assert tokens == expected
    for a, b in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert runtime_greedy(rt, PROMPT, steps, "block", k=2)[0] == expected


def test_blocks_stop_at_a_stop_token_and_at_the_budget(tiny):
    expected, _ = eager_greedy(tiny.model("llama", DEVICE), PROMPT, 10)
    rt = CudaGraphRuntime(tiny.model("llama", DEVICE), step="torch", use_graphs=False)
    rt.reserve(1, 64)
    rt.prefill(0, torch.tensor(PROMPT))
    stop = expected[4]
    first_stop = expected.index(stop, 1)
    blocks = list(rt.iter_blocks(0, expected[0], len(PROMPT), SamplingSpec(), frozenset({stop}), 50, k=3))
    flat = [t for b in blocks for t in b]
    assert flat == expected[1:first_stop + 1]  # ends with the stop token, nothing after it
    rt.prefill(0, torch.tensor(PROMPT))
    blocks = list(rt.iter_blocks(0, expected[0], len(PROMPT), SamplingSpec(), frozenset(), 5, k=3))
    assert [len(b) for b in blocks] == [3, 2] and [t for b in blocks for t in b] == expected[1:6]
    rt.prefill(0, torch.tensor(PROMPT))
    result = rt.decode_block(0, expected[0], len(PROMPT), k=4)
    assert result.tokens == expected[1:5] and not result.finished
    result = rt.decode_block(0, expected[4], len(PROMPT) + 4, k=4, stop_ids=frozenset({expected[6]}))
    assert result.tokens == expected[5:7] and result.finished


def test_seeded_sampling_does_not_depend_on_the_block_size(tiny):
    rt = CudaGraphRuntime(tiny.model("llama", DEVICE), step="torch", use_graphs=False)
    rt.reserve(1, 64)
    spec = SamplingSpec(temperature=1.5, top_p=0.95, seed=1234)
    runs = []
    for k in (2, 3):
        first = int(rt.prefill(0, torch.tensor(PROMPT)).argmax())
        runs.append([t for b in rt.iter_blocks(0, first, len(PROMPT), spec, frozenset(), 6, k=k) for t in b])
    assert runs[0] == runs[1] and len(runs[0]) == 6
    first = int(rt.prefill(0, torch.tensor(PROMPT)).argmax())
    other = [t for b in rt.iter_blocks(0, first, len(PROMPT), SamplingSpec(1.5, 0, 0.95, 0.0, 99), frozenset(), 6)
             for t in b]
    assert other != runs[0]  # another seed, another sequence (1 / 384^6 odds of a clash)


def test_batched_decode_rows_and_cache_checks(tiny):
    model = tiny.model("qwen2", DEVICE)
    rt = CudaGraphRuntime(model, step="torch", use_graphs=False)
    rt.reserve(2, 32)
    assert rt.rows == 2 and rt.max_seq >= 32 and rt.cache.k[0].shape[0] == 3  # one scratch row
    a = rt.prefill(0, torch.tensor(PROMPT))
    b = rt.prefill(1, torch.tensor(PROMPT[:6]))
    ta, tb = int(a.argmax()), int(b.argmax())
    both = rt.decode(torch.tensor([0, 1]), torch.tensor([ta, tb]), torch.tensor([len(PROMPT), 6]))
    one = rt.decode(torch.tensor([1]), torch.tensor([tb]), torch.tensor([6]))
    torch.testing.assert_close(both[1], one[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(SoloError):
        rt.prefill(2, torch.tensor(PROMPT))  # the scratch row is not handed out
    for rows, tokens, positions in [([2], [ta], [6]), ([0], [ta], [rt.max_seq]), ([0], [10**6], [6]),
                                    ([0, 1], [ta], [6, 6])]:
        with pytest.raises(SoloError, match="out of range|one row, token id and position"):
            rt.decode(torch.tensor(rows), torch.tensor(tokens), torch.tensor(positions))
    with pytest.raises(SoloError):
        CudaGraphRuntime(model, step="nope")
    if not ON_GPU:
        with pytest.raises(SoloError):
            CudaGraphRuntime(model, use_graphs=True)  # graphs need CUDA


def test_eager_calls_attend_without_cudnn_and_restore_the_setting(tiny, monkeypatch):
    # cuDNN's SDPA builds a plan per new attended length (37-631 ms each on an H200): the runtime's eager
    # prefill, batched decode and verify leave it out, and the process's own setting is back afterwards.
    import torch.nn.functional as F

    model = tiny.model("qwen2", DEVICE)
    rt = CudaGraphRuntime(model, step="torch", use_graphs=False)
    rt.reserve(2, 32)
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    a = rt.prefill(0, torch.tensor(PROMPT))
    rt.prefill(1, torch.tensor(PROMPT[:6]))
    rt.decode(torch.tensor([0, 1]), torch.tensor([int(a.argmax()), 3]), torch.tensor([len(PROMPT), 6]))
    rt.verify(0, torch.tensor([3, 4]), len(PROMPT) + 1)
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_eager_attention_scope_keeps_long_prefills_and_disabled_backends_as_they_are():
    from solo.runtime.cuda.torch_step import MATH_SCORES_BUDGET_BYTES, eager_attention_backends

    with eager_attention_backends(32, 1, 4096):  # a decode step: cuDNN left out
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    long_tokens = MATH_SCORES_BUDGET_BYTES // (4 * 32 * 8192) + 1
    with eager_attention_backends(32, long_tokens, 8192):  # a long prefill: torch's own choice
        assert torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    try:
        with eager_attention_backends(32, 1, 64):
            assert not torch.backends.cuda.mem_efficient_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    finally:
        torch.backends.cuda.enable_mem_efficient_sdp(True)


def test_cuda_graph_backend_is_registered():
    assert "cuda-graph" in BACKENDS
    with pytest.raises(SoloError):
        create_runtime(_cpu_model(), "cuda-graph", torch.device("cpu"))


def _cpu_model():
    from solo.model.config import ModelConfig
    from solo.model.transformer import Transformer

    cfg = ModelConfig.from_dict(dict(architectures=["LlamaForCausalLM"], hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=1, num_attention_heads=4, vocab_size=50))
    return Transformer(cfg)


def test_fused_weights_are_views_and_change_nothing(tiny):
    from solo.model.transformer import KVCache
    from solo.runtime.cuda.weights import fused_layers, weight_bytes_per_token

    model = tiny.model("qwen2", DEVICE)  # q/k/v biases too
    ids, pos = torch.tensor([PROMPT], device=DEVICE), torch.arange(len(PROMPT), device=DEVICE)[None]

    def logits():
        cache = KVCache(model.config, 1, 32, model.dtype, DEVICE)
        return model(ids, pos, cache, torch.zeros(1, dtype=torch.long, device=DEVICE))

    before = logits()
    bytes_before = weight_bytes_per_token(model)
    layers = fused_layers(model)
    assert fused_layers(model) is layers  # fused once per model
    attn, mlp = model.layers[0].attn, model.layers[0].mlp
    assert attn.k_proj.weight.data_ptr() == layers[0].w_qkv[attn.q_proj.weight.shape[0]:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == layers[0].w_gate_up[mlp.gate_proj.weight.shape[0]:].data_ptr()
    assert attn.v_proj.bias.data_ptr() == layers[0].b_qkv[-attn.v_proj.bias.shape[0]:].data_ptr()
    assert torch.equal(logits(), before)
    assert weight_bytes_per_token(model) == bytes_before


def test_bench_runner_decodes_in_blocks_like_the_engine(tiny):
    # `solo bench` times a block-decoding runtime as Engine.run drives it (K tokens per host sync), with
    # the greedy tokens of the per-token loop.
    from solo.bench.runner import SoloRunner

    steps = 12
    expected, _ = eager_greedy(tiny.model("llama", DEVICE), PROMPT, steps + 1)
    rt = CudaGraphRuntime(tiny.model("llama", DEVICE), step="torch", use_graphs=False, block_size=4)
    runner = SoloRunner(rt)
    result = runner.run(PROMPT, steps + 1)
    assert result.decode_tokens == steps and result.host_syncs == 3  # 12 tokens in blocks of 4
    assert (runner._token, runner._position) == (expected[-1], len(PROMPT) + steps)
    runner.advance(1)  # continues after the block run, within the reserved row
    assert runner._position == len(PROMPT) + steps + 1
    # A turn shorter than a block is not padded to one: its tokens in powers of two, each K warmed up first.
    ks = record_block_sizes(rt)
    runner.warm_up(PROMPT)
    assert sorted(set(ks)) == [1, 2, 4]
    ks.clear()
    runner.begin(PROMPT, 8)
    runner.advance(7)
    assert ks == [4, 2, 1] and runner._position == len(PROMPT) + 7
    # Warmed up for the timed runs' length: a timed run keeps the cache (and the graphs captured on it).
    runner = SoloRunner(CudaGraphRuntime(tiny.model("llama", DEVICE), step="torch", use_graphs=False, block_size=4))
    runner.warm_up(PROMPT, reserve_tokens=len(PROMPT) + 300)
    cache = runner.runtime.cache
    runner.begin(PROMPT, 300 - 1)
    assert runner.runtime.cache is cache


def test_server_decodes_a_lone_greedy_request_in_blocks(tiny):
    # The server's scheduler on a block-decoding runtime: a lone greedy request takes K tokens per host sync
    # (as Engine.run), with the per-token loop's tokens; beside another request, or sampled, it steps per
    # token as before.

    from solo import Engine, SamplingParams
    from solo.server.scheduler import Scheduler

    loaded = Engine.load(tiny.folder("llama"), device=str(DEVICE), backend="eager", dtype="float32")
    rt = CudaGraphRuntime(loaded.model, step="torch", use_graphs=False, block_size=4)
    reference = Engine.load(tiny.folder("llama"), device=str(DEVICE), backend="eager", dtype="float32")
    prompts = ["def fibonacci(n):", "class Tree:"]
    params = SamplingParams(max_tokens=13, ignore_eos=True, temperature=0.0)
    expected = [reference.complete(p, params).token_ids for p in prompts]
    scheduler = Scheduler(rt, max_batch=2, max_queue=4, max_seq=128)
    scheduler.block_target_s = 60.0  # whole blocks of 4 even at the interpreter's speed

    scheduler.start()
    try:
        syncs = rt.host_syncs
        assert scheduler_tokens(scheduler, [loaded.make_request(prompts[0], params)]) == [expected[0]]
        assert scheduler.blocks == 3 and rt.host_syncs - syncs == 1 + 3  # prefill, then 12 tokens in blocks of 4
        assert scheduler.steps == 0
        blocks = scheduler.blocks
        assert scheduler_tokens(scheduler, [loaded.make_request(p, params) for p in prompts]) == expected
        sampled = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.8, seed=1)
        assert len(scheduler_tokens(scheduler, [loaded.make_request(prompts[1], sampled)])[0]) == 6
        assert scheduler.blocks - blocks <= 3  # only while one greedy request ran alone
    finally:
        scheduler.stop()


def test_server_blocks_shrink_to_the_time_target(tiny):
    # A block longer than the target holds an arriving request back: K halves (powers of two) until it fits,
    # once a block of a K already captured was timed; the tail of a request runs in powers of two too.
    import asyncio

    from solo import Engine, SamplingParams
    from solo.server.scheduler import Scheduler

    loaded = Engine.load(tiny.folder("llama"), device=str(DEVICE), backend="eager", dtype="float32")
    rt = CudaGraphRuntime(loaded.model, step="torch", use_graphs=False, block_size=8)
    scheduler = Scheduler(rt, max_batch=1, max_queue=1, max_seq=128)
    scheduler.block_target_s = 1e-9
    params = SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.0)
    expected = Engine.load(tiny.folder("llama"), device=str(DEVICE), backend="eager",
                           dtype="float32").complete("def f(x):", params).token_ids
    ks = record_block_sizes(rt)

    async def run():
        gen = scheduler.submit([loaded.make_request("def f(x):", params)], asyncio.get_running_loop())
        return [t async for _, e in gen.events() for t in e.token_ids]

    scheduler.start()
    try:
        assert asyncio.run(run()) == expected
    finally:
        scheduler.stop()
    # 29 tokens after the prefill: K=8 untimed (its first use), K=8 timed, then K=1 for the other 13
    assert ks == [8, 8] + [1] * 13 and scheduler.blocks == 15

    ks.clear()  # a tail shorter than K: powers of two (8 + 4 + 2 + 1 after a generous target)
    scheduler = Scheduler(rt, max_batch=1, max_queue=1, max_seq=128)
    scheduler.block_target_s = 60.0
    params = SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.0)
    scheduler.start()
    try:
        asyncio.run(run())
    finally:
        scheduler.stop()
    assert ks == [8, 4, 2, 1]


def test_server_blocks_while_requests_wait_for_the_only_row(tiny):
    # With every row taken, a waiting request can only start when the running one ends: blocks end it sooner.
    import asyncio

    from solo import Engine, SamplingParams
    from solo.server.scheduler import Scheduler

    loaded = Engine.load(tiny.folder("llama"), device=str(DEVICE), backend="eager", dtype="float32")
    rt = CudaGraphRuntime(loaded.model, step="torch", use_graphs=False, block_size=4)
    scheduler = Scheduler(rt, max_batch=1, max_queue=4, max_seq=128)
    scheduler.block_target_s = 60.0
    prompts = ["def f(x):", "import os"]
    params = SamplingParams(max_tokens=9, ignore_eos=True, temperature=0.0)
    reference = Engine.load(tiny.folder("llama"), device=str(DEVICE), backend="eager", dtype="float32")
    expected = [reference.complete(p, params).token_ids for p in prompts]

    async def run():
        loop = asyncio.get_running_loop()
        gens = [scheduler.submit([loaded.make_request(p, params)], loop) for p in prompts]

        async def drain(g):
            return [t async for _, e in g.events() for t in e.token_ids]

        return await asyncio.gather(*(drain(g) for g in gens))

    scheduler.start()
    try:
        assert asyncio.run(run()) == expected
    finally:
        scheduler.stop()
    assert scheduler.blocks == 2 + 2 and scheduler.steps == 0  # 8 tokens after each prefill, in blocks of 4


@pytest.mark.parametrize("arch", ["llama", "qwen3", pytest.param("olmoe", marks=pytest.mark.slow)])
def test_triton_step_tunes_over_every_layer_and_decodes_with_what_it_chose(tiny, tmp_path, monkeypatch, arch):
    from solo.runtime.triton import gemv, qkv_rope, rmsnorm_gemv, swiglu, tuning

    monkeypatch.setenv("SOLO_TUNING_CACHE", str(tmp_path / "tuning.json"))
    monkeypatch.setattr(tuning, "_MEMORY", {})
    # Double-buffered candidates only, each timed faster than the last, so the step decodes with them.
    monkeypatch.setattr(gemv, "CANDIDATES", (gemv.GemvConfig(4, 32, 1, 1, 2), gemv.GemvConfig(8, 32, 2, 1, 2)))
    monkeypatch.setattr(qkv_rope, "CANDIDATES", (qkv_rope.QkvRopeConfig(4, 32, 1, 2),))
    monkeypatch.setattr(swiglu, "CANDIDATES", (swiglu.GatedMlpConfig(4, 32, 1, 2),))
    monkeypatch.setattr(rmsnorm_gemv, "CANDIDATES", (rmsnorm_gemv.RmsNormGemvConfig(8, 32, 1, 2),))
    # Which weight matrix each launch of a timed graph read (the weight is the wrapper's argument `arg`).
    read: list[list[int]] = []

    def recorder(fn, arg):
        def recording(*args, **kwargs):
            if read:
                read[-1].append(args[arg].data_ptr())
            return fn(*args, **kwargs)
        return recording

    for module, name, arg in ((gemv, "gemv", 0), (qkv_rope, "qkv_rope", 2), (rmsnorm_gemv, "rmsnorm_gemv", 2),
                              (swiglu, "gated_mlp", 1)):
        monkeypatch.setattr(module, name, recorder(getattr(module, name), arg))
    timed: list[list[int]] = []

    def fake_time_graph(launches, rounds, flush_bytes):
        read.append([])
        for fn in launches:
            fn()
        timed.append(read.pop())
        return 1.0 / len(timed)

    monkeypatch.setattr(tuning, "time_graph", fake_time_graph)
    model = tiny.model(arch, DEVICE)
    layers, cfg = model.config.num_layers, model.config
    expected, _ = eager_greedy(tiny.model(arch, DEVICE), PROMPT, 4)
    rt = CudaGraphRuntime(model, step="triton", use_graphs=False, tune=True)
    assert runtime_greedy(rt, PROMPT, 4, "token")[0] == expected
    dense = 0 if cfg.is_moe else layers  # the tiny MoE checkpoint's layers are all MoE
    # One graph per candidate and the reference: q/k/v (2), o (3), down (3) and gate/up (2) over the layers
    # that have the site, the LM head (2) once; each launch on its own layer's weights.
    assert sorted(map(len, timed)) == sorted([layers] * 5 + [dense] * 5 * (dense > 0) + [1] * 2)
    assert all(len(set(ptrs)) == len(ptrs) for ptrs in timed)
    assert rt.tuned["o"] == gemv.CANDIDATES[-1] and rt.tuned["head"] == rmsnorm_gemv.CANDIDATES[0]
