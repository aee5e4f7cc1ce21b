"""Mixture-of-experts models in the server: concurrent requests stay isolated, batched decode routes per row."""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_checkpoint
from server_harness import start_server
from test_isolation import CASES, run_one, run_together

from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime import create_runtime


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    """A tiny Qwen2-MoE (8 experts, top-2, a shared expert, one dense layer), with a chat template."""
    return make_checkpoint(tmp_path_factory.mktemp("moe") / "model", "qwen2_moe")


def test_concurrent_moe_streams_equal_their_lone_runs(moe_model):
    # Prefix caching off, as in test_isolation.py: reused KV equals a fresh prefill only up to rounding.
    running = start_server(moe_model, max_batch=4, max_queue=16, backend="auto", prefix_cache_gb=None)
    try:
        assert running.state.status == "ok", running.state.error
        client = running.client(timeout=120)
        alone = [run_one(client, prompt, params) for prompt, params in CASES]
        together = run_together(running)
        assert running.state.scheduler.peak_active >= 2
        for i, (one, other) in enumerate(zip(alone, together, strict=True)):
            assert other == one, f"request {i} changed when run beside others: {one} != {other}"
    finally:
        running.stop()


def test_batched_moe_decode_matches_each_row_alone(moe_model):
    # One decode call over 4 rows routes each row to its own experts (the batch reads their union).
    config = ModelConfig.from_file(moe_model)
    model = load_weights(moe_model, config, torch.float32)
    runtime = create_runtime(model, "auto", torch.device("cpu"))
    assert runtime.name == "cpu" and runtime.batch_invariant  # the native runtime (cpu_kernels/moe.h)
    runtime.reserve(4, 64)
    prompts = [[5, 9, 13], [7, 7, 7, 7, 7], [100, 3], [42, 43, 44, 45]]
    first = [int(runtime.prefill(row, torch.tensor(ids)).argmax()) for row, ids in enumerate(prompts)]
    positions = torch.tensor([len(ids) for ids in prompts])
    batched = runtime.decode(torch.arange(4), torch.tensor(first), positions)
    for row in range(4):
        runtime.prefill(row, torch.tensor(prompts[row]))
        single = runtime.decode(torch.tensor([row]), torch.tensor([first[row]]), positions[row:row + 1])[0]
        assert torch.equal(batched[row], single)  # bit for bit: the server's batch invariance
