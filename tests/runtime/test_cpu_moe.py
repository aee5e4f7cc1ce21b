"""The native CPU runtime on mixture-of-experts models, against the eager oracle and transformers.

Mixtral (top-2 of 8, float32 routing weights), Qwen2-MoE (shared expert with a sigmoid gate, a dense
mlp_only layer), Qwen3-MoE (a dense layer from decoder_sparse_step, q/k norms) and OLMoE (q/k norms over
the whole projection), on tiny random checkpoints written by transformers (tests/checkpoints.py).
"""

from __future__ import annotations

import pytest
import torch
from _decode_helpers import greedy_steps
from checkpoints import hf_greedy_ids, make_checkpoint
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from solo.errors import SoloError
from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime import create_runtime
from solo.runtime.cpu import CpuRuntime
from solo.runtime.eager import EagerRuntime
from solo.runtime.quant import quantize_model, set_int8_activations
from solo.runtime.quant_moe import QuantExperts
from solo.server.scheduler import runtime_is_batch_invariant

ARCHS = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
PROMPT = [1, 17, 93, 5, 250, 31, 77, 8, 140, 66, 12, 301, 9, 44, 2, 180, 23]
F32_ATOL = 1e-4  # float32: only summation orders differ
# bfloat16: as tests/runtime/test_cpu_runtime.py (PyTorch's attention rounds a logit a bf16 step away at
# times); the routing sees the same rounded router logits, so the experts chosen are the same.
BF16_ATOL = 0.15


def _load(folder, dtype):
    return load_weights(folder, ModelConfig.from_file(folder), dtype)


def _greedy(runtime, prompt, steps, forced=None):
    return greedy_steps(runtime, prompt, steps, forced, with_prefill=True)


