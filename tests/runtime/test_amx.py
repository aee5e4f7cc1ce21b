"""The AMX tile kernels (cpu_kernels/amx.h, the "amx" ISA level) for bf16 weights.

Decode reads the weights as A tiles and the tokens as the B tile; the span prefill the other way round
(tokens as A, weights interleaved into B tiles). Solo's rule holds only because an AMX result element
depends on its own row and column alone and the two roles give the same bits: these tests check it through
the kernels at odd widths (partial k steps), odd row counts (partial 16-row groups), token counts across
the 16- and 32-token groups, 1 and 2 threads and every AMX knob, and that the result is a correct product.
Skipped where the library is not the "amx" level (it runs only under `SOLO_CPU_ISA=amx`, on a CPU with
AMX-BF16: tests/runtime/test_cpu_isa.py runs this file under every level the CPU has).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from solo.runtime.cpu import _W_BF16, _Mat
from solo.runtime.cpu_build import library_isa, load_library


@pytest.fixture(scope="module")
def lib():
    lib = load_library()
    if library_isa(lib) != "amx":
        pytest.skip(f"the kernels run at the {library_isa(lib)!r} level, not 'amx' (SOLO_CPU_ISA=amx on a CPU "
                    "with AMX-BF16 runs these)")
    yield lib
    for knob, value in ((b"amx", 1), (b"amx_streams", 1), (b"amx_prefetch", 0), (b"span_tile", 1),
                        (b"pass_min_b", 32)):
        lib.solo_set_knob(knob, value)


def _gemv(lib, mat, x, threads=2):
    y = torch.empty(x.shape[0], mat.rows)
    workspace = torch.empty(x.numel() * 4 + 64, dtype=torch.uint8)
    lib.solo_gemv(ctypes.byref(mat), x.data_ptr(), x.shape[0], y.data_ptr(), workspace.data_ptr(), threads)
    return y


@pytest.mark.parametrize("rows,cols", [(16, 32), (37, 33), (50, 96), (64, 2048), (21, 3237)])
def test_every_batch_split_and_knob_gives_batch_1_bits(lib, rows, cols):
    torch.manual_seed(rows * cols)
    # A wide range of magnitudes, so a different summation order would show in the bits.
    w = (torch.randn(rows, cols) * torch.exp2(torch.randint(-8, 8, (rows, cols)).float())).bfloat16()
    x = (torch.randn(40, cols) * torch.exp2(torch.randint(-8, 8, (40, cols)).float())).bfloat16().float()
    mat = _Mat(_W_BF16, rows, cols, 32, w.data_ptr(), None, None)
    singles = torch.cat([_gemv(lib, mat, x[i:i + 1], threads=1) for i in range(40)])
    for streams in (1, 2):
        for prefetch in (0, 1):
            assert lib.solo_set_knob(b"amx_streams", streams) == 0
            assert lib.solo_set_knob(b"amx_prefetch", prefetch) == 0
            for threads in (1, 2):
                for batch in (1, 2, 3, 4, 5, 15, 16, 17, 31, 32, 33, 40):
                    got = _gemv(lib, mat, x[:batch], threads)
                    assert torch.equal(got, singles[:batch]), (streams, prefetch, threads, batch)
    # The result is the product: float64 reference within float32 accumulation error.
    ref = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    assert ((singles.double() - ref).abs() <= 1e-5 * scale + 1e-30).all()


def test_amx_is_what_runs(lib):
    """The AMX kernels (not the AVX512-BF16 fallback) compute the products: their order differs in the bits."""
    torch.manual_seed(0)
    w = torch.randn(64, 2048).bfloat16()
    x = torch.randn(5, 2048).bfloat16().float()
    mat = _Mat(_W_BF16, 64, 2048, 32, w.data_ptr(), None, None)
    amx = [_gemv(lib, mat, x[:1]), _gemv(lib, mat, x)]
    assert lib.solo_set_knob(b"amx", 0) == 0
    try:
        avx = [_gemv(lib, mat, x[:1]), _gemv(lib, mat, x)]
    finally:
        assert lib.solo_set_knob(b"amx", 1) == 0
    assert not torch.equal(amx[0], avx[0]) and not torch.equal(amx[1], avx[1])
    torch.testing.assert_close(amx[1], avx[1], rtol=1e-4, atol=1e-4)


def test_tile_configuration_of_other_code_does_not_leak(lib):
    """oneDNN (a torch bf16 matmul, AMX on this CPU) loads its own tile configuration on the same thread."""
    torch.manual_seed(1)
    w = torch.randn(48, 1024).bfloat16()
    x = torch.randn(20, 1024).bfloat16().float()
    mat = _Mat(_W_BF16, 48, 1024, 32, w.data_ptr(), None, None)
    before = [_gemv(lib, mat, x[:1], threads=1), _gemv(lib, mat, x, threads=1)]
    a = torch.randn(64, 512).bfloat16()
    torch.matmul(a, a.T)
    after = [_gemv(lib, mat, x[:1], threads=1), _gemv(lib, mat, x, threads=1)]
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
