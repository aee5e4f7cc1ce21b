"""Weight-only int8/int4: the formats, the native matrix-vector kernels, and quality against bf16."""

from __future__ import annotations

import ctypes

import pytest
import torch
from checkpoints import make_checkpoint

from solo.bench.runner import quant_quality
from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime.cpu import (
    _W_BF16,
    _W_F32,
    _W_INT4,
    _W_INT4_BF16X,
    _W_INT4_Q8,
    _W_INT8,
    _W_INT8_Q8,
    CpuRuntime,
    _Mat,
)
from solo.runtime.cpu_build import load_library
from solo.runtime.eager import EagerRuntime
from solo.runtime.quant import (
    dequantize,
    fake_quantize_activations_q8,
    quantize_activations_q8,
    quantize_int4,
    quantize_int8,
    quantize_model,
    set_int8_activations,
)

# Weight formats of the GEMV tests: the float paths, and the integer-dot paths (int8-quantized inputs, qdot.h).
FORMATS = ["bf16", "f32", "int8", "int4", "int4-bf16x", "int8-q8", "int4-q8"]
CODES = {"bf16": _W_BF16, "f32": _W_F32, "int8": _W_INT8, "int4": _W_INT4, "int4-bf16x": _W_INT4_BF16X,
         "int8-q8": _W_INT8_Q8, "int4-q8": _W_INT4_Q8}

PROMPT = [1, 17, 93, 5, 250, 31, 77, 8, 140, 66, 12, 301]


def test_int8_round_trip_error_is_half_a_step():
    w = torch.randn(37, 100)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (37,)
    err = (dequantize("int8", q, scale, torch.float32) - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-6).all())


def test_int4_round_trip_and_packing():
    w = torch.randn(5, 64)
    packed, scale = quantize_int4(w)
    assert packed.shape == (5, 32) and packed.dtype == torch.uint8 and scale.shape == (5, 2)
    restored = dequantize("int4", packed, scale, torch.float32)
    # 16 levels over about +-2.5 sigma: the RMS error of a Gaussian weight is about 10% of its spread.
    assert float((restored - w).pow(2).mean().sqrt()) < 0.12 * float(w.std())
    # Byte i of a group holds input i (low nibble) and input i + 16 (high nibble).
    q = torch.round(w[0, :32] / scale[0, 0].float()).clamp(-8, 7).to(torch.int16) + 8
    assert int(packed[0, 3]) == int(q[3]) | (int(q[19]) << 4)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,cols", [(37, 96), (16, 64), (130, 320)])
@pytest.mark.parametrize("batch", [1, 3, 6])
def test_gemv_kernels_match_torch(fmt, rows, cols, batch):
    lib = load_library()
    torch.manual_seed(rows + cols)
    w = torch.randn(rows, cols)
    x = torch.randn(batch, cols)
    code = CODES[fmt]
    # Whether the kernel rounds its input to bf16 depends on the ISA path taken (AVX512-BF16 kernels do); the
    # integer-dot formats quantize it to int8 per block of 32 (exactly as the reference does).
    xs = x.bfloat16().float() if lib.solo_input_bf16(code) else x
    if fmt.endswith("-q8"):
        xs = fake_quantize_activations_q8(x)
    if fmt == "bf16":
        wt = w.bfloat16()
        mat = _Mat(_W_BF16, rows, cols, 32, wt.data_ptr(), None, None)
        ref = xs @ wt.float().T  # products accumulate in fp32
        keep = (wt,)
    elif fmt == "f32":
        mat = _Mat(_W_F32, rows, cols, 32, w.data_ptr(), None, None)
        ref, keep = x @ w.T, (w,)
    else:
        mode = fmt[:4]
        q, scale = (quantize_int8 if mode == "int8" else quantize_int4)(w)
        mat = _Mat(code, rows, cols, 32, q.data_ptr(), scale.data_ptr(), None)
        ref, keep = xs @ dequantize(mode, q, scale, torch.float32).T, (q, scale)
    y = torch.empty(batch, rows)
    workspace = torch.empty(batch * cols * 4 + 64, dtype=torch.uint8)
    lib.solo_gemv(ctypes.byref(mat), x.data_ptr(), batch, y.data_ptr(), workspace.data_ptr(), 2)
    assert keep
    torch.testing.assert_close(y, ref, atol=1e-3 * cols ** 0.5, rtol=1e-4)


def _native_mat(fmt, w):
    """(struct, tensors to keep alive, dense float32 [rows, cols] reference weights) for one format."""
    rows, cols = w.shape
    if fmt in ("bf16", "f32"):
        wt = w.bfloat16() if fmt == "bf16" else w
        return _Mat(_W_BF16 if fmt == "bf16" else _W_F32, rows, cols, 32, wt.data_ptr(), None, None), (wt,), wt.float()
    mode = fmt[:4]
    q, scale = (quantize_int8 if mode == "int8" else quantize_int4)(w)
    return _Mat(CODES[fmt], rows, cols, 32, q.data_ptr(), scale.data_ptr(), None), (q, scale), \
        dequantize(mode, q, scale, torch.float32)


