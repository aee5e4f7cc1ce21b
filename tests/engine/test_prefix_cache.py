"""Prefix caching in the engine: reuse across calls, identical greedy output, the bounded snapshot store."""

from __future__ import annotations

import pytest
import torch

from solo.engine.engine import Engine
from solo.engine.prefix_cache import PrefixCache, common_prefix_length
from solo.engine.sampling import SamplingParams
from solo.runtime.eager import EagerRuntime

TURN = "def fibonacci(n):\n    if n < 2:\n        return n\n"
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)


def _turns(engine: Engine, prompts: list[str]) -> list:
    return [engine.complete(p, GREEDY) for p in prompts]


@pytest.mark.parametrize(("backend", "span"), [("eager", None), ("cpu", None), ("cpu", 0), ("cpu", 8), ("cpu", 64)])
def test_greedy_output_and_logprobs_identical_with_and_without_the_cache(tiny_llama, backend, span):
    cold = Engine.load(tiny_llama, dtype="float32", backend=backend, prefix_cache_gb=None, speculative="off")
    warm = Engine.load(tiny_llama, dtype="float32", backend=backend, speculative="off")
    assert warm.prefix_cache is not None and cold.prefix_cache is None
    if span is not None:  # CPU tails up to `span` tokens go through the decode kernel, longer ones matmuls
        warm.runtime.span_prefill_tokens = span
        warm.runtime.span_prefill_positions = 0  # (None: short prompts take the decode kernel, cold or not)
    first = cold.complete(TURN, GREEDY)
    # An agent's next turn: the previous prompt, the answer, a tool result; then an unrelated prompt,
    # then the first conversation again (its KV comes back from the snapshot store).
    second = TURN + first.text + "\nprint(fibonacci(10))\n"
    prompts = [TURN, second, "import os\nimport sys\n", second + "# done\n"]
    expected, got = _turns(cold, prompts), _turns(warm, prompts)
    for e, g in zip(expected, got, strict=True):
        assert g.token_ids == e.token_ids
        assert e.stats.cached_tokens == 0
        for le, lg in zip(e.logprobs, g.logprobs, strict=True):
            assert abs(le.logprob - lg.logprob) < 1e-4
    def held(r):  # what a finished request leaves in its row: prompt + output but the last token
        return r.prompt_token_ids + r.token_ids[:-1]

    # Token ids, not text, are matched: re-encoding prompt + answer can merge tokens across the seam.
    assert got[0].stats.cached_tokens == 0
    assert got[1].stats.cached_tokens == common_prefix_length(held(got[0]), got[1].prompt_token_ids) > 10
    assert got[3].stats.cached_tokens == common_prefix_length(held(got[1]), got[3].prompt_token_ids) > 20
    stats = warm.prefix_cache.stats
    assert stats.queries == 4 and stats.hits >= 2 and warm.prefix_cache.stored_sequences >= 1


def test_the_last_prompt_token_is_always_recomputed(tiny_llama):
    engine = Engine.load(tiny_llama, dtype="float32", backend="eager", speculative="off")
    a = engine.complete(TURN, GREEDY)
    b = engine.complete(TURN, GREEDY)  # the same prompt again: all but its last token reused
    assert b.stats.cached_tokens == len(a.prompt_token_ids) - 1
    assert b.token_ids == a.token_ids


def test_the_store_stays_under_its_bound_and_evicts_least_recently_used(tiny_llama):
    engine = Engine.load(tiny_llama, dtype="float32", backend="eager", prefix_cache_gb=None, speculative="off")
    runtime = engine.runtime
    assert isinstance(runtime, EagerRuntime)
    runtime.reserve(1, 64)
    per_token = 2 * engine.config.num_layers * engine.config.num_kv_heads * engine.config.head_dim * 4
    cache = PrefixCache(runtime, capacity_bytes=per_token * 25)
    sequences = [[1, 10 + i, 20 + i, 30, 40, 50, 60, 70, 80, 90] for i in range(4)]
    for ids in sequences:
        assert cache.load(0, ids + [3]) in (0, 1)
        runtime.prefill(0, torch.tensor(ids + [3]))
        cache.finish(0, ids)
    # Each later prompt overwrote the row, so earlier ones went to the store; two fit in 25 tokens.
    assert cache.stats.stored_bytes <= cache.capacity_bytes
    assert cache.stored_sequences == 2 and cache.stats.evictions >= 1
    assert cache.load(0, sequences[0] + [4]) == 1  # evicted: only the shared first token is reused in-row
    assert cache.load(0, sequences[2] + [4]) == len(sequences[2])  # still stored: copied back in


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([7], [8]) == 0


