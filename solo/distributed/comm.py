"""Collectives of tensor parallelism over `torch.distributed`, timed: how long ranks are blocked on them.

`DistLanes` is the multi-rank `solo.model.lanes.LocalLanes`: a cross-lane sum is this rank's lanes summed,
then an all-reduce over ranks, started asynchronously and waited when the lane model needs it (d layers
later under DTP). Dense Megatron-style TP uses the same object's blocking `all_reduce` and `gather_last`.
Every wait is timed into `CommStats`, which `solo bench --tp` reports per token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from solo.model.lanes import Pending


@dataclass
class CommStats:
    """Time this rank spent blocked on collectives.

    Attributes:
        blocked_s: seconds spent waiting for collectives to complete (blocking calls in full, asynchronous
            ones from the `wait()`), since the last `reset`.
        collectives: collectives issued since the last `reset`.
    """

    blocked_s: float = 0.0
    collectives: int = 0

    def reset(self) -> None:
        """Zero both counters."""
        self.blocked_s, self.collectives = 0.0, 0


class DistLanes:
    """Cross-rank communication for lane models and dense TP (one process group, one rank per process).

    Args:
        group: the process group (None: the default one).
        vocab_size: the full vocabulary (logits gathered by `gather_last` are trimmed to it).
    """

    def __init__(self, group: dist.ProcessGroup | None = None, vocab_size: int | None = None) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.vocab_size = vocab_size
        self.stats = CommStats()
        self._cuda_sync = False

    def _timed_wait(self, work: dist.Work, tensor: torch.Tensor) -> None:
        start = time.perf_counter()
        work.wait()
        if tensor.is_cuda:
            torch.cuda.current_stream().synchronize()  # NCCL's wait only orders streams; time the real wait
        self.stats.blocked_s += time.perf_counter() - start

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Blocking sum over ranks of x (any shape); returns the summed tensor."""
        x = x.contiguous()
        self.stats.collectives += 1
        self._timed_wait(dist.all_reduce(x, group=self.group, async_op=True), x)
        return x

    def lane_sum(self, x: torch.Tensor) -> Pending:
        """Start the sum over every lane of every rank of x [batch, seq, lanes here, n]; wait() gives [b, s, 1, n]."""
        local = x.sum(dim=2, keepdim=True).contiguous()
        self.stats.collectives += 1
        work = dist.all_reduce(local, group=self.group, async_op=True)
        return Pending(local, lambda: self._timed_wait(work, local))

    def lane_sum_now(self, x: torch.Tensor) -> torch.Tensor:
        """Blocking sum over every lane of every rank: [batch, seq, lanes here, n] -> [batch, seq, 1, n]."""
        return self.all_reduce(x.sum(dim=2, keepdim=True))

    def gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate x's last dimension over ranks, in rank order.

        Each rank's piece is padded to `vocab_chunk` rows, and the result trimmed to `vocab_size`.
        """
        size = x.shape[-1]
        chunk = vocab_chunk(self.vocab_size, self.world) if self.vocab_size else size
        if size < chunk:
            x = torch.nn.functional.pad(x, (0, chunk - size))
        x = x.contiguous()
        pieces = [torch.empty_like(x) for _ in range(self.world)]
        self.stats.collectives += 1
        self._timed_wait(dist.all_gather(pieces, x, group=self.group, async_op=True), x)
        out = torch.cat(pieces, dim=-1)
        return out[..., : self.vocab_size] if self.vocab_size else out


def vocab_chunk(vocab_size: int, world: int) -> int:
    """Vocabulary rows per rank of a vocab-parallel LM head (the last rank may hold fewer)."""
    return -(-vocab_size // world)


def vocab_range(vocab_size: int, world: int, rank: int) -> tuple[int, int]:
    """The [start, stop) vocabulary rows rank `rank` computes."""
    chunk = vocab_chunk(vocab_size, world)
    return min(vocab_size, rank * chunk), min(vocab_size, (rank + 1) * chunk)
