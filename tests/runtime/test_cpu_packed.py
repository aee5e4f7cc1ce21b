"""bf16 weights packed in the AMX tiles' layout (solo.runtime.cpu_packing) and their kernels (cpu_kernels/packed.h).

The avx512-bf16 and amx levels pack a bf16 model's matrices. Decode (1-4 tokens) runs on AVX512-BF16
instructions arranged to give the tile's bits; the span prefill on tiles (amx level, tests/runtime/test_amx.py)
or as outer products over the packed rows (packed_span). These tests check that every way of computing a (row,
token) result gives the same bits: batch 1, batched decode, the span at every tile shape and chunk size, at odd
widths (partial k steps), odd row counts (partial 16-row groups), token counts across the tiles' token groups,
1 and 2 threads; that the result is the product; that denormal sums are flushed as on the tiles; and that the
packing round-trips. Skipped below the avx512-bf16 level (tests/runtime/test_cpu_isa.py runs this file under
every level the CPU has).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from solo.runtime.cpu import _W_BF16, _W_BF16_AMX, PACKED_BF16_LEVELS, _Mat
from solo.runtime.cpu_build import library_isa, load_library
from solo.runtime.cpu_packing import pack_bf16_amx, packed_shape, unpack_bf16_amx

_DEFAULT_KNOBS = ((b"packed_tile", 24), (b"packed_chunk_kb", 1024), (b"span_tile", 1), (b"pass_min_b", 32))


@pytest.fixture(scope="module")
def lib():
    lib = load_library()
    if library_isa(lib) not in PACKED_BF16_LEVELS:
        pytest.skip(f"the kernels run at the {library_isa(lib)!r} level, which keeps bf16 weights row-major "
                    f"(levels that pack them: {', '.join(PACKED_BF16_LEVELS)})")
    if library_isa(lib) == "amx":  # the span without tiles
        assert lib.solo_set_knob(b"amx", 0) == 0
    yield lib
    for knob, value in (*_DEFAULT_KNOBS, (b"amx", 1)):
        lib.solo_set_knob(knob, value)


def _gemv(lib, mat, x, threads=2):
    y = torch.empty(x.shape[0], mat.rows)
    workspace = torch.empty(x.numel() * 4 + 64, dtype=torch.uint8)
    lib.solo_gemv(ctypes.byref(mat), x.data_ptr(), x.shape[0], y.data_ptr(), workspace.data_ptr(), threads)
    return y


def _packed(w):
    packed = pack_bf16_amx(w)
    return _Mat(_W_BF16_AMX, w.shape[0], w.shape[1], 32, packed.data_ptr(), None, None), packed


@pytest.mark.parametrize("rows,cols", [(16, 32), (37, 33), (50, 96), (64, 2048), (21, 3237), (3, 5)])
def test_packing_round_trips_and_the_native_packer_agrees(rows, cols):
    w = torch.randn(rows, cols).bfloat16()
    packed = pack_bf16_amx(w)
    assert packed.shape == packed_shape(rows, cols)
    assert torch.equal(unpack_bf16_amx(packed, rows, cols), w)
    native = torch.full(packed.shape, float("nan"), dtype=torch.bfloat16)  # every element must be written
    load_library().solo_pack_bf16_amx(w.data_ptr(), rows, cols, native.data_ptr(), 2)
    assert torch.equal(native, packed)


@pytest.mark.parametrize("rows,cols", [(16, 32), (37, 33), (50, 96), (64, 2048), (21, 3237), (300, 160)])
def test_every_batch_split_and_knob_gives_batch_1_bits(lib, rows, cols):
    torch.manual_seed(rows * cols)
    # A wide range of magnitudes, so a different summation order would show in the bits.
    w = (torch.randn(rows, cols) * torch.exp2(torch.randint(-8, 8, (rows, cols)).float())).bfloat16()
    x = (torch.randn(40, cols) * torch.exp2(torch.randint(-8, 8, (40, cols)).float())).bfloat16().float()
    mat, _keep = _packed(w)
    singles = torch.cat([_gemv(lib, mat, x[i:i + 1], threads=1) for i in range(40)])
    # Every span tile shape (10 groups + tokens), chunks of one 16-row group to all rows, and the decode
    # kernel with 4 tokens at a time (span_tile 0).
    settings = [{b"packed_tile": t} for t in (14, 24, 26, 34, 43)] + [{b"packed_chunk_kb": 1}, {b"span_tile": 0}]
    for knobs in settings:
        for knob, value in _DEFAULT_KNOBS:
            assert lib.solo_set_knob(knob, knobs.get(knob, value)) == 0
        for threads in (1, 2):
            for batch in (1, 2, 3, 4, 5, 6, 7, 11, 15, 16, 17, 31, 32, 33, 40):
                got = _gemv(lib, mat, x[:batch], threads)
                assert torch.equal(got, singles[:batch]), (knobs, threads, batch)
    for knob, value in _DEFAULT_KNOBS:
        lib.solo_set_knob(knob, value)
    # The result is the product: float64 reference within float32 accumulation error.
    ref = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    assert ((singles.double() - ref).abs() <= 1e-5 * scale + 1e-30).all()


def test_a_long_product_in_token_blocks_keeps_batch_1_bits(lib):
    """A long prompt's matmul prefill multiplies all its tokens in one call: the span converts their inputs
    256 tokens at a time (bounded scratch), with the same bits."""
    torch.manual_seed(3)
    w = torch.randn(70, 200).bfloat16()
    x = torch.randn(600, 200).bfloat16().float()
    mat, _keep = _packed(w)
    singles = torch.cat([_gemv(lib, mat, x[i:i + 1], threads=1) for i in range(600)])
    for batch in (255, 256, 257, 513, 600):
        assert torch.equal(_gemv(lib, mat, x[:batch]), singles[:batch]), batch


def test_denormal_sums_are_flushed_as_on_the_tiles(lib):
    """The tile flushes a denormal E + O or C + (E + O) to zero; the decode kernel and the spans must too."""
    w = torch.zeros(16, 64)
    w[:, 0] = w[:, 1] = 1.0
    w[1, 32] = 1.0  # row 1: a normal sum in the first k step, then one that cancels it to a denormal
    x = torch.zeros(40, 64)
    x[:, 0] = 2.0 ** -120
    x[:, 1] = -(2.0 ** -120) * (1 - 2.0 ** -7)  # E + O = 2^-127: denormal
    x[:, 32] = -(2.0 ** -120) * (1 - 2.0 ** -6)
    w, x = w.bfloat16(), x.bfloat16().float()
    mat, _keep = _packed(w)
    single = _gemv(lib, mat, x[:1])
    assert single[0, 0].item() == 0.0 and single[0, 2].item() == 0.0
    for amx in (0, 1) if library_isa(lib) == "amx" else (0,):  # the span without and with tiles
        lib.solo_set_knob(b"amx", amx)
        span = _gemv(lib, mat, x)
        assert torch.equal(span, single.expand_as(span)), amx
    lib.solo_set_knob(b"amx", 0)


def test_the_packed_kernels_give_another_order_than_the_row_major_kernel(lib):
    """The packed kernels sum in the tile's order: not the bits of the AVX512-BF16 row-major kernel."""
    torch.manual_seed(0)
    w = torch.randn(64, 2048).bfloat16()
    x = torch.randn(40, 2048).bfloat16().float()
    mat, _keep = _packed(w)
    dense = _Mat(_W_BF16, 64, 2048, 32, w.data_ptr(), None, None)
    packed, row_major = _gemv(lib, mat, x), _gemv(lib, dense, x)
    assert not torch.equal(packed, row_major)
    torch.testing.assert_close(packed, row_major, rtol=1e-4, atol=1e-4)


