"""Mixture-of-experts models on the CUDA-graph runtime's steps (without graphs; the interpreter on a CPU)."""

from __future__ import annotations

# isort: off
from _triton_env import DEVICE, requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import pytest
import torch
from _cuda_helpers import PROMPT, TinyCheckpoints, eager_greedy, runtime_greedy

from solo.runtime.cuda.runtime import CudaGraphRuntime
from solo.runtime.cuda.weights import weight_bytes_per_token

pytestmark = requires_triton


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyCheckpoints:
    return TinyCheckpoints(tmp_path_factory.mktemp("cuda-moe"))


@pytest.mark.parametrize("step", ["triton", "torch"])
@pytest.mark.parametrize("arch", ["olmoe", pytest.param("qwen2_moe", marks=pytest.mark.slow),
                                  pytest.param("mixtral", marks=pytest.mark.slow)])
def test_moe_steps_match_eager(tiny, arch, step):
    steps = 4
    expected, expected_logits = eager_greedy(tiny.model(arch, DEVICE), PROMPT, steps)
    rt = CudaGraphRuntime(tiny.model(arch, DEVICE), step=step, use_graphs=False)
    tokens, logits = runtime_greedy(rt, PROMPT, steps, "token")
    assert tokens == expected
    for a, b in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_weight_bytes_count_the_active_experts(tiny):
    model = tiny.model("mixtral")
    cfg = model.config
    inactive = (cfg.num_experts - cfg.num_experts_per_tok) * 3 * cfg.hidden_size * cfg.moe_intermediate_size
    everything = sum(p.numel() for p in model.parameters()) - cfg.vocab_size * cfg.hidden_size + cfg.hidden_size
    assert weight_bytes_per_token(model) == 4 * (everything - cfg.num_layers * inactive)


@pytest.mark.gpu
@pytest.mark.timeout(180)
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("step", ["triton", "torch"])
@pytest.mark.parametrize("arch", ["olmoe", "qwen2_moe", "mixtral", "qwen3_moe"])
def test_moe_graphs_on_gpu_match_eager_without_host_syncs(tiny, arch, step):
    # Captured graphs: the expert ids must stay on the device (a host read would fail the capture).
    steps = 32
    expected, expected_logits = eager_greedy(tiny.model(arch, "cuda"), PROMPT, steps)
    rt = CudaGraphRuntime(tiny.model(arch, "cuda"), step=step, block_size=16, tune=False)
    tokens, logits = runtime_greedy(rt, PROMPT, steps, "token")
    assert tokens == expected
    for a, b in zip(logits[:8], expected_logits[:8], strict=False):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    before = rt.host_syncs
    block_tokens, _ = runtime_greedy(rt, PROMPT, steps, "block", k=16)
    assert block_tokens == tokens
    assert rt.host_syncs - before <= steps // 4  # about one per block of 16 tokens, none per layer