def _gemv(lib, mat, x, threads=2):
    y = torch.empty(x.shape[0], mat.rows)
    workspace = torch.empty(x.numel() * 4 + 64, dtype=torch.uint8)
    lib.solo_gemv(ctypes.byref(mat), x.data_ptr(), x.shape[0], y.data_ptr(), workspace.data_ptr(), threads)
    return y


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cols", [896, 2048])
def test_gemv_is_bit_identical_across_batch_sizes(fmt, cols):
    # One reduction order for every batch size (the server's batch invariance), at real widths where the
    # kernels' unrolled main loops run: batch 1, 2, 4 and 6 (a whole tile plus a remainder) agree bit for bit.
    lib = load_library()
    torch.manual_seed(cols)
    mat, keep, dense = _native_mat(fmt, torch.randn(80, cols))
    x = torch.randn(6, cols).bfloat16().float()
    singles = torch.cat([_gemv(lib, mat, x[i:i + 1]) for i in range(6)])
    for batch in (2, 4, 6):
        for start in range(0, 6 - batch + 1, batch):
            assert torch.equal(_gemv(lib, mat, x[start:start + batch]), singles[start:start + batch]), (batch, start)
    xs = fake_quantize_activations_q8(x) if fmt.endswith("-q8") else x
    torch.testing.assert_close(singles, xs @ dense.T, atol=1e-3 * cols ** 0.5, rtol=1e-4)
    assert keep


@pytest.mark.parametrize("cols", [77, 96, 896, 8960])
@pytest.mark.parametrize("fmt", ["int8-q8", "int4-q8"])
def test_input_quantization_matches_the_reference(cols, fmt):
    # The kernels' int8 blocks (values, scales and lane corrections) are exactly quantize_activations_q8's.
    lib = load_library()
    torch.manual_seed(cols)
    x = torch.randn(3, cols) * torch.linspace(0.01, 30, cols)  # blocks of very different ranges
    x[1, :40] = 0  # an all-zero block
    out = torch.zeros(3, cols * 4, dtype=torch.uint8)
    lib.solo_quantize_q8(x.data_ptr(), cols, 3, out.data_ptr(), CODES[fmt])
    q, d = quantize_activations_q8(x)
    nb = d.shape[1]
    assert torch.equal(out[:, :32 * nb].view(torch.int8), q)
    assert torch.equal(out[:, 32 * nb:36 * nb].contiguous().view(torch.float32), d)
    corr = out[:, 36 * nb:68 * nb].contiguous().view(torch.int32).view(3, nb, 8)
    lane_sums = q.view(3, nb, 8, 4).int().sum(dim=3)
    assert torch.equal(corr, -(8 if fmt == "int4-q8" else 128) * lane_sums)
    assert float((fake_quantize_activations_q8(x) - x).abs().max()) <= float(d.max()) / 2 + 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_native_fake_quantization_matches_the_reference(dtype):
    # What the CPU prefill multiplies on the integer-dot path: the values of the int8 blocks, in the dtype.
    lib = load_library()
    torch.manual_seed(3)
    x = (torch.randn(5, 77) * torch.linspace(0.01, 30, 77)).to(dtype)
    ref = fake_quantize_activations_q8(x).to(dtype)
    lib.solo_fake_quantize_q8(x.data_ptr(), 77, 5, int(dtype == torch.bfloat16), 2)
    assert torch.equal(x, ref)


def _library_of(level):
    from solo.runtime.cpu_build import declare, library_path

    return declare(ctypes.CDLL(str(library_path(level))))


@pytest.mark.parametrize("fmt", ["int8-q8", "int4-q8"])
def test_integer_dot_gemv_is_bit_identical_across_isa_levels_and_threads(fmt):
    # Integer lane sums are exact and every level scales and sums them in the same float operations (qdot.h),
    # so scalar, AVX2, AVX-512 (VNNI) and the session's own build agree bit for bit, at any thread count.
    from solo.runtime.cpu_build import available_levels

    torch.manual_seed(7)
    results = {}
    for cols in (77, 896, 4864) if fmt == "int8-q8" else (96, 864, 4864):  # 864: 27 groups, a tail of 3
        mat, keep, _ = _native_mat(fmt, torch.randn(70, cols))
        x = torch.randn(3, cols).bfloat16().float()
        for level in available_levels():
            lib = _library_of(level)
            for threads in (1, 2, 3):
                results[(cols, level.name, threads)] = _gemv(lib, mat, x, threads)
        assert keep
    for (cols, level, threads), y in results.items():
        assert torch.equal(y, results[(cols, "scalar", 1)]), (cols, level, threads)


