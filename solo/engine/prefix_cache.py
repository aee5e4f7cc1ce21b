"""Prefix caching: reuse the KV cache of earlier requests whose token ids start the same way.

An agent sends the model one prompt after another, each the previous one plus an answer and a tool
result. Recomputing the shared beginning every time is what prefix caching avoids (vLLM's automatic
prefix caching, SGLang's RadixAttention). Here, matching is on token ids, longest common prefix (LCP),
at token granularity, in two places:

- In the row: a KV-cache row keeps the KV of its last sequence after the request ends. A new request
  placed in that row reuses the LCP of its prompt with the row's tokens at no cost (no copy). For
  `Engine.complete` in a loop (one row), every turn that extends the previous one hits here.
- In a store: a bounded LRU of snapshots (`KVSnapshot`, every layer, sliding-window layers included, as
  the static cache keeps whole sequences) of rows that were about to be overwritten by an unrelated
  prompt (unless it keeps all but a few of their tokens: `MIN_SAVED_TAIL`), or dropped by a cache
  reallocation. A request whose best match is there gets it copied in, from the first position its row
  does not already hold.

Memory. By default each snapshot is its own tensor, allocated when a row is saved and freed when it is
evicted: the store's memory grows with traffic up to its bound (fine for `solo run`, where it rarely
fills). A server calls `allocate_store()` once at start-up instead: the whole bound becomes one token
pool ([tokens, layers, kv_heads, head_dim] for keys and values, written once so its pages are resident),
and a snapshot takes free token slots of it. Then the store's memory is decided at start-up like the
static KV cache: resident memory does not grow as the store fills (a 10-minute soak's +71% RSS was the
lazy store filling towards its bound), and evictions and saves of every size reuse the same slots instead
of going through the allocator (no heap holes left by long-lived buffers of varying sizes).

The last prompt token is always recomputed (its logits choose the first new token), so at most
len(prompt) - 1 tokens are reused. What a row holds after a request: the prompt and every generated
token but the last (the last one is never fed back to the model).

Exactness. Prefill of the tail after a cached prefix attends over the same keys and values a whole
prefill would have written, so on runtimes whose prefill is exact at any start position the logits
agree within the runtime's own rounding noise (tests compare greedy tokens and logits). The cached KV of
generated tokens comes from decode steps, not from a prefill, so it differs from a cold prefill of the
same text by rounding only. The native CPU runtime has no such difference within its
`span_prefill_positions`: every prefill there runs through the decode kernel, the same bits for any split.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from solo.runtime.base import DecodeRuntime, KVSnapshot, supports_kv_snapshots

DEFAULT_PREFIX_CACHE_GB = 1.0
"""Default bound of the snapshot store (`--prefix-cache-gb`); rows reuse their own KV at no extra memory."""

MIN_SAVED_TAIL = 16
"""A row's sequence goes to the store when a new prompt would overwrite at least this many of its tokens
(or more than it keeps). The next turn of a conversation usually differs from what its row holds only in
the last few tokens
(the answer's final token is never fed back; re-encoding answer + tool text can merge tokens across
the seam); copying the whole row out for those would cost a copy of the whole KV every turn to keep
a handful of tokens (vLLM's block size is 16: a paged cache would not keep them either)."""


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token-id sequences.

    Slice comparisons (C speed) with a binary search for the first mismatch: O(n) element comparisons
    and O(log n) Python steps, for the scheduler's lookups on every request.
    """
    a = a if isinstance(a, list) else list(a)
    b = b if isinstance(b, list) else list(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class _Entry:
    ids: list[int]
    snapshot: KVSnapshot | None  # its own tensors (no pool), or None: its KV lies in the pool's `slots`
    nbytes: int
    slots: torch.Tensor | None = None  # int64 [len(ids)]: token slots of the pool, position order


class _TokenPool:
    """Preallocated KV of `tokens` token slots (see the module docstring, "Memory").

    Args:
        template: a snapshot of one position; its tensors give the layout (position on dim 2), dtype, device.
        tokens: slots.
    """

    def __init__(self, template: KVSnapshot, tokens: int) -> None:
        def pool(t: torch.Tensor) -> torch.Tensor:
            shape = (tokens, *t.shape[:2], *t.shape[3:])
            return torch.zeros(shape, dtype=t.dtype, device=t.device)  # zeros: written, so resident from now

        self.k, self.v = pool(template.k), pool(template.v)
        self.tokens = tokens
        self.token_bytes = (self.k[0].numel() * self.k.element_size() + self.v[0].numel() * self.v.element_size())
        self.free = list(range(tokens - 1, -1, -1))  # pop() hands out low slots first

    def take(self, n: int) -> torch.Tensor:
        taken = self.free[-n:] if n else []
        del self.free[len(self.free) - n:]
        return torch.tensor(taken[::-1], dtype=torch.long)

    def give_back(self, slots: torch.Tensor) -> None:
        self.free.extend(slots.tolist()[::-1])

    def write(self, slots: torch.Tensor, snapshot: KVSnapshot) -> None:
        # [A, B, n, D] (position on dim 2) -> slot-major [n, A, B, D]
        n = slots.numel()
        self.k.index_copy_(0, slots.to(self.k.device), snapshot.k[:, :, :n].movedim(2, 0))
        self.v.index_copy_(0, slots.to(self.v.device), snapshot.v[:, :, :n].movedim(2, 0))

    def read(self, slots: torch.Tensor) -> KVSnapshot:
        # The slots' KV as a snapshot (positions 0 .. n - 1); a transient copy, freed after the import.
        k = self.k.index_select(0, slots.to(self.k.device)).movedim(0, 2)
        v = self.v.index_select(0, slots.to(self.v.device)).movedim(0, 2)
        return KVSnapshot(k, v, slots.numel())


@dataclass
class PrefixCacheStats:
    """Counters since start.

    Attributes:
        queries: requests looked up.
        hits: requests that reused at least one token.
        cached_tokens: prompt tokens reused (not prefilled).
        prompt_tokens: prompt tokens of every request looked up.
        stored_bytes: bytes held by the snapshot store now (with a pool: its slots in use).
        evictions: snapshots dropped to stay under the bound.
    """

    queries: int = 0
    hits: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    stored_bytes: int = 0
    evictions: int = 0


class PrefixCache:
    """Which tokens each KV-cache row holds, plus a bounded LRU store of row snapshots (module docstring).

    Use from one thread at a time (the engine's lock or the scheduler's thread); `stats` may be read anywhere.

    Args:
        runtime: the decode runtime; the store needs `export_kv` / `import_kv` (else only in-row reuse).
        capacity_bytes: bound of the snapshot store in bytes (0: in-row reuse only).

    Raises:
        ValueError: a negative capacity.
    """

    def __init__(self, runtime: DecodeRuntime, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"the prefix cache bound must be >= 0 bytes, got {capacity_bytes}")
        self.runtime = runtime
        self.capacity_bytes = capacity_bytes if supports_kv_snapshots(runtime) else 0
        self.stats = PrefixCacheStats()
        self._rows: dict[int, list[int]] = {}
        self._used: dict[int, int] = {}  # row -> when it last finished, for least-recently-used reuse
        self._tick = 0
        self._store: OrderedDict[int, _Entry] = OrderedDict()
        # (ids, key) of every stored entry in lexicographic order of ids: the entry sharing the longest
        # prefix with a prompt is next to the prompt's place in it, so a lookup is O(log n) comparisons
        # instead of one per entry (a store of thousands of snapshots cost the scheduler ~30% of its time).
        self._index: list[tuple[list[int], int]] = []
        self._next_key = 0
        self._lock = threading.Lock()
        self._pool: _TokenPool | None = None

    def allocate_store(self, capacity_bytes: int | None = None) -> int:
        """Preallocate the snapshot store as one token pool of (at most) `capacity_bytes` (module docstring).

        Call once the runtime's cache is reserved (the pool's layout is read from a one-position export of
        row 0). Snapshots stored until now are dropped. With a bound of 0, or a runtime without snapshots,
        nothing is allocated.

        Args:
            capacity_bytes: the new bound (default: the current one); rounded down to whole tokens.

        Returns:
            Bytes allocated.

        Raises:
            ValueError: a negative bound.
        """
        if capacity_bytes is not None:
            if capacity_bytes < 0:
                raise ValueError(f"the prefix cache bound must be >= 0 bytes, got {capacity_bytes}")
            self.capacity_bytes = capacity_bytes if supports_kv_snapshots(self.runtime) else 0
        with self._lock:
            self._store.clear()
            self._index.clear()
            self.stats.stored_bytes = 0
            self._pool = None
        if self.capacity_bytes <= 0:
            return 0
        template = self.runtime.export_kv(0, 1)
        tokens = self.capacity_bytes // template.nbytes
        if tokens <= 0:
            self.capacity_bytes = 0
            return 0
        pool = _TokenPool(template, tokens)
        self._pool = pool
        self.capacity_bytes = tokens * pool.token_bytes
        return self.capacity_bytes

    @property
    def preallocated(self) -> bool:
        """True when the store is a preallocated token pool (`allocate_store`)."""
        return self._pool is not None

    # ------------------------------------------------------------------------------------------ rows

    def reserve(self, rows: int, max_seq: int) -> None:
        """`runtime.reserve`, saving the rows' contents to the store first when the cache will be reallocated."""
        runtime = self.runtime
        if runtime.rows >= rows and runtime.max_seq >= max_seq:
            runtime.reserve(rows, max_seq)
            return
        for row in list(self._rows):
            self._save_row(row)
        self._rows.clear()
        runtime.reserve(rows, max_seq)

    def pick_row(self, free_rows: Sequence[int], prompt_ids: Sequence[int]) -> int:
        """The free row whose tokens share the longest prefix with the prompt (an empty row on ties).

        Args:
            free_rows: candidate rows (non-empty).
            prompt_ids: the prompt's token ids.
        """
        best, best_key = free_rows[-1], (-1, 0, 0)
        for row in free_rows:
            held = self._rows.get(row)
            lcp = 0 if held is None else common_prefix_length(held, prompt_ids)
            # A match first, then a row holding nothing, then the row used longest ago.
            key = (lcp, 1 if held is None else 0, -self._used.get(row, 0))
            if key > best_key:
                best, best_key = row, key
        return best

    def load(self, row: int, prompt_ids: Sequence[int]) -> int:
        """Prepare `row` for a prompt: how many of its first tokens already have their KV there.

        Reuses the row's own tokens or copies the best snapshot in, whichever shares more; saves the row's
        previous sequence to the store when the prompt would overwrite part of it.

        Args:
            row: the cache row the request will run in.
            prompt_ids: the prompt's token ids.

        Returns:
            Tokens to skip: prefill starts at this position (at most len(prompt_ids) - 1).
        """
        limit = len(prompt_ids) - 1
        held = self._rows.pop(row, None)
        in_row = min(common_prefix_length(held, prompt_ids), limit) if held else 0
        key, entry, stored = self._best_entry(prompt_ids, limit)
        lost = 0 if held is None else len(held) - in_row  # held tokens the prompt will overwrite
        if lost >= MIN_SAVED_TAIL or (lost > 0 and lost >= in_row):
            # The prompt overwrites part of it: keep a copy (never by evicting the entry about to be read).
            self._save(held, row, protect=key if entry is not None and stored > in_row else None)
        cached = in_row
        if entry is not None and stored > in_row:
            # Positions the row already holds for this prompt stay; only the rest is copied in.
            snapshot = entry.snapshot if entry.snapshot is not None else self._pool.read(entry.slots[:stored])
            self.runtime.import_kv(row, snapshot, stored, start=in_row)
            cached = stored
            with self._lock:
                if key in self._store:
                    self._store.move_to_end(key)  # used: most recent in the LRU order
        with self._lock:
            self.stats.queries += 1
            self.stats.prompt_tokens += len(prompt_ids)
            if cached:
                self.stats.hits += 1
                self.stats.cached_tokens += cached
        return cached

    def finish(self, row: int, ids: Sequence[int]) -> None:
        """Record that `row` now holds the KV of `ids` (positions 0 .. len(ids) - 1)."""
        self._rows[row] = list(ids)
        self._tick += 1
        self._used[row] = self._tick

    def forget(self, row: int | None = None) -> None:
        """The row's KV is unknown (an error mid-step, or another user of the row); None: every row."""
        if row is None:
            self._rows.clear()
        else:
            self._rows.pop(row, None)

    def clear(self) -> None:
        """Drop every row record and every snapshot (a preallocated pool stays allocated, all slots free)."""
        self._rows.clear()
        with self._lock:
            for entry in self._store.values():
                self._release(entry)
            self._store.clear()
            self._index.clear()
            self.stats.stored_bytes = 0

    # ----------------------------------------------------------------------------------------- store

    def _best_entry(self, prompt_ids: Sequence[int], limit: int) -> tuple[int | None, _Entry | None, int]:
        # The longest common prefix of a prompt with any sorted entry is with its neighbour on one side.
        prompt = list(prompt_ids)
        best_key, best, best_len = None, None, 0
        with self._lock:
            i = bisect.bisect_left(self._index, (prompt,))
            for ids, key in self._index[max(0, i - 1):i + 1]:
                n = min(common_prefix_length(ids, prompt), limit)
                if n > best_len:
                    best_key, best, best_len = key, self._store[key], n
        return best_key, best, best_len

    def _covering(self, ids: list[int]) -> int | None:
        # The key of an entry that starts with `ids` (or equals it), else None (call with the lock held).
        i = bisect.bisect_left(self._index, (ids,))
        if i < len(self._index) and self._index[i][0][:len(ids)] == ids:
            return self._index[i][1]
        return None

    def _prefixes(self, ids: list[int]) -> list[int]:
        # Keys of the entries that are prefixes of `ids` (call with the lock held). The last entry sorting
        # at or before ids[:bound] is either such a prefix (then the next one is shorter) or shares fewer
        # than `bound` tokens with it (then no prefix is longer than what it shares).
        keys, bound = [], len(ids)
        while bound > 0:
            j = bisect.bisect_right(self._index, (ids[:bound], math.inf)) - 1
            if j < 0:
                break
            entry_ids, key = self._index[j]
            shared = common_prefix_length(entry_ids, ids[:bound])
            if shared == len(entry_ids):
                keys.append(key)
                bound = shared - 1
            else:
                bound = shared
        return keys

    def _save_row(self, row: int) -> None:
        held = self._rows.get(row)
        if held:
            self._save(held, row)

    def _save(self, ids: list[int], row: int, protect: int | None = None) -> None:
        if self.capacity_bytes <= 0 or not ids:
            return
        ids = list(ids)
        with self._lock:
            key = self._covering(ids)
            if key is not None:  # already covered by a longer (or equal) entry
                self._store.move_to_end(key)
                return
        pool = self._pool
        nbytes = len(ids) * pool.token_bytes if pool is not None else None
        if nbytes is not None and nbytes > self.capacity_bytes:
            return
        snapshot = self.runtime.export_kv(row, len(ids))
        if nbytes is None:
            nbytes = snapshot.nbytes
            if nbytes > self.capacity_bytes:
                return
        with self._lock:
            for key in self._prefixes(ids):  # the new one supersedes them
                self._drop(key)
            victims = iter([key for key in self._store if key != protect])  # least recently used first
            while self.stats.stored_bytes + nbytes > self.capacity_bytes:
                key = next(victims, None)
                if key is None:
                    return
                self._drop(key)
                self.stats.evictions += 1
            if pool is None:
                entry = _Entry(ids, snapshot, nbytes)
            else:  # the row's KV goes into free slots of the pool; the exported copy is freed at once
                entry = _Entry(ids, None, nbytes, pool.take(len(ids)))
                pool.write(entry.slots, snapshot)
            del snapshot
            self._store[self._next_key] = entry
            bisect.insort(self._index, (entry.ids, self._next_key))
            self._next_key += 1
            self.stats.stored_bytes += nbytes

    def _drop(self, key: int) -> None:
        # Call with the lock held.
        entry = self._store.pop(key)
        del self._index[bisect.bisect_left(self._index, (entry.ids, key))]
        self.stats.stored_bytes -= entry.nbytes
        self._release(entry)

    def _release(self, entry: _Entry) -> None:
        if entry.slots is not None and self._pool is not None:
            self._pool.give_back(entry.slots)
            entry.slots = None
        entry.snapshot = None

    @property
    def stored_sequences(self) -> int:
        """Snapshots in the store."""
        with self._lock:
            return len(self._store)
