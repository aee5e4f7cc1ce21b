"""The contract every decode runtime (eager, compiled CPU, CUDA graphs) fulfils.

A runtime owns the model's weights in its preferred layout and a static KV cache with `rows` sequences
of up to `max_seq` tokens. The engine and the server's scheduler only talk to this interface.

Beyond the `DecodeRuntime` protocol a runtime may declare capabilities, by having the methods:
`verify` (several tokens of one row in one forward pass, for speculative decoding; `VerifyRuntime`) and
`export_kv` / `import_kv` (KV-cache rows copied out and back in, for prefix caching; `KVSnapshotRuntime`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from solo.errors import SoloError
from solo.model.config import ModelConfig
from solo.model.transformer import KVCache


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


# ------------------------------------------------------------------------------------- capabilities
# Optional abilities a runtime declares by having the method. The engine and the server ask
# (`supports_verify`, `supports_kv_snapshots`) instead of importing a runtime's module.


@dataclass
class KVSnapshot:
    """A copy of the first `length` positions of one KV-cache row, every layer (sliding-window ones too).

    Attributes:
        k, v: [layers, kv_heads, length, head_dim] in the cache's dtype, on the cache's device.
        length: positions held.
    """

    k: torch.Tensor
    v: torch.Tensor
    length: int

    @property
    def nbytes(self) -> int:
        """Memory held, in bytes."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


@runtime_checkable
class VerifyRuntime(Protocol):
    """A runtime that can score several consecutive tokens of one row in one forward pass."""

    def verify(self, row: int, token_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Feed k consecutive tokens of one row and return every position's logits.

        Used by speculative decoding: the keys and values of all k tokens are written (positions past the
        accepted ones are rewritten by later steps before anything reads them).

        Args:
            row: cache row (its positions < start_pos already hold the sequence).
            token_ids: int64 [k] ids at positions start_pos .. start_pos + k - 1.
            start_pos: position of the first id.

        Returns:
            float32 [k, vocab]: row i predicts the token after token_ids[i].

        Raises:
            SoloError: the row or the positions fall outside the reserved cache, or k == 0.
        """
        ...


@runtime_checkable
class KVSnapshotRuntime(Protocol):
    """A runtime whose KV-cache rows can be copied out and back in (prefix caching)."""

    def export_kv(self, row: int, length: int) -> KVSnapshot:
        """Copy positions 0 .. length - 1 of `row` (every layer) out of the cache."""
        ...

    def import_kv(self, row: int, snapshot: KVSnapshot, length: int) -> None:
        """Write the snapshot's first `length` positions into positions 0 .. length - 1 of `row`."""
        ...


def supports_verify(runtime: object) -> bool:
    """True when `runtime` has a multi-token `verify` (speculative decoding can run on it)."""
    return callable(getattr(runtime, "verify", None))


def supports_kv_snapshots(runtime: object) -> bool:
    """True when `runtime` has `export_kv` and `import_kv` (prefix caching can run on it)."""
    return callable(getattr(runtime, "export_kv", None)) and callable(getattr(runtime, "import_kv", None))


def export_cache_kv(cache: KVCache | None, row: int, length: int) -> KVSnapshot:
    """`export_kv` for a runtime whose cache is a `KVCache` ([rows, kv_heads, max_seq, head_dim] per layer).

    Raises:
        SoloError: no cache, or the row / length fall outside it.
    """
    _check_span(cache, row, length)
    k = torch.stack([layer[row, :, :length] for layer in cache.k])
    v = torch.stack([layer[row, :, :length] for layer in cache.v])
    return KVSnapshot(k, v, length)


def import_cache_kv(cache: KVCache | None, row: int, snapshot: KVSnapshot, length: int) -> None:
    """`import_kv` for a runtime whose cache is a `KVCache` (see `export_cache_kv`).

    Raises:
        SoloError: no cache, the row / length fall outside it, or the snapshot is shorter than `length`.
    """
    _check_span(cache, row, length)
    if length > snapshot.length:
        raise SoloError(f"a KV snapshot of {snapshot.length} positions cannot fill {length}")
    for i, (k_layer, v_layer) in enumerate(zip(cache.k, cache.v, strict=True)):
        k_layer[row, :, :length].copy_(snapshot.k[i, :, :length])
        v_layer[row, :, :length].copy_(snapshot.v[i, :, :length])


def _check_span(cache: KVCache | None, row: int, length: int) -> None:
    if cache is None:
        raise SoloError("reserve() the KV cache before copying KV in or out")
    if not 0 <= row < cache.rows or not 0 <= length <= cache.max_seq:
        raise SoloError(f"row {row}, {length} positions fall outside the KV cache ({cache.rows} rows x "
                        f"{cache.max_seq} positions)")
