"""The rows x tokens tiles of products with many tokens (cpu_kernels/tile.h) give batch-1 decode's bits.

A span prefill runs a prompt's tokens through the decode kernel, whose products take a register tile over
rows and tokens when the inputs are long (tile.h). Every (row, token) must stay bit-identical to a batch-1
product, or a prompt's keys, values and logits would depend on how it was split. The knob "span_tile"
forces the tiles at every width (2) or turns them off (0), "bf16_pass_kb" sets the AVX512-BF16 pass tile's
k block, "gvec_rt" picks the portable builds' bf16 tile (AVX2, NEON), "row_streams" how many rows their
decode kernel runs side by side and "bf16_streams" the same for the AVX512-BF16 decode kernel; on ISA
levels without tiles every setting takes the decode kernels, and the check still holds.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from solo.runtime.cpu import _W_BF16, _W_INT4_Q8, _W_INT8_Q8, _Mat
from solo.runtime.cpu_build import bf16_pass_k_block, bf16_stream_count, load_library
from solo.runtime.quant import dequantize, fake_quantize_activations_q8, quantize_int4, quantize_int8


def _gemv(lib, mat, x, threads=2):
    y = torch.empty(x.shape[0], mat.rows)
    workspace = torch.empty(x.numel() * 4 + 64, dtype=torch.uint8)
    lib.solo_gemv(ctypes.byref(mat), x.data_ptr(), x.shape[0], y.data_ptr(), workspace.data_ptr(), threads)
    return y


def _check_pass_tiles(lib, mat, x, singles, shape_knob, block_knob, settings, batches=(3, 5, 7, 11)):
    """Every (shape, k block) setting of a tile, forced at any batch, gives the batch-1 rows bit for bit.

    block_knob None: the tile has no k block (settings' second values unused).
    """
    assert lib.solo_set_knob(b"pass_min_b", 1) == 0  # the tiles at any batch (default: 32 sequences and more)
    for shape, k_block in settings:
        assert lib.solo_set_knob(shape_knob, shape) == 0
        if block_knob is not None:
            assert lib.solo_set_knob(block_knob, k_block) == 0
        for batch in batches:
            assert torch.equal(_gemv(lib, mat, x[:batch]), singles[:batch]), (shape, k_block, batch)


BF16_STREAMS_DEFAULT = bf16_stream_count()  # the defaults of the knobs "bf16_streams" and "q8_streams" (gemv.h, qdot.h)
Q8_STREAMS_DEFAULT = 2


# Real widths (Qwen2.5-0.5B's hidden 896 and inter 4864, Llama-3.2-1B's 2048 and 8192) and one that is a
# multiple of neither 128 nor 32 (the 32-wide and masked tails); 37 rows: a 2-row tile leaves a last row.
@pytest.mark.parametrize("cols", [896, 2048, 3237, 4864, 8192])
def test_tiles_give_batch_1_bits_at_real_widths(cols):
    lib = load_library()
    torch.manual_seed(cols)
    w = torch.randn(37, cols).bfloat16()
    mat = _Mat(_W_BF16, 37, cols, 32, w.data_ptr(), None, None)
    x = torch.randn(11, cols).bfloat16().float()  # 11 tokens: two 4-token groups and a group of 3
    try:
        singles = torch.cat([_gemv(lib, mat, x[i:i + 1]) for i in range(11)])
        for knob in (1, 2, 0):
            assert lib.solo_set_knob(b"span_tile", knob) == 0
            for batch in (5, 6, 11):
                assert torch.equal(_gemv(lib, mat, x[:batch]), singles[:batch]), (knob, batch)
            assert torch.equal(_gemv(lib, mat, x[:11], threads=1), singles), knob
        # The AVX512-BF16 pass tile's k blocks (a no-op elsewhere), forced at every width (span_tile 2).
        _check_pass_tiles(lib, mat, x, singles, b"span_tile", b"bf16_pass_kb",
                          [(2, 128), (2, 384), (2, 2048), (2, 8192)], batches=(5, 6, 11))
        # The portable builds' bf16 tiles in every shape the knob offers (elsewhere no-ops).
        assert lib.solo_set_knob(b"span_tile", 1) == 0
        _check_pass_tiles(lib, mat, x, singles, b"gvec_rt", None,
                          [(22, 0), (24, 0), (25, 0), (33, 0), (43, 0), (34, 0)])
        # Their decode kernel with 1, 2 and 4 rows side by side (37 rows: on 1 thread runs of 9 and a rest of 1,
        # on 2 threads 32 + 5 rows), 1 to 3 sequences, on 1 and 2 threads.
        assert lib.solo_set_knob(b"span_tile", 0) == 0
        for streams in (1, 2, 4):
            assert lib.solo_set_knob(b"row_streams", streams) == 0
            assert lib.solo_set_knob(b"bf16_streams", streams) == 0
            for threads in (1, 2):
                for batch in (1, 2, 3):
                    assert torch.equal(_gemv(lib, mat, x[:batch], threads), singles[:batch]), (streams, threads, batch)
    finally:
        lib.solo_set_knob(b"span_tile", 1)
        lib.solo_set_knob(b"bf16_pass_kb", bf16_pass_k_block())
        lib.solo_set_knob(b"gvec_rt", 34)
        lib.solo_set_knob(b"row_streams", 4)
        lib.solo_set_knob(b"bf16_streams", BF16_STREAMS_DEFAULT)
        lib.solo_set_knob(b"pass_min_b", 32)
    torch.testing.assert_close(singles, x @ w.float().T, atol=1e-3 * cols ** 0.5, rtol=1e-4)


# int8 and int4 with integer-dot products: the pass tiles in every shape the "qz_rt" and "q8_rt" knobs offer
# and several k blocks, at widths with a short last block of 32 (3237, int8 only: int4 rows are whole
# groups), with 1 and 3 groups after the last 4 (928, 992) and the down projections' (4864, 8192).
@pytest.mark.parametrize("cols", [896, 928, 992, 2048, 3237, 4864, 8192])
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_integer_dot_pass_tiles_give_batch_1_bits(mode, cols):
    if mode == "int4" and cols % 32:
        pytest.skip("int4 rows are whole groups of 32")
    lib = load_library()
    torch.manual_seed(cols)
    q, scale = (quantize_int8 if mode == "int8" else quantize_int4)(torch.randn(37, cols))
    mat = _Mat(_W_INT8_Q8 if mode == "int8" else _W_INT4_Q8, 37, cols, 32, q.data_ptr(), scale.data_ptr(), None)
    x = torch.randn(11, cols).bfloat16().float()
    try:
        singles = torch.cat([_gemv(lib, mat, x[i:i + 1]) for i in range(11)])
        # The 512-bit pass tile (AVX512-VNNI builds; elsewhere a no-op) in every shape and several k blocks,
        # then (off) the 256-bit one in every shape the "q8_rt" knob offers (int8; int4 takes it on AVX2/NEON).
        _check_pass_tiles(lib, mat, x, singles, b"qz_rt", b"qz_pass_kb",
                          [(34, 2048), (36, 2048), (46, 2048), (44, 128), (44, 384), (44, 2048)])
        assert lib.solo_set_knob(b"qz_rt", 0) == 0
        _check_pass_tiles(lib, mat, x, singles, b"q8_rt", b"q8_pass_kb",
                          [(0, 1024), (22, 1024), (23, 1024), (24, 1024), (33, 1024), (44, 1024),
                           (34, 128), (34, 384), (34, 4096), (34, 1024)])
        # The decode kernel with 1, 2 and 4 rows side by side (and the AVX-512 int4 kernel's 256-bit form, which
        # takes them), 1 to 3 sequences, on 1 and 2 threads.
        assert lib.solo_set_knob(b"pass_min_b", 32) == 0
        for ymm in (0, 1):
            assert lib.solo_set_knob(b"qdot_ymm", ymm) == 0
            for streams in (1, 2, 4):
                assert lib.solo_set_knob(b"q8_streams", streams) == 0
                for threads in (1, 2):
                    for batch in (1, 2, 3):
                        assert torch.equal(_gemv(lib, mat, x[:batch], threads), singles[:batch]), (ymm, streams,
                                                                                                  threads, batch)
    finally:
        lib.solo_set_knob(b"qdot_ymm", 0)
        lib.solo_set_knob(b"q8_streams", Q8_STREAMS_DEFAULT)
        lib.solo_set_knob(b"qz_rt", 44)
        lib.solo_set_knob(b"qz_pass_kb", 2048)
        lib.solo_set_knob(b"q8_rt", -1)  # this build's default
        lib.solo_set_knob(b"q8_pass_kb", 1024)
        lib.solo_set_knob(b"pass_min_b", 32)
    reference = fake_quantize_activations_q8(x) @ dequantize(mode, q, scale, torch.float32).T
    torch.testing.assert_close(singles, reference, atol=1e-3 * cols ** 0.5, rtol=1e-4)
