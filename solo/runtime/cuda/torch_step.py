"""One decode step in graph-safe torch ops: the general fallback, and the torch.compile baseline.

The eager model syncs with the host once per layer (`int(positions.max())` sizes its attention), so it
cannot be captured in a CUDA graph. Here the attended length comes from the host instead
(`cached_attention`): a decode step reads the token, position and row from the device state and
attends over the whole static cache row under a position mask, so its shapes never change and it
captures as is and compiles with `fullgraph=True`; a prefill passes the prompt's end and runs without
per-layer syncs. The eager model's modules (norms, projections, MLP, RoPE, soft-capped attention) are
reused, so every architecture the eager model supports runs.

Cost: attention reads the full `max_seq` row every step (masked), which is fine at short and medium
contexts; the Triton step's flash-decoding reads only the live positions.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from solo.model.layers import Attention, _softcapped_attention, attention_mask
from solo.model.rope import apply_rope
from solo.model.transformer import KVCache, Transformer
from solo.runtime.cuda.state import STATE_POS, STATE_ROW, STATE_TOKEN

log = logging.getLogger(__name__)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, row: torch.Tensor, pos: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> None:
    """Write one token's keys and values at (row, :, pos) without a host sync.

    Args:
        k_cache, v_cache: [rows, kv_heads, max_seq, head_dim].
        row, pos: int64 [1] device tensors.
        k, v: [kv_heads, head_dim].
    """
    k_cache[row, :, pos] = k.unsqueeze(0).to(k_cache.dtype)
    v_cache[row, :, pos] = v.unsqueeze(0).to(v_cache.dtype)


def cached_attention(attn: Attention, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     positions: torch.Tensor, rows: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     kv_len: int) -> torch.Tensor:
    """`Attention.forward` with the attended length given by the host instead of read from the device.

    With kv_len = max_seq the shapes are static (a decode step for a CUDA graph); with the prompt's
    end it is a prefill without the eager model's per-layer host syncs.

    Args:
        attn: the eager attention module (its projections, norms and window are used).
        h: [batch, seq, hidden] normalized input.
        cos, sin: [batch, seq, head_dim] RoPE tables in the activation dtype.
        positions: int64 [batch, seq] device tensor; rows: int64 [batch] device tensor.
        k_cache, v_cache: this layer's cache [cache_rows, kv_heads, max_seq, head_dim].
        kv_len: cache slots attended over (> every position in `positions`).

    Returns:
        [batch, seq, hidden].
    """
    cfg = attn.config
    batch, seq, _ = h.shape
    q = attn.q_proj(h).view(batch, seq, cfg.num_heads, cfg.head_dim)
    k = attn.k_proj(h).view(batch, seq, cfg.num_kv_heads, cfg.head_dim)
    v = attn.v_proj(h).view(batch, seq, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = apply_rope(q.transpose(1, 2), cos, sin)  # [batch, heads, seq, head_dim]
    k = apply_rope(k.transpose(1, 2), cos, sin)  # [batch, kv_heads, seq, head_dim]
    row_idx = rows[:, None].expand(batch, seq)
    k_cache[row_idx, :, positions] = k.transpose(1, 2).to(k_cache.dtype)
    v_cache[row_idx, :, positions] = v.to(v_cache.dtype)
    keys = k_cache[rows, :, :kv_len]  # [batch, kv_heads, kv_len, head_dim]
    values = v_cache[rows, :, :kv_len]
    mask = attention_mask(positions, kv_len, attn.window)
    if cfg.attn_logit_softcap is None:
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=cfg.attn_scale,
                                             enable_gqa=cfg.num_kv_groups > 1)
    else:
        out = _softcapped_attention(q, keys, values, mask, cfg.attn_scale, cfg.attn_logit_softcap)
    return attn.o_proj(out.transpose(1, 2).reshape(batch, seq, cfg.num_heads * cfg.head_dim))


def forward_tokens(model: Transformer, cache: KVCache, input_ids: torch.Tensor, positions: torch.Tensor,
                   rows: torch.Tensor, kv_len: int, last_only: bool = False) -> torch.Tensor:
    """`Transformer.forward` through `cached_attention` (same arguments, plus the host-known kv_len).

    Returns:
        Logits [batch, seq, vocab] (or [batch, 1, vocab] with last_only) in the weights' dtype.
    """
    x = model.embed_tokens(input_ids)
    cos, sin = model.rotary(positions, x.dtype)
    for i, layer in enumerate(model.layers):
        # DecoderLayer.forward with the attention swapped.
        h = cached_attention(layer.attn, layer.attn_norm(x), cos, sin, positions, rows, cache.k[i], cache.v[i],
                             kv_len)
        if layer.sandwich_norm:
            h = layer.attn_out_norm(h)
        x = x + h
        h = layer.mlp(layer.mlp_norm(x))
        if layer.sandwich_norm:
            h = layer.mlp_out_norm(h)
        x = x + h
    if last_only:
        x = x[:, -1:]
    return model.logits(x)


class TorchStep:
    """A decode step over the device state in plain torch ops (see the module docstring).

    Args:
        model: the eager model.
        cache: the static KV cache (one extra scratch row is fine).
        state: int64 decode state [STATE_SIZE] (token, position, row are read).
        logits: float32 [vocab] output buffer.
        compile_mode: None to run the ops as they are, else a `torch.compile` mode such as "default" or
            "max-autotune-no-cudagraphs" (the runtime captures the CUDA graph itself).
    """

    def __init__(self, model: Transformer, cache: KVCache, state: torch.Tensor, logits: torch.Tensor,
                 compile_mode: str | None = None) -> None:
        self.model = model
        self.cache = cache
        self.state = state
        self.logits = logits
        self.compile_mode = compile_mode
        self._forward_fn = self._forward
        if compile_mode is not None:
            self._forward_fn = torch.compile(self._forward, mode=compile_mode, fullgraph=True, dynamic=False)

    def _forward(self, state: torch.Tensor, logits: torch.Tensor) -> None:
        token = state[STATE_TOKEN:STATE_TOKEN + 1].view(1, 1)
        pos = state[STATE_POS:STATE_POS + 1].view(1, 1)
        row = state[STATE_ROW:STATE_ROW + 1]
        out = forward_tokens(self.model, self.cache, token, pos, row, self.cache.max_seq, last_only=True)
        logits.copy_(out[0, -1].float())

    def __call__(self) -> None:
        """Run one step: reads the state, writes this token's k/v into the cache and the logits."""
        self._forward_fn(self.state, self.logits)

    def tune(self) -> None:
        """Nothing to tune (torch.compile autotunes inside its own first call)."""
