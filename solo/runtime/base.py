"""The contract every decode runtime (eager, compiled CPU, CUDA graphs) fulfils.

A runtime owns the model's weights in its preferred layout and a static KV cache with `rows` sequences
of up to `max_seq` tokens. The engine and the server's scheduler only talk to this interface.
"""

from __future__ import annotations

from typing import Protocol

import torch

from solo.model.config import ModelConfig


class DecodeRuntime(Protocol):
    """How prefill and decode steps run.

    Attributes:
        name: short backend name reported by the CLI and bench ("eager", "cpu-compiled", "cuda-graph").
        config: the model config.
        device: where logits come back.
        rows: number of KV-cache rows (concurrent sequences).
        max_seq: tokens per row currently allocated (may exceed what was reserved: runtimes round up).
        batch_invariant: True when `decode` over several rows gives each row bit for bit its batch-1 logits;
            the server then decodes all active requests in one call (else one call per request, so a
            request's output never depends on its neighbours).
    """

    name: str
    config: ModelConfig
    device: torch.device
    rows: int
    max_seq: int
    batch_invariant: bool

    def reserve(self, rows: int, max_seq: int) -> None:
        """Make sure the cache holds at least `rows` rows of `max_seq` tokens each.

        Growing the cache may reallocate it, which discards cached sequences.

        Args:
            rows: concurrent sequences.
            max_seq: tokens per sequence (prompt + generated).
        """
        ...

    def prefill(self, row: int, token_ids: torch.Tensor, start_pos: int = 0) -> torch.Tensor:
        """Run the prompt through the model into cache row `row`.

        Args:
            row: cache row.
            token_ids: int64 [seq] prompt ids (written at positions start_pos .. start_pos + seq - 1).
            start_pos: position of the first id.

        Returns:
            float32 [vocab] logits of the last position.

        Raises:
            SoloError: (CPU and CUDA runtimes) the row or the positions fall outside the reserved cache.
        """
        ...

    def decode(self, rows: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One decode step for a batch of sequences.

        Args:
            rows: int64 [batch] cache rows.
            token_ids: int64 [batch] the newest token of each sequence.
            positions: int64 [batch] the position of that token.

        Returns:
            float32 [batch, vocab] logits.

        Raises:
            SoloError: (CPU and CUDA runtimes) no cache reserved, or (CPU) a row, position or id out of range.
        """
        ...
