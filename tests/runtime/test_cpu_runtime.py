"""The native CPU runtime against the eager oracle and transformers, on tiny checkpoints of every architecture."""

from __future__ import annotations

import platform

import pytest
import torch
from _decode_helpers import greedy_steps
from checkpoints import hf_greedy_ids, make_checkpoint
from transformers import AutoModelForCausalLM

from solo.errors import SoloError
from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime import create_runtime
from solo.runtime.cpu import CpuRuntime, cpu_unsupported_reason
from solo.runtime.eager import EagerRuntime

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "phi4", "smollm3"]
PROMPT = [1, 17, 93, 5, 250, 31, 77, 8, 140, 66, 12, 301, 9, 44, 2, 180, 23]  # longer than the sliding windows
F32_ATOL = 1e-4  # float32: only the summation order differs
# bfloat16: the runtime rounds wherever eager rounds, but PyTorch's attention uses its own exp() and
# summation order, so a logit can land one bf16 step (1/32 at |logit| in [4, 8)) away; allow a few.
BF16_ATOL = 0.15


def _load(folder, dtype):
    return load_weights(folder, ModelConfig.from_file(folder), dtype)


_greedy = greedy_steps


def _hf_greedy(folder, prompt, steps):
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    return hf_greedy_ids(hf, prompt, steps)


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_greedy_matches_transformers_and_eager(tmp_path, arch):
    folder = make_checkpoint(tmp_path / arch, arch)
    runtime = CpuRuntime(_load(folder, torch.float32))
    tokens, logits = _greedy(runtime, PROMPT, 32)
    eager_tokens, eager_logits = _greedy(EagerRuntime(_load(folder, torch.float32)), PROMPT, 32)
    assert tokens == eager_tokens
    assert tokens == _hf_greedy(folder, PROMPT, 32)
    torch.testing.assert_close(logits, eager_logits, atol=F32_ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_logits_match_eager(tmp_path, arch):
    folder = make_checkpoint(tmp_path / arch, arch, dtype=torch.bfloat16)
    eager_tokens, eager_logits = _greedy(EagerRuntime(_load(folder, torch.bfloat16)), PROMPT, 32)
    # Teacher forcing on eager's tokens keeps both runs on the same path, so every step is compared.
    tokens, logits = _greedy(CpuRuntime(_load(folder, torch.bfloat16)), PROMPT, 32, forced=eager_tokens)
    torch.testing.assert_close(logits.float(), eager_logits.float(), atol=BF16_ATOL, rtol=0)
    top2 = eager_logits.float().topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * BF16_ATOL  # argmax must agree wherever eager's choice is not a near-tie
    agree = logits.argmax(-1) == eager_logits.argmax(-1)
    assert bool(agree[clear].all())
    assert tokens[0] == eager_tokens[0]


@pytest.mark.parametrize("rope", [
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
], ids=lambda r: r["rope_type"])
def test_rope_scaling_and_biases(tmp_path, rope):
    # A 32-token trained context (dynamic NTK kicks in past it), and every optional bias switched on.
    folder = make_checkpoint(tmp_path / rope["rope_type"], "llama", max_position_embeddings=32,
                             attention_bias=True, mlp_bias=True, rope_parameters={"rope_theta": 10000.0, **rope})
    tokens, logits = _greedy(CpuRuntime(_load(folder, torch.float32)), PROMPT, 30)
    eager_tokens, eager_logits = _greedy(EagerRuntime(_load(folder, torch.float32)), PROMPT, 30)
    assert tokens == eager_tokens
    torch.testing.assert_close(logits, eager_logits, atol=F32_ATOL, rtol=0)


def test_dynamic_rope_rows_take_their_own_lengths_in_a_batch(tmp_path):
    # Dynamic NTK frequencies follow a sequence's own length: a row past the trained context must not change the
    # frequencies of a shorter row decoded in the same step.
    folder = make_checkpoint(tmp_path / "dynamic", "llama", max_position_embeddings=16,
                             rope_parameters={"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0})
    runtime = CpuRuntime(_load(folder, torch.float32))
    runtime.reserve(2, 64)
    prompts = [PROMPT[:6], PROMPT + PROMPT[:10]]  # 6 tokens (inside 16) and 27 (past it)
    for row, prompt in enumerate(prompts):
        runtime.prefill(row, torch.tensor(prompt))
    batched = runtime.decode(torch.tensor([0, 1]), torch.tensor([5, 7]), torch.tensor([6, len(prompts[1])]))
    runtime.prefill(0, torch.tensor(prompts[0]))
    alone = runtime.decode(torch.tensor([0]), torch.tensor([5]), torch.tensor([6]))[0]
    torch.testing.assert_close(batched[0], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_multi_row_decode_matches_single_rows(tmp_path, dtype):
    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=dtype)
    runtime = CpuRuntime(_load(folder, dtype))
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:12], PROMPT[:1], PROMPT[::-1]]  # 5 rows: a tile of 4 plus 1
    runtime.reserve(len(prompts), 64)
    singles, next_ids = [], []
    for row, prompt in enumerate(prompts):
        next_ids.append(int(runtime.prefill(row, torch.tensor(prompt)).argmax()))
    rows = torch.arange(len(prompts))
    positions = torch.tensor([len(p) for p in prompts])
    batched = runtime.decode(rows, torch.tensor(next_ids), positions)
    for row, prompt in enumerate(prompts):
        runtime.prefill(row, torch.tensor(prompt))
        singles.append(runtime.decode(torch.tensor([row]), torch.tensor([next_ids[row]]),
                                      torch.tensor([len(prompt)]))[0])
    # Same kernels, only the batch tiling differs: float32 to summation order, bf16 to the same rounding.
    torch.testing.assert_close(batched, torch.stack(singles), atol=1e-5 if dtype == torch.float32 else 0.07, rtol=0)


def test_rows_are_independent(tmp_path):
    folder = make_checkpoint(tmp_path / "qwen2", "qwen2")
    runtime = CpuRuntime(_load(folder, torch.float32))
    runtime.reserve(2, 64)
    alone = runtime.prefill(1, torch.tensor(PROMPT[:6]))
    first = runtime.decode(torch.tensor([1]), torch.tensor([int(alone.argmax())]), torch.tensor([6]))
    runtime.prefill(1, torch.tensor(PROMPT[:6]))
    runtime.prefill(0, torch.tensor(PROMPT))  # another sequence in row 0 must not leak into row 1
    again = runtime.decode(torch.tensor([1]), torch.tensor([int(alone.argmax())]), torch.tensor([6]))
    torch.testing.assert_close(first, again, atol=1e-6, rtol=0)


def test_auto_backend_picks_cpu_and_falls_back_for_float16(tmp_path):
    folder = make_checkpoint(tmp_path / "llama", "llama")
    model = _load(folder, torch.float32)
    assert isinstance(create_runtime(model, "auto", torch.device("cpu")), CpuRuntime)
    half = _load(folder, torch.float16)
    assert "float16" in cpu_unsupported_reason(half)
    assert isinstance(create_runtime(half, "auto", torch.device("cpu")), EagerRuntime)
    with pytest.raises(SoloError, match="cpu backend cannot run"):
        create_runtime(half, "cpu", torch.device("cpu"))


def test_a_float16_checkpoint_loads_as_bfloat16_for_the_cpu_kernels(tmp_path, caplog):
    # As vLLM on CPUs: dtype "auto" on a float16 checkpoint (an F16 GGUF file) takes the native kernels in
    # bfloat16 instead of the eager reference in float16; an explicit --dtype float16 keeps float16.
    from solo import Engine

    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.float16)
    engine = Engine.load(folder)
    assert engine.model.dtype == torch.bfloat16 and engine.backend_name == "cpu"
    assert "float16 weights are loaded as bfloat16 for the CPU kernels" in caplog.text
    assert Engine.load(folder, dtype="float16").model.dtype == torch.float16
    assert Engine.load(folder, backend="eager").model.dtype == torch.float16


