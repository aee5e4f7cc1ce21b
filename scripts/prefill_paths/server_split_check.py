"""Greedy outputs under concurrent load vs alone, in process, bundled model, the chat workload's two pools.

Usage: python scripts/prefill_paths/server_split_check.py SPAN_PREFILL_POSITIONS SEED
(0: the old rule, short prompts' prefills in batched matmuls; 512: the default). 8 client threads send 14
greedy requests each (48 tokens) to a server with 8 rows and the prefix cache on; then every distinct
(prompt, output) is re-sent alone and compared, as `solo bench --load --verify` does. Prints the wrong ones.
The pools are cut from Solo's source with the load bench's lengths and seeds (not its exact prompts).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

import solo
import solo.runtime.cpu as cpu
from solo import Engine
from solo.bench.load.workload import load_workload, prompt_lengths


def pool_prompts() -> list[str]:
    tok = Engine.load(None).tokenizer
    root = Path(solo.__file__).resolve().parent
    corpus = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py")))
    ids = tok.encode(corpus[:400000])
    prompts = []
    for ci, cls in enumerate(load_workload("chat").classes):
        rng = random.Random(ci)
        for n in prompt_lengths(cls, 32768, ci):
            start = rng.randrange(max(1, len(ids) - n))
            text = tok.decode(ids[start:start + n])
            prompts.append("Explain what this code does:\n\n" + text if cls.style == "chat" else text)
    return prompts


def main() -> None:
    cpu.SPAN_PREFILL_POSITIONS = cpu.SPAN_PREFILL_POSITIONS_AMX = int(sys.argv[1])  # read by each CpuRuntime
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "server"))
    from server_harness import start_server

    prompts = pool_prompts()
    running = start_server(None, served_model_name="m", dtype="auto", backend="auto", max_batch=8)
    assert running.state.status == "ok", running.state.error
    client = running.client(timeout=300)

    def one(i: int) -> str:
        r = client.completions.create(model="m", prompt=prompts[i], max_tokens=48, temperature=0,
                                      extra_body={"ignore_eos": True})
        return r.choices[0].text

    results: dict[int, set[str]] = {}

    def worker(order: list[int]) -> None:
        for i in order:
            results.setdefault(i, set()).add(one(i))

    rng = random.Random(int(sys.argv[2]))
    threads = [threading.Thread(target=worker, args=([rng.randrange(len(prompts)) for _ in range(14)],))
               for _ in range(8)]
    start = time.time()
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    print(f"loaded phase {time.time() - start:.0f} s", flush=True)
    wrong = 0
    for i in sorted(results):
        alone = one(i)
        for got in results[i] - {alone}:
            wrong += 1
            first = next((k for k in range(min(len(got), len(alone))) if got[k] != alone[k]), None)
            print(f"prompt {i} differs at char {first}", flush=True)
    checked = sum(len(v) for v in results.values())
    print(f"span_prefill_positions {cpu.SPAN_PREFILL_POSITIONS}: checked {checked}, wrong {wrong}", flush=True)
    running.stop()


if __name__ == "__main__":
    main()