def test_gemv_odd_input_size():
    # bf16 rows whose length is not a multiple of the 32-wide vector step use the masked tail.
    lib = load_library()
    w, x = torch.randn(9, 77).bfloat16(), torch.randn(2, 77)
    mat = _Mat(_W_BF16, 9, 77, 32, w.data_ptr(), None, None)
    y = torch.empty(2, 9)
    workspace = torch.empty(2 * 77 * 4 + 64, dtype=torch.uint8)
    lib.solo_gemv(ctypes.byref(mat), x.data_ptr(), 2, y.data_ptr(), workspace.data_ptr(), 2)
    xs = x.bfloat16().float() if lib.solo_input_bf16(_W_BF16) else x
    torch.testing.assert_close(y, xs @ w.float().T, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("int_dot", [False, True], ids=["float", "int-dot"])
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_runtime_matches_eager_on_the_same_quantized_model(tmp_path, mode, int_dot):
    # int-dot: the eager model quantizes each linear layer's input as the kernels do (set_int8_activations).
    folder = make_checkpoint(tmp_path / "qwen2", "qwen2", hidden_size=64, intermediate_size=128,
                             tie_word_embeddings=True)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.float32)
    qmodel = quantize_model(model, mode)
    assert model.lm_head is None and qmodel.lm_head is not None  # the original is left untouched
    cpu = CpuRuntime(qmodel, int_dot=int_dot)
    eager = EagerRuntime(set_int8_activations(qmodel, int_dot))
    for rt in (cpu, eager):
        rt.reserve(1, 32)
    a, b = cpu.prefill(0, torch.tensor(PROMPT)), eager.prefill(0, torch.tensor(PROMPT))
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    token = int(a.argmax())
    for pos in range(len(PROMPT), len(PROMPT) + 8):
        a = cpu.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([pos]))
        b = eager.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([pos]))
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        token = int(b.argmax())


# A tiny random model (hidden 64) has much flatter logits than a trained one, so near-ties are common and
# agreement is a pessimistic proxy; the bounds pin today's quality so a broken kernel or format fails.
@pytest.mark.parametrize("int_dot", [False, True], ids=["float", "int-dot"])
@pytest.mark.parametrize("mode,min_agreement,max_error", [("int8", 0.85, 0.05), ("int4", 0.3, 0.5)])
def test_quality_against_bf16(tmp_path, mode, min_agreement, max_error, int_dot):
    # Greedy agreement over 64 tokens and mean logit error (relative to the logits' spread) against bf16.
    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
    dense = CpuRuntime(model)
    quality = quant_quality(dense, CpuRuntime(quantize_model(model, mode), int_dot=int_dot), PROMPT, steps=64)
    print(f"{mode} {'int-dot' if int_dot else 'float'}: {quality}")
    assert quality.top1_agreement >= min_agreement
    assert quality.mean_abs_logit_error <= max_error * quality.logit_std


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_native_dequantize_matches_the_reference(mode, dtype):
    from solo.runtime.quant import QuantLinear

    w = torch.randn(40, 96)
    q, scale = (quantize_int8 if mode == "int8" else quantize_int4)(w)
    layer = QuantLinear(mode, q, scale, None, 96, dtype)
    assert torch.equal(layer.weight, dequantize(mode, q, scale, dtype))


@pytest.mark.parametrize("mode,min_agreement,max_error", [("int8", 0.95, 0.03), ("int4", 0.85, 0.15)])
def test_quality_on_the_bundled_trained_model(mode, min_agreement, max_error):
    # A trained model has peaked logits, so this is the meaningful quality check (64 greedy positions).
    import random

    from solo.errors import ModelNotFoundError
    from solo.model.default_model import default_model_path

    try:
        folder = default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(f"the bundled model is not built in this checkout: {exc}")
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
    rng = random.Random(0)
    prompt = [rng.randrange(3, model.config.vocab_size) for _ in range(32)]
    quality = quant_quality(CpuRuntime(model), CpuRuntime(quantize_model(model, mode)), prompt, steps=64)
    print(f"{mode} ({'int-dot' if CpuRuntime(model).int_dot else 'float'} kernels): {quality}")
    assert quality.top1_agreement >= min_agreement
    assert quality.mean_abs_logit_error <= max_error * quality.logit_std


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_integer_dot_decode_is_bit_identical_across_batches_and_threads(tmp_path, mode):
    # Real widths (hidden 896, intermediate 2048, head_dim 64): the server's batch invariance, and one thread
    # against two against more threads than cores, for the integer-dot formats.
    from solo.server.scheduler import runtime_is_batch_invariant

    folder = make_checkpoint(tmp_path / "qwen2", "qwen2", hidden_size=896, intermediate_size=2048,
                             num_hidden_layers=1, num_attention_heads=14, num_key_value_heads=2,
                             dtype=torch.bfloat16)
    qmodel = quantize_model(load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16), mode)
    runtime = CpuRuntime(qmodel, rows=4, max_seq=32)
    assert runtime.int_dot
    assert runtime_is_batch_invariant(runtime, rows=4)
    logits = []
    for threads in (1, 2, 5):
        rt = CpuRuntime(qmodel, max_seq=32, num_threads=threads)
        rt.reserve(1, 32)
        rt.prefill(0, torch.tensor(PROMPT))
        logits.append(rt.decode(torch.tensor([0]), torch.tensor([7]), torch.tensor([len(PROMPT)])))
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[0], logits[2])
