"""Cold prefill time of the CPU runtime's two prefill paths, interleaved: batched matmuls vs the decode kernel.

Usage: python scripts/prefill_paths/time_cold_prefill.py [MODEL] (default: the bundled model, bf16).
Prints, per prompt length, the min and median of 5 interleaved runs of each path (ms) and their ratio.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from solo import Engine


def main() -> None:
    engine = Engine.load(sys.argv[1] if len(sys.argv) > 1 else None, dtype="bfloat16", backend="cpu")
    rt = engine.runtime
    print(f"isa {rt.isa}, threads {rt.num_threads}, matmul dtype {rt.prefill_matmul_dtype}")
    rt.reserve(1, 600)
    ids = torch.arange(1000, 1512)
    for n in (16, 48, 96, 192, 320, 512):
        times: dict[str, list[float]] = {"matmul": [], "kernel": []}
        for _ in range(5):
            for name, positions in (("matmul", 0), ("kernel", 512)):
                rt.span_prefill_positions = positions
                start = time.perf_counter()
                rt.prefill(0, ids[:n])
                times[name].append(time.perf_counter() - start)
        m, k = (sorted(times[p]) for p in ("matmul", "kernel"))
        print(f"{n:4d} tokens: matmul min {m[0] * 1e3:7.1f} med {statistics.median(m) * 1e3:7.1f} | kernel min "
              f"{k[0] * 1e3:7.1f} med {statistics.median(k) * 1e3:7.1f} | kernel/matmul (min) {k[0] / m[0]:.2f}")


if __name__ == "__main__":
    main()
