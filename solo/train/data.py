"""Packed token stream and a deterministic, resumable batch order.

All training documents (``BOS text EOS``) are concatenated into one stream and cut into chunks of
``context + 1`` tokens (inputs plus the shifted targets). Each epoch visits the chunks in a
permutation drawn from ``seed + epoch``, and epochs after the first shift the chunk boundaries by
a seeded offset. Batch ``g`` therefore depends only on ``(seed, g)``, so the data position of a
run is just its step count and resuming replays nothing and skips nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def pack_documents(docs: list[list[int]]) -> np.ndarray:
    """Concatenate tokenised documents into one stream.

    Args:
        docs: token ids per document (each already ``[BOS, ..., EOS]``).

    Returns:
        ``[n_tokens]`` uint16 array when every id fits in 16 bits, else int32.
    """
    max_id = max((max(d) for d in docs if d), default=0)
    dtype = np.uint16 if max_id < 2**16 else np.int32
    return np.fromiter((t for d in docs for t in d), dtype=dtype, count=sum(len(d) for d in docs))


@dataclass
class BatchSchedule:
    """Deterministic batches of packed chunks from a token stream.

    Attributes:
        tokens: ``[n_tokens]`` integer array, the packed training stream.
        context: tokens per training sequence (model inputs).
        batch_size: sequences per batch.
        seed: base seed of the chunk order.

    Raises:
        ValueError: if the stream is too short for one batch of ``batch_size`` chunks.
    """

    tokens: np.ndarray
    context: int
    batch_size: int
    seed: int

    def __post_init__(self) -> None:
        if self.batches_per_epoch(0) < 1:
            raise ValueError(
                f"token stream of {len(self.tokens)} tokens is too short for one batch of "
                f"{self.batch_size} x {self.context + 1} tokens"
            )
        self._cached_epoch: int | None = None
        self._cached_starts: np.ndarray | None = None

    def _offset(self, epoch: int) -> int:
        if epoch == 0:
            return 0
        return int(np.random.default_rng([self.seed, epoch, 1]).integers(0, self.context))

    def batches_per_epoch(self, epoch: int) -> int:
        """Number of full batches in an epoch.

        Args:
            epoch: epoch index (0-based); epochs > 0 lose up to one chunk to their offset.

        Returns:
            Batches per epoch (int).
        """
        n_chunks = (len(self.tokens) - self._offset(epoch) - 1) // self.context
        return n_chunks // self.batch_size

    def _chunk_starts(self, epoch: int) -> np.ndarray:
        if self._cached_epoch != epoch:
            offset = self._offset(epoch)
            n_chunks = (len(self.tokens) - offset - 1) // self.context
            order = np.random.default_rng([self.seed, epoch, 0]).permutation(n_chunks)
            self._cached_starts = offset + order * self.context
            self._cached_epoch = epoch
        assert self._cached_starts is not None
        return self._cached_starts

    def position(self, step: int) -> tuple[int, int]:
        """Map a global batch index to ``(epoch, batch index within the epoch)``.

        Args:
            step: global batch index (the optimiser step count), >= 0.

        Returns:
            ``(epoch, batch_in_epoch)``.
        """
        epoch = 0
        while step >= (n := self.batches_per_epoch(epoch)):
            step -= n
            epoch += 1
        return epoch, step

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the batch for a global step.

        Args:
            step: global batch index, >= 0.

        Returns:
            ``(inputs, targets)``, both int64 ``[batch, seq]`` with ``seq = context``;
            ``targets[:, i] = inputs[:, i + 1]`` within the stream.
        """
        epoch, index = self.position(step)
        starts = self._chunk_starts(epoch)[index * self.batch_size : (index + 1) * self.batch_size]
        rows = np.stack([self.tokens[s : s + self.context + 1] for s in starts]).astype(np.int64)
        chunk = torch.from_numpy(rows)
        return chunk[:, :-1], chunk[:, 1:]
