"""A/B of the CPU int8 / int4 decode kernels (not a `solo bench` report): integer dot products vs the float path.

One quantized model of a real shape (random bf16 weights), two `CpuRuntime`s over it: `int_dot=True` (the
input vector quantized to int8 per block of 32, integer dot products: cpu_kernels/qdot.h) and `int_dot=False`
(every weight widened to float32, float multiply-adds: the kernels before). Rounds of decode steps take
turns between them (and between thread counts), so a loaded machine's noise hits every setting alike;
prints min / median step times, tok/s at the median and the new/old ratio per thread count.

    python benchmarks/intdot_step_ab.py --shape Qwen2.5-0.5B --quantize int8 --steps 16 --rounds 7
"""

from __future__ import annotations

import argparse
import time

import torch

from solo.bench.shapes import build_model, shape_config
from solo.runtime.cpu import CpuRuntime
from solo.runtime.quant import quantize_model


def main() -> None:
    """Print per-setting step statistics and the int-dot / float ratio of median step times."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--shape", default="Qwen2.5-0.5B")
    ap.add_argument("--quantize", choices=["int8", "int4"], default="int8")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per setting and round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    args = ap.parse_args()
    cfg = shape_config(args.shape)
    qmodel = quantize_model(build_model(cfg, torch.bfloat16), args.quantize)
    runtimes = {}
    for threads in args.threads:
        for int_dot in (True, False):
            rt = CpuRuntime(qmodel, num_threads=threads, int_dot=int_dot)
            rt.threads.enabled = False  # fixed thread counts: the comparison is of kernels
            rt.reserve(1, 64 + args.steps)
            rt.prefill(0, torch.arange(3, 67))
            runtimes[(threads, int_dot)] = rt
    primitive = next(iter(runtimes.values())).int_dot_primitive
    times: dict[tuple[int, bool], list[float]] = {k: [] for k in runtimes}
    row = torch.zeros(1, dtype=torch.long)
    for _ in range(args.rounds):
        for key, rt in runtimes.items():
            time.sleep(0.2)
            for i in range(args.steps):
                start = time.perf_counter()
                rt.decode(row, torch.tensor([5 + i]), torch.tensor([64 + i]))
                times[key].append(time.perf_counter() - start)
    print(f"{args.shape} {args.quantize} ({next(iter(runtimes.values())).isa} kernels, int-dot: {primitive}), "
          f"{args.rounds} rounds x {args.steps} steps per setting, interleaved")
    medians, mins = {}, {}
    for (threads, int_dot), ts in times.items():
        ts = sorted(ts)
        medians[(threads, int_dot)], mins[(threads, int_dot)] = ts[len(ts) // 2], ts[0]
        print(f"{threads} thread(s) {'int-dot' if int_dot else 'float  '}: min {ts[0] * 1e3:.2f} ms, median "
              f"{ts[len(ts) // 2] * 1e3:.2f} ms = {1 / ts[len(ts) // 2]:.2f} tok/s")
    for threads in args.threads:
        ratio = medians[(threads, False)] / medians[(threads, True)]
        best = mins[(threads, False)] / mins[(threads, True)]
        print(f"{threads} thread(s): int-dot / float decode speed {ratio:.2f}x at the median, {best:.2f}x at the min")


if __name__ == "__main__":
    main()