def _hf_greedy(folder, prompt, steps):
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return hf_greedy_ids(hf, prompt, steps)


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_greedy_matches_transformers_and_eager(tmp_path, arch):
    folder = make_checkpoint(tmp_path / arch, arch)
    runtime = create_runtime(_load(folder, torch.float32), "auto", torch.device("cpu"))
    assert isinstance(runtime, CpuRuntime)  # MoE models take the native runtime now
    tokens, logits = _greedy(runtime, PROMPT, 32)
    eager_tokens, eager_logits = _greedy(EagerRuntime(_load(folder, torch.float32)), PROMPT, 32)
    assert tokens == eager_tokens
    assert tokens == _hf_greedy(folder, PROMPT, 32)
    torch.testing.assert_close(logits, eager_logits, atol=F32_ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_greedy_and_logits_match_eager(tmp_path, arch):
    folder = make_checkpoint(tmp_path / arch, arch, dtype=torch.bfloat16)
    eager_tokens, eager_logits = _greedy(EagerRuntime(_load(folder, torch.bfloat16)), PROMPT, 16)
    runtime = CpuRuntime(_load(folder, torch.bfloat16))
    # Teacher forcing on eager's tokens keeps both on one path, so every step's logits are compared.
    _, logits = _greedy(runtime, PROMPT, 16, forced=eager_tokens)
    torch.testing.assert_close(logits, eager_logits, atol=BF16_ATOL, rtol=0)
    top2 = eager_logits.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * BF16_ATOL  # argmax must agree wherever eager's choice is no near-tie
    assert bool((logits.argmax(-1) == eager_logits.argmax(-1))[clear].all())
    # Free-running greedy: 16 tokens identical to eager's, or diverging only where eager's choice is a near-tie
    # (bf16 rounding may flip one there, as for the dense models: qwen2_moe's token 16 of 16, where eager's
    # top-2 gap is 0.125 and the two runtimes' logits are within 0.1).
    tokens = _greedy(runtime, PROMPT, 16)[0]
    diverged = next((i for i, (a, b) in enumerate(zip(tokens, eager_tokens, strict=True)) if a != b), None)
    assert diverged is None or not bool(clear[diverged]), (tokens, eager_tokens)


@pytest.mark.parametrize("arch", ["qwen2_moe", "olmoe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_prefill_matches_eager_including_chunks(tmp_path, arch, dtype):
    folder = make_checkpoint(tmp_path / arch, arch, dtype=dtype)
    cpu, eager = CpuRuntime(_load(folder, dtype)), EagerRuntime(_load(folder, dtype))
    atol = F32_ATOL if dtype == torch.float32 else BF16_ATOL
    for rt in (cpu, eager):
        rt.reserve(2, 64)
    torch.testing.assert_close(cpu.prefill(1, torch.tensor(PROMPT)), eager.prefill(1, torch.tensor(PROMPT)),
                               atol=atol, rtol=0)
    cpu.prefill(0, torch.tensor(PROMPT[:7]))
    eager.prefill(0, torch.tensor(PROMPT[:7]))
    torch.testing.assert_close(cpu.prefill(0, torch.tensor(PROMPT[7:]), start_pos=7),
                               eager.prefill(0, torch.tensor(PROMPT[7:]), start_pos=7), atol=atol, rtol=0)
    for layer in range(cpu.config.num_layers):  # OLMoE's whole-projection k norm lands in the cache too
        torch.testing.assert_close(cpu.cache.k[layer][:, :, :len(PROMPT)].float(),
                                   eager.cache.k[layer][:, :, :len(PROMPT)].float(), atol=atol, rtol=0)


@pytest.mark.parametrize("ties", ["all", "some"])
def test_router_ties_break_like_transformers(tmp_path, ties):
    # "all": every router row equal, so every token's experts are decided by the tie-breaking alone
    # (torch.topk's order on the CPU, which is not lowest index first: 6, 5 of 8); "some": experts 5 and 7
    # copy expert 2's row, so they tie with it whenever it is among the top-k.
    folder = make_checkpoint(tmp_path / ties, "olmoe")
    tensors = load_file(folder / "model.safetensors")
    for name, tensor in tensors.items():
        if name.endswith("mlp.gate.weight"):
            if ties == "all":
                tensors[name] = tensor[:1].expand_as(tensor).contiguous()
            else:
                tensor = tensor.clone()
                tensor[5] = tensor[7] = tensor[2]
                tensors[name] = tensor
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    tokens, logits = _greedy(CpuRuntime(_load(folder, torch.float32)), PROMPT, 12)
    eager_tokens, eager_logits = _greedy(EagerRuntime(_load(folder, torch.float32)), PROMPT, 12)
    assert tokens == eager_tokens == _hf_greedy(folder, PROMPT, 12)
    torch.testing.assert_close(logits, eager_logits, atol=F32_ATOL, rtol=0)


@pytest.mark.parametrize("experts,k", [(8, 2), (64, 8), (128, 8), (60, 4), (128, 2), (256, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_native_routing_equals_torch_topk_including_ties(experts, k, dtype):
    # Many ties (logits drawn from 5 values) through both of torch.topk's CPU algorithms (nth_element + sort,
    # and partial_sort where k * 64 <= experts), every expert count of the MoE families and more.
    import ctypes

    from solo.model.moe import route
    from solo.runtime.cpu import checked_library

    lib = checked_library()
    gen = torch.Generator().manual_seed(experts * 10 + k)
    logits = torch.randint(0, 5, (64, experts), generator=gen).to(dtype) * 0.25
    logits[0] = 0.0  # one row of all-equal logits
    for norm, fp32 in ((False, False), (True, False), (True, True)):
        ref_w, ref_ids = route(logits, torch.eye(experts, dtype=dtype), k, norm, fp32)  # router = identity
        ids = torch.empty(64, k, dtype=torch.int32)
        weights = torch.empty(64, k)
        as_float = logits.float().contiguous()  # kept alive through the call
        lib.solo_moe_route(ctypes.c_void_p(as_float.data_ptr()), 64, experts, k, int(norm),
                           int(fp32), int(dtype == torch.bfloat16), ctypes.c_void_p(ids.data_ptr()),
                           ctypes.c_void_p(weights.data_ptr()))
        assert torch.equal(ids.long(), ref_ids), (norm, fp32)
        torch.testing.assert_close(weights, ref_w.float(), atol=1e-6, rtol=0)


# int4 needs every input size a multiple of 32: the tiny Mixtral's experts (48) and Qwen2-MoE's shared
# expert (48) are not, so int4 runs on OLMoE and Qwen3-MoE.
QUANT_CASES = [("mixtral", "int8"), ("qwen2_moe", "int8"), ("qwen3_moe", "int8"), ("olmoe", "int8"),
               ("qwen3_moe", "int4"), ("olmoe", "int4")]


@pytest.mark.parametrize("arch,mode", QUANT_CASES)
def test_quantized_experts_match_eager_on_the_same_quantized_model(tmp_path, arch, mode):
    folder = make_checkpoint(tmp_path / arch, arch)
    model = _load(folder, torch.float32)
    qmodel = quantize_model(model, mode)
    moe_layer = next(i for i in range(model.config.num_layers) if model.config.is_moe_layer(i))
    assert isinstance(qmodel.layers[moe_layer].mlp.gate_up_proj, QuantExperts)
    assert isinstance(model.layers[moe_layer].mlp.gate_up_proj, torch.nn.Parameter)  # the original is untouched
    cpu = CpuRuntime(qmodel)
    eager = EagerRuntime(set_int8_activations(qmodel, cpu.int_dot))  # attention: the integer-dot kernels' inputs
    for rt in (cpu, eager):
        rt.reserve(2, 40)
    # The default prefill of a short prompt is the decode kernel over its tokens: the eager model's decode
    # steps are its reference. (The eager batched prefill differs from those steps by rounding, which the
    # int8 activation blocks can widen into a different router choice on these tiny random models.)
    prompt = torch.tensor(PROMPT)
    b = eager.prefill(1, prompt[:1])
    for pos in range(1, len(PROMPT)):
        b = eager.decode(torch.tensor([1]), prompt[pos:pos + 1], torch.tensor([pos]))[0]
    torch.testing.assert_close(cpu.prefill(1, prompt), b, atol=F32_ATOL, rtol=0)
    cpu.span_prefill_positions = 0  # the batched-matmul prefill: eager's prefill is its reference
    a, b = cpu.prefill(0, prompt), eager.prefill(0, prompt)
    torch.testing.assert_close(a, b, atol=F32_ATOL, rtol=0)
    token = int(b.argmax())
    for pos in range(len(PROMPT), len(PROMPT) + 12):
        a = cpu.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([pos]))
        b = eager.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([pos]))
        torch.testing.assert_close(a, b, atol=F32_ATOL, rtol=0)
        token = int(b.argmax())


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_bfloat16_experts_match_eager(tmp_path, mode):
    # bf16 activations: int4 takes the bf16 dot-product kernel where the CPU has AVX512-BF16.
    folder = make_checkpoint(tmp_path / "olmoe", "olmoe", dtype=torch.bfloat16)
    qmodel = quantize_model(_load(folder, torch.bfloat16), mode)
    # The experts' kernels are the subject: attention on the float path too. (With integer-dot attention, decode
    # multiplies the exact int8-block values of the activations and the eager reference their bf16 roundings;
    # that small difference flipped a near-tied expert choice at one of 12 steps here. The float32 test above
    # covers integer-dot attention in MoE models.)
    cpu = CpuRuntime(qmodel, int_dot=False)
    eager_tokens, eager_logits = _greedy(EagerRuntime(qmodel), PROMPT, 12)
    tokens, logits = _greedy(cpu, PROMPT, 12, forced=eager_tokens)
    assert tokens[0] == eager_tokens[0]
    torch.testing.assert_close(logits, eager_logits, atol=BF16_ATOL, rtol=0)


def test_int4_refuses_expert_widths_that_are_not_multiples_of_32(tmp_path):
    folder = make_checkpoint(tmp_path / "mixtral", "mixtral")  # experts of width 48
    with pytest.raises(SoloError, match="multiples of 32"):
        quantize_model(_load(folder, torch.float32), "int4")


@pytest.mark.parametrize("arch,dtype,mode", [("qwen2_moe", "float32", None), ("qwen2_moe", "bfloat16", None),
                                             ("olmoe", "bfloat16", None), ("mixtral", "float32", None),
                                             ("qwen3_moe", "float32", "int8"), ("olmoe", "bfloat16", "int4")])
def test_batched_decode_is_bit_identical_to_batch_1(tmp_path, arch, dtype, mode):
    """Rows of a batch route to different experts (their union is streamed): each row's logits are still those
    of a batch-1 step, bit for bit (the server's batch invariance)."""
    folder = make_checkpoint(tmp_path / arch, arch, dtype=getattr(torch, dtype))
    model = _load(folder, getattr(torch, dtype))
    runtime = CpuRuntime(quantize_model(model, mode) if mode else model, rows=5, max_seq=72)
    assert runtime_is_batch_invariant(runtime, rows=5, trials=4)


def test_batched_decode_is_bit_identical_at_real_widths(tmp_path):
    """Batch invariance where the kernels' unrolled loops and multi-sequence tiles run (hidden 512, experts of
    width 256, 16 experts, top-4, a shared expert), in bfloat16."""
    folder = make_checkpoint(tmp_path / "qwen2_moe", "qwen2_moe", dtype=torch.bfloat16, hidden_size=512,
                             num_hidden_layers=1, mlp_only_layers=[], num_attention_heads=8, num_key_value_heads=2,
                             num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256,
                             shared_expert_intermediate_size=512)
    runtime = CpuRuntime(_load(folder, torch.bfloat16), rows=6, max_seq=72)
    assert runtime_is_batch_invariant(runtime, rows=6, trials=4)


@pytest.mark.parametrize("mode", [None, "int4"])
def test_expert_schedules_and_thread_counts_give_identical_logits(tmp_path, monkeypatch, mode):
    """Expert work claimed item by item (the default: gate/up and down items in one stream; knob moe_fused=0: two
    phases with a barrier between; smaller items), or in fixed row blocks (SOLO_MOE_SCHEDULE=static), on 1, 2 or
    3 threads: every row's arithmetic is the same, so the logits are bit for bit equal. Widths of several work
    items per expert (gate/up blocks of 128 rows, down blocks of 256) with a partial last block, in bf16."""
    folder = make_checkpoint(tmp_path / "qwen2_moe", "qwen2_moe", dtype=torch.bfloat16, hidden_size=576,
                             num_hidden_layers=1, mlp_only_layers=[], num_attention_heads=8, num_key_value_heads=2,
                             num_experts=16, num_experts_per_tok=4, moe_intermediate_size=352,
                             shared_expert_intermediate_size=96)
    model = _load(folder, torch.bfloat16)
    model = quantize_model(model, mode) if mode else model
    out = []
    knobs = {"phased": {"moe_fused": 0}, "small": {"moe_gu_rows": 32, "moe_down_rows": 32}}
    defaults = {"moe_fused": 1, "moe_gu_rows": 128, "moe_down_rows": 256}
    for schedule, threads in (("dynamic", 2), ("static", 2), ("dynamic", 3), ("dynamic", 1), ("static", 3),
                              ("phased", 2), ("small", 2), ("small", 3)):
        monkeypatch.setenv("SOLO_MOE_SCHEDULE", "static" if schedule == "static" else "dynamic")
        runtime = CpuRuntime(model, rows=3, max_seq=40, num_threads=threads)
        try:
            for name, value in knobs.get(schedule, {}).items():
                runtime._lib.solo_set_knob(name.encode(), value)
            for row in range(3):
                runtime.prefill(row, torch.tensor(PROMPT[row:row + 9]))
            logits = [runtime.decode(torch.tensor([0, 1, 2]), torch.tensor([5 + i, 70, 301 - i]),
                                     torch.tensor([9 + i] * 3)) for i in range(4)]
        finally:
            for name, value in defaults.items():
                runtime._lib.solo_set_knob(name.encode(), value)
        out.append(torch.stack(logits))
    assert all(torch.equal(out[0], o) for o in out[1:])


def test_step_profile_times_the_moe_phases(tmp_path):
    """cpu_profile's MoE rows: the router and the expert work are timed on both threads (the fused schedule
    puts every expert item under "moe down", the phased one splits gate/up from down), with the bytes of the
    selected experts."""
    from solo.bench.cpu_profile import profile, report

    folder = make_checkpoint(tmp_path / "olmoe", "olmoe", dtype=torch.bfloat16, num_experts=8, num_experts_per_tok=2)
    runtime = CpuRuntime(_load(folder, torch.bfloat16), rows=1, max_seq=64, num_threads=2)
    runtime.reserve(1, 64)
    result = profile(runtime, steps=3, context=8)
    phases = result["phases"]
    assert sum(phases["moe router"]) > 0 and sum(phases["moe down"]) > 0 and not any(phases["moe gate/up"])
    assert result["matrix_bytes"]["moe down"] > result["matrix_bytes"]["moe router"] > 0
    assert "moe dn wait" in report(result)
    runtime._lib.solo_set_knob(b"moe_fused", 0)
    try:
        phased = profile(runtime, steps=3, context=8)["phases"]
    finally:
        runtime._lib.solo_set_knob(b"moe_fused", 1)
    assert sum(phased["moe gate/up"]) > 0 and sum(phased["moe down"]) > 0


def test_verify_matches_sequential_decode(tmp_path):
    # Speculative decoding's verify: k positions of one row in one native step (a batch sharing one row).
    folder = make_checkpoint(tmp_path / "qwen3_moe", "qwen3_moe")
    runtime = CpuRuntime(_load(folder, torch.float32), rows=2, max_seq=64)
    draft = [40, 7, 301, 99, 12]
    runtime.prefill(0, torch.tensor(PROMPT))
    steps = [runtime.decode(torch.tensor([0]), torch.tensor([t]), torch.tensor([len(PROMPT) + i]))[0]
             for i, t in enumerate(draft)]
    runtime.prefill(1, torch.tensor(PROMPT))
    verified = runtime.verify(1, torch.tensor(draft), len(PROMPT))
    assert runtime.verify_matches_decode
    assert torch.equal(verified, torch.stack(steps))


@pytest.mark.parametrize("arch,mode", [("qwen2_moe", None), ("olmoe", None), ("qwen3_moe", "int8"),
                                       ("olmoe", "int4")])
def test_runtime_streams_the_active_bytes_the_roofline_counts(tmp_path, arch, mode):
    # Router, shared expert and top-k routed experts per MoE layer (solo.bench.roofline.decode_bytes).
    from solo.bench.roofline import decode_bytes

    folder = make_checkpoint(tmp_path / arch, arch, dtype=torch.bfloat16)
    model = _load(folder, torch.bfloat16)
    runtime = CpuRuntime(quantize_model(model, mode) if mode else model)
    assert runtime.weight_nbytes() == decode_bytes(model.config, 2, 0, mode).weights


def test_engine_runs_moe_on_the_native_runtime_with_quantization(tmp_path):
    from solo import Engine, SamplingParams

    folder = make_checkpoint(tmp_path / "qwen2_moe", "qwen2_moe")
    engine = Engine.load(folder, dtype="float32", backend="cpu", quantize="int8")
    assert engine.runtime.name == "cpu" and engine.runtime.quantization == "int8"
    result = engine.complete("def fibonacci(n):", SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert len(result.token_ids) == 8


# A subset of the tests above reruns under every other ISA level this CPU runs: tests/runtime/test_cpu_isa.py.
