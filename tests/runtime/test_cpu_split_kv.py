"""Split-KV (flash-decoding) attention in the CPU decode kernel: at contexts past one 512-position block, a
sequence's attention is split into blocks on a fixed grid, run on different threads and merged. Checked
against the eager oracle at long-ish contexts, for batch invariance and thread-count invariance, at the block
edges, and (slow) under the AVX2 kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _decode_helpers import greedy_steps
from checkpoints import make_checkpoint

from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime import cpu_build
from solo.runtime.cpu import CpuRuntime
from solo.runtime.eager import EagerRuntime

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 512  # SOLO_KV_BLOCK in cpu_kernels/elementwise.h
F32_ATOL = 1e-4
BF16_ATOL = 0.25  # as tests/runtime/test_cpu_runtime.py's grouped-attention test over a long context

# (arch, query heads, KV heads): GQA with 2 KV heads (both threads had a head each before the split),
# 3 KV heads (2 threads: one had twice the work), MQA (one KV head: one thread streamed it all), and a
# sliding window that starts inside a block.
SHAPES = [("qwen2", 4, 2), ("llama", 6, 3), ("llama", 4, 1), ("mistral", 4, 2)]


def _checkpoint(tmp_path, arch, heads, kv_heads, dtype, context=2304):
    extra = {"sliding_window": 700} if arch == "mistral" else {}
    return make_checkpoint(tmp_path / f"{arch}-{heads}-{kv_heads}", arch, dtype=dtype, hidden_size=192, head_dim=64,
                           num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=context,
                           **extra)


def _load(folder, dtype):
    return load_weights(folder, ModelConfig.from_file(folder), dtype)


def _prompt(n: int, vocab: int = 380) -> list[int]:
    return [(7 * i * i + 3 * i + 5) % (vocab - 3) + 3 for i in range(n)]


@pytest.mark.parametrize("arch,heads,kv_heads", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_long_context_decode_matches_eager(tmp_path, arch, heads, kv_heads, dtype):
    folder = _checkpoint(tmp_path, arch, heads, kv_heads, dtype)
    # 2045 prompt tokens: decode steps at positions 2045..2050 cross the block edge at 2048 (4 -> 5 blocks).
    prompt = _prompt(2045)
    eager_tokens, eager_logits = greedy_steps(EagerRuntime(_load(folder, dtype)), prompt, 6)
    tokens, logits = greedy_steps(CpuRuntime(_load(folder, dtype)), prompt, 6, eager_tokens)
    atol = F32_ATOL if dtype == torch.float32 else BF16_ATOL
    torch.testing.assert_close(logits.float(), eager_logits.float(), atol=atol, rtol=0)
    if dtype == torch.float32:
        assert tokens == eager_tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_split_rows_are_batch_and_thread_count_invariant(tmp_path, dtype):
    folder = _checkpoint(tmp_path, "qwen2", 4, 1, dtype, context=1600)
    # Rows below, at and past the block edges: 1 block, exactly 2 (the current position opens block 2),
    # 2 and 3 blocks.
    lengths = [300, BLOCK, BLOCK + 1, 2 * BLOCK + 77]
    results = []
    for threads in (1, 2, 3):
        runtime = CpuRuntime(_load(folder, dtype), rows=len(lengths), max_seq=1600, num_threads=threads)
        first = [int(runtime.prefill(r, torch.tensor(_prompt(n))).argmax()) for r, n in enumerate(lengths)]
        positions = torch.tensor(lengths)
        batched = runtime.decode(torch.arange(len(lengths)), torch.tensor(first), positions)
        for r in range(len(lengths)):
            # The same position is rewritten with the batch-1 step's own keys and values before it is read.
            single = runtime.decode(torch.tensor([r]), torch.tensor([first[r]]), positions[r:r + 1])[0]
            assert torch.equal(batched[r], single), f"row of {lengths[r]} tokens, {threads} threads"
        results.append(batched)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


@pytest.mark.slow
def test_split_kv_under_the_avx2_kernels():
    available = [lv.name for lv in cpu_build.available_levels()]
    if "avx2" not in available:
        pytest.skip("this CPU cannot run the avx2 level")
    if cpu_build.selected_level().name == "avx2":
        pytest.skip("avx2 is this session's level: this file runs on it")
    # The step's barriers spin first (the default 2 ms; the suite's workers sleep at once, tests/conftest.py).
    env = {**os.environ, "SOLO_CPU_ISA": "avx2", "SOLO_CPU_SPIN_US": "2000"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", __file__, "-k", "not avx2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, f"split-KV tests under SOLO_CPU_ISA=avx2:\n{output}"
