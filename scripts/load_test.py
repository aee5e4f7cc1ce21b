"""Load test of `solo serve` on loopback: many streaming clients, client-side TTFT / ITL percentiles.

Superseded by `solo bench --load` (workload files, Poisson arrivals and bursts, cancelling clients, latency
against offered load, output checks); kept to reproduce benchmarks/results/server_load_test_*.

    python scripts/load_test.py MODEL --requests 64 --clients 8 --max-tokens 64
    python scripts/load_test.py --random-model --requests 64 --clients 8      # no model needed
    python scripts/load_test.py --url http://127.0.0.1:8000 --model-name NAME  # a server already running

Without --url it starts `solo serve` on a free port (once per --decode-batching value), waits for /health,
measures one request alone (the baseline a lone user gets), then runs the load: `--clients` concurrent
clients send `--requests` streaming chat requests in total through the official `openai` client. Each
request asks for exactly --max-tokens tokens (ignore_eos), so none can be "lost" silently: the test
checks every request ends with a finish_reason and the full usage count, and counts statuses.

Times are measured by the client: TTFT from sending the request to the first chunk with text, ITL
between consecutive chunks with text, end-to-end to the last chunk. Results go to a JSON file and a
Markdown table (with the command line) under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is in two sentences.",
    "def fibonacci(n):",
    "class LRUCache:",
    "Sort a list of dictionaries by the key 'age'.",
    "What does the `yield` keyword do in Python?",
    "import os\nimport sys\n\n",
    "Write a SQL query that counts orders per customer.",
]


@dataclass
class Sample:
    ok: bool
    status: int | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    completion_tokens: int = 0
    error: str | None = None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def one_request(client: openai.AsyncOpenAI, model: str, index: int, max_tokens: int) -> Sample:
    # Half greedy, half seeded sampling: both kinds of request share the batch.
    sampling = {"temperature": 0.0} if index % 2 == 0 else {"temperature": 0.8, "seed": index}
    start = time.perf_counter()
    last = None
    sample = Sample(ok=False)
    finish = None
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}],
            max_tokens=max_tokens, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True}, **sampling,
        )
        async for chunk in stream:
            now = time.perf_counter()
            for choice in chunk.choices:
                if choice.delta.content:
                    if last is None:
                        sample.ttft_s = now - start
                    else:
                        sample.itl_s.append(now - last)
                    last = now
                finish = choice.finish_reason or finish
            if chunk.usage is not None:
                sample.completion_tokens = chunk.usage.completion_tokens
        sample.e2e_s = time.perf_counter() - start
        sample.status = 200
        sample.ok = finish == "length" and sample.completion_tokens == max_tokens
        if not sample.ok:
            sample.error = f"finish_reason={finish}, completion_tokens={sample.completion_tokens}"
    except openai.APIStatusError as exc:
        sample.status, sample.error = exc.status_code, str(exc)
    except openai.APIError as exc:
        sample.error = repr(exc)
    return sample


async def run_load(base_url: str, model: str, requests: int, clients: int, max_tokens: int) -> tuple[list, float]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    samples: list[Sample] = []

    async def worker() -> None:
        # One connection pool per client, as separate users would have.
        async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="load-test", max_retries=0,
                                      timeout=300) as client:
            while not queue.empty():
                samples.append(await one_request(client, model, queue.get_nowait(), max_tokens))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return samples, time.perf_counter() - start


def summarize(samples: list[Sample], wall_s: float) -> dict:
    ttft = [s.ttft_s for s in samples if s.ttft_s is not None]
    itl = [gap for s in samples for gap in s.itl_s]
    e2e = [s.e2e_s for s in samples if s.e2e_s is not None]
    statuses: dict[str, int] = {}
    for s in samples:
        key = str(s.status) if s.status is not None else "no response"
        statuses[key] = statuses.get(key, 0) + 1

    def ms(values: list[float], q: float) -> float | None:
        p = percentile(values, q)
        return None if p is None else round(p * 1000, 2)

    tokens = sum(s.completion_tokens for s in samples)
    return {
        "requests": len(samples),
        "completed_ok": sum(s.ok for s in samples),
        "statuses": statuses,
        "errors": [s.error for s in samples if s.error][:5],
        "wall_s": round(wall_s, 2),
        "generated_tokens": tokens,
        "throughput_tok_s": round(tokens / wall_s, 1) if wall_s else None,
        **{f"ttft_p{int(q * 100)}_ms": ms(ttft, q) for q in (0.5, 0.9, 0.99)},
        **{f"itl_p{int(q * 100)}_ms": ms(itl, q) for q in (0.5, 0.9, 0.99)},
        **{f"e2e_p{int(q * 100)}_ms": ms(e2e, q) for q in (0.5, 0.99)},
        "itl_mean_ms": round(statistics.fmean(itl) * 1000, 2) if itl else None,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args: argparse.Namespace, model: str, decode_batching: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "solo.cli", "serve", model, "--port", str(port), "--served-model-name",
               args.model_name, "--max-batch", str(args.max_batch), "--max-queue", str(args.requests),
               "--decode-batching", decode_batching, "--dtype", args.dtype, "--backend", args.backend]
    log = open(Path(tempfile.gettempdir()) / f"solo-load-test-{port}.log", "w")  # noqa: SIM115
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"solo serve exited with {process.returncode}; see {log.name}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit("solo serve did not become ready in 300 s")


def random_model(folder: Path) -> str:
    # A random-weight Llama (about 8M parameters) from the test suite's checkpoint writer: realistic
    # compute per token for a small model, no download.
    sys.path.insert(0, str(ROOT / "tests"))
    from checkpoints import make_checkpoint

    make_checkpoint(folder, hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=8,
                    num_key_value_heads=4, max_position_embeddings=2048)
    return str(folder)


def cpu_load() -> str:
    try:
        one, five, _ = os.getloadavg()
        return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"
    except OSError:
        return "unknown"


def write_markdown(path: Path, runs: dict, meta: dict) -> None:
    lines = [
        "# `solo serve` load test",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"- Model: {meta['model']}",
        f"- {meta['requests']} streaming chat requests from {meta['clients']} concurrent clients, "
        f"{meta['max_tokens']} tokens each (ignore_eos), half greedy and half seeded sampling; "
        f"`--max-batch {meta['max_batch']}`, backend {meta['backend']}, dtype {meta['dtype']}",
        f"- Machine: {meta['machine']}; CPU load before the run: {meta['cpu_load_before']}",
        f"- {meta['note']}" if meta.get("note") else "",
        "",
        "Times are client-side (official `openai` client, streaming): TTFT to the first chunk with text, ITL "
        "between chunks with text. \"Alone\" is one request with the server otherwise idle.",
        "",
        "| decode batching | run | ok / sent | statuses | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) "
        "| e2e p50 / p99 (ms) | throughput (tok/s) | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, result in runs.items():
        for name in ("alone", "load"):
            r = result[name]
            lines.append(
                f"| {mode} | {name} | {r['completed_ok']} / {r['requests']} | {r['statuses']} | "
                f"{r['ttft_p50_ms']} / {r['ttft_p90_ms']} / {r['ttft_p99_ms']} | "
                f"{r['itl_p50_ms']} / {r['itl_p90_ms']} / {r['itl_p99_ms']} | {r['e2e_p50_ms']} / {r['e2e_p99_ms']} | "
                f"{r['throughput_tok_s']} | {r['wall_s']} |"
            )
    lines.append("")
    path.write_text("\n".join(line for line in lines if line is not None) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="model folder for `solo serve` (default: the bundled model)")
    parser.add_argument("--random-model", action="store_true", help="serve a random-weight ~8M Llama instead")
    parser.add_argument("--url", help="use a server that is already running at this URL")
    parser.add_argument("--model-name", default="solo-load-test", help="served model name")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--decode-batching", nargs="+", default=["isolated", "fused"],
                        choices=("isolated", "fused"), help="server modes to measure (one server each)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--note", default="", help="a line added to the results (e.g. that the CPU was shared)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "server_load_test")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory()
    model = args.model
    model_desc = args.model or "Solo's bundled model"
    if args.random_model:
        model = random_model(Path(tmp.name) / "random-llama")
        model_desc = ("random-weight Llama (about 8M parameters): hidden 256, 8 layers, 8 heads / 4 KV heads, "
                      "MLP 768, vocab 384, saved in float32 (made by --random-model with tests/checkpoints.py; "
                      "loaded in --dtype)")
    argv = sys.argv[1:]
    if "--note" in argv:  # the note is printed on its own line
        i = argv.index("--note")
        argv = argv[:i] + argv[i + 2:] + ["--note", "..."]
    meta = {
        "command": "python scripts/load_test.py " + shlex.join(argv).replace(str(ROOT) + "/", ""),
        "model": model_desc, "requests": args.requests, "clients": args.clients, "max_tokens": args.max_tokens,
        "max_batch": args.max_batch, "backend": args.backend, "dtype": args.dtype,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "cpu_load_before": cpu_load(), "note": args.note,
    }
    runs = {}
    modes = ["(external server)"] if args.url else args.decode_batching
    for mode in modes:
        process = None
        if args.url:
            base = args.url.rstrip("/")
        else:
            process, base = start_server(args, model or "", mode)
        try:
            alone, alone_wall = asyncio.run(run_load(base, args.model_name, 4, 1, args.max_tokens))
            samples, wall = asyncio.run(run_load(base, args.model_name, args.requests, args.clients, args.max_tokens))
            runs[mode] = {"alone": summarize(alone, alone_wall), "load": summarize(samples, wall)}
            print(mode, json.dumps(runs[mode], indent=1), flush=True)
        finally:
            if process is not None:
                process.terminate()
                process.wait(60)
    meta["cpu_load_after"] = cpu_load()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2) + "\n")
    write_markdown(args.out.with_suffix(".md"), runs, meta)
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}")
    failed = any(r["load"]["completed_ok"] != r["load"]["requests"] for r in runs.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
