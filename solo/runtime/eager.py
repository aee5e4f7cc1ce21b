"""The eager runtime: the reference model run op by op over a static KV cache.

It is the oracle the fast runtimes are tested against, and the fallback wherever they do not apply.
"""

from __future__ import annotations

import torch

from solo.model.transformer import KVCache, Transformer


class EagerRuntime:
    """Runs `Transformer.forward` directly.

    Args:
        model: the loaded eager model.
        rows: KV-cache rows (concurrent sequences).
        max_seq: tokens per row.
    """

    name = "eager"
    # F.linear picks a different GEMM path for several rows than for one, and attention pads rows to the
    # longest, so batched logits differ from batch-1 logits in the last bits.
    batch_invariant = False

    def __init__(self, model: Transformer, rows: int = 1, max_seq: int = 0) -> None:
        self.model = model
        self.config = model.config
        self.device = model.device
        self.rows = 0
        self.max_seq = 0
        self.cache: KVCache | None = None
        if max_seq:
            self.reserve(rows, max_seq)

    def reserve(self, rows: int, max_seq: int) -> None:
        """Allocate the cache if it is smaller than `rows` x `max_seq` tokens (discarding its contents)."""
        if self.cache is not None and rows <= self.rows and max_seq <= self.max_seq:
            return
        self.rows, self.max_seq = max(rows, self.rows), max(max_seq, self.max_seq)
        self.cache = None  # free the old cache before allocating the new one
        self.cache = KVCache(self.config, self.rows, self.max_seq, self.model.dtype, self.device)

    @torch.inference_mode()
    def prefill(self, row: int, token_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Prompt -> float32 [vocab] logits of its last position (see `DecodeRuntime.prefill`)."""
        ids = token_ids.to(self.device).view(1, -1)
        positions = torch.arange(start_pos, start_pos + ids.shape[1], device=self.device).view(1, -1)
        rows = torch.tensor([row], device=self.device)
        return self.model(ids, positions, self.cache, rows, last_only=True)[0, -1].float()

    @torch.inference_mode()
    def decode(self, rows: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step for a batch -> float32 [batch, vocab] (see `DecodeRuntime.decode`)."""
        logits = self.model(
            token_ids.to(self.device).view(-1, 1), positions.to(self.device).view(-1, 1), self.cache,
            rows.to(self.device), last_only=True,
        )
        return logits[:, -1].float()
