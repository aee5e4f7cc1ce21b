r"""Diagnostic of the native CPU runtime's batched decode step (not a `solo bench` report): knob A/B in one process.

A server decodes several rows per step, so every matrix is multiplied with `--batch` sequences: the same
products a span prefill makes, with the weights streaming from DRAM instead of sitting in cache. Variants,
each a set of `solo_set_knob` knobs ("name=knob=value,knob=value"; decode.cpp lists them; give every variant
every knob any of them sets), take turns round by round on one runtime (random weights of a bench shape,
`--batch` rows after a short prompt each) and time `--steps` decode steps. Prints each variant's median
ms/step and whether all variants returned the same logits bit for bit (knobs must not change a result):

    python benchmarks/batch_decode_ab.py --shape Qwen2.5-0.5B --quantize int8 --batch 8 \
        --variant decode-tiles=q8_rt=0,pass_min_b=1 --variant pass-tiles=q8_rt=-1,pass_min_b=1

Measurement only: noisy on a shared machine, like every timing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from prefill_ab import parse_variant, select_variant  # this folder (the script's own) is on sys.path
from step_ab import build_library

from solo.bench.shapes import build_model, shape_config
from solo.runtime.cpu import CpuRuntime


@torch.inference_mode()
def main() -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--shape", default="Qwen2.5-0.5B", help="a `solo bench --shape` name")
    ap.add_argument("--quantize", choices=["int8", "int4"], help="weight-only quantization, as `solo bench`")
    ap.add_argument("--batch", type=int, default=8, help="rows decoded per step")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--variant", action="append", default=[], help="name=knob=value,knob=value (repeatable)")
    args = ap.parse_args()
    specs = [parse_variant(v) for v in args.variant] or [("base", {}, None, False)]
    if any(row_major for *_, row_major in specs):
        raise SystemExit("this script runs one weight layout: drop 'rowmajor' (prefill_ab.py and step_ab.py "
                         "compare layouts)")
    model = build_model(shape_config(args.shape), torch.bfloat16)
    if args.quantize:
        from solo.runtime.quant import quantize_model

        model = quantize_model(model, args.quantize)
    batch, prompt_len = args.batch, 16
    runtime = CpuRuntime(model, rows=batch, max_seq=prompt_len + args.steps + 8, num_threads=args.threads)
    runtime.threads.enabled = False  # the thread count stays fixed while measuring
    runtime.threads.threads = args.threads
    runtime.reserve(batch, prompt_len + args.steps + 8)
    generator = torch.Generator().manual_seed(0)
    for row in range(batch):
        runtime.prefill(row, torch.randint(0, model.config.vocab_size, (prompt_len,), generator=generator))
    rows, base_lib = torch.arange(batch), runtime._lib
    # (name, library, knobs): another build of the kernels ("lib:DIR") runs on the same struct and cache
    variants = [(name, build_library(d) if d else base_lib, knobs) for name, knobs, d, _ in specs]
    times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    logits: dict[str, torch.Tensor] = {}
    for _ in range(args.rounds):
        for name, lib, knobs in variants:
            select_variant(runtime, lib, knobs)
            start = time.perf_counter()
            for step in range(args.steps):  # the same positions every round: the cache rows are rewritten
                out = runtime.decode(rows, torch.full((batch,), 5), torch.full((batch,), prompt_len + step))
            times[name].append((time.perf_counter() - start) / args.steps)
            logits[name] = out
    runtime._lib = base_lib
    first = variants[0][0]
    same = all(torch.equal(logits[name], logits[first]) for name, _, _ in variants)
    label = f"{args.shape} {args.quantize}" if args.quantize else args.shape
    print(f"{label}, batch {batch}, {runtime.isa} kernels, {args.threads} threads, {args.rounds} rounds of "
          f"{args.steps} steps; logits identical across variants: {same}")
    for name, _, _ in variants:
        print(f"{name:>20s}  {statistics.median(times[name]) * 1e3:8.1f} ms/step (median)  "
              f"fastest {min(times[name]) * 1e3:8.1f}")


if __name__ == "__main__":
    main()
