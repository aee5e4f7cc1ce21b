"""A load run: start (or reach) a loopback server, build prompts, measure capacity, run phases, check outputs.

Order of a run:
1. The server: `solo serve MODEL` started on a free loopback port (or `--url`, which must be loopback).
2. Prompts: each class's pool, cut from Solo's own source code to token lengths measured by the server's
   /tokenize (exact, template included), so near-context-limit prompts are exactly near the limit.
3. Idle baseline: one request of every class alone (TTFT of an idle server, the reference for "within
   3x of idle").
4. Capacity (only when a rate is given as "<k>x"): as many closed-loop clients as the server has slots
   (its `solo_slots` metric, or `--max-batch`) sending the workload's requests back to back for a short
   while; capacity = completed requests/s.
5. One phase per rate: open-loop arrivals (Poisson + bursts) sent on schedule whatever the server does;
   server RSS sampled every second.
6. References: every distinct greedy request that completed under load is sent again alone; its text
   must be identical ("wrong output" otherwise).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from solo.bench.load.client import Outcome, request_body, send
from solo.bench.load.workload import (
    MAX_REQUESTS,
    PlannedRequest,
    RequestClass,
    Workload,
    plan_phase,
    prompt_lengths,
)
from solo.errors import SoloError

MAX_IN_FLIGHT = 512
"""Requests the generator keeps open at once; beyond it an arrival is counted as "client saturated"."""


_HEADERS: dict[str, str] = {}
"""Headers of every request to the server (its API key, `use_api_key`)."""


def use_api_key(key: str | None) -> None:
    """Send `Authorization: Bearer <key>` with every request to the server from now on (None: no key)."""
    _HEADERS.clear()
    if key:
        _HEADERS["Authorization"] = f"Bearer {key}"


def _async_client(base_url: str, timeout_s: float, **options: Any) -> httpx.AsyncClient:  # noqa: ANN401
    # A client of the server: its base URL, the request deadline, the API key's header.
    return httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout_s), headers=_HEADERS, **options)


def check_loopback(url: str) -> str:
    """The server's base URL, if its host is a loopback address.

    The URL loses a trailing slash and a trailing /v1 (the OpenAI clients' base URL is taken too).

    Raises:
        SoloError: another host (the load generator only targets this machine).
    """
    parsed = urlparse(url)
    host = parsed.hostname or ""
    if parsed.scheme not in ("http", "https") or not host:
        raise SoloError(f"--url {url}: give http://127.0.0.1:PORT")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        raise SoloError(f"--url {url}: cannot resolve {host!r}") from None
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise SoloError(f"--url {url}: the load generator only targets loopback addresses (127.0.0.1, ::1, localhost)")
    url = url.rstrip("/")
    return url.removesuffix("/v1") if parsed.path.rstrip("/").endswith("/v1") else url


def server_slots(base_url: str) -> int | None:
    """The server's KV-cache slots from its /metrics (`solo_slots`), or None when it does not report them."""
    try:
        text = httpx.get(f"{base_url}/metrics", timeout=30, headers=_HEADERS).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("solo_slots "):
            value = float(line.split()[1])
            return int(value) if value >= 1 else None
    return None


SERVER_HISTOGRAMS = {"queue": "solo_request_queue_time_seconds", "prefill_wait": "solo_request_prefill_wait_seconds",
                     "ttft": "solo_time_to_first_token_seconds"}
"""The server's per-request latency histograms a phase reports (where TTFT goes, server side)."""


def server_histograms(base_url: str) -> dict[str, list[tuple[float, float]]]:
    """The cumulative buckets [(upper bound s, count)] of `SERVER_HISTOGRAMS` from /metrics ({} when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"{base_url}/metrics", timeout=30, headers=_HEADERS).text
    except httpx.HTTPError:
        return {}
    wanted = {v: k for k, v in SERVER_HISTOGRAMS.items()}
    out: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        key = wanted.get(family.name)
        if key is None:
            continue
        out[key] = [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
    return out


def histogram_quantiles(before: dict, after: dict) -> dict[str, dict[str, float | None]]:
    """p50/p90/p99 (seconds, the bucket's upper bound) of each histogram's counts between two scrapes."""
    out: dict[str, dict[str, float | None]] = {}
    for key, buckets in after.items():
        prior = dict(before.get(key, []))
        counts = [(le, n - prior.get(le, 0.0)) for le, n in buckets]
        total = counts[-1][1] if counts else 0.0
        out[key] = {f"p{int(q * 100)}": next((le for le, n in counts if n >= q * total), None) if total else None
                    for q in (0.5, 0.9, 0.99)}
        out[key]["count"] = total
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerProcess:
    """A `solo serve` subprocess started for the run."""

    process: subprocess.Popen
    base_url: str
    log_path: Path

    def rss_bytes(self) -> int | None:
        """Resident memory of the server process, bytes (None without /proc)."""
        return process_rss_bytes(self.process.pid)

    def stop(self, timeout_s: float = 60) -> int | None:
        """SIGTERM, wait, SIGKILL if it hangs; returns the exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


def process_rss_bytes(pid: int) -> int | None:
    """VmRSS of a process from /proc, bytes, or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def start_server(model: str | None, serve_args: list[str], timeout_s: float = 300) -> ServerProcess:
    """Start `solo serve` on a free loopback port and wait for /health.

    Raises:
        SoloError: the server exited or did not become ready (its log's path is in the message).
    """
    port = free_port()
    command = [sys.executable, "-m", "solo.cli", "serve", *([model] if model else []), "--host", "127.0.0.1",
               "--port", str(port), *serve_args]
    # A new file of this process's own (a predictable name in the shared temp folder could be another user's link).
    log = tempfile.NamedTemporaryFile("w", prefix=f"solo-bench-load-{port}-", suffix=".log", delete=False)  # noqa: SIM115
    log_path = Path(log.name)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    server = ServerProcess(process, base, log_path)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log.flush()
                lines = log_path.read_text(errors="replace").splitlines()
                said = [line for line in lines if line.startswith("solo: error:")]
                why = f": {said[-1].removeprefix('solo: error:').strip()}" if said else f"; see {log_path}"
                raise SoloError(f"solo serve exited with status {process.returncode}{why}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SoloError(f"solo serve did not become ready in {timeout_s:.0f} s; see {log_path}")
    except BaseException as exc:  # not ready, or the bench itself interrupted (Ctrl-C, SIGTERM): no server left
        server.stop(timeout_s=10)
        log.close()
        if not isinstance(exc, SoloError):  # (a failure's message names the log: kept; an interruption's is not)
            log_path.unlink(missing_ok=True)
        raise


def _corpus() -> str:
    # Solo's own source: realistic code for a code model, present wherever Solo is installed, no download.
    root = Path(__file__).resolve().parents[2]
    return "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py")))


@dataclass
class Prompt:
    """A pool prompt: its text and its exact token count on the server (chat template included)."""

    text: str
    tokens: int


@dataclass
class Prompts:
    """Every class's prompt pool, built against a running server."""

    model: str
    max_model_len: int
    pools: dict[str, list[Prompt]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def build_prompts(base_url: str, workload: Workload, seed: int) -> Prompts:
    """Cut each class's prompts from the corpus to their drawn token lengths, measured by /tokenize.

    Raises:
        SoloError: the server has no /tokenize, refuses the prompts, or answers unlike `solo serve`.
    """
    with httpx.Client(base_url=base_url, timeout=120, headers=_HEADERS) as http:
        models = http.get("/v1/models")
        if models.status_code != 200:
            raise SoloError(f"GET /v1/models answered {models.status_code}: {models.text[:200]}")
        model = _field(models, "GET /v1/models", "data", 0, "id")
        corpus = _corpus()
        ids: list[int] = []
        max_model_len = 0
        # The corpus is tokenized in pieces the server accepts (and only as much as the prompts need).
        for start in range(0, len(corpus), 20_000):
            r = http.post("/tokenize", json={"model": model, "prompt": corpus[start:start + 20_000],
                                             "add_special_tokens": False})
            if r.status_code != 200:
                raise SoloError(f"POST /tokenize answered {r.status_code}: {r.text[:200]}")
            ids += _field(r, "POST /tokenize", "tokens")
            max_model_len = _field(r, "POST /tokenize", "max_model_len")
            if len(ids) > 4 * max_model_len + 4096:
                break
        prompts = Prompts(model, max_model_len)
        chat_classes = [c for c in workload.classes if c.endpoint == "chat"]
        probe = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        if chat_classes and http.post("/tokenize", json=probe).status_code == 400:
            # A completion model (no chat template, such as the bundled one): say so in the report.
            for c in chat_classes:
                c.endpoint = "completions"
            prompts.notes.append(f"{model} has no chat template: the chat classes "
                                 f"({', '.join(c.name for c in chat_classes)}) were sent to /v1/completions")
        for ci, cls in enumerate(workload.classes):
            rng = random.Random(seed * 1000 + ci)
            pool = []
            for n in prompt_lengths(cls, max_model_len, seed * 1000 + ci):
                pool.append(_fit_prompt(http, model, cls, ids, n, rng, max_model_len))
            prompts.pools[cls.name] = pool
    return prompts


def _fit_prompt(http: httpx.Client, model: str, cls: RequestClass, ids: list[int], n: int, rng: random.Random,
                max_model_len: int) -> Prompt:
    limit = max_model_len - max(cls.max_tokens)
    take = n
    for _ in range(6):
        start = rng.randrange(max(1, len(ids) - take))
        text = _field(http.post("/detokenize", json={"model": model, "tokens": ids[start:start + take]}),
                      "POST /detokenize", "prompt")
        if cls.style == "chat":
            text = "Explain what this code does:\n\n" + text
        count = _count(http, model, cls.endpoint, text)
        if count <= limit:
            return Prompt(text, count)
        take = max(1, take - (count - limit) - 8)  # re-tokenized text or the template made it longer
    raise SoloError(f"class {cls.name}: cannot build a prompt that leaves room for max_tokens {max(cls.max_tokens)} "
                    f"within max_model_len {max_model_len}; lower max_tokens or the prompt lengths")


def _count(http: httpx.Client, model: str, endpoint: str, text: str) -> int:
    if endpoint == "chat":
        body = {"model": model, "messages": [{"role": "user", "content": text}], "add_generation_prompt": True}
    else:
        body = {"model": model, "prompt": text}
    r = http.post("/tokenize", json=body)
    if r.status_code != 200:
        raise SoloError(f"POST /tokenize answered {r.status_code}: {r.text[:200]}")
    return _field(r, "POST /tokenize", "count")


def _field(r: httpx.Response, route: str, *path: str | int) -> Any:  # noqa: ANN401
    # A field of a Solo route's JSON answer; another server's answer (llama-server's /tokenize has no
    # max_model_len, a proxy's HTML page) is named as such rather than failing with a KeyError.
    try:
        value = r.json()
        for key in path:
            value = value[key]
    except (ValueError, KeyError, IndexError, TypeError):
        where = "".join(f"[{key!r}]" for key in path)
        raise SoloError(f"{route} answered {r.status_code} without {where} in JSON ({r.text[:120]!r}): "
                        f"`solo bench --load` needs the routes of `solo serve` (/v1/models, /tokenize, /detokenize); "
                        f"point --url at a Solo server") from None
    expected = {"count": int, "max_model_len": int, "tokens": list, "prompt": str, "id": str}[path[-1]]
    if not isinstance(value, expected) or isinstance(value, bool) or (expected is int and value <= 0):
        raise SoloError(f"{route} answered {path[-1]} = {str(value)[:80]!r}, not what `solo serve` answers; "
                        f"point --url at a Solo server")
    return value


def _key(req: PlannedRequest) -> tuple:
    return (req.cls.name, req.prompt, req.max_tokens)


def _body(prompts: Prompts, req: PlannedRequest, stream: bool | None = None) -> dict[str, Any]:
    prompt = prompts.pools[req.cls.name][req.prompt]
    return request_body(req.cls.endpoint, prompts.model, prompt.text, req.max_tokens,
                        req.stream if stream is None else stream, req.greedy, req.seed)


@dataclass
class PhaseResult:
    """One phase: its offered rate, what happened to each request, and server RSS samples."""

    rate_rps: float
    label: str
    duration_s: float
    outcomes: list[Outcome]
    wall_s: float
    rss_samples: list[tuple[float, int]] = field(default_factory=list)
    saturated: int = 0
    server_latency: dict[str, dict[str, float | None]] = field(default_factory=dict)
    arrivals_end_s: float | None = None  # where `max_requests` ended the arrivals before `duration_s`, else None


async def run_phase(base_url: str, prompts: Prompts, workload: Workload, rate: float, label: str, duration_s: float,
                    max_requests: int, seed: int, timeout_s: float, rss: Any = None) -> PhaseResult:  # noqa: ANN401
    """Send one phase's arrivals on schedule (open loop) and wait for them, at most `timeout_s` past the end.

    Args:
        rss: a callable giving the server's RSS in bytes (sampled every second), or None.
    """
    # One request more than the bound tells whether the bound, not the duration, ended the arrivals (the first
    # `max_requests` are the same either way).
    plan = plan_phase(workload, rate, duration_s, max_requests + 1, seed)
    arrivals_end_s = None
    if len(plan) > max_requests:
        plan = plan[:max_requests]
        arrivals_end_s = plan[-1].offset_s
        raise_it = "raise it" if workload.max_requests_from == "--max-requests" else "--max-requests raises it"
        print(f"phase {label}: {workload.max_requests_from} ({max_requests}) ends its arrivals at "
              f"{arrivals_end_s:.1f} s of {duration_s:g} s ({raise_it}, up to {MAX_REQUESTS})", file=sys.stderr)
    histograms_before = await asyncio.to_thread(server_histograms, base_url)
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=64)
    outcomes: list[Outcome] = []
    samples: list[tuple[float, int]] = []
    saturated = 0
    async with _async_client(base_url, timeout_s, limits=limits) as client:
        start = time.perf_counter()
        stop_sampling = asyncio.Event()

        async def sample() -> None:
            # Every second, and once more at the end (so even a phase with no arrivals has two samples).
            while True:
                value = rss() if rss is not None else None
                if value is not None:
                    samples.append((time.perf_counter() - start, value))
                if stop_sampling.is_set():
                    return
                try:
                    await asyncio.wait_for(stop_sampling.wait(), 1.0)
                except TimeoutError:
                    pass

        sampler = asyncio.create_task(sample())
        tasks = []
        for req in plan:
            delay = start + req.offset_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sum(not t.done() for t in tasks[-MAX_IN_FLIGHT:]) >= MAX_IN_FLIGHT:
                saturated += 1
                continue
            outcome = Outcome(cls=req.cls.name, offered_at=start + req.offset_s,
                              key=_key(req) if req.greedy else None, prompt=req.prompt)
            outcomes.append(outcome)
            tasks.append(asyncio.create_task(_send_with_retries(client, prompts, req, outcome, timeout_s,
                                                                workload.retries)))
        if tasks:
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
        stop_sampling.set()
        await sampler
    histograms = await asyncio.to_thread(server_histograms, base_url)
    return PhaseResult(rate, label, duration_s, outcomes, wall, samples, saturated,
                       histogram_quantiles(histograms_before, histograms), arrivals_end_s)


async def _send_with_retries(client: httpx.AsyncClient, prompts: Prompts, req: PlannedRequest, outcome: Outcome,
                             timeout_s: float, retries: int) -> None:
    # A 503 with Retry-After is retried after that delay (capped at 60 s), as the openai client does.
    deadline = outcome.offered_at + timeout_s
    for attempt in range(retries + 1):
        left = deadline - time.perf_counter()
        if left <= 0:
            outcome.error = "timeout"
            return
        outcome.status = outcome.error = outcome.retry_after_s = None
        await send(client, req.cls.endpoint, _body(prompts, req), outcome, req.cancel_after, left)
        if outcome.status != 503 or outcome.retry_after_s is None or attempt == retries:
            return
        outcome.refusals += 1
        await asyncio.sleep(min(60.0, outcome.retry_after_s, max(0.0, deadline - time.perf_counter())))


async def closed_loop_capacity(base_url: str, prompts: Prompts, workload: Workload, clients: int, duration_s: float,
                               seed: int, timeout_s: float) -> float:
    """Completed requests/s with `clients` clients sending back to back (no cancellations) for `duration_s`.

    Raises:
        SoloError: no request completed (naming the first failure and the server's message for it).
    """
    plan = [r for r in plan_phase(workload, 1000.0, 1e9, 100_000, seed)][:5000]
    for r in plan:
        r.cancel_after = None
    done = 0
    index = 0
    failed: list[Outcome] = []
    async with _async_client(base_url, timeout_s) as client:
        start = time.perf_counter()

        async def worker() -> None:
            nonlocal done, index
            while time.perf_counter() - start < duration_s and index < len(plan):
                req = plan[index]
                index += 1
                outcome = Outcome(cls=req.cls.name, offered_at=time.perf_counter())
                await send(client, req.cls.endpoint, _body(prompts, req), outcome, None, timeout_s)
                done += outcome.completed
                if outcome.error and not failed:
                    failed.append(outcome)

        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - start
    if not done:
        why = f"; the first failure: {failed[0].error}" if failed else ""
        if failed and failed[0].error_message:
            why += f" ({failed[0].error_message})"
        raise SoloError(f"no request completed in the capacity run ({index} sent{why})")
    return done / wall if wall > 0 else 0.0


IDLE_PROMPT_MAX_TOKENS = 4
"""Tokens each prompt's idle TTFT request asks for (its first text, not a whole answer)."""

WARMUP_REQUESTS = 2
"""Requests per route sent before the idle baseline (not measured)."""

WARMUP_PROMPT = "Warm-up request (not measured): say hello."
"""Their prompt, outside every pool."""


async def idle_baseline(base_url: str, prompts: Prompts, workload: Workload, timeout_s: float,
                        repeats: int = 3) -> dict[str, dict[str, Any]]:
    """TTFT of requests alone on the idle server, per class and per prompt (streamed, greedy).

    Per class: the TTFT and e2e of `repeats` different prompts of the pool at the class's largest
    max_tokens, the median (the server has not seen them). Per prompt of the pool ("for the same prompt"):
    its TTFT the first time the server sees it ("new": only what it shares with other prompts, such as a
    chat template, is reused) and, over `repeats` - 1 more sends at `IDLE_PROMPT_MAX_TOKENS`, the median
    TTFT of a full prefix-cache hit ("warm": the state a pool prompt is in once the server has seen it).

    Returns:
        {class: {"ttft_s", "e2e_s", "prompts": [{"new_ttft_s", "warm_ttft_s"} per pool index]}}.
    """
    out: dict[str, dict[str, Any]] = {}
    async with _async_client(base_url, timeout_s) as client:
        # A fresh server's first requests on a route are slow (a break test: 423 and 409 ms, then 48): warm each
        # route used with a prompt outside the pools, so no pool prompt is charged for it.
        for endpoint in dict.fromkeys(cls.endpoint for cls in workload.classes):
            for _ in range(WARMUP_REQUESTS):
                body = request_body(endpoint, prompts.model, WARMUP_PROMPT, IDLE_PROMPT_MAX_TOKENS, True, True, 0)
                await send(client, endpoint, body, Outcome(cls="warm-up", offered_at=time.perf_counter()), None,
                           timeout_s)
        for cls in workload.classes:
            ttfts, e2es = [], []
            new: dict[int, float] = {}
            for i in range(repeats):
                req = PlannedRequest(0.0, cls, i % cls.pool, max(cls.max_tokens), True, True, 0, None)
                outcome = Outcome(cls=cls.name, offered_at=time.perf_counter())
                await send(client, cls.endpoint, _body(prompts, req), outcome, None, timeout_s)
                if outcome.completed:
                    ttfts.append(outcome.ttft_s)
                    e2es.append(outcome.e2e_s)
                    if outcome.ttft_s is not None and not outcome.prefix_hit:
                        new.setdefault(req.prompt, outcome.ttft_s)
            out[cls.name] = {"ttft_s": _median(ttfts), "e2e_s": _median(e2es)}
            per_prompt = []
            for index in range(cls.pool):
                warm = []
                for _ in range(repeats if index not in new else repeats - 1):
                    req = PlannedRequest(0.0, cls, index, IDLE_PROMPT_MAX_TOKENS, True, True, 0, None)
                    outcome = Outcome(cls=cls.name, offered_at=time.perf_counter())
                    await send(client, cls.endpoint, _body(prompts, req), outcome, None, timeout_s)
                    if outcome.completed and outcome.ttft_s is not None:
                        if outcome.prefix_hit:
                            warm.append(outcome.ttft_s)
                        else:
                            new.setdefault(index, outcome.ttft_s)
                per_prompt.append({"new_ttft_s": new.get(index, out[cls.name]["ttft_s"]), "warm_ttft_s": _median(warm)})
            out[cls.name]["prompts"] = per_prompt
    return out


def _median(values: list) -> float | None:
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


async def check_outputs(base_url: str, prompts: Prompts, workload: Workload, phases: list[PhaseResult],
                        timeout_s: float, limit: int) -> dict[str, Any]:
    """Send every distinct greedy request that completed under load alone; mark mismatches "wrong output".

    Args:
        limit: most distinct references to send (the rest are counted as unchecked).

    Returns:
        {"checked": requests compared, "references": distinct references sent, "unchecked": ..., "wrong": ...}
    """
    by_key: dict[tuple, list[Outcome]] = {}
    for phase in phases:
        for o in phase.outcomes:
            if o.key is not None and o.completed:
                by_key.setdefault(o.key, []).append(o)
    classes = {c.name: c for c in workload.classes}
    checked = wrong = unchecked = 0
    mismatches: list[dict[str, Any]] = []
    keys = list(by_key)
    async with _async_client(base_url, timeout_s) as client:
        for i, key in enumerate(keys):
            if i >= limit:
                unchecked += len(by_key[key])
                continue
            name, prompt, max_tokens = key
            req = PlannedRequest(0.0, classes[name], prompt, max_tokens, False, True, 0, None)
            ref = Outcome(cls=name, offered_at=time.perf_counter())
            await send(client, classes[name].endpoint, _body(prompts, req), ref, None, timeout_s)
            if not ref.completed:
                unchecked += len(by_key[key])
                continue
            for o in by_key[key]:
                checked += 1
                if o.text != ref.text:
                    o.error = "wrong output"
                    wrong += 1
                    at = next((i for i, (a, b) in enumerate(zip(o.text, ref.text, strict=False)) if a != b),
                              min(len(o.text), len(ref.text)))
                    mismatches.append({"class": name, "prompt": prompt, "max_tokens": max_tokens,
                                       "streamed": o.ttft_s is not None, "tokens": o.completion_tokens,
                                       "reference_tokens": ref.completion_tokens, "first_difference_at_char": at,
                                       "got": o.text[max(0, at - 20):at + 40],
                                       "expected": ref.text[max(0, at - 20):at + 40]})
    return {"checked": checked, "references": min(len(keys), limit), "unchecked": unchecked, "wrong": wrong,
            "mismatches": mismatches[:20]}


def energy_uj() -> int | None:
    """Package energy counter of Intel RAPL (microjoules), or None where it cannot be read."""
    total, found = 0, False
    for path in Path("/sys/class/powercap").glob("intel-rapl:*/energy_uj"):
        if path.parent.name.count(":") != 1:
            continue  # sub-zones (core, dram) are inside the package's count
        try:
            total += int(path.read_text())
            found = True
        except (OSError, ValueError):
            return None
    return total if found else None


def cpu_load() -> str:
    """The 1- and 5-minute load averages and the CPU count, as a line for the report."""
    try:
        one, five, _ = os.getloadavg()
        return f"{one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"
    except OSError:
        return "unknown"
