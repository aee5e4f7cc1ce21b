"""One decode step in graph-safe torch ops: the general fallback, and the torch.compile baseline.

The eager model syncs with the host once per layer (`int(positions.max())` sizes its attention), so it
cannot be captured in a CUDA graph. Here the attended length comes from the host instead
(`forward_tokens`): a decode step reads the token, position and row from the device state and
attends over the whole static cache row under a position mask, so its shapes never change and it
captures as is and compiles with `fullgraph=True`; a prefill passes the prompt's end and runs without
per-layer syncs. The eager model's modules (norms, projections, MLP, RoPE, soft-capped attention) are
reused, so every architecture the eager model supports runs.

Cost: attention reads the full `max_seq` row every step (masked), which is fine at short and medium
contexts; the Triton step's flash-decoding reads only the live positions.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

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


def forward_tokens(model: Transformer, cache: KVCache, input_ids: torch.Tensor, positions: torch.Tensor,
                   rows: torch.Tensor, kv_len: int, last_only: bool = False) -> torch.Tensor:
    """`Transformer.forward` with the attended length given by the host instead of read from the device.

    With kv_len = max_seq the shapes are static (a decode step for a CUDA graph); with the prompt's end it
    is a prefill without the eager model's per-layer host syncs.

    Args:
        model: the eager model.
        cache: the static KV cache.
        input_ids: int64 [batch, seq] token ids.
        positions: int64 [batch, seq] absolute positions.
        rows: int64 [batch] cache rows.
        kv_len: cache slots attended over (> every position), in tokens.
        last_only: compute logits for the last position only.

    Returns:
        Logits [batch, seq, vocab] (or [batch, 1, vocab] with last_only) in the weights' dtype.
    """
    return model(input_ids, positions, cache, rows, last_only=last_only, kv_len=kv_len)


MATH_SCORES_BUDGET_BYTES = 256 * 2**20
"""Largest float32 score matrix (heads x query tokens x attended positions) an eager call may attend with
cuDNN left out: the backend torch then takes for the model's masked grouped-KV calls can be its math
one, which holds those scores whole; longer prefills keep torch's own choice."""


def eager_attention_backends(heads: int = 1, tokens: int = 1, kv_len: int = 1) -> contextlib.AbstractContextManager:
    """Scope for one of the GPU runtimes' eager torch calls (prefill, batched decode, verify): SDPA off cuDNN.

    Those calls attend over a length that changes with every prompt and every step, and torch 2.11 picks
    cuDNN's attention for bf16 with a mask on Hopper, which builds a plan per new shape: on an H200
    (Llama-3.2-1B shape) a prefill of a new length took 37-631 ms the first time against 8-10 ms after, and
    a 4-row decode step at a new length 36-382 ms against 8-9 ms (benchmarks/results/nvidia-h200). Without
    it a new length cost nothing extra there (prefill 11-16 ms, decode 9.4-9.6 ms). For these masked
    grouped-KV calls torch's flash backend takes no mask and, per its backend checks, the memory-efficient
    one no grouped KV heads, so the math backend may run, whose scores are a whole float32
    [heads, tokens, kv_len] matrix: calls whose matrix would exceed `MATH_SCORES_BUDGET_BYTES` (long
    prefills) keep torch's choice. Backends the process turned off stay off; the setting is restored on
    exit.

    Args:
        heads: query heads per sequence times the batch's sequences.
        tokens: query tokens per sequence (1 for a decode step).
        kv_len: positions attended.

    Returns:
        A context manager (`torch.nn.attention.sdpa_kernel` over the enabled backends but cuDNN's, or a no-op).
    """
    backends = [b for b, on in ((SDPBackend.FLASH_ATTENTION, torch.backends.cuda.flash_sdp_enabled()),
                                (SDPBackend.EFFICIENT_ATTENTION, torch.backends.cuda.mem_efficient_sdp_enabled()),
                                (SDPBackend.MATH, torch.backends.cuda.math_sdp_enabled())) if on]
    if not backends or 4 * heads * tokens * kv_len > MATH_SCORES_BUDGET_BYTES:
        return contextlib.nullcontext()
    return sdpa_kernel(backends)


def eager_forward_tokens(model: Transformer, cache: KVCache, input_ids: torch.Tensor, positions: torch.Tensor,
                         rows: torch.Tensor, kv_len: int, last_only: bool = False) -> torch.Tensor:
    """`forward_tokens` as the GPU runtimes' eager calls run it (prefill, batched decode, verify).

    Attention is scoped by `eager_attention_backends` for the call's [batch, seq] tokens over `kv_len`
    positions. Args and returns: see `forward_tokens`.
    """
    batch, seq = input_ids.shape
    with eager_attention_backends(model.config.num_heads * batch, seq, kv_len):
        return forward_tokens(model, cache, input_ids, positions, rows, kv_len, last_only=last_only)


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
