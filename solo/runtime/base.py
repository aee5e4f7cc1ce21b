"""The contract every decode runtime (eager, compiled CPU, CUDA graphs) fulfils.

A runtime owns the model's weights in its preferred layout and a static KV cache with `rows` sequences
of up to `max_seq` tokens. The engine and the server's scheduler only talk to this interface.

Beyond the `DecodeRuntime` protocol a runtime may declare capabilities, by having the methods:
`verify` (several tokens of one row in one forward pass, for speculative decoding; `VerifyRuntime`),
`decode_spans` (every row's next 1..k tokens in one call: a decode step whose rows may carry a speculative
draft; `SpanDecodeRuntime`, with `decode_spans_by_calls` as the loop any runtime with `decode` and `verify`
can run),
`export_kv` / `import_kv` (KV-cache rows copied out and back in, for prefix caching; `KVSnapshotRuntime`)
and `iter_blocks` (blocks of tokens decoded and sampled on the device per host sync; `BlockDecodingRuntime`,
whose sampling settings are a `SamplingSpec`). `runtime_capabilities` reads them all into one
`RuntimeCapabilities`; the engine and the server ask it instead of importing a runtime's module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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
class SpanDecodeRuntime(Protocol):
    """A runtime that runs a decode step in which each row feeds 1..k consecutive tokens, in one call."""

    def decode_spans(self, rows: Sequence[int], token_lists: Sequence[Sequence[int]],
                     start_positions: Sequence[int]) -> list[torch.Tensor]:
        """Feed row i's tokens token_lists[i] at positions start_positions[i] .. + k_i - 1, every row at once.

        A row with one token is a decode step; a row with 1 + d tokens is a speculative verify of a d-token
        draft (`VerifyRuntime.verify`). The keys and values of every token are written (positions past the
        accepted ones are rewritten by later steps before anything reads them).

        Args:
            rows: distinct cache rows, one per span (their positions < start_positions[i] hold the sequence).
            token_lists: for each row, its k_i >= 1 token ids.
            start_positions: for each row, the position of its first token.

        Returns:
            One float32 [k_i, vocab] tensor per row: entry j predicts the token after token_lists[i][j].

        Raises:
            SoloError: mismatched lengths, an empty span, a repeated row, or rows / positions / ids outside
                the reserved cache or the vocabulary.
        """
        ...


def check_spans(rows: Sequence[int], token_lists: Sequence[Sequence[int]], start_positions: Sequence[int]) -> None:
    """The argument checks every `decode_spans` shares (ranges are the runtime's own checks).

    Raises:
        SoloError: the three sequences differ in length, a span is empty, or a row appears twice.
    """
    if not len(rows) == len(token_lists) == len(start_positions):
        raise SoloError(f"decode_spans got {len(rows)} rows, {len(token_lists)} token lists and "
                        f"{len(start_positions)} start positions; pass one of each per row")
    if any(len(tokens) == 0 for tokens in token_lists):
        raise SoloError("decode_spans got an empty token list; every row needs at least its newest token")
    if len(set(rows)) != len(rows):
        raise SoloError(f"decode_spans got a row twice ({list(rows)}); give each row one span of consecutive tokens")


def decode_spans_by_calls(runtime: DecodeRuntime, rows: Sequence[int], token_lists: Sequence[Sequence[int]],
                          start_positions: Sequence[int]) -> list[torch.Tensor]:
    """`SpanDecodeRuntime.decode_spans` as separate calls: one `decode` for one-token rows, a `verify` per other.

    The one-token rows go in one batched `decode`; a runtime without `verify` may only pass those.

    What the server's scheduler ran before the capability existed: a runtime without a fused span kernel
    (eager, CUDA graphs, CPU lane models) computes exactly what it computed then.

    Raises:
        SoloError: see `check_spans`; a longer span on a runtime without `verify`; the runtime's own errors.
    """
    check_spans(rows, token_lists, start_positions)
    out: list[torch.Tensor | None] = [None] * len(rows)
    single = [i for i, tokens in enumerate(token_lists) if len(tokens) == 1]
    if single:
        logits = runtime.decode(torch.tensor([rows[i] for i in single], dtype=torch.long),
                                torch.tensor([token_lists[i][0] for i in single], dtype=torch.long),
                                torch.tensor([start_positions[i] for i in single], dtype=torch.long))
        for j, i in enumerate(single):
            out[i] = logits[j:j + 1]
    for i, tokens in enumerate(token_lists):
        if len(tokens) > 1:
            if not supports_verify(runtime):
                raise SoloError(f"the {getattr(runtime, 'name', '?')} runtime has no verify: decode_spans can only "
                                "feed one token per row there")
            out[i] = runtime.verify(rows[i], torch.tensor(list(tokens), dtype=torch.long), start_positions[i])
    return out  # type: ignore[return-value]


def decode_spans(runtime: DecodeRuntime, rows: Sequence[int], token_lists: Sequence[Sequence[int]],
                 start_positions: Sequence[int], between: Callable[[], None] | None = None) -> list[torch.Tensor]:
    """The runtime's `decode_spans` where it declares one, else `decode_spans_by_calls` (same contract).

    Args:
        rows, token_lists, start_positions: see `SpanDecodeRuntime.decode_spans`.
        between: on a runtime with `pausable_steps` (`RuntimeCapabilities`), called between runs of the
            step's layers (the native CPU runtime: `CpuRuntime.decode_spans`); elsewhere the step is one call
            and `between` is not called.
    """
    method = getattr(runtime, "decode_spans", None)
    if callable(method):
        if between is not None and getattr(runtime, "pausable_steps", False):
            return method(rows, token_lists, start_positions, between=between)
        return method(rows, token_lists, start_positions)
    return decode_spans_by_calls(runtime, rows, token_lists, start_positions)


@runtime_checkable
class KVSnapshotRuntime(Protocol):
    """A runtime whose KV-cache rows can be copied out and back in (prefix caching)."""

    def export_kv(self, row: int, length: int) -> KVSnapshot:
        """Copy positions 0 .. length - 1 of `row` (every layer) out of the cache."""
        ...

    def import_kv(self, row: int, snapshot: KVSnapshot, length: int, start: int = 0) -> None:
        """Write the snapshot's positions start .. length - 1 into the same positions of `row`.

        `start` > 0 when the row already holds the first positions (prefix caching copies only the rest).
        """
        ...


MODE_GREEDY = 0
MODE_SAMPLE = 1
MODE_FILTERED = 2


@dataclass(frozen=True)
class SamplingSpec:
    """What a device sampler (block decoding) needs from a request's resolved sampling values.

    Attributes:
        temperature: 0 for greedy.
        top_k: 0 disables.
        top_p: 1 disables.
        min_p: 0 disables.
        seed: Philox key base (any int; the CUDA runtime's `DecodeState.start` reduces it modulo 2**62).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0

    @classmethod
    def from_resolved(cls, sampling: Any) -> SamplingSpec:  # noqa: ANN401
        """Take the fields of a `solo.engine.sampling.ResolvedSampling` (or any object with them).

        Raises:
            ValueError: the request uses penalties, which the device sampler does not apply.
        """
        if getattr(sampling, "needs_penalties", False):
            raise ValueError("repetition / presence / frequency penalties need per-token decoding")
        return cls(float(sampling.temperature), int(sampling.top_k), float(sampling.top_p),
                   float(sampling.min_p), int(sampling.seed))

    @property
    def mode(self) -> int:
        """MODE_GREEDY, MODE_SAMPLE (temperature only) or MODE_FILTERED."""
        if self.temperature == 0.0:
            return MODE_GREEDY
        if self.top_k == 0 and self.top_p >= 1.0 and self.min_p == 0.0:
            return MODE_SAMPLE
        return MODE_FILTERED


@runtime_checkable
class BlockDecodingRuntime(Protocol):
    """A runtime that decodes blocks of tokens on the device, sampling and stop checks included (GPU)."""

    def iter_blocks(self, row: int, token: int, position: int, sampling: SamplingSpec, stop_ids: frozenset[int],
                    max_tokens: int, k: int | None = None) -> Iterator[list[int]]:
        """Decode up to `max_tokens` tokens after `token` (at `position`) in row `row`, a block per host sync.

        Yields:
            Each block's tokens, in order; a block ends early at a stop id or the budget.
        """
        ...


DEFAULT_BLOCK_SIZE = 16
"""Tokens per block on a block-decoding runtime that does not say (`block_size`)."""


def runtime_block_size(runtime: object) -> int:
    """Most tokens per `iter_blocks` block: the runtime's `block_size`, else `DEFAULT_BLOCK_SIZE` (at least 1)."""
    return max(1, int(getattr(runtime, "block_size", DEFAULT_BLOCK_SIZE)))


def block_tail(left: int, k: int) -> int:
    """The K of the next block when `left` tokens remain and blocks hold up to `k`.

    `k` while at least k remain, else the largest power of two <= left (1 when nothing or one remains): a
    block always runs all of its K steps, so a remainder is not padded to a whole block, and the Ks a
    generation uses stay few (each is one captured graph). Example: 37 tokens with k = 16 run as
    16, 16, 4, 1.
    """
    return k if left >= k else 1 << (max(left, 1).bit_length() - 1)


@dataclass(frozen=True)
class RuntimeCapabilities:
    """What a runtime can do beyond the `DecodeRuntime` protocol (read with `runtime_capabilities`).

    Attributes:
        name: the backend name ("cpu", "eager", "cuda-graph", ...).
        verify: multi-token `verify` (speculative decoding can run).
        verify_matches_decode: verify's logits are bit for bit those of decode steps.
        decode_spans: declares `decode_spans` (the native CPU runtime: one kernel call for a step whose rows
            carry drafts; eager: its decode and verify calls in a loop); without it the module-level
            `decode_spans` runs `decode_spans_by_calls`.
        spans_batch_invariant: a row's `decode_spans` logits are bit for bit the same alone or beside other
            rows' spans (one-token rows: its batch-1 decode logits; longer ones: its `verify` logits).
        speculative_auto: `--speculative auto` turns speculation on here.
        kv_snapshots: `export_kv` / `import_kv` (the prefix cache's snapshot store can run).
        block_decoding: `iter_blocks` (tokens decoded in blocks on the device).
        batch_invariant: a row's logits in a batched `decode` are bit for bit its batch-1 logits.
        pausable_steps: `decode_spans(..., between=f)` calls f between runs of the step's layers, where f may
            run other rows' calls (a server serves a new request's first token inside a long batched step).
    """

    name: str
    verify: bool
    verify_matches_decode: bool
    decode_spans: bool
    spans_batch_invariant: bool
    speculative_auto: bool
    kv_snapshots: bool
    block_decoding: bool
    batch_invariant: bool
    pausable_steps: bool = False


def runtime_capabilities(runtime: object) -> RuntimeCapabilities:
    """The capabilities `runtime` declares (by its methods and attributes)."""
    verify = supports_verify(runtime)
    return RuntimeCapabilities(
        name=str(getattr(runtime, "name", type(runtime).__name__)),
        verify=verify,
        verify_matches_decode=verify and bool(getattr(runtime, "verify_matches_decode", False)),
        decode_spans=supports_decode_spans(runtime),
        spans_batch_invariant=supports_decode_spans(runtime) and bool(getattr(runtime, "spans_batch_invariant", False)),
        speculative_auto=verify and bool(getattr(runtime, "speculative_auto", False)),
        kv_snapshots=supports_kv_snapshots(runtime),
        block_decoding=callable(getattr(runtime, "iter_blocks", None)),
        batch_invariant=bool(getattr(runtime, "batch_invariant", False)),
        pausable_steps=supports_decode_spans(runtime) and bool(getattr(runtime, "pausable_steps", False)),
    )


def supports_verify(runtime: object) -> bool:
    """True when `runtime` has a multi-token `verify` (speculative decoding can run on it)."""
    return callable(getattr(runtime, "verify", None))


def supports_decode_spans(runtime: object) -> bool:
    """True when `runtime` declares `decode_spans` (`SpanDecodeRuntime`)."""
    return callable(getattr(runtime, "decode_spans", None))


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


def import_cache_kv(cache: KVCache | None, row: int, snapshot: KVSnapshot, length: int, start: int = 0) -> None:
    """`import_kv` for a runtime whose cache is a `KVCache` (see `export_cache_kv`): positions start .. length - 1.

    Raises:
        SoloError: no cache, the row / length fall outside it, the snapshot is shorter than `length`, or
            `start` is outside [0, length].
    """
    _check_span(cache, row, length)
    if length > snapshot.length:
        raise SoloError(f"a KV snapshot of {snapshot.length} positions cannot fill {length}")
    if not 0 <= start <= length:
        raise SoloError(f"a KV import from position {start} to {length} is empty or reversed")
    for i, (k_layer, v_layer) in enumerate(zip(cache.k, cache.v, strict=True)):
        k_layer[row, :, start:length].copy_(snapshot.k[i, :, start:length])
        v_layer[row, :, start:length].copy_(snapshot.v[i, :, start:length])


def _check_span(cache: KVCache | None, row: int, length: int) -> None:
    if cache is None:
        raise SoloError("reserve() the KV cache before copying KV in or out")
    if not 0 <= row < cache.rows or not 0 <= length <= cache.max_seq:
        raise SoloError(f"row {row}, {length} positions fall outside the KV cache ({cache.rows} rows x "
                        f"{cache.max_seq} positions)")
