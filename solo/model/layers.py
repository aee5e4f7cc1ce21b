"""Building blocks of the eager reference transformer: RMSNorm, attention with a static KV cache, MLP.

These modules are the readable oracle every fast path is tested against. Their numerics mirror
transformers' Llama/Gemma 2 modules (where each cast to float32 happens), so greedy tokens match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from solo.model.config import ModelConfig
from solo.model.rope import apply_rope

_ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich, 2019), computed in float32.

    Args:
        dim: size of the normalized (last) dimension.
        eps: added to the mean square.
        unit_offset: scale by (1 + weight) and cast after scaling (Gemma) instead of by weight after
            casting (Llama); transformers documents the difference in Gemma2RMSNorm.
    """

    def __init__(self, dim: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize `x` [..., dim] (any float dtype); returns the same shape, in x's dtype when the weight has it."""
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (normed * (1.0 + self.weight.float())).type_as(x)
        return self.weight * normed.to(x.dtype)


def attention_mask(
    positions: torch.Tensor, kv_len: int, window: int | None
) -> torch.Tensor:
    """Boolean mask of the keys each query may attend to.

    A query at position p sees cache slots j <= p, and with a sliding window only j > p - window.

    Args:
        positions: int64 [batch, seq], the queries' absolute positions.
        kv_len: number of cache slots attended over.
        window: sliding-window size in tokens, or None.

    Returns:
        bool [batch, 1, seq, kv_len] (True = attend).
    """
    key_pos = torch.arange(kv_len, device=positions.device)
    q = positions[:, :, None]
    allowed = key_pos[None, None, :] <= q
    if window is not None:
        allowed &= key_pos[None, None, :] > q - window
    return allowed[:, None]


class Attention(nn.Module):
    """Multi-head attention with grouped-query KV heads, RoPE and a static KV cache.

    Scaled dot-product attention (Vaswani et al. 2017) through `F.scaled_dot_product_attention`; KV heads
    are shared by groups of query heads (GQA, Ainslie et al. 2023); Gemma 2's tanh soft-capping of the
    scores runs as explicit matmuls.

    Args:
        config: model config.
        layer_idx: index of this layer (selects its sliding window and its cache tensors).
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        h, hd = config.hidden_size, config.head_dim
        self.config = config
        self.layer_idx = layer_idx
        self.window = config.layer_sliding_windows[layer_idx]
        self.q_proj = nn.Linear(h, config.num_heads * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, config.num_kv_heads * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, config.num_kv_heads * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * hd, h, bias=config.o_bias)
        if config.qk_norm:
            # Per head (Qwen3), or across the whole q / k projection (OLMoE).
            wide = config.qk_norm_full_width
            offset = config.norm_unit_offset  # Gemma 3's q/k norms scale by (1 + w) as its other norms
            self.q_norm = RMSNorm(config.num_heads * hd if wide else hd, config.rms_norm_eps, offset)
            self.k_norm = RMSNorm(config.num_kv_heads * hd if wide else hd, config.rms_norm_eps, offset)
        self.use_rope = config.layer_uses_rope(layer_idx)  # False on SmolLM3's NoPE layers

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        rows: torch.Tensor,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """Attend from `x` over the cache after writing this step's keys and values into it.

        Args:
            x: [batch, seq, hidden] activations.
            cos, sin: [batch, seq, head_dim] RoPE tables.
            positions: int64 [batch, seq] absolute positions of the tokens in x.
            k_cache, v_cache: [cache_rows, kv_heads, max_seq, head_dim] this layer's cache, written in place
                at (rows[b], :, positions[b, s]).
            rows: int64 [batch], which cache row each batch entry owns.
            kv_len: cache slots attended over (> every position); None reads it from `positions`, which
                syncs with the device. A fixed kv_len (the whole row, masked) keeps shapes static for
                CUDA-graph capture and torch.compile.

        Returns:
            [batch, seq, hidden] in x's dtype.
        """
        cfg = self.config
        batch, seq, _ = x.shape
        q, k = self.q_proj(x), self.k_proj(x)
        if cfg.qk_norm and cfg.qk_norm_full_width:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(batch, seq, cfg.num_heads, cfg.head_dim)
        k = k.view(batch, seq, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(x).view(batch, seq, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm and not cfg.qk_norm_full_width:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [batch, heads or kv_heads, seq, head_dim]
        if self.use_rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        row_idx = rows[:, None].expand(batch, seq)
        k_cache[row_idx, :, positions] = k.transpose(1, 2).to(k_cache.dtype)
        v_cache[row_idx, :, positions] = v.to(v_cache.dtype)

        if kv_len is None:
            kv_len = int(positions.max()) + 1
        keys = k_cache[rows, :, :kv_len]  # [batch, kv_heads, kv_len, head_dim]
        values = v_cache[rows, :, :kv_len]
        mask = attention_mask(positions, kv_len, self.window)
        if cfg.attn_logit_softcap is None:
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=cfg.attn_scale, enable_gqa=cfg.num_kv_groups > 1
            )
        else:
            out = _softcapped_attention(q, keys, values, mask, cfg.attn_scale, cfg.attn_logit_softcap)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, cfg.num_heads * cfg.head_dim))


def _softcapped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    # Gemma 2: scores are squashed by softcap * tanh(scores / softcap) before masking; SDPA cannot do this.
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)) (SwiGLU with silu, GeGLU with gelu; Shazeer 2020, "GLU Variants").

    Args:
        config: model config (sizes, activation, bias).
        intermediate_size: hidden width, when not `config.intermediate_size` (an MoE shared expert).
    """

    def __init__(self, config: ModelConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        h, f = config.hidden_size, intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(h, f, bias=config.mlp_bias)
        self.up_proj = nn.Linear(h, f, bias=config.mlp_bias)
        self.down_proj = nn.Linear(f, h, bias=config.mlp_bias)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, hidden] -> [batch, seq, hidden], in the weights' dtype."""
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One pre-norm transformer block; with `sandwich_norm` also post-norms (Gemma 2).

    Args:
        config: model config.
        layer_idx: index of the layer.
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        eps, offset = config.rms_norm_eps, config.norm_unit_offset
        self.sandwich_norm = config.sandwich_norm
        self.attn_norm = RMSNorm(config.hidden_size, eps, offset)
        self.attn = Attention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, eps, offset)
        if config.is_moe_layer(layer_idx):
            from solo.model.moe import SparseMoeBlock  # moe.py builds on this module

            self.mlp = SparseMoeBlock(config)
        else:
            self.mlp = MLP(config)
        if config.sandwich_norm:
            self.attn_out_norm = RMSNorm(config.hidden_size, eps, offset)
            self.mlp_out_norm = RMSNorm(config.hidden_size, eps, offset)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        rows: torch.Tensor,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """[batch, seq, hidden] -> [batch, seq, hidden]; see `Attention.forward` for the other args."""
        h = self.attn(self.attn_norm(x), cos, sin, positions, k_cache, v_cache, rows, kv_len)
        if self.sandwich_norm:
            h = self.attn_out_norm(h)
        x = x + h
        h = self.mlp(self.mlp_norm(x))
        if self.sandwich_norm:
            h = self.mlp_out_norm(h)
        return x + h