def test_solo_bench_loads_a_float16_checkpoint_as_engine_load_does(tmp_path):
    # From a break-test: `solo bench` resolved the dtype itself and measured float16 on the eager reference (2.5x
    # slower than what `solo run` gives), and refused --backend cpu, which `solo run` takes.
    from types import SimpleNamespace

    from solo.bench.cli import _load

    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.float16)
    args = SimpleNamespace(shape=None, model=str(folder), revision=None, dtype="auto", backend="auto", seed=0)
    assert _load(args, torch.device("cpu"))[0].dtype == torch.bfloat16
    assert _load(SimpleNamespace(**{**vars(args), "dtype": "float16"}), torch.device("cpu"))[0].dtype == torch.float16


@pytest.mark.parametrize("edit", [{"torch_dtype": "float32", "dtype": "bfloat16"}, {}],
                         ids=["dtype-over-torch_dtype", "no-dtype-key"])
def test_auto_dtype_is_read_as_transformers_reads_it(tmp_path, edit):
    # From a break-test: with both keys transformers 5 takes `dtype`; with neither, the weights' own dtype (Solo took
    # float32: twice the checkpoint's memory).
    import json

    from solo import Engine

    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16)
    path = folder / "config.json"
    config = {k: v for k, v in json.loads(path.read_text()).items() if k not in ("dtype", "torch_dtype")}
    path.write_text(json.dumps({**config, **edit}))
    expected = AutoModelForCausalLM.from_pretrained(folder, dtype="auto").dtype
    assert Engine.load(folder, backend="eager").model.dtype == expected == torch.bfloat16


