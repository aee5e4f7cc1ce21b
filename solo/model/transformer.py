"""The eager reference decoder-only transformer, one implementation for every supported architecture.

Feature fields of `ModelConfig` (biases, q/k norms, sandwich norms, soft-capping, per-layer sliding
windows) switch behaviour; the architecture's name is never consulted here. Parameter names are Solo's
own; `solo.model.weights` maps Hugging Face checkpoint names onto them.
"""

from __future__ import annotations

import errno
import math
from collections.abc import Callable

import torch
from torch import nn

from solo.errors import KVCacheMemoryError
from solo.memory import KV_MEMORY_FIX, check_kv_cache_fits, size_text
from solo.model.config import ModelConfig
from solo.model.layers import DecoderLayer, RMSNorm
from solo.model.rope import RotaryEmbedding


class KVCache:
    """Static KV cache: preallocated once, written in place at each token's position.

    Args:
        config: model config (layers, kv_heads, head_dim).
        rows: sequences the cache holds.
        max_seq: tokens per row.
        dtype: element dtype of the cache (the model's weight dtype).
        device: where the cache lives.
        allocate: optional nbytes -> uint8 [>= nbytes] memory on `device` to hold all the layers (the
            native CPU runtime's is a mapping on transparent huge pages); it is zero-filled here.
            Default: each layer its own `torch.zeros`.

    Attributes:
        k, v: per layer, a tensor [rows, kv_heads, max_seq, head_dim]. A row holds one sequence; the
            server gives each concurrent request its own row.

    Raises:
        KVCacheMemoryError: a host cache larger than the memory Linux can hand out (`solo.memory`), or memory
            that cannot be allocated (out of memory), with the sizes and the fix.
        ValueError: `allocate` gave something other than a uint8 tensor of at least the bytes asked for.
    """

    # Each layer's tensor starts on a 4 KiB boundary of the allocation (a page: layers never share one).
    _LAYER_ALIGN = 4096

    def __init__(
        self,
        config: ModelConfig,
        rows: int,
        max_seq: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        allocate: Callable[[int], torch.Tensor] | None = None,
    ) -> None:
        shape = (rows, config.num_kv_heads, max_seq, config.head_dim)
        self.rows = rows
        self.max_seq = max_seq
        need = self.buffer_bytes(config, rows, max_seq, dtype)
        if torch.device(device).type == "cpu":  # (overcommit: the allocation would succeed, the first writes not)
            check_kv_cache_fits(need, rows, max_seq)
        try:
            if allocate is None:
                self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
                self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
                return
            buffer = allocate(need)
            if buffer.dtype != torch.uint8 or buffer.device != torch.device(device) or buffer.numel() < need:
                raise ValueError(
                    f"KVCache allocate({need}) must give a uint8 tensor on {device} of at least {need} bytes, "
                    f"got {buffer.dtype} [{buffer.numel()}] on {buffer.device}"
                )
            buffer[:need].zero_()  # touches every page now (as torch.zeros does), not during decode
        except (MemoryError, OSError, RuntimeError) as exc:
            if not out_of_memory(exc):
                raise
            raise KVCacheMemoryError(f"out of memory for the KV cache of {rows} sequence(s) x {max_seq} tokens "
                                     f"({size_text(need)}); {KV_MEMORY_FIX}") from exc
        step = self._layer_bytes(shape, dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        layers = [buffer[i * step:i * step + nbytes].view(dtype).view(shape) for i in range(2 * config.num_layers)]
        self.k, self.v = layers[:config.num_layers], layers[config.num_layers:]

    @classmethod
    def _layer_bytes(cls, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        nbytes = math.prod(shape) * dtype.itemsize
        return -(-nbytes // cls._LAYER_ALIGN) * cls._LAYER_ALIGN

    @classmethod
    def buffer_bytes(cls, config: ModelConfig, rows: int, max_seq: int, dtype: torch.dtype) -> int:
        """Bytes `allocate` is asked for: 2 x layers tensors, each padded to 4 KiB."""
        shape = (rows, config.num_kv_heads, max_seq, config.head_dim)
        return 2 * config.num_layers * cls._layer_bytes(shape, dtype)

    def nbytes(self) -> int:
        """Memory held by the cache, in bytes."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class Transformer(nn.Module):
    """Decoder-only transformer (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, SmolLM3, MoE families) in plain PyTorch.

    Args:
        config: model config.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_unit_offset)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False
        )
        self.rotary = RotaryEmbedding(config)

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the weights."""
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        """Device of the weights."""
        return self.embed.weight.device

    def lm_head_weight(self) -> torch.Tensor:
        """The LM head matrix [vocab, hidden] (the embedding when tied)."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [batch, seq, hidden] (weights' dtype) for int64 `input_ids` [batch, seq].

        Gemma multiplies by `embedding_scale` (sqrt(hidden)) rounded to the weights' dtype.
        """
        x = self.embed(input_ids)
        if self.config.embedding_scale is not None:
            # Gemma rounds the scale to the weights' dtype before multiplying (transformers does too).
            x = x * torch.tensor(self.config.embedding_scale).to(x.dtype)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm, LM head and logit soft-capping: [batch, seq, hidden] -> [batch, seq, vocab].

        The logits are in the weights' dtype; Gemma 2 squashes them by cap * tanh(logits / cap).
        """
        if getattr(self.lm_head, "int8_activations", False):  # a QuantLinear as the CPU integer-dot kernels run it
            logits = self.lm_head(self.norm(hidden))
        else:
            logits = nn.functional.linear(self.norm(hidden), self.lm_head_weight())
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        rows: torch.Tensor,
        last_only: bool = False,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """Run the model over new tokens, appending their keys and values to the cache.

        Args:
            input_ids: int64 [batch, seq] token ids.
            positions: int64 [batch, seq] absolute positions (row b's earlier tokens must already be in
                the cache at positions < positions[b, 0]).
            cache: the static KV cache.
            rows: int64 [batch], the cache row of each batch entry.
            last_only: compute logits for the last position only (prefill needs no more).
            kv_len: cache slots attended over, when the caller knows it (see `Attention.forward`); None
                reads it from `positions` once per layer (a device sync).

        Returns:
            Logits [batch, seq, vocab] (or [batch, 1, vocab] with last_only) in the weights' dtype.
        """
        x = self.embed_tokens(input_ids)
        tables = self.rotary.layer_tables(positions, x.dtype)  # one per distinct RoPE (Gemma 3: local, global)
        for i, layer in enumerate(self.layers):
            cos, sin = tables[self.config.layer_rope_table(i)]
            x = layer(x, cos, sin, positions, cache.k[i], cache.v[i], rows, kv_len)
        if last_only:
            x = x[:, -1:]
        return self.logits(x)


def out_of_memory(exc: BaseException) -> bool:
    """Whether an allocation failed for want of memory.

    torch's allocators, mmap's ENOMEM, MemoryError, and the errors safetensors raises when it cannot map a file.
    """
    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOMEM
    message = str(exc).lower()
    if "cannot allocate memory (12)" in message:  # safetensors' mmap under `ulimit -v`: ENOMEM in its message
        return True
    # torch's CPU allocator: "can't allocate memory"; CUDA's: "out of memory"
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in message or "out of memory" in message)
