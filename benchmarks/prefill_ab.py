r"""Diagnostic of the native CPU span prefill (not a `solo bench` report): phase-by-phase A/B in one process.

A prompt that ends within `CpuRuntime.span_prefill_positions` positions runs through the decode kernel
(`solo_decode_span`), so its matrix products are the decode kernels' with many tokens. Variants of that
kernel, each a set of `solo_set_knob` knobs ("name=value,name=value"; decode.cpp lists them; a knob that one
variant sets stays set for the next, so give every variant every knob any of them sets), take turns
round by round on one runtime (random weights of a bench shape, one cache row) and prefill the same prompt
with the kernel's phase profile on (the "profile" knob: time per phase on thread 0). Prints per variant and
phase the median over rounds of (first variant's time / this variant's time) and the fastest time, for the
matrix products (q/k/v, o, gate/up with the activation, down), attention and the whole prefill, and whether
every variant returned the same logits bit for bit (the knobs must not change a result). A variant may
also name another build of the kernels, "lib:DIR" (DIR/decode.cpp compiled with this machine's flags, run
on the same struct and cache, as in step_ab.py), or "rowmajor": a second model of the shape whose runtime
keeps its bf16 matrices row-major where the first packs them (the avx512-bf16 and amx levels; its logits
differ in the last bits, so the identity check then covers the variants of each layout):

    python benchmarks/prefill_ab.py --shape Llama-3.2-1B --prompt-len 128 --rounds 5 \
        --variant old=span_tile=0 --variant tiles=span_tile=1
    python benchmarks/prefill_ab.py --shape Llama-3.2-1B --variant rowmajor=rowmajor --variant packed=
    python benchmarks/prefill_ab.py --variant before=lib:/path/to/old/cpu_kernels --variant after=

Measurement only: noisy on a shared machine, like every timing (the same-round ratios are the steadier
number there; --threads 1 leaves out waits for a core at the barriers).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch
from step_ab import build_library  # (benchmarks/ is this script's folder)

from solo.bench.cpu_profile import PHASES
from solo.bench.shapes import build_model, shape_config
from solo.runtime.cpu import CpuRuntime

SHOWN = ["qkv", "o", "gate/up+act", "down", "attention", "head", "total"]


def parse_variant(text: str) -> tuple[str, dict[str, int], str | None, bool]:
    """"name=[lib:DIR,][rowmajor,]knob=value,..." -> (name, {knob: value}, DIR or None, rowmajor)."""
    name, _, knobs = text.partition("=")
    settings, lib_dir, row_major = {}, None, False
    for item in filter(None, knobs.split(",")):
        if item.startswith("lib:"):
            lib_dir = item[4:]
            continue
        if item == "rowmajor":
            row_major = True
            continue
        key, _, value = item.partition("=")
        settings[key] = int(value)
    return name, settings, lib_dir, row_major


def select_variant(runtime: CpuRuntime, lib: ctypes.CDLL, knobs: dict[str, int]) -> None:
    """Point `runtime` at a variant's library (`lib:DIR` or its own) and set the variant's knobs there."""
    runtime._lib = lib
    for key, value in knobs.items():
        if lib.solo_set_knob(key.encode(), value) != 0:
            raise SystemExit(f"unknown knob {key!r}")


def main() -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--shape", default="Llama-3.2-1B", help="a `solo bench --shape` name")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--variant", action="append", default=[], help="name=knob=value,knob=value (repeatable)")
    ap.add_argument("--quantize", choices=["int8", "int4"], help="weight-only quantization, as `solo bench`")
    args = ap.parse_args()
    specs = [parse_variant(v) for v in args.variant] or [("base", {}, None, False)]
    seq = args.prompt_len

    def make_runtime(row_major: bool) -> CpuRuntime:
        model = build_model(shape_config(args.shape), torch.bfloat16)
        if args.quantize:
            from solo.runtime.quant import quantize_model

            model = quantize_model(model, args.quantize)
        runtime = CpuRuntime(model, rows=1, max_seq=seq + 8, num_threads=args.threads,
                             pack_amx=False if row_major else None)
        runtime.reserve(1, seq + 8)
        if seq > runtime.span_prefill_positions:
            raise SystemExit(f"a {seq}-token prompt takes the matmul prefill, not the span prefill "
                             f"(span_prefill_positions = {runtime.span_prefill_positions})")
        runtime.threads.enabled = False  # the thread count stays fixed while measuring
        runtime.threads.threads = args.threads
        return runtime

    runtimes = {layout: make_runtime(layout) for layout in sorted({row_major for *_, row_major in specs})}
    runtime = next(iter(runtimes.values()))
    base_lib, nt = runtime._lib, args.threads
    # (name, library, knobs, runtime): another build of the kernels runs on the same struct and cache
    variants = [(name, build_library(d) if d else base_lib, knobs, runtimes[row_major])
                for name, knobs, d, row_major in specs]
    ids = torch.randint(0, runtime.model.config.vocab_size, (seq,), generator=torch.Generator().manual_seed(0))
    for r in runtimes.values():
        r.prefill(0, ids)  # warm-up
    times: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in variants}
    logits: dict[str, torch.Tensor] = {}
    try:
        for _ in range(args.rounds):
            for name, lib, knobs, runtime in variants:
                select_variant(runtime, lib, knobs)
                lib.solo_set_knob(b"profile", 1)
                start = time.perf_counter()
                logits[name] = runtime.prefill(0, ids)
                wall = time.perf_counter() - start
                out = (ctypes.c_double * (nt * len(PHASES)))()
                lib.solo_profile(out, nt)
                lib.solo_set_knob(b"profile", 0)
                row = {phase: out[p] / 1e6 for p, phase in enumerate(PHASES)}  # thread 0, ms
                row["total"] = wall * 1e3
                times[name].append(row)
    finally:
        for _, lib, _, runtime in variants:
            lib.solo_set_knob(b"profile", 0)
            runtime._lib = base_lib
    first = variants[0][0]
    same = all(torch.equal(logits[name], logits[next(n for n, *_, r in variants if r is rt)])
               for name, *_, rt in variants)
    label = f"{args.shape} {args.quantize}" if args.quantize else args.shape
    print(f"{label}, prompt {seq}, {runtime.isa} kernels, {nt} threads, {args.rounds} rounds; "
          f"logits identical across variants: {same}")
    print(f"per phase: median of same-round ({first} ms / variant ms) [fastest ms]")
    print(f"{'phase':12s}" + "".join(f"  {name:>22s}" for name, *_ in variants))
    for phase in SHOWN:
        cells = []
        for name, *_ in variants:
            ratio = statistics.median(a[phase] / b[phase] if b[phase] else float("nan")
                                      for a, b in zip(times[first], times[name], strict=True))
            cells.append(f"x{ratio:5.2f} [{min(r[phase] for r in times[name]):7.1f}]")
        print(f"{phase:12s}" + "".join(f"  {c:>22s}" for c in cells))


if __name__ == "__main__":
    main()
