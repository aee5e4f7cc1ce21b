"""Diagnostic (not a `solo bench` report): a native decode step against a plain read of its own weights.

The bandwidth probe reads a fresh buffer, whose pages may sit elsewhere than the model's and whose speed on
this VM drifts minute to minute; this instead reads the very tensors the step streams (every >= 1 MiB
tensor the runtime's struct points at, in build order, with the kernels' streaming sum on the same threads)
and times one decode step right after, round by round. Prints per round and as medians: the probe (a
512 MiB buffer), the same-bytes read and the step in GB/s of the step's weight bytes, by wall time and by
CPU time (process CPU time / threads; immune to waiting for a core on a loaded machine, cleanest with
--threads 1), and the median same-round ratio step / same-bytes read.

    python benchmarks/step_same_bytes.py --shape Llama-3.2-1B --threads 1 --rounds 16

Measurement only: noisy on a shared machine, like every timing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from solo.bench.shapes import build_model, shape_config
from solo.runtime.cpu import CpuRuntime


def main() -> None:
    """Run the rounds and print the table (module docstring)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--shape", default="Llama-3.2-1B")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    nt = args.threads
    rt = CpuRuntime(build_model(shape_config(args.shape), torch.bfloat16), num_threads=nt)
    rt.threads.enabled = False  # a fixed thread count
    rt.threads.threads = nt
    rt.reserve(1, 64)
    rt.prefill(0, torch.arange(3, 35))
    lib = rt._lib
    seen: set[int] = set()
    tensors: list[tuple[int, int]] = []  # (address, bytes rounded down to 64)
    for t in rt._keep:
        n = t.numel() * t.element_size()
        if n >= 1 << 20 and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            tensors.append((t.data_ptr(), n // 64 * 64))
    same_bytes = sum(n for _, n in tensors)
    nbytes = rt.weight_nbytes()
    print(f"{args.shape} bf16, {rt.isa}, {nt} threads: the step reads {nbytes / 1e6:.0f} MB of weights; "
          f"same-bytes read: {same_bytes / 1e6:.0f} MB in {len(tensors)} tensors")
    probe_buf = torch.ones((1 << 29) // 8, dtype=torch.int64)
    row, tok = torch.zeros(1, dtype=torch.long), torch.tensor([5])
    res: dict[str, list[float]] = {k: [] for k in ("probe", "same", "step", "same_cpu", "step_cpu")}
    for r in range(args.rounds):
        t0 = time.perf_counter()
        lib.solo_stream_read(probe_buf.data_ptr(), probe_buf.numel() * 8, 1, nt, 1)
        res["probe"].append(probe_buf.numel() * 8 / (time.perf_counter() - t0) / 1e9)
        c0, t0 = time.process_time(), time.perf_counter()
        for ptr, n in tensors:
            lib.solo_stream_read(ptr, n, 1, nt, 1)
        res["same"].append(same_bytes / (time.perf_counter() - t0) / 1e9)
        res["same_cpu"].append(same_bytes / (time.process_time() - c0) * nt / 1e9)
        rt.decode(row, tok, torch.tensor([40]))  # untimed: the threads wake
        c0, t0 = time.process_time(), time.perf_counter()
        rt.decode(row, tok, torch.tensor([41]))
        res["step"].append(nbytes / (time.perf_counter() - t0) / 1e9)
        res["step_cpu"].append(nbytes / (time.process_time() - c0) * nt / 1e9)
        print(f"round {r:2d}: probe {res['probe'][-1]:5.1f}  same-bytes read {res['same'][-1]:5.1f}  step "
              f"{res['step'][-1]:5.1f} GB/s | by CPU time: same-bytes {res['same_cpu'][-1]:5.1f}  step "
              f"{res['step_cpu'][-1]:5.1f}", flush=True)
    for k, v in res.items():
        print(f"{k:9s} median {statistics.median(v):5.1f} GB/s, best {max(v):5.1f}")
    for wall, label in ((("step", "same"), "wall"), (("step_cpu", "same_cpu"), "CPU time")):
        ratios = [s / m for s, m in zip(res[wall[0]], res[wall[1]], strict=True)]
        print(f"step / same-bytes read, median of same-round ratios by {label}: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
