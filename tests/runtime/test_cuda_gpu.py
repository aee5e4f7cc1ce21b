"""GPU parity of the CUDA-graph runtime: captured graphs, real-shape kernels, syncs (skipped without CUDA).

Tiny checkpoints of every architecture run in float32, so the fused kernels and the eager model agree to
~1e-6 and greedy tokens must match for 64 tokens. A mismatch is accepted only where the eager model's
own top-2 margin is below 1e-5 (a tie that rounding may break either way); the message says which.
"""

from __future__ import annotations

# isort: off
from _triton_env import ON_GPU, bf16_close  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import pytest
import torch
from _cuda_helpers import (
    ARCHS,
    PROMPT,
    TinyCheckpoints,
    eager_greedy,
    first_divergence,
    runtime_greedy,
    scheduler_tokens,
)

from solo.runtime.cuda.runtime import CudaGraphRuntime
from solo.runtime.cuda.state import SamplingSpec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")]

STEPS = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyCheckpoints:
    return TinyCheckpoints(tmp_path_factory.mktemp("cuda-gpu"))


def _assert_same_greedy(tokens, expected, expected_logits):
    problem = first_divergence(tokens, expected, expected_logits)
    if problem is None:
        return
    i = next(i for i, (a, b) in enumerate(zip(tokens, expected, strict=False)) if a != b)
    margin = float(expected_logits[i][expected[i]] - expected_logits[i][tokens[i]])
    assert margin < 1e-5, problem


@pytest.mark.timeout(180)
@pytest.mark.parametrize("step", ["triton", "torch"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_eager_for_64_tokens(tiny, arch, step):
    expected, expected_logits = eager_greedy(tiny.model(arch, "cuda"), PROMPT, STEPS)
    rt = CudaGraphRuntime(tiny.model(arch, "cuda"), step=step, block_size=16, tune=False)
    tokens, logits = runtime_greedy(rt, PROMPT, STEPS, "token")
    _assert_same_greedy(tokens, expected, expected_logits)
    for a, b in zip(logits[:8], expected_logits[:8], strict=False):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    block_tokens, _ = runtime_greedy(rt, PROMPT, STEPS, "block", k=16)
    _assert_same_greedy(block_tokens, expected, expected_logits)
    assert block_tokens == tokens  # decode_block and per-token decode agree exactly (same kernels)
    assert ("block", 16, 0) in rt._graphs and ("step",) in rt._graphs


@pytest.mark.timeout(180)
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_programmatic_dependent_launch_gives_the_same_tokens(tiny, arch):
    from solo.runtime.triton.common import pdl_supported

    if not pdl_supported():
        pytest.skip("programmatic dependent launch needs Hopper or newer")
    plain = CudaGraphRuntime(tiny.model(arch, "cuda"), step="triton", tune=False)
    pdl = CudaGraphRuntime(tiny.model(arch, "cuda"), step="triton-pdl", tune=False)
    for mode in ("block", "token"):
        expected, expected_logits = runtime_greedy(plain, PROMPT, STEPS, mode, k=16)
        tokens, logits = runtime_greedy(pdl, PROMPT, STEPS, mode, k=16)
        assert tokens == expected  # the same kernels in the same order: bit-identical or a race
        for a, b in zip(logits, expected_logits, strict=True):
            assert torch.equal(a, b)


@pytest.mark.timeout(180)
def test_bf16_llama_tracks_eager(tiny):
    """bf16: teacher-forced logits within bf16 noise of eager (tensor-core attention, bf16 rounding)."""
    model = tiny.model("llama", "cuda", torch.bfloat16)
    expected, expected_logits = eager_greedy(model, PROMPT, 24)
    rt = CudaGraphRuntime(model, step="triton", tune=False)
    rt.reserve(1, 64)
    logits = rt.prefill(0, torch.tensor(PROMPT))
    for i in range(23):
        logits = rt.decode(torch.tensor([0]), torch.tensor([expected[i]]), torch.tensor([len(PROMPT) + i]))[0]
        ref = expected_logits[i + 1].cuda()
        assert (logits - ref).abs().max() < 0.05 * ref.abs().max() + 0.05


@pytest.mark.timeout(120)
def test_host_syncs_per_token_in_block_mode(tiny):
    rt = CudaGraphRuntime(tiny.model("llama", "cuda"), step="triton", block_size=16, tune=False)
    rt.reserve(1, len(PROMPT) + 257)
    rt.prefill(0, torch.tensor(PROMPT))  # warm-up: captures
    list(rt.iter_blocks(0, 1, len(PROMPT), SamplingSpec(), frozenset(), 40))
    before = rt.host_syncs
    tokens, _ = runtime_greedy(rt, PROMPT, 256, "block", k=16)
    assert len(tokens) == 256
    assert (rt.host_syncs - before) / 256 < 0.15


@pytest.mark.timeout(120)
def test_seeded_sampling_on_gpu_is_reproducible_across_block_sizes(tiny):
    rt = CudaGraphRuntime(tiny.model("qwen2", "cuda"), step="triton", tune=False)
    rt.reserve(1, 128)
    spec = SamplingSpec(temperature=1.0, top_k=50, top_p=0.9, seed=7)
    runs = []
    for k in (4, 16, 16):
        first = int(rt.prefill(0, torch.tensor(PROMPT)).argmax())
        runs.append([t for b in rt.iter_blocks(0, first, len(PROMPT), spec, frozenset(), 40, k=k) for t in b])
    assert runs[0] == runs[1] == runs[2] and len(runs[0]) == 40


@pytest.mark.timeout(120)
def test_engine_runs_on_the_cuda_graph_runtime(tiny):
    from solo import Engine, SamplingParams
    from solo.engine.block_decoding import run_in_blocks
    from solo.runtime import create_runtime

    loaded = Engine.load(tiny.folder("llama"), device="cuda", backend="eager")
    assert create_runtime(loaded.model, "auto", torch.device("cuda")).name == "cuda-graph"
    # Built around the runtime (not swapped in afterwards: the prefix cache and the capabilities are
    # read from the runtime at construction); tuning is exercised by the benchmark.
    engine = Engine(loaded.model, loaded.tokenizer, loaded.defaults, CudaGraphRuntime(loaded.model, tune=False),
                    loaded.model_dir, loaded.name, prefix_cache_gb=1.0)
    assert engine.capabilities.runtime.block_decoding
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    per_token = engine.complete("def fibonacci(n):", params)
    reference = Engine.load(tiny.folder("llama"), device="cuda", backend="eager").complete("def fibonacci(n):", params)
    assert per_token.token_ids == reference.token_ids
    request = engine.make_request("def fibonacci(n):", params)
    engine.runtime.reserve(1, len(request.prompt_ids) + request.max_new_tokens)
    logits = engine.runtime.prefill(0, torch.tensor(request.prompt_ids))
    events = list(run_in_blocks(engine.runtime, request, logits))
    assert [t for e in events for t in e.token_ids] == reference.token_ids


@pytest.mark.timeout(120)
def test_server_scheduler_on_captured_graphs(tiny):
    # The server's scheduler on the CUDA-graph runtime with graphs: a lone greedy request in blocks (one
    # host sync per block), two at once in per-token steps; the eager engine's tokens either way.

    from solo import Engine, SamplingParams
    from solo.server.scheduler import Scheduler

    loaded = Engine.load(tiny.folder("llama"), device="cuda", backend="eager", dtype="float32")
    reference = Engine.load(tiny.folder("llama"), device="cuda", backend="eager", dtype="float32")
    rt = CudaGraphRuntime(loaded.model, tune=False, block_size=8)
    prompts = ["def fibonacci(n):", "class Tree:"]
    params = SamplingParams(max_tokens=33, ignore_eos=True, temperature=0.0)
    expected = [reference.complete(p, params).token_ids for p in prompts]
    scheduler = Scheduler(rt, max_batch=2, max_queue=4, max_seq=128)
    scheduler.block_target_s = 60.0

    scheduler.start()
    try:
        syncs = rt.host_syncs
        assert scheduler_tokens(scheduler, [loaded.make_request(prompts[0], params)]) == [expected[0]]
        assert scheduler.blocks == 4 and rt.host_syncs - syncs == 1 + 4
        assert scheduler_tokens(scheduler, [loaded.make_request(p, params) for p in prompts]) == expected
    finally:
        scheduler.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(32, 8, 64), (32, 16, 96)])
