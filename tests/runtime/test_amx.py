"""The AMX level's tiles (cpu_kernels/amx.h) over packed bf16 weights (solo.runtime.cpu_packing).

The span prefill multiplies on AMX tiles; decode (1-4 tokens) on AVX512-BF16 instructions arranged to give
the tile's bits (tests/runtime/test_cpu_packed.py tests those, and the span without tiles). These tests
check that the span on tiles gives batch 1's bits (knob "amx" on and off), at odd widths (partial k steps),
odd row counts (partial 16-row groups), token counts across the 16- and 32-token groups, small super-blocks,
1 and 2 threads; that other code's tile configuration does not leak; attention on tiles.
Skipped where the library is not the "amx" level (it runs only under `SOLO_CPU_ISA=amx`, on a CPU with
AMX-BF16: tests/runtime/test_cpu_isa.py runs this file under every level the CPU has).
"""

from __future__ import annotations

import pytest
import torch
from test_cpu_packed import _gemv, _packed  # (test_cpu_packed also runs its denormal test on tiles)

from solo.runtime.cpu_build import library_isa, load_library


@pytest.fixture(scope="module")
def lib():
    lib = load_library()
    if library_isa(lib) != "amx":
        pytest.skip(f"the kernels run at the {library_isa(lib)!r} level, not 'amx' (SOLO_CPU_ISA=amx on a CPU "
                    "with AMX-BF16 runs these)")
    yield lib
    for knob, value in ((b"amx", 1), (b"amx_span_kb", 1024), (b"span_tile", 1), (b"pass_min_b", 32)):
        lib.solo_set_knob(knob, value)


@pytest.mark.parametrize("rows,cols", [(16, 32), (37, 33), (50, 96), (64, 2048), (21, 3237)])
def test_the_span_on_tiles_gives_batch_1_bits(lib, rows, cols):
    torch.manual_seed(rows * cols)
    # A wide range of magnitudes, so a different summation order would show in the bits.
    w = (torch.randn(rows, cols) * torch.exp2(torch.randint(-8, 8, (rows, cols)).float())).bfloat16()
    x = (torch.randn(40, cols) * torch.exp2(torch.randint(-8, 8, (40, cols)).float())).bfloat16().float()
    mat, _keep = _packed(w)
    singles = torch.cat([_gemv(lib, mat, x[i:i + 1], threads=1) for i in range(40)])
    for amx, span_kb in ((1, 1024), (1, 1), (0, 1024)):
        assert lib.solo_set_knob(b"amx", amx) == 0
        assert lib.solo_set_knob(b"amx_span_kb", span_kb) == 0
        for threads in (1, 2):
            for batch in (1, 2, 3, 4, 5, 15, 16, 17, 31, 32, 33, 40):
                got = _gemv(lib, mat, x[:batch], threads)
                assert torch.equal(got, singles[:batch]), (amx, span_kb, threads, batch)


def test_tile_configuration_of_other_code_does_not_leak(lib):
    """oneDNN (a torch bf16 matmul, AMX on this CPU) loads its own tile configuration on the same thread."""
    torch.manual_seed(1)
    w = torch.randn(48, 1024).bfloat16()
    x = torch.randn(20, 1024).bfloat16().float()
    mat, _keep = _packed(w)
    before = [_gemv(lib, mat, x[:1], threads=1), _gemv(lib, mat, x, threads=1)]
    a = torch.randn(64, 512).bfloat16()
    torch.matmul(a, a.T)
    after = [_gemv(lib, mat, x[:1], threads=1), _gemv(lib, mat, x, threads=1)]
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    assert torch.equal(before[0], before[1][:1])


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(14, 2, 64), (16, 1, 64), (20, 1, 64), (8, 2, 128), (16, 1, 128)],
                         ids=["gqa7", "gqa16", "gqa20-avx512", "hd128-gqa4", "hd128-gqa16"])
def test_split_kv_attention_on_tiles(lib, tmp_path, heads, kv_heads, head_dim):
    """Split-KV parts of a bf16 cache (head_dim 64 or 128, up to 16 query heads per KV head) run q . k and p @ v on
    tiles: as close to the eager model as the AVX-512 kernels (knob attn_amx = 0; another order of the same
    products), and batched rows keep batch 1's bits. 20 heads per KV head take the AVX-512 kernels (same bits
    with the knob on and off)."""
    from _decode_helpers import greedy_steps
    from checkpoints import make_checkpoint

    from solo.model.config import ModelConfig
    from solo.model.weights import load_weights
    from solo.runtime.cpu import CpuRuntime
    from solo.runtime.eager import EagerRuntime

    folder = make_checkpoint(tmp_path / "qwen2", "qwen2", dtype=torch.bfloat16, hidden_size=head_dim * heads // 2,
                             head_dim=head_dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
                             max_position_embeddings=1700)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
    prompt = [(7 * i * i + 3 * i + 5) % 377 + 3 for i in range(1290)]  # 3 blocks of 512 at the decode steps
    eager_tokens, eager_logits = greedy_steps(EagerRuntime(model), prompt, 3)
    runtime = CpuRuntime(model, rows=2, max_seq=1700)
    results = {}
    try:
        for knob in (0, 1):  # tiles last: the cache row then holds their prompt (prefilled by the kernel)
            assert runtime._lib.solo_set_knob(b"attn_amx", knob) == 0  # (the same library as `lib`)
            _, results[knob] = greedy_steps(runtime, prompt, 3, eager_tokens)
            # (bf16 logits of these shapes: up to 0.77 from eager's, the prompt's 1290 positions prefilled by the
            # kernel at the amx level; against a float32 eager model both are off by 0.67-0.69 on average, up to 2.8)
            torch.testing.assert_close(results[knob], eager_logits.float(), atol=1.0, rtol=0)
        if heads // kv_heads > 16:
            assert torch.equal(results[0], results[1])
        elif (heads, kv_heads, head_dim) == (16, 1, 64):  # (other shapes' differences vanish in bf16 roundings)
            assert not torch.equal(results[0], results[1])
        # Batched: row 1 at another length (2 blocks), row 0 at the same position as its batch-1 step.
        runtime._lib.solo_set_knob(b"attn_amx", 1)
        runtime.prefill(1, torch.tensor(prompt[:700]))
        position = torch.tensor([len(prompt) + 2, 700])
        batched = runtime.decode(torch.tensor([0, 1]), torch.tensor([eager_tokens[2], 9]), position)
        single = runtime.decode(torch.tensor([0]), torch.tensor([eager_tokens[2]]), position[:1])[0]
        assert torch.equal(batched[0], single)
        assert torch.equal(batched[0], results[1][2])
    finally:
        runtime._lib.solo_set_knob(b"attn_amx", 1)