def test_bad_bound_is_a_clear_error(tiny_llama):
    from solo.errors import SoloError

    with pytest.raises(SoloError, match="prefix-cache-gb"):
        Engine.load(tiny_llama, prefix_cache_gb=-1)


def test_a_row_that_loses_only_a_few_tokens_is_not_copied_to_the_store(tiny_llama):
    engine = Engine.load(tiny_llama, dtype="float32", backend="eager", prefix_cache_gb=None, speculative="off")
    runtime = engine.runtime
    runtime.reserve(1, 128)
    cache = PrefixCache(runtime, capacity_bytes=10**8)
    first = list(range(3, 3 + 40))

    def run(ids):
        cached = cache.load(0, ids)
        runtime.prefill(0, torch.tensor(ids[cached:]), cached)
        cache.finish(0, ids)
        return cached

    assert run(first) == 0
    # The next turn keeps all but the last 2 tokens: the row keeps the prefix, nothing is copied out.
    assert run(first[:-2] + [90, 91, 92]) == len(first) - 2
    assert cache.stored_sequences == 0
    # An unrelated prompt overwrites (almost) everything: the row goes to the store first...
    assert run([99, 98, 97]) == 0
    assert cache.stored_sequences == 1
    # ... and comes back from it.
    assert run(first[:-2] + [90, 91, 92, 93]) == len(first) + 1


def _pooled(tiny_llama, rows: int = 1, max_seq: int = 64, tokens: int = 40):
    engine = Engine.load(tiny_llama, dtype="float32", backend="eager", prefix_cache_gb=None, speculative="off")
    runtime = engine.runtime
    runtime.reserve(rows, max_seq)
    per_token = 2 * engine.config.num_layers * engine.config.num_kv_heads * engine.config.head_dim * 4
    cache = PrefixCache(runtime, capacity_bytes=per_token * tokens)
    assert cache.allocate_store() == per_token * tokens and cache.preallocated
    return runtime, cache


def test_a_preallocated_store_never_allocates_again_and_keeps_its_bound(tiny_llama):
    # The server's store (allocate_store): one pool for the whole bound, so resident memory cannot grow as
    # snapshots of every size are saved and evicted (a 10-minute soak grew +71% before).
    runtime, cache = _pooled(tiny_llama, tokens=40)
    pool = cache._pool
    pointers = (pool.k.data_ptr(), pool.v.data_ptr())
    rng = torch.Generator().manual_seed(0)
    exported = {}
    for i in range(60):
        n = int(torch.randint(3, 30, (1,), generator=rng))
        ids = [100 + i] + torch.randint(4, 200, (n,), generator=rng).tolist()
        cached = cache.load(0, ids)
        runtime.prefill(0, torch.tensor(ids[cached:]), cached)
        cache.finish(0, ids)
        exported[tuple(ids)] = runtime.export_kv(0, len(ids))
        assert cache.stats.stored_bytes <= cache.capacity_bytes
        used = sum(e.slots.numel() for e in cache._store.values())
        assert used + len(pool.free) == pool.tokens  # every slot is either held by one entry or free
        assert used * pool.token_bytes == cache.stats.stored_bytes
    assert (pool.k.data_ptr(), pool.v.data_ptr()) == pointers and cache.stats.evictions > 10
    # Every stored sequence comes back bit for bit (from its own slots, after many reuses of the pool).
    for entry in list(cache._store.values()):
        ids = entry.ids
        runtime.prefill(0, torch.tensor([7, 8, 9]))  # overwrite the row's start
        cache.forget(0)
        assert cache.load(0, ids + [3]) == len(ids)
        got, want = runtime.export_kv(0, len(ids)), exported[tuple(ids)]
        assert torch.equal(got.k, want.k) and torch.equal(got.v, want.v)