def test_flash_decoding_at_long_context_real_shapes(heads, kv_heads, head_dim):
    from solo.runtime.triton.attention import AttentionPlan, decode_attention

    max_seq, pos = 8192, 5000
    kc = torch.randn(1, kv_heads, max_seq, head_dim, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(heads * head_dim, device="cuda", dtype=torch.bfloat16)
    state = torch.zeros(8, dtype=torch.int64, device="cuda")
    state[1] = pos
    out = torch.empty_like(q)
    plan = AttentionPlan(max_seq, heads, kv_heads, head_dim, "cuda")
    assert plan.num_parts > 1
    decode_attention(q, kc, vc, state, out, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     scale=head_dim**-0.5, plan=plan)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.view(1, heads, 1, head_dim).float(), kc[:, :, :pos + 1].float(), vc[:, :, :pos + 1].float(),
        scale=head_dim**-0.5, enable_gqa=True).reshape(-1)
    assert torch.linalg.norm(out.float() - ref) / torch.linalg.norm(ref) < 1e-2  # bf16 output rounding ~4e-3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,k,split_k", [(2048, 8192, 4), (3072, 12288, 2), (2048, 2048, 1)])
def test_split_k_gemv_real_shapes_is_right_and_deterministic(n, k, split_k):
    from solo.runtime.triton.gemv import GemvConfig, SplitKWorkspace, gemv

    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(k, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    config = GemvConfig(8, 512, split_k)
    ws = SplitKWorkspace(n, config, "cuda") if split_k > 1 else None
    outs = [gemv(w, x, residual=res, config=config, workspace=ws) for _ in range(20)]
    expected = (torch.nn.functional.linear(x.float(), w.float()).to(torch.bfloat16) + res)
    bf16_close(outs[0], expected, ulps=2)
    assert all(torch.equal(o, outs[0]) for o in outs)  # the last CTA sums the partials in a fixed order


@pytest.mark.timeout(240)
def test_compiled_torch_step_matches_eager(tiny):
    expected, expected_logits = eager_greedy(tiny.model("llama", "cuda"), PROMPT, 16)
    rt = CudaGraphRuntime(tiny.model("llama", "cuda"), step="compiled")
    tokens, _ = runtime_greedy(rt, PROMPT, 16, "block", k=8)
    _assert_same_greedy(tokens, expected, expected_logits)
