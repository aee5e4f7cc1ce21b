"""Split-K GEMV and RMSNorm + GEMV kernels against torch (interpreter on CPU, compiled on a GPU)."""

from __future__ import annotations

# isort: off
from _triton_env import DEVICE, bf16_close, requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import pytest
import torch

from solo.model.layers import RMSNorm

pytestmark = requires_triton


def _rand(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


def _linear_ref(w, x, bias=None):
    # nn.Linear in the weights' dtype: float32 accumulation, one rounding.
    y = w.double() @ x.double()
    if bias is not None:
        y = y + bias.double()
    return y


@pytest.mark.parametrize("n,k", [(37, 100), (16, 64), (5, 300)])
@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize("num_stages", [1, 2])  # 2: the next weight tile is loaded before this one is used
def test_gemv_float32_with_bias_and_residual(n, k, split_k, num_stages):
    from solo.runtime.triton.gemv import GemvConfig, SplitKWorkspace, gemv

    config = GemvConfig(block_n=8, block_k=32, split_k=split_k, num_stages=num_stages)
    per_split = ((-(-k // split_k) + 31) // 32) * 32
    if -(-k // per_split) != split_k:
        pytest.skip("this split leaves an empty K slice (the wrapper rejects it)")
    w, x, b, r = _rand(n, k), _rand(k), _rand(n), _rand(n)
    ws = SplitKWorkspace(n, config, DEVICE) if split_k > 1 else None
    out = torch.full((n,), float("nan"), device=DEVICE)  # poisoned: every element must be written
    gemv(w, x, out, bias=b, residual=r, config=config, workspace=ws)
    torch.testing.assert_close(out.double(), _linear_ref(w, x, b) + r.double(), rtol=1e-5, atol=1e-4)
    if ws is not None:
        assert int(ws.counters.abs().sum()) == 0  # left ready for the next launch (graph replay)
        gemv(w, x, out, bias=b, residual=r, config=config, workspace=ws)  # and reusable
        torch.testing.assert_close(out.double(), _linear_ref(w, x, b) + r.double(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("split_k", [1, 2])
def test_gemv_bf16_rounds_like_linear_then_residual_add(split_k):
    from solo.runtime.triton.gemv import GemvConfig, gemv

    n, k = 45, 128
    w, x, r = _rand(n, k, dtype=torch.bfloat16), _rand(k, dtype=torch.bfloat16), _rand(n, dtype=torch.bfloat16)
    out = r.clone()
    gemv(w, x, out, residual=out, config=GemvConfig(4, 32, split_k))  # in place, as the decode step does
    expected = (torch.nn.functional.linear(x.float(), w.float()).to(torch.bfloat16) + r)
    bf16_close(out, expected)


def test_gemv_default_config_and_checks():
    from solo.runtime.triton.gemv import GemvConfig, default_config, gemv

    assert default_config(2048, 2048).block_n >= 1
    assert default_config(128, 8192, sm_count=132).split_k > 1  # few rows: split K for parallelism
    w = _rand(8, 64)
    with pytest.raises(ValueError):
        gemv(w, _rand(63))
    with pytest.raises(ValueError):
        gemv(w.t(), _rand(8))
    with pytest.raises(ValueError):
        gemv(w, _rand(64), config=GemvConfig(4, 32, 4))  # 4 slices of a 2-tile K: empty slices


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_rmsnorm_gemv_matches_norm_then_linear(dtype, unit_offset):
    from solo.runtime.triton.rmsnorm_gemv import RmsNormGemvConfig, rmsnorm_gemv

    n, k = 77, 96
    norm = RMSNorm(k, 1e-5, unit_offset).to(DEVICE, dtype)
    torch.nn.init.normal_(norm.weight, std=0.5)
    w, x, b = _rand(n, k, dtype=dtype), _rand(k, dtype=dtype, scale=3.0), _rand(n, dtype=dtype)
    out = torch.full((n,), float("nan"), device=DEVICE)  # float32 logits buffer
    rmsnorm_gemv(x, norm.weight, w, 1e-5, out, bias=b, unit_offset=unit_offset, config=RmsNormGemvConfig(16, 32))
    # The reference runs on the CPU: torch's CUDA rsqrt is approximate (about 2 ulp) where the kernel's
    # 1 / sqrt is correctly rounded, and one ulp of rstd can move a normalized input across a bf16 rounding.
    expected = torch.nn.functional.linear(norm.cpu()(x.cpu().view(1, 1, -1)), w.cpu(), b.cpu()).view(-1).to(DEVICE)
    norm.to(DEVICE)
    double_buffered = torch.full_like(out, float("nan"))
    rmsnorm_gemv(x, norm.weight, w, 1e-5, double_buffered, bias=b, unit_offset=unit_offset,
                 config=RmsNormGemvConfig(16, 32, num_stages=2))
    assert torch.equal(double_buffered, out)  # the same sums in the same order
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
    else:
        assert out.dtype == torch.float32
        assert torch.equal(out, out.to(torch.bfloat16).float())  # rounded to bf16 like eager logits
        bf16_close(out, expected.float())
