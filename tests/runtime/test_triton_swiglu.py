"""RMSNorm + gate/up + activation kernel against the eager MLP's first half."""

from __future__ import annotations

# isort: off
from _triton_env import DEVICE, bf16_close, requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import pytest
import torch

from solo.model.config import ModelConfig
from solo.model.layers import MLP, RMSNorm

pytestmark = requires_triton


@pytest.mark.parametrize("activation", ["silu", "gelu_pytorch_tanh", "gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("unit_offset,bias", [(False, False), (True, True)])
def test_gated_mlp_matches_eager(activation, dtype, unit_offset, bias):
    from solo.runtime.triton.swiglu import GatedMlpConfig, gated_mlp

    hidden, ffn = 40, 37  # odd F: the last block is partial
    cfg = ModelConfig.from_dict(dict(architectures=["LlamaForCausalLM"], hidden_size=hidden, intermediate_size=ffn,
                                     num_hidden_layers=1, num_attention_heads=4, vocab_size=50,
                                     hidden_act=activation, mlp_bias=bias))
    torch.manual_seed(1)
    mlp, norm = MLP(cfg).to(DEVICE, dtype), RMSNorm(hidden, 1e-5, unit_offset).to(DEVICE, dtype)
    for p in [*mlp.parameters(), *norm.parameters()]:
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(hidden, device=DEVICE).to(dtype)
    w = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
    b = torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias]) if bias else None
    out = torch.full((ffn,), float("nan"), device=DEVICE).to(dtype)
    gated_mlp(x, w, out, norm_weight=norm.weight, eps=1e-5, bias=b, activation=activation, unit_offset=unit_offset,
              config=GatedMlpConfig(8, 16))
    h = norm(x.view(1, 1, -1))
    expected = (mlp.act(mlp.gate_proj(h)) * mlp.up_proj(h)).view(-1)
    double_buffered = gated_mlp(x, w, norm_weight=norm.weight, eps=1e-5, bias=b, activation=activation,
                                unit_offset=unit_offset, config=GatedMlpConfig(8, 16, num_stages=2))
    assert torch.equal(double_buffered, out)  # the same sums in the same order
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    else:
        bf16_close(out, expected)


def test_gated_mlp_without_norm_and_checks():
    from solo.runtime.triton.swiglu import GatedMlpConfig, gated_mlp

    x, w = torch.randn(32, device=DEVICE), torch.randn(20, 32, device=DEVICE)
    out = gated_mlp(x, w, config=GatedMlpConfig(4, 16))
    g, u = w[:10] @ x, w[10:] @ x
    torch.testing.assert_close(out, torch.nn.functional.silu(g) * u, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        gated_mlp(x, w, activation="relu")
    with pytest.raises(ValueError):
        gated_mlp(x, torch.randn(21, 32, device=DEVICE))
