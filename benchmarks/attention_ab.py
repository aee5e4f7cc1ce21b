r"""Diagnostic of the native CPU decode step at long context (not a `solo bench` report): knob A/B in one process.

At tens of thousands of positions a batch-1 decode step spends much of its time in attention over the KV
cache. Variants, each a set of `solo_set_knob` knobs ("name=knob=value,knob=value"; decode.cpp lists them;
give every variant every knob any of them sets; "lib:DIR" names another build of the kernels, as in
step_ab.py), take turns round by round on one runtime (random weights
of a bench shape, a cache of `--context` positions) and time `--steps` decode steps with the kernel's phase
profile on (`solo.bench.cpu_profile.profile`). Prints per variant the attention phase's ms per token (thread
0) each round, the whole step's, and the median over rounds of (first variant's attention time / this
variant's):

    python benchmarks/attention_ab.py --shape Qwen2.5-0.5B --context 32000 \
        --variant off=attn_prefetch=0 --variant on=attn_prefetch=2

Measurement only: noisy on a shared machine (and on a VM whose memory bandwidth changes from minute to
minute), like every timing; the same-round ratios are the steadier number.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from prefill_ab import parse_variant, select_variant  # this folder (the script's own) is on sys.path
from step_ab import build_library

from solo.bench.cpu_profile import profile
from solo.bench.shapes import build_model, shape_config
from solo.runtime.cpu import CpuRuntime


def main() -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--shape", default="Qwen2.5-0.5B", help="a `solo bench --shape` name")
    ap.add_argument("--context", type=int, default=32000, help="position of the first timed step")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--variant", action="append", default=[], help="name=knob=value,knob=value (repeatable)")
    ap.add_argument("--fill", choices=["zeros", "random"], default="zeros",
                    help="the cached keys and values: zeros, or standard normal as `solo bench --sweep-fill random`")
    args = ap.parse_args()
    specs = [parse_variant(v) for v in args.variant] or [("base", {}, None, False)]
    if any(row_major for *_, row_major in specs):
        raise SystemExit("this script runs one weight layout: drop 'rowmajor' (prefill_ab.py and step_ab.py "
                         "compare layouts)")
    model = build_model(shape_config(args.shape), torch.bfloat16)
    positions = args.context + 3 * args.steps + 2
    runtime = CpuRuntime(model, rows=1, max_seq=positions, num_threads=args.threads)
    runtime.reserve(1, positions)
    if args.fill == "random":
        gen = torch.Generator().manual_seed(0)
        for layer in (*runtime.cache.k, *runtime.cache.v):
            layer[0, :, :args.context].copy_(torch.randn(layer[0, :, :args.context].shape, generator=gen))
    base_lib = runtime._lib
    # (name, library, knobs): another build of the kernels runs on the same struct and cache
    variants = [(name, build_library(d) if d else base_lib, knobs) for name, knobs, d, _ in specs]
    attention: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    step: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    try:
        for _ in range(args.rounds):
            for name, lib, knobs in variants:
                select_variant(runtime, lib, knobs)
                result = profile(runtime, args.steps, args.context)
                attention[name].append(result["phases"]["attention"][0])
                step[name].append(result["ms_per_token"])
    finally:
        runtime._lib = base_lib
    first = variants[0][0]
    print(f"{args.shape}, context {args.context} ({args.fill} cache), {runtime.isa} kernels, "
          f"{runtime.num_threads} threads, {args.rounds} rounds of {args.steps} steps (ms per token)")
    for name, _, _ in variants:
        ratio = statistics.median(a / b for a, b in zip(attention[first], attention[name], strict=True))
        print(f"{name:>14s}  attention {' '.join(f'{t:6.2f}' for t in attention[name])}  "
              f"step {' '.join(f'{t:6.1f}' for t in step[name])}  x{ratio:.2f}")


if __name__ == "__main__":
    main()
