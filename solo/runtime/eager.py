"""The eager runtime: the reference model run op by op over a static KV cache.

It is the oracle the fast runtimes are tested against, and the fallback wherever they do not apply.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from solo.errors import SoloError
from solo.model.transformer import KVCache, Transformer
from solo.runtime.base import KVSnapshot, decode_spans_by_calls, export_cache_kv, import_cache_kv


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
    # verify() is one forward over k tokens: the same arithmetic as k decode steps in float32 up to rounding,
    # but not bit for bit (a bfloat16 near-tie can flip).
    verify_matches_decode = False

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
        rows, max_seq = max(rows, self.rows), max(max_seq, self.max_seq)
        self.cache = None  # free the old cache before allocating the new one
        self.cache = KVCache(self.config, rows, max_seq, self.model.dtype, self.device)
        self.rows, self.max_seq = rows, max_seq  # (after it: a failed allocation leaves the old sizes)

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

    @torch.inference_mode()
    def verify(self, row: int, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Score k consecutive tokens of one row: float32 [k, vocab], every position's logits (see `VerifyRuntime`).

        Raises:
            SoloError: no cache, an empty `token_ids`, or positions past the reserved cache.
        """
        ids = token_ids.to(self.device, torch.long).view(1, -1)
        k = ids.shape[1]
        if self.cache is None or k == 0 or not 0 <= row < self.rows or start_pos + k > self.max_seq:
            raise SoloError(f"verify of {k} tokens at {start_pos} does not fit row {row} of the cache "
                            f"({self.rows} rows x {self.max_seq} tokens)")
        positions = torch.arange(start_pos, start_pos + k, device=self.device).view(1, -1)
        rows = torch.tensor([row], device=self.device)
        return self.model(ids, positions, self.cache, rows)[0].float()

    def decode_spans(self, rows: Sequence[int], token_lists: Sequence[Sequence[int]],
                     start_positions: Sequence[int]) -> list[torch.Tensor]:
        """Every row's 1..k tokens (`SpanDecodeRuntime`): float32 [k_i, vocab] per row, by separate calls.

        One batched `decode` for the one-token rows and one `verify` per longer row (`decode_spans_by_calls`).

        The reference keeps its separate calls: a single forward over ragged spans would pad them, and its
        arithmetic is not batch-invariant anyway (`batch_invariant`).
        """
        return decode_spans_by_calls(self, rows, token_lists, start_positions)

    def export_kv(self, row: int, length: int) -> KVSnapshot:
        """Copy positions 0 .. length - 1 of `row` out of the cache (see `KVSnapshotRuntime`)."""
        return export_cache_kv(self.cache, row, length)

    def import_kv(self, row: int, snapshot: KVSnapshot, length: int, start: int = 0) -> None:
        """Write a snapshot's positions start .. length - 1 into `row` (see `KVSnapshotRuntime`)."""
        import_cache_kv(self.cache, row, snapshot, length, start)
