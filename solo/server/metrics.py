"""Prometheus metrics of one server (prefix `solo_`), in a registry of its own.

Each app gets its own `CollectorRegistry`, so several servers can run in one process (as the tests do)
without "duplicated timeseries" errors. Latencies follow the usual serving terms: TTFT (arrival to first
token, queueing included), ITL (inter-token latency, between consecutive tokens of one request) and
end-to-end latency (arrival to last token). KV-cache memory is reported in bytes: the static cache's
capacity, what running requests hold now (read when /metrics is scraped, nothing on the decode path), and
a histogram of what each request held when it finished.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from solo.engine.request import GenerationStats

_TTFT_BUCKETS_S = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5,
                   2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fine where a TTFT target lies
_ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
                  0.5, 1.0, 2.5)
_E2E_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)
_ACCEPTANCE_BUCKETS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)
_TOKENS_PER_S_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)
_KV_BYTES_BUCKETS = tuple(float(2**k) for k in range(12, 36, 2))  # 4 KiB .. 32 GiB

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""Content-Type of the Prometheus text exposition format."""


class ServerMetrics:
    """The server's metrics. Thread-safe: the scheduler thread and the event loop both update them.

    Attributes:
        registry: this server's own registry.
        requests: counter of HTTP requests by route and status code.
        ttft: histogram of time to first token, seconds.
        queue_time: histogram of the time from arrival until a request got a KV-cache slot, seconds.
        prefill_wait: histogram of the time from arrival until a request's first prefill chunk began,
            seconds (queue_time plus the wait for the scheduler step in progress and the prefills ahead).
            TTFT minus this is the request's own prefill.
        itl: histogram of inter-token latency, seconds (one sample per token after the first).
        e2e: histogram of end-to-end request latency, seconds.
        tokens_per_s: histogram of each request's decode speed after its first token, tokens/s.
        prompt_tokens, generation_tokens: counters of prompt and generated tokens.
        finished: counter of finished generations (one per choice) by finish reason.
        queue_depth: gauge of requests waiting for a KV-cache slot.
        active_slots: gauge of requests holding a KV-cache slot.
        kv_capacity: gauge of the KV cache's bytes (every slot, allocated at start-up).
        kv_used: gauge of the KV-cache bytes running requests hold (prompt + generated tokens).
        kv_usage: gauge of kv_used / kv_capacity.
        request_kv: histogram of the KV-cache bytes each request held when it finished.
        prefix_cache_queries, prefix_cache_hits, prefix_cache_tokens: counters of finished requests, of those
            that reused cached prompt tokens, and of the tokens reused.
        prefix_cache_stored, prefix_cache_capacity: gauges of the bytes the prefix cache's snapshot store
            holds now and of its bound (read at each scrape).
        The registry also holds prometheus_client's process collector (`process_resident_memory_bytes`,
        `process_open_fds`, ...: what a soak watches for drift).
        spec_verify_steps, spec_draft_tokens, spec_accepted_tokens: counters of speculative verify steps and
            of the draft tokens proposed and accepted in them.
        spec_acceptance_length: histogram of each request's mean tokens per verify step.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("solo_requests", "HTTP requests by route and status code",
                                ["route", "status"], registry=r)
        self.ttft = Histogram("solo_time_to_first_token_seconds", "Time from arrival to the first token",
                              buckets=_TTFT_BUCKETS_S, registry=r)
        self.queue_time = Histogram("solo_request_queue_time_seconds", "Time from arrival to a KV-cache slot",
                                    buckets=_TTFT_BUCKETS_S, registry=r)
        self.prefill_wait = Histogram("solo_request_prefill_wait_seconds",
                                      "Time from arrival to the start of the request's first prefill chunk",
                                      buckets=_TTFT_BUCKETS_S, registry=r)
        self.itl = Histogram("solo_inter_token_latency_seconds", "Time between consecutive tokens of a request",
                             buckets=_ITL_BUCKETS_S, registry=r)
        self.e2e = Histogram("solo_e2e_request_latency_seconds", "Time from arrival to the last token",
                             buckets=_E2E_BUCKETS_S, registry=r)
        self.tokens_per_s = Histogram("solo_request_decode_tokens_per_second",
                                      "Per-request decode speed after the first token",
                                      buckets=_TOKENS_PER_S_BUCKETS, registry=r)
        self.prompt_tokens = Counter("solo_prompt_tokens", "Prompt tokens of finished generations, one per choice "
                                     "(an n > 1 request counts its prompt n times), prefix-cache hits included",
                                     registry=r)
        self.generation_tokens = Counter("solo_generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter("solo_generations_finished", "Finished generations (one per choice)",
                                ["finish_reason"], registry=r)
        self.queue_depth = Gauge("solo_queue_depth", "Requests waiting for a KV-cache slot", registry=r)
        self.active_slots = Gauge("solo_active_slots", "Requests holding a KV-cache slot", registry=r)
        self.slots = Gauge("solo_slots", "KV-cache slots: requests generated together (--max-batch)", registry=r)
        self.kv_capacity = Gauge("solo_kv_cache_capacity_bytes", "KV-cache bytes allocated for every slot",
                                 registry=r)
        self.kv_used = Gauge("solo_kv_cache_used_bytes", "KV-cache bytes held by running requests", registry=r)
        self.kv_usage = Gauge("solo_kv_cache_usage_ratio", "KV-cache bytes held by running requests / capacity",
                              registry=r)
        self.request_kv = Histogram("solo_request_kv_cache_bytes",
                                    "KV-cache bytes a request held when it finished (prompt + generated tokens)",
                                    buckets=_KV_BYTES_BUCKETS, registry=r)
        self._kv_bytes_per_token = 0
        self.prefix_cache_queries = Counter("solo_prefix_cache_queries", "Generations (one per choice) looked up in "
                                            "the prefix cache", registry=r)
        self.prefix_cache_hits = Counter("solo_prefix_cache_hits", "Generations (one per choice) that reused cached "
                                         "prompt tokens", registry=r)
        self.prefix_cache_tokens = Counter("solo_prefix_cache_cached_tokens",
                                           "Prompt tokens whose KV came from the prefix cache (not prefilled)",
                                           registry=r)
        self.prefix_cache_stored = Gauge("solo_prefix_cache_stored_bytes",
                                         "Bytes held by the prefix cache's snapshot store", registry=r)
        self.prefix_cache_capacity = Gauge("solo_prefix_cache_capacity_bytes",
                                           "Bound of the prefix cache's snapshot store, bytes", registry=r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes & co. (Linux /proc; nothing elsewhere)
        self.spec_verify_steps = Counter("solo_spec_decode_verify_steps", "Speculative draft-and-verify steps",
                                         registry=r)
        self.spec_draft_tokens = Counter("solo_spec_decode_draft_tokens", "Speculative draft tokens proposed",
                                         registry=r)
        self.spec_accepted_tokens = Counter("solo_spec_decode_accepted_tokens", "Speculative draft tokens accepted",
                                            registry=r)
        self.spec_acceptance_length = Histogram(
            "solo_spec_decode_acceptance_length", "Per request: mean tokens emitted per speculative verify step",
            buckets=_ACCEPTANCE_BUCKETS, registry=r)

    def set_load(self, waiting: int, active: int) -> None:
        """Update the queue-depth and active-slots gauges."""
        self.queue_depth.set(waiting)
        self.active_slots.set(active)

    def watch_kv_cache(self, used_bytes: Callable[[], int], capacity_bytes: int, bytes_per_token: int) -> None:
        """Report the scheduler's KV cache: `used_bytes()` is called at each scrape.

        Args:
            used_bytes: bytes running requests hold now.
            capacity_bytes: bytes of every slot together.
            bytes_per_token: KV bytes of one token (for the per-request histogram).
        """
        self._kv_bytes_per_token = bytes_per_token
        self.kv_capacity.set(capacity_bytes)
        self.kv_used.set_function(lambda: float(used_bytes()))
        self.kv_usage.set_function(lambda: used_bytes() / capacity_bytes if capacity_bytes else 0.0)

    def watch_prefix_cache(self, stored_bytes: Callable[[], int], capacity_bytes: int) -> None:
        """Report the prefix cache's snapshot store: `stored_bytes()` is called at each scrape.

        Args:
            stored_bytes: bytes the store holds now.
            capacity_bytes: its bound.
        """
        self.prefix_cache_capacity.set(capacity_bytes)
        self.prefix_cache_stored.set_function(lambda: float(stored_bytes()))

    def observe_finished(self, stats: GenerationStats, finish_reason: str) -> None:
        """Record one finished (or aborted) generation.

        Args:
            stats: its timings and counts (total_s set).
            finish_reason: "stop", "length", "abort", ...
        """
        self.finished.labels(finish_reason).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generation_tokens.inc(stats.completion_tokens)
        if stats.ttft_s is not None:
            self.ttft.observe(stats.ttft_s)
        if stats.queue_s is not None:
            self.queue_time.observe(stats.queue_s)
        if stats.prefill_start_s is not None:
            self.prefill_wait.observe(stats.prefill_start_s)
        for gap in stats.token_times_s[1:]:
            self.itl.observe(gap)
        self.e2e.observe(stats.total_s)
        if self._kv_bytes_per_token:
            self.request_kv.observe((stats.prompt_tokens + stats.completion_tokens) * self._kv_bytes_per_token)
        tps = stats.decode_tokens_per_s
        if tps is not None:
            self.tokens_per_s.observe(tps)
        self.prefix_cache_queries.inc()
        if stats.cached_tokens:
            self.prefix_cache_hits.inc()
            self.prefix_cache_tokens.inc(stats.cached_tokens)
        if stats.verify_steps:
            self.spec_verify_steps.inc(stats.verify_steps)
            self.spec_draft_tokens.inc(stats.draft_tokens)
            self.spec_accepted_tokens.inc(stats.accepted_tokens)
            self.spec_acceptance_length.observe(stats.acceptance_length)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