def test_the_runtime_packs_bf16_matrices_and_the_eager_model_still_runs(lib, tmp_path):
    """A bf16 model's matrices are packed once (a second runtime reuses them); the eager model's Linear
    layers become AmxPackedLinear views that compute what they computed before."""
    from checkpoints import make_checkpoint

    from solo.model.config import ModelConfig
    from solo.model.weights import load_weights
    from solo.runtime.cpu import CpuRuntime
    from solo.runtime.cpu_packing import AmxPackedLinear
    from solo.runtime.eager import EagerRuntime

    folder = make_checkpoint(tmp_path / "qwen2", "qwen2", dtype=torch.bfloat16)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
    ids = torch.tensor([1, 17, 93, 5, 250, 31, 77])

    def eager_logits():
        eager = EagerRuntime(model)
        eager.reserve(1, 32)
        return eager.prefill(0, ids)

    before = eager_logits()
    first = CpuRuntime(model)
    layer = first._struct.layer[0]
    assert {layer.qkv.format, layer.o.format, layer.gate_up.format, layer.down.format} == {_W_BF16_AMX}
    attn = model.layers[0].attn
    assert isinstance(attn.q_proj, AmxPackedLinear) and isinstance(attn.v_proj, AmxPackedLinear)
    second = CpuRuntime(model, pack_amx=False)  # the model is packed already: the runtime reads that copy
    assert second.pack_amx and second._struct.layer[0].qkv.weight == layer.qkv.weight
    assert torch.equal(eager_logits(), before)
    first.reserve(1, 32)
    second.reserve(1, 32)
    assert torch.equal(first.prefill(0, ids), second.prefill(0, ids))