def test_the_entry_being_read_is_not_evicted_to_make_room_for_the_row_it_replaces(tiny_llama):
    # Room for one 20-token sequence: loading stored sequence A into a row that holds B saves B first; B
    # must not take A's slots before A is copied in.
    runtime, cache = _pooled(tiny_llama, tokens=24)
    a = list(range(10, 30))
    b = list(range(50, 70))
    for ids in (a, b):  # a is stored when b overwrites the row
        cached = cache.load(0, ids)
        runtime.prefill(0, torch.tensor(ids[cached:]), cached)
        cache.finish(0, ids)
        if ids is a:
            want = runtime.export_kv(0, len(a))
    assert cache.stored_sequences == 1
    assert cache.load(0, a + [5]) == len(a)
    got = runtime.export_kv(0, len(a))
    assert torch.equal(got.k, want.k) and torch.equal(got.v, want.v)


def test_pooled_and_unpooled_stores_reuse_the_same_tokens(tiny_llama):
    runtime_a, pooled = _pooled(tiny_llama, tokens=50)
    engine = Engine.load(tiny_llama, dtype="float32", backend="eager", prefix_cache_gb=None, speculative="off")
    runtime_b = engine.runtime
    runtime_b.reserve(1, 64)
    plain = PrefixCache(runtime_b, capacity_bytes=pooled.capacity_bytes)
    rng = torch.Generator().manual_seed(1)
    bases = [torch.randint(4, 200, (12,), generator=rng).tolist() for _ in range(3)]
    for i in range(30):
        ids = bases[i % 3] + torch.randint(4, 200, (int(torch.randint(2, 20, (1,), generator=rng)),),
                                           generator=rng).tolist()
        got = []
        for runtime, cache in ((runtime_a, pooled), (runtime_b, plain)):
            cached = cache.load(0, ids)
            runtime.prefill(0, torch.tensor(ids[cached:]), cached)
            cache.finish(0, ids)
            got.append(cached)
        assert got[0] == got[1]
    assert pooled.stats.stored_bytes == plain.stats.stored_bytes


class _TokenRows:
    """A runtime stand-in whose KV "cache" holds each position's token id (one layer, head and channel)."""

    def __init__(self, rows: int, max_seq: int) -> None:
        self.kv = torch.full((rows, max_seq), -1.0)

    def export_kv(self, row, length):
        from solo.runtime.base import KVSnapshot

        held = self.kv[row, :length].reshape(1, 1, length, 1).clone()
        return KVSnapshot(held, held.clone(), length)

    def import_kv(self, row, snapshot, length, start=0):
        self.kv[row, start:length] = snapshot.k[0, 0, start:length, 0]


@pytest.mark.parametrize("pooled", [False, True])
def test_store_lookups_find_the_longest_match_among_many_entries(pooled):
    # The store's sorted index against brute force over its entries: random prompts over a 2-token
    # alphabet (many shared prefixes), rows reused at random, a bound that evicts.
    rng = torch.Generator().manual_seed(0)
    runtime = _TokenRows(rows=4, max_seq=40)
    cache = PrefixCache(runtime, capacity_bytes=8 * 300)
    if pooled:
        cache.allocate_store()
    for _ in range(1500):
        row = int(torch.randint(4, (1,), generator=rng))
        prompt = torch.randint(2, (int(torch.randint(2, 24, (1,), generator=rng)),), generator=rng).tolist()
        held = cache._rows.get(row)
        best = max([common_prefix_length(e.ids, prompt) for e in cache._store.values()] +
                   [common_prefix_length(held, prompt) if held else 0])
        cached = cache.load(row, prompt)
        assert cached == min(best, len(prompt) - 1)
        assert runtime.kv[row, :cached].tolist() == prompt[:cached]  # the reused KV is this prompt's
        runtime.kv[row, cached:len(prompt)] = torch.tensor(prompt[cached:], dtype=torch.float32)  # "prefill"
        cache.finish(row, prompt)
        entries = [(e.ids, k) for k, e in cache._store.items()]
        assert cache._index == sorted(entries)
        assert not any(a != b and b[:len(a)] == a for a, _ in entries for b, _ in entries)  # no entry covers another
    assert cache.stats.evictions > 0 and len(cache._store) > 10


def test_common_prefix_length_matches_a_plain_loop():
    rng = torch.Generator().manual_seed(1)
    for _ in range(300):
        a = torch.randint(2, (int(torch.randint(0, 70, (1,), generator=rng)),), generator=rng).tolist()
        b = a[:int(torch.randint(0, 70, (1,), generator=rng))] + torch.randint(2, (5,), generator=rng).tolist()
        expected = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert common_prefix_length(a, b) == expected
        assert common_prefix_length(tuple(a), b) == expected

