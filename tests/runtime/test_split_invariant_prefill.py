"""A sequence's KV and logits must not depend on how its prefill was split (issue #15).

The prefix cache prefills only a prompt's uncached tail, the scheduler prefills long prompts in chunks, and
a finished request's generated tokens come back as cached KV: with a split-dependent prefill, a greedy
request's output depended on what the server had run before it (the load bench found a chat-pool prompt
whose output under load differed from its lone run). `CpuRuntime.prefill` runs every prefill that ends
within `span_prefill_positions` through the decode kernel, which computes each token alone, so every
split gives the same bits as a cold prefill and as decode steps (`solo.runtime.cpu.SPAN_PREFILL_POSITIONS`).
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_checkpoint

from solo.errors import ModelNotFoundError
from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime.cpu import CpuRuntime

PROMPT = [(37 * i + 11) % 300 + 2 for i in range(40)]
SPLITS = [[1], [7], [13], [20], [39], [16, 32], list(range(1, 40))]  # cached prefix + tail; chunks; token by token


@pytest.fixture(scope="module", params=["llama", "gemma2", "qwen2_moe"])
def runtime(request, tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    rt = CpuRuntime(load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16))
    rt.reserve(2, 64)
    return rt


def _prefill(rt: CpuRuntime, row: int, prompt: list[int], splits: list[int]) -> torch.Tensor:
    pos = 0
    for end in [*splits, len(prompt)]:
        logits = rt.prefill(row, torch.tensor(prompt[pos:end]), pos)
        pos = end
    return logits


@pytest.mark.parametrize("splits", SPLITS, ids=lambda s: f"at{s[0]}x{len(s)}")
def test_any_split_of_a_short_prompt_gives_the_cold_prefill_bits(runtime, splits):
    cold = _prefill(runtime, 0, PROMPT, [])
    split = _prefill(runtime, 1, PROMPT, splits)
    assert torch.equal(split, cold)
    for layer in range(runtime.config.num_layers):
        assert torch.equal(runtime.cache.k[layer][1, :, :len(PROMPT)], runtime.cache.k[layer][0, :, :len(PROMPT)])
        assert torch.equal(runtime.cache.v[layer][1, :, :len(PROMPT)], runtime.cache.v[layer][0, :, :len(PROMPT)])


def test_the_prefill_of_generated_tokens_equals_their_decode_steps(runtime):
    # A finished request's row holds prompt + output: the next turn reuses the output's decode-step KV,
    # which must be what a cold prefill of the same tokens writes.
    runtime.prefill(0, torch.tensor(PROMPT[:10]))
    for i, token in enumerate(PROMPT[10:]):
        stepped = runtime.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([10 + i]))[0]
    assert torch.equal(runtime.prefill(1, torch.tensor(PROMPT)), stepped)


def test_a_tail_prefill_past_a_kv_block_equals_its_decode_steps(tmp_path):
    # The span prefill runs its last layer past the cache writes for the last token alone, whose attention
    # then spans two KV blocks (split-KV parts): still the bits of that token's decode step.
    folder = make_checkpoint(tmp_path, "llama")
    rt = CpuRuntime(load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16))
    rt.reserve(2, 640)
    prompt = [(37 * i + 11) % 300 + 2 for i in range(600)]
    for row in (0, 1):
        rt.prefill(row, torch.tensor(prompt[:560]))
    for i, token in enumerate(prompt[560:]):
        stepped = rt.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([560 + i]))[0]
    assert torch.equal(rt.prefill(1, torch.tensor(prompt[560:]), 560), stepped)


# A prompt of the load bench's pool (a cut of Solo's own source) whose greedy continuation, on the bundled
# model in bfloat16, changed with the prefill's split point when short prompts took the batched matmuls.
BUNDLED_PROMPT = (" has more ids than the shape's vocabulary.\n    \"\"\"\n    from pathlib import Path\n\n"
                  "    from solo.bench.shapes import shape_model_for_")


@pytest.mark.slow
def test_bundled_model_greedy_output_does_not_depend_on_the_cached_prefix():
    from solo import Engine
    from solo.engine.sampling import SamplingParams

    try:
        cold = Engine.load(None, dtype="bfloat16", backend="cpu", prefix_cache_gb=None, speculative="off")
        warm = Engine.load(None, dtype="bfloat16", backend="cpu", speculative="off")
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    expected = cold.complete(BUNDLED_PROMPT, greedy).token_ids
    ids = warm.encode_prompt(BUNDLED_PROMPT)
    for cut in (3, 5, 9, 27):  # split points that flipped a token at output 12-20 before the fix
        warm.prefix_cache.clear()  # only the primed prefix is cached
        warm.complete(warm.tokenizer.decode(ids[:cut]), SamplingParams(max_tokens=1, temperature=0.0))
        got = warm.complete(BUNDLED_PROMPT, greedy)
        assert 0 < got.stats.cached_tokens < len(ids) - 1
        assert got.token_ids == expected, f"cached prefix of {got.stats.cached_tokens} tokens"


def test_packed_levels_cover_2048_positions_of_a_dense_model(tmp_path):
    # At the amx level, and at avx512-bf16 with packed weights, the span prefill is no slower than the matmuls
    # up to 2048 positions (`SPAN_PREFILL_POSITIONS_AMX`), so a prompt past 512 positions is split-exact there too.
    from solo.runtime.cpu import PACKED_BF16_LEVELS, SPAN_PREFILL_POSITIONS, SPAN_PREFILL_POSITIONS_AMX

    folder = make_checkpoint(tmp_path, "llama")
    rt = CpuRuntime(load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16))
    if rt.isa not in PACKED_BF16_LEVELS:
        assert rt.span_prefill_positions == SPAN_PREFILL_POSITIONS
        pytest.skip(f"the kernels run at the {rt.isa} level here (bf16 weights row-major)")
    assert rt.span_prefill_positions == SPAN_PREFILL_POSITIONS_AMX
    if rt.isa != "amx":  # row-major weights at avx512-bf16 (a measurement setting) keep the shorter bound
        row_major = CpuRuntime(load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16), pack_amx=False)
        assert row_major.span_prefill_positions == SPAN_PREFILL_POSITIONS
    rt.reserve(2, 800)
    prompt = [(37 * i + 11) % 300 + 2 for i in range(700)]
    cold = _prefill(rt, 0, prompt, [])
    assert torch.equal(_prefill(rt, 1, prompt, [300, 556, 690]), cold)  # chunks and a cached prefix + tail
    moe = make_checkpoint(tmp_path / "moe", "qwen2_moe")
    assert CpuRuntime(load_weights(moe, ModelConfig.from_file(moe), torch.bfloat16)).span_prefill_positions \
        == SPAN_PREFILL_POSITIONS  # the grouped expert matmuls are faster past it
    from solo.runtime.quant import quantize_model

    int8 = quantize_model(load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16), "int8")
    assert CpuRuntime(int8).span_prefill_positions == SPAN_PREFILL_POSITIONS  # int8 products: neither tiles nor packed
    f32 = load_weights(folder, ModelConfig.from_file(folder), torch.float32)
    assert CpuRuntime(f32).span_prefill_positions == SPAN_PREFILL_POSITIONS


def test_a_long_span_prefill_is_split_into_calls_with_the_same_bits(tmp_path, monkeypatch):
    # Spans longer than SPAN_CALL_TOKENS run as several kernel calls (bounded workspace); every token is computed
    # alone, so the bits are those of any other split.
    from solo.runtime import cpu

    monkeypatch.setattr(cpu, "SPAN_CALL_TOKENS", 64)
    folder = make_checkpoint(tmp_path, "llama")
    rt = CpuRuntime(load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16))
    rt.span_prefill_positions = 300
    rt.reserve(2, 320)
    prompt = [(37 * i + 11) % 300 + 2 for i in range(290)]
    calls = []
    step = rt._step
    monkeypatch.setattr(rt, "_step", lambda *a: calls.append(len(a[1])) or step(*a))
    cold = _prefill(rt, 0, prompt, [])
    assert calls == [64, 64, 64, 64, 34]
    assert torch.equal(_prefill(rt, 1, prompt, [100, 200]), cold)