@pytest.mark.parametrize("default", [torch.float64, torch.bfloat16])
def test_torchs_default_dtype_changes_no_output(tmp_path, default):
    # From a break-test: the runtime made its RoPE tables and prefill buffers in torch's default dtype, which the
    # kernels read as float32: other outputs under float64 (cached in the tables after the default was restored),
    # and under a 2-byte default a heap overflow (SIGSEGV) on a prompt past 512 positions.
    from solo import Engine, SamplingParams

    folder = make_checkpoint(tmp_path / "llama", "llama", max_position_embeddings=1024)
    prompt, params = [5 + i % 300 for i in range(600)], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine = Engine.load(folder, backend="cpu")
    expected = engine.complete(prompt, params).token_ids
    try:
        torch.set_default_dtype(default)
        assert engine.complete(prompt, params).token_ids == expected
        assert Engine.load(folder, backend="cpu").complete(prompt, params).token_ids == expected
    finally:
        torch.set_default_dtype(torch.float32)
    assert engine.complete(prompt, params).token_ids == expected


def test_out_of_range_decode_is_refused(tmp_path):
    folder = make_checkpoint(tmp_path / "llama", "llama")
    runtime = CpuRuntime(_load(folder, torch.float32), rows=1, max_seq=16)
    with pytest.raises(SoloError, match="out of range"):
        runtime.decode(torch.tensor([0]), torch.tensor([3]), torch.tensor([16]))
    with pytest.raises(SoloError, match="out of range"):
        runtime.decode(torch.tensor([1]), torch.tensor([3]), torch.tensor([0]))
    with pytest.raises(SoloError, match="out of range"):
        runtime.decode(torch.tensor([0]), torch.tensor([10**6]), torch.tensor([0]))
    with pytest.raises(SoloError, match="0 rows"):  # (torch's min() of nothing raised a RuntimeError)
        runtime.decode(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long),
                       torch.tensor([], dtype=torch.long))
    with pytest.raises(SoloError, match="outside the reserved cache"):
        runtime.prefill(0, torch.arange(17))


