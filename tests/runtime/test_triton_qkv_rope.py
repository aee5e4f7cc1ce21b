"""RMSNorm + QKV + RoPE + KV-cache-write kernel against the eager attention's first half."""

from __future__ import annotations

# isort: off
from _triton_env import DEVICE, bf16_close, requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import pytest
import torch

from solo.model.config import ModelConfig
from solo.model.rope import apply_rope, dynamic_ntk_inv_freq
from solo.model.transformer import Transformer

pytestmark = requires_triton


def _model(dtype, head_dim=12, heads=4, kv_heads=2, hidden=48, bias=True, rope=None):
    raw = dict(architectures=["LlamaForCausalLM"], hidden_size=hidden, intermediate_size=64, num_hidden_layers=1,
               num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=50,
               max_position_embeddings=64, attention_bias=bias)
    if rope is not None:
        raw["rope_scaling"] = rope
    cfg = ModelConfig.from_dict(raw)
    torch.manual_seed(0)
    model = Transformer(cfg).to(DEVICE, dtype)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    model.rotary.to(DEVICE)
    return model


def _reference(model, x, pos):
    attn, cfg = model.layers[0].attn, model.config
    positions = torch.tensor([[pos]], device=DEVICE)
    cos, sin = model.rotary(positions, x.dtype)
    h = model.layers[0].attn_norm(x.view(1, 1, -1))
    q = attn.q_proj(h).view(1, 1, cfg.num_heads, cfg.head_dim).transpose(1, 2)
    k = attn.k_proj(h).view(1, 1, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
    v = attn.v_proj(h).view(cfg.num_kv_heads, cfg.head_dim)
    return apply_rope(q, cos, sin).reshape(-1), apply_rope(k, cos, sin)[0, :, 0], v


def _fused(model):
    a = model.layers[0].attn
    w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
    b = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]) if a.q_proj.bias is not None else None
    return w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,heads,kv_heads,block_p", [(12, 4, 2, 4), (16, 6, 3, 8), (8, 4, 4, 64)])
def test_qkv_rope_matches_eager(dtype, head_dim, heads, kv_heads, block_p):
    from solo.runtime.triton.qkv_rope import QkvRopeConfig, qkv_rope

    model = _model(dtype, head_dim, heads, kv_heads, hidden=40)
    cfg = model.config
    x = torch.randn(40, device=DEVICE).to(dtype)
    pos, row = 37, 1
    w, b = _fused(model)
    freqs = torch.arange(64, device=DEVICE).float()[:, None] * model.rotary.inv_freq.float()[None]
    state = torch.zeros(8, dtype=torch.int64, device=DEVICE)
    state[1], state[2] = pos, row
    q = torch.full((heads * head_dim,), float("nan"), device=DEVICE).to(dtype)
    kc = torch.zeros(3, kv_heads, 64, head_dim, device=DEVICE, dtype=dtype)
    vc = torch.zeros_like(kc)
    qkv_rope(x, model.layers[0].attn_norm.weight, w, cfg.rms_norm_eps, freqs.cos(), freqs.sin(), state, q, kc, vc,
             num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, bias=b, config=QkvRopeConfig(block_p, 16))
    q_ref, k_ref, v_ref = _reference(model, x, pos)
    check = (lambda a, e: torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)) if dtype == torch.float32 \
        else bf16_close
    check(q, q_ref)
    check(kc[row, :, pos], k_ref)
    check(vc[row, :, pos], v_ref)
    # Double-buffered weight loads: the same sums in the same order, so the same bits.
    q2, kc2, vc2 = torch.full_like(q, float("nan")), torch.zeros_like(kc), torch.zeros_like(vc)
    qkv_rope(x, model.layers[0].attn_norm.weight, w, cfg.rms_norm_eps, freqs.cos(), freqs.sin(), state, q2, kc2, vc2,
             num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, bias=b,
             config=QkvRopeConfig(block_p, 16, num_stages=2))
    assert torch.equal(q2, q) and torch.equal(kc2, kc) and torch.equal(vc2, vc)
    kc[row, :, pos] = 0
    vc[row, :, pos] = 0
    assert not kc.any() and not vc.any()  # nothing else in the cache was touched


def test_qkv_rope_per_step_table_for_dynamic_rope():
    from solo.runtime.triton.qkv_rope import QkvRopeConfig, qkv_rope

    model = _model(torch.float32, rope=dict(rope_type="dynamic", factor=2.0))
    cfg = model.config
    pos = 100  # past max_position_embeddings (64): the frequencies are rescaled
    x = torch.randn(48, device=DEVICE)
    w, b = _fused(model)
    p = torch.tensor([pos], device=DEVICE)
    freqs = p.float()[:, None] * dynamic_ntk_inv_freq(cfg, p + 1)
    state = torch.zeros(8, dtype=torch.int64, device=DEVICE)
    state[1] = pos
    q = torch.empty(48, device=DEVICE)
    kc = torch.zeros(1, 2, 128, 12, device=DEVICE)
    qkv_rope(x, model.layers[0].attn_norm.weight, w, cfg.rms_norm_eps, freqs.cos(), freqs.sin(), state, q, kc,
             kc.clone(), num_heads=4, num_kv_heads=2, head_dim=12, bias=b, per_step_table=True,
             config=QkvRopeConfig(4, 16))
    q_ref, k_ref, _ = _reference(model, x, pos)
    torch.testing.assert_close(q, q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc[0, :, pos], k_ref, rtol=1e-5, atol=1e-5)


def test_fit_block_p_divides_the_kv_segment():
    from solo.runtime.triton.qkv_rope import fit_block_p

    assert fit_block_p(8, 8, 64) == 8
    assert fit_block_p(256, 16, 96) == 256  # 768 pairs
    assert fit_block_p(64, 3, 16) == 8  # 24 pairs
    assert fit_block_p(4, 1, 6) == 1  # 3 pairs


def test_qkv_rope_refuses_inputs_of_the_wrong_length():
    from solo.runtime.triton.qkv_rope import qkv_rope

    model = _model(torch.float32, 12, 4, 2, hidden=40)
    w, b = _fused(model)
    freqs = torch.zeros(64, 6, device=DEVICE)
    state = torch.zeros(8, dtype=torch.int64, device=DEVICE)
    q = torch.zeros(48, device=DEVICE)
    kc = torch.zeros(3, 2, 64, 12, device=DEVICE)
    norm = model.layers[0].attn_norm.weight
    for x, norm_weight, message in [
        (torch.zeros(39, device=DEVICE), norm, "w_qkv must be a row-major \\[96, 39\\] matrix"),
        (torch.zeros(80, device=DEVICE)[::2], norm, "x must be a contiguous \\[40\\] vector"),
        (torch.zeros(40, device=DEVICE), norm[:39], "norm_weight must be a contiguous \\[40\\] vector"),
    ]:
        with pytest.raises(ValueError, match=message):
            qkv_rope(x, norm_weight, w, 1e-6, freqs, freqs, state, q, kc, torch.zeros_like(kc),
                     num_heads=4, num_kv_heads=2, head_dim=12, bias=b)