def test_a_packed_layer_keeps_the_linear_state_dict():
    from solo.runtime.cpu_packing import AmxPackedLinear

    torch.manual_seed(2)
    linear = torch.nn.Linear(40, 24).bfloat16()
    packed = AmxPackedLinear(pack_bf16_amx(linear.weight.detach()), linear.bias.detach().clone(), 40, 24)
    state = packed.state_dict()
    assert state.keys() == linear.state_dict().keys()
    assert torch.equal(state["weight"], linear.weight) and torch.equal(state["bias"], linear.bias)
    other = torch.nn.Linear(40, 24).bfloat16()
    packed.load_state_dict(other.state_dict())
    assert torch.equal(packed.weight, other.weight) and torch.equal(packed.bias, other.bias)
    x = torch.randn(3, 40).bfloat16()
    assert torch.equal(packed(x), other(x))
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        packed.load_state_dict(torch.nn.Linear(41, 24).bfloat16().state_dict())
    with pytest.raises(RuntimeError, match="Unexpected key.*junk"):
        packed.load_state_dict({**other.state_dict(), "junk": torch.zeros(1)})


def test_row_major_weights_stay_available_and_batch_invariant(lib, tmp_path):
    """`pack_amx=False` keeps a bf16 model row-major on the AVX512-BF16 kernels (measurement): batched decode
    still equals batch 1 there, and its logits are the packed runtime's up to the summation order (another
    order: test_the_packed_kernels_give_another_order_than_the_row_major_kernel)."""
    from checkpoints import make_checkpoint

    from solo.model.config import ModelConfig
    from solo.model.weights import load_weights
    from solo.runtime.cpu import CpuRuntime
    from solo.server.scheduler import runtime_is_batch_invariant

    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16, hidden_size=384,
                             num_attention_heads=6, num_key_value_heads=2, head_dim=64, intermediate_size=512)
    ids = torch.tensor([1, 17, 93, 5, 250, 31, 77])
    logits = {}
    for packed in (False, True):
        model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
        runtime = CpuRuntime(model, rows=4, max_seq=64, pack_amx=packed)
        assert runtime.pack_amx == packed
        assert (runtime._struct.layer[0].gate_up.format == _W_BF16_AMX) == packed
        runtime.reserve(4, 64)
        assert runtime_is_batch_invariant(runtime, rows=4, trials=8)
        logits[packed] = runtime.prefill(0, ids)
    torch.testing.assert_close(logits[False], logits[True], rtol=0.02, atol=0.02)


@pytest.mark.parametrize("intermediate", [512, 528])  # 32 or 33 row groups per half (pairs of them at batch 1)
def test_decode_steps_keep_their_bits_at_every_claim_and_chunk_size(lib, tmp_path, intermediate):
    """The decode step's MLP reads a chunk's gate and up rows side by side (packed_gemv_pair_in at 1 and 2
    tokens; 3 and 4 read one run after the other), and a thread takes several chunks at once from the front
    of its run (knob claim_chunks). Batch 1, batched decode, 1 and 2 threads,
    every claim size and chunk size give the same logits bit for bit."""
    from checkpoints import make_checkpoint

    from solo.model.config import ModelConfig
    from solo.model.weights import load_weights
    from solo.runtime.cpu import CpuRuntime
    from solo.server.scheduler import runtime_is_batch_invariant

    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16, hidden_size=384,
                             num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                             intermediate_size=intermediate)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
    ids = torch.tensor([1, 17, 93, 5, 250, 31, 77])
    results = []
    try:
        for threads, claim, chunk_kb in ((2, 1, 128), (2, 4, 128), (2, 3, 4), (1, 4, 4), (2, 4, 4)):
            runtime = CpuRuntime(model, rows=4, max_seq=64, num_threads=threads)
            assert runtime._struct.layer[0].gate_up.format == _W_BF16_AMX
            runtime._lib.solo_set_knob(b"claim_chunks", claim)
            runtime._lib.solo_set_knob(b"chunk_kb", chunk_kb)
            runtime.reserve(4, 64)
            assert runtime_is_batch_invariant(runtime, rows=4, trials=4), (threads, claim, chunk_kb)
            runtime.prefill(0, ids)
            steps = [runtime.decode(torch.tensor([0]), torch.tensor([t]), torch.tensor([len(ids) + i]))
                     for i, t in enumerate((5, 300, 42))]
            results.append(torch.cat(steps))
    finally:
        lib.solo_set_knob(b"claim_chunks", 4)
        lib.solo_set_knob(b"chunk_kb", 128)
    for other in results[1:]:
        assert torch.equal(other, results[0])