def test_fused_weights_are_shared_with_the_eager_model(tmp_path):
    folder = make_checkpoint(tmp_path / "llama", "llama")
    model = _load(folder, torch.float32)
    before = sum(p.numel() for p in model.parameters())
    q = model.layers[0].attn.q_proj.weight.clone()
    CpuRuntime(model)
    CpuRuntime(model)  # a second runtime reuses the fused buffers instead of fusing again
    attn = model.layers[0].attn
    assert torch.equal(attn.q_proj.weight, q)
    assert attn.k_proj.weight.data_ptr() == attn.q_proj.weight.data_ptr() + q.numel() * q.element_size()
    assert sum(p.numel() for p in model.parameters()) == before


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("span", [0, 64], ids=["matmuls", "decode-kernel"])
def test_prefill_matches_eager_including_chunks(tmp_path, arch, dtype, span):
    folder = make_checkpoint(tmp_path / arch, arch, dtype=dtype)
    cpu, eager = CpuRuntime(_load(folder, dtype)), EagerRuntime(_load(folder, dtype))
    cpu.span_prefill_positions = span  # 0: the batched matmuls of a long prompt; 64: a short prompt's kernel
    atol = F32_ATOL if dtype == torch.float32 else BF16_ATOL
    for rt in (cpu, eager):
        rt.reserve(2, 64)
    # Whole prompt in row 1, then the same prompt in two chunks (start_pos > 0) in row 0.
    torch.testing.assert_close(cpu.prefill(1, torch.tensor(PROMPT)), eager.prefill(1, torch.tensor(PROMPT)),
                               atol=atol, rtol=0)
    cpu.prefill(0, torch.tensor(PROMPT[:7]))
    eager.prefill(0, torch.tensor(PROMPT[:7]))
    torch.testing.assert_close(cpu.prefill(0, torch.tensor(PROMPT[7:]), start_pos=7),
                               eager.prefill(0, torch.tensor(PROMPT[7:]), start_pos=7), atol=atol, rtol=0)
    for layer in range(cpu.config.num_layers):
        torch.testing.assert_close(cpu.cache.k[layer][:, :, :len(PROMPT)].float(),
                                   eager.cache.k[layer][:, :, :len(PROMPT)].float(), atol=atol, rtol=0)


def test_batched_decode_is_bit_identical_to_batch_1(tmp_path):
    """The server fuses decode steps only for batch-invariant runtimes: check the claim bit for bit."""
    from checkpoints import make_checkpoint

    from solo import Engine
    from solo.server.scheduler import runtime_is_batch_invariant

    for dtype in ("float32", "bfloat16"):
        engine = Engine.load(make_checkpoint(tmp_path / dtype, "llama"), dtype=dtype, backend="cpu")
        assert engine.runtime.batch_invariant
        assert runtime_is_batch_invariant(engine.runtime, rows=4)
    # solo serve --max-model-len 2: the probe's prompts are one token, its step at position 1.
    runtime = Engine.load(tmp_path / "float32", backend="cpu").runtime
    runtime.reserve(4, 2)
    assert runtime_is_batch_invariant(runtime, rows=4)


# The native runtime has a grouped attention kernel (one pass over a KV head's cache for all the query
# heads sharing it) for head_dim 64/96/128/256; the tiny checkpoints above (head_dim 16) take the per-head
# kernel. (arch, head_dim, query heads, KV heads): GQA groups of 2, 4 (shrunk to 2 at batch 1 so that both
# threads get work) and 8 (MQA), plus a sliding window.
GROUPED = [("llama", 64, 4, 2), ("llama", 128, 8, 1), ("qwen2", 64, 4, 1), ("mistral", 96, 6, 3)]
LONG_PROMPT = [(7 * i + 3) % 380 + 3 for i in range(90)]


