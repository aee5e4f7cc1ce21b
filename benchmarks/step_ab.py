"""Diagnostic of the native CPU decode step (not a `solo bench` report): whole-token A/B in one process.

Variants of the decode step take turns round by round on one runtime (random weights of a bench shape,
batch 1), each round preceded by a streaming-read probe on the same threads, so this VM's bandwidth modes
(which change minute to minute) hit every variant alike. A variant is a set of `solo_set_knob` knobs
("name=value,name=value"; decode.cpp lists them) and optionally another build of the kernels
("lib:DIR" compiles DIR/decode.cpp with this machine's flags and runs its step on the same struct):

    python benchmarks/step_ab.py --shape Llama-3.2-1B --steps 4 --rounds 30 \
        --variant base= --variant ahead=ahead_kb=256,ahead_hint=1

Prints first the share of weight bytes on transparent huge pages, then per variant: median tok/s over the
rounds, the median of (step GB/s / the round's probe GB/s), the median of its same-round tok/s ratios to the
first variant, and every round's tok/s. Measurement only: noisy on a shared machine, like every timing.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import time
from pathlib import Path

import torch

from solo.bench.shapes import build_model, shape_config
from solo.runtime.cpu import CpuRuntime, check_struct_layout
from solo.runtime.cpu_build import _compiler, compile_flags, declare, selected_level


def huge_page_share(tensors: list[torch.Tensor]) -> float:
    """Fraction of the tensors' bytes inside mappings whose AnonHugePages covers them (from /proc/self/smaps).

    Per mapping: min(1, AnonHugePages / Rss) of the tensor bytes inside it (an estimate: smaps does not say
    which pages of a mapping are huge).
    """
    maps: list[tuple[int, int, int, int]] = []  # start, end, rss kB, huge kB
    cur: list[int] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            cur = [lo, hi, 0, 0]
            maps.append(cur)  # type: ignore[arg-type]
        elif head == "Rss:" and cur is not None:
            cur[2] = int(line.split()[1])
        elif head == "AnonHugePages:" and cur is not None:
            cur[3] = int(line.split()[1])
    total = huge = 0.0
    for t in tensors:
        a, n = t.data_ptr(), t.numel() * t.element_size()
        total += n
        for lo, hi, rss, hp in maps:
            overlap = min(hi, a + n) - max(lo, a)
            if overlap > 0 and rss:
                huge += overlap * min(1.0, hp / rss)
    return huge / total if total else 0.0


def build_library(folder: str) -> ctypes.CDLL:
    """Compile `folder`/decode.cpp for the selected ISA level (this machine's flags) and load it."""
    out = Path("/tmp") / f"solo_step_ab_{abs(hash(folder))}.so"
    cmd = [_compiler(), *compile_flags(selected_level()), str(Path(folder) / "decode.cpp"), "-o", str(out)]
    subprocess.run(cmd, check=True)
    lib = declare(ctypes.CDLL(str(out)))
    check_struct_layout(lib)
    return lib


def main() -> None:
    """Run the rounds and print the table (module docstring)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--shape", default="Llama-3.2-1B")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per variant and round")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=knob=v,knob=v or NAME=lib:DIR[,knob=v] (repeatable; default: one baseline)")
    args = ap.parse_args()
    cfg = shape_config(args.shape)
    model = build_model(cfg, torch.bfloat16)
    rt = CpuRuntime(model, num_threads=args.threads)
    rt.threads.enabled = False  # a fixed thread count: the variants, not the governor, are compared
    rt.threads.threads = args.threads
    rt.reserve(1, 64 + args.steps * args.rounds * 2 + 8)
    base_lib = rt._lib
    variants: list[tuple[str, ctypes.CDLL, list[tuple[bytes, int]]]] = []
    for spec in args.variant or ["base="]:
        name, _, rest = spec.partition("=")
        lib, knobs = base_lib, []
        for item in filter(None, rest.split(",")):
            if item.startswith("lib:"):
                lib = build_library(item[4:])
            else:
                k, _, v = item.partition("=")
                knobs.append((k.encode(), int(v)))
        variants.append((name, lib, knobs))
    all_knobs = {k for _, _, ks in variants for k, _ in ks}
    nbytes = rt.weight_nbytes()
    weights = [t for t in rt._keep if t.numel() * t.element_size() >= 1 << 20]
    print(f"{args.shape} bf16, {rt.isa}, {args.threads} threads, {nbytes / 1e6:.1f} MB per token; "
          f"weights on huge pages: {huge_page_share(weights) * 100:.0f}%")
    buf = torch.ones((1 << 30) // 8, dtype=torch.int64)
    print(f"probe buffer on huge pages: {huge_page_share([buf]) * 100:.0f}%")
    rt.prefill(0, torch.arange(3, 35))
    row, tok = torch.zeros(1, dtype=torch.long), torch.tensor([5])
    res: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in variants}
    pos = 35
    for _ in range(args.rounds):
        for name, lib, knobs in variants:
            for lb in {id(base_lib): base_lib, id(lib): lib}.values():
                for k in all_knobs:
                    lb.solo_set_knob(k, 0)
                for k, v in knobs:
                    lb.solo_set_knob(k, v)
            rt._lib = lib
            start = time.perf_counter()
            lib.solo_stream_read(buf.data_ptr(), buf.numel() * 8, 1, args.threads)
            probe = buf.numel() * 8 / (time.perf_counter() - start) / 1e9
            rt.decode(row, tok, torch.tensor([pos]))  # one untimed step: the variant's first
            start = time.perf_counter()
            for i in range(args.steps):
                rt.decode(row, tok, torch.tensor([pos + 1 + i]))
            step = (time.perf_counter() - start) / args.steps
            res[name].append((1 / step, nbytes / step / 1e9 / probe))
        pos = 35  # every round decodes the same positions
    rt._lib = base_lib
    width = max(len(n) for n in res)
    first = res[variants[0][0]]
    for name, rows in res.items():
        tok_s = statistics.median(r[0] for r in rows)
        frac = statistics.median(r[1] for r in rows)
        paired = statistics.median(r[0] / f[0] for r, f in zip(rows, first, strict=True))
        print(f"{name:{width}s} {tok_s:7.2f} tok/s  {frac * 100:5.1f}% of the round's probe  "
              f"x{paired:.3f} vs {variants[0][0]} (median of same-round ratios)  "
              f"rounds [{', '.join(f'{r[0]:.1f}' for r in rows)}]")


if __name__ == "__main__":
    main()
