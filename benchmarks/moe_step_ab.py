"""Diagnostic of the native CPU MoE decode step (not a `solo bench` report): step times under interleaved settings.

Min / median / mean over many steps of one runtime, the settings taking turns, so a loaded machine's noise hits
every setting alike.

Settings: the expert schedule (SOLO_MOE_SCHEDULE=static: fixed row blocks per thread; dynamic: work items
claimed from a shared counter, the default) on all threads, and the default schedule on one thread, each
beside a streaming-read probe on the same thread count; and steps with the matrix-vector products replaced
by zero writes (what is left: routing, norms, attention, barriers).

    python benchmarks/moe_step_ab.py --shape OLMoE-1B-7B-4L --steps 24 --rounds 6
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from solo.bench.roofline import decode_bytes
from solo.bench.shapes import build_model, shape_config
from solo.runtime.cpu import CpuRuntime
from solo.runtime.cpu_build import load_library


def main() -> None:
    """Print per-setting step statistics (ms) and the GB/s of the active bytes at the mean step time."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--shape", default="OLMoE-1B-7B-4L")
    ap.add_argument("--steps", type=int, default=24, help="decode steps per setting and round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    cfg = shape_config(args.shape)
    model = build_model(cfg, torch.bfloat16)
    runtimes = {n: CpuRuntime(model, num_threads=n) for n in sorted({1, args.threads})}
    nbytes = decode_bytes(cfg, 2, 32 + args.steps // 2).total
    lib = load_library()
    buf = torch.ones((512 << 20) // 8, dtype=torch.int64)
    settings = [("dynamic", args.threads, False), ("static", args.threads, False), ("dynamic", 1, False),
                ("dynamic", args.threads, True)]
    times: dict[tuple, list[float]] = {s: [] for s in settings}
    probes: dict[int, list[float]] = {n: [] for n in runtimes}
    for _ in range(args.rounds):
        for schedule, threads, skip in settings:
            os.environ["SOLO_MOE_SCHEDULE"] = schedule
            rt = runtimes[threads]
            time.sleep(0.3)
            if not skip:
                start = time.perf_counter()
                lib.solo_stream_read(buf.data_ptr(), buf.numel() * 8, 1, threads, 1)
                probes[threads].append(buf.numel() * 8 / (time.perf_counter() - start) / 1e9)
            rt.reserve(1, 40 + args.steps)
            rt.prefill(0, torch.arange(3, 35))
            rt.skip_matmuls(skip)
            row = torch.zeros(1, dtype=torch.long)
            for i in range(args.steps):
                start = time.perf_counter()
                rt.decode(row, torch.tensor([5]), torch.tensor([32 + i]))
                times[(schedule, threads, skip)].append(time.perf_counter() - start)
            rt.skip_matmuls(False)
    print(f"{args.shape}, bf16, {nbytes / 1e6:.1f} MB of active bytes per step; "
          f"read probe best: {', '.join(f'{n} thread(s) {max(p):.1f} GB/s' for n, p in probes.items())}")
    for (schedule, threads, skip), ts in times.items():
        ts = sorted(ts)
        mean = sum(ts) / len(ts)
        what = "products skipped" if skip else f"{nbytes / mean / 1e9:.1f} GB/s at the mean"
        print(f"{schedule:8s} {threads} thread(s){' (no products)' if skip else ''}: {len(ts)} steps, min "
              f"{ts[0] * 1e3:.1f} ms, median {ts[len(ts) // 2] * 1e3:.1f}, mean {mean * 1e3:.1f} ms ({what})")


if __name__ == "__main__":
    main()