@pytest.mark.parametrize("arch,head_dim,heads,kv_heads", GROUPED, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grouped_attention_matches_eager(tmp_path, arch, head_dim, heads, kv_heads, dtype):
    folder = make_checkpoint(tmp_path / arch, arch, dtype=dtype, head_dim=head_dim, num_attention_heads=heads,
                             num_key_value_heads=kv_heads, hidden_size=128)
    eager_tokens, eager_logits = _greedy(EagerRuntime(_load(folder, dtype)), LONG_PROMPT, 8)
    runtime = CpuRuntime(_load(folder, dtype))
    tokens, logits = _greedy(runtime, LONG_PROMPT, 8, forced=eager_tokens)
    # bfloat16 over a 90-token context: more of the roundings where PyTorch's attention differs (see
    # BF16_ATOL) pile up; the per-head kernel lands at the same bits as this one (0.17 here at most).
    atol = F32_ATOL if dtype == torch.float32 else 0.25
    torch.testing.assert_close(logits.float(), eager_logits.float(), atol=atol, rtol=0)
    if dtype == torch.float32:
        assert tokens == eager_tokens == _hf_greedy(folder, LONG_PROMPT, 8)
    # Batch 2 changes how query heads are grouped per work item, never a head's arithmetic: same bits.
    runtime.reserve(2, len(LONG_PROMPT) + 2)
    first = [int(runtime.prefill(row, torch.tensor(LONG_PROMPT[row:])).argmax()) for row in range(2)]
    positions = torch.tensor([len(LONG_PROMPT), len(LONG_PROMPT) - 1])
    batched = runtime.decode(torch.arange(2), torch.tensor(first), positions)
    for row in range(2):
        runtime.prefill(row, torch.tensor(LONG_PROMPT[row:]))
        single = runtime.decode(torch.tensor([row]), torch.tensor([first[row]]), positions[row:row + 1])[0]
        assert torch.equal(batched[row], single)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_decode_is_bit_identical_at_real_widths(tmp_path, dtype):
    """Batch invariance where the kernels' unrolled loops run: hidden 896, intermediate 2048, head_dim 64."""
    from solo.server.scheduler import runtime_is_batch_invariant

    folder = make_checkpoint(tmp_path / "qwen2", "qwen2", hidden_size=896, intermediate_size=2048,
                             num_hidden_layers=1, num_attention_heads=14, num_key_value_heads=2)
    runtime = CpuRuntime(_load(folder, getattr(torch, dtype)), rows=4, max_seq=32)
    assert runtime_is_batch_invariant(runtime, rows=4)
    runtime = CpuRuntime(_load(folder, getattr(torch, dtype)), rows=2, max_seq=32)
    assert runtime_is_batch_invariant(runtime, rows=2)


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_float32_prefill_matmuls_of_a_bf16_model_match_eager(tmp_path, quantize):
    """CPUs without a native bf16 matmul run prefill's matmuls in float32 (widened bf16 weights)."""
    from solo.runtime.quant import quantize_model, set_int8_activations

    folder = make_checkpoint(tmp_path / "qwen2", "qwen2", dtype=torch.bfloat16)
    model = _load(folder, torch.bfloat16)
    if quantize:
        model = quantize_model(model, quantize)
    cpu = CpuRuntime(model)
    eager = EagerRuntime(set_int8_activations(model, cpu.int_dot) if quantize else model)
    cpu.prefill_matmul_dtype = torch.float32
    cpu.span_prefill_positions = 0  # the matmul path even for this short prompt
    for rt in (cpu, eager):
        rt.reserve(1, 64)
    torch.testing.assert_close(cpu.prefill(0, torch.tensor(PROMPT)), eager.prefill(0, torch.tensor(PROMPT)),
                               atol=BF16_ATOL, rtol=0)
    for layer in range(cpu.config.num_layers):
        torch.testing.assert_close(cpu.cache.v[layer][:, :, :len(PROMPT)].float(),
                                   eager.cache.v[layer][:, :, :len(PROMPT)].float(), atol=BF16_ATOL, rtol=0)


def test_prefill_matmul_dtype_follows_the_cpu(monkeypatch):
    from solo.runtime.cpu import native_bf16_matmul

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not native_bf16_matmul()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    if platform.machine() == "x86_64":
        assert native_bf16_matmul() == any(
            getattr(torch.cpu, n)() for n in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def test_more_threads_than_cores_give_the_same_bits(tmp_path):
    """The step's barrier sleeps after a bounded spin: oversubscribed threads still finish, with identical logits
    (each weight row and attention head is computed by one thread with the same arithmetic, whatever the split)."""
    import os

    folder = make_checkpoint(tmp_path / "qwen2", "qwen2", dtype=torch.bfloat16, hidden_size=128, head_dim=64,
                             num_attention_heads=4, num_key_value_heads=2)
    threads = 3 * (os.cpu_count() or 2) + 1
    results = []
    for num_threads in (2, threads):
        runtime = CpuRuntime(_load(folder, torch.bfloat16), num_threads=num_threads)
        results.append(_greedy(runtime, PROMPT, 6)[1])
    assert torch.equal(results[0], results[1])
