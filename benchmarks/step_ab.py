"""Diagnostic of the native CPU decode step (not a `solo bench` report): whole-token A/B in one process.

Variants of the decode step take turns round by round on one runtime (random weights of a bench shape,
batch 1), each round preceded by a streaming-read probe on the same threads, so this VM's bandwidth modes
(which change minute to minute) hit every variant alike. A variant is a set of `solo_set_knob` knobs
("name=value,name=value"; decode.cpp lists them) and optionally another build of the kernels
("lib:DIR" compiles DIR/decode.cpp with this machine's flags and runs its step on the same struct; "skip":
the products write zeros instead of reading weights, what is left is the step's other work; "noarena": a
second model of the shape whose runtime leaves the weights where PyTorch allocated them, i.e. without the
huge-page arena of solo/runtime/cpu.py; "rowmajor": likewise a second model, its bf16 matrices left row-major
on the AVX512-BF16 kernels at the amx level, where the first runtime packs them for the AMX kernels):

    python benchmarks/step_ab.py --shape Llama-3.2-1B --steps 4 --rounds 30 \
        --variant base= --variant ahead=ahead_kb=256,ahead_hint=1

Prints first the share of weight bytes on transparent huge pages, then per variant: median tok/s over the
rounds, the median of (step GB/s / the round's probe GB/s), the median of its same-round tok/s ratios to the
first variant, and every round's tok/s; then each variant's fastest, 10th-percentile and median single
steps, and the same from CPU time per thread (immune to waiting for a core, so the better measure on a
loaded machine, cleanest with --threads 1). Measurement only: noisy on a shared machine, like every timing.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from solo.bench.shapes import build_model, shape_config
from solo.runtime.cpu import CpuRuntime, check_struct_layout
from solo.runtime.cpu_build import (
    _compiler,
    bf16_pass_k_block,
    bf16_stream_count,
    compile_flags,
    declare,
    selected_level,
)


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


# decode.cpp's knob defaults (solo_set_knob): a variant's knobs are set over these, every other knob reset.
KNOB_DEFAULTS = {"static_rows": 0, "chunk_kb": 128, "claim_chunks": 4, "late_us": 1000,
                 "ahead_kb": 0, "ahead_hint": 0, "spin_pause": 1,
                 "moe_gu_rows": 128, "moe_down_rows": 256, "moe_fused": 1, "span_tile": 1, "row_streams": 4,
                 "bf16_streams": bf16_stream_count(), "q8_streams": 2, "amx": 1, "amx_groups": 4, "amx_span_kb": 1024,
                 "bf16_pass_kb": bf16_pass_k_block()}


def runtime_without_arena(model: torch.nn.Module, threads: int) -> CpuRuntime:
    """A CpuRuntime whose weights stay where the model has them (no huge-page arena): the A/B's old layout."""
    original = CpuRuntime._arena_for

    def no_arena(self: CpuRuntime, sizes: list[int], i: int) -> None:
        pass  # the arena stays empty: _to_arena leaves every weight in place

    CpuRuntime._arena_for = no_arena  # type: ignore[method-assign]
    try:
        return CpuRuntime(model, num_threads=threads)
    finally:
        CpuRuntime._arena_for = original  # type: ignore[method-assign]


def build_library(folder: str) -> ctypes.CDLL:
    """Compile `folder`/decode.cpp for the selected ISA level (this machine's flags) and load it."""
    out = Path(tempfile.gettempdir()) / f"solo_step_ab_{abs(hash(folder))}.so"
    cmd = [*_compiler(), *compile_flags(selected_level()), str(Path(folder) / "decode.cpp"), "-o", str(out)]
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
    ap.add_argument("--quantize", choices=["int8", "int4"], help="weight-only quantization, as `solo bench`")
    args = ap.parse_args()
    cfg = shape_config(args.shape)
    model = build_model(cfg, torch.bfloat16)
    if args.quantize:
        from solo.runtime.quant import quantize_model

        model = quantize_model(model, args.quantize)
    specs = args.variant or ["base="]
    runtimes = {"base": CpuRuntime(model, num_threads=args.threads)}
    if any("noarena" in spec for spec in specs):  # a second model of the shape, its weights left in place
        runtimes["noarena"] = runtime_without_arena(build_model(cfg, torch.bfloat16), args.threads)
    if any("rowmajor" in spec for spec in specs):  # a second model of the shape, not packed for AMX
        runtimes["rowmajor"] = CpuRuntime(build_model(cfg, torch.bfloat16), num_threads=args.threads,
                                          pack_amx=False)
    for r in runtimes.values():
        r.threads.enabled = False  # a fixed thread count: the variants, not the governor, are compared
        r.threads.threads = args.threads
        r.reserve(1, 64 + args.steps * args.rounds * 2 + 8)
        r.prefill(0, torch.arange(3, 35))
    rt = runtimes["base"]
    base_lib = rt._lib
    variants: list[tuple[str, ctypes.CDLL, list[tuple[bytes, int]], CpuRuntime]] = []
    for spec in specs:
        name, _, rest = spec.partition("=")
        lib, knobs, which = base_lib, [], "base"
        for item in filter(None, rest.split(",")):
            if item.startswith("lib:"):
                lib = build_library(item[4:])
            elif item == "skip":  # products write zeros: the step's cost outside weight streaming
                knobs.append((b"", 1))
            elif item in ("noarena", "rowmajor"):  # the second runtime (above)
                which = item
            else:
                k, _, v = item.partition("=")
                knobs.append((k.encode(), int(v)))
        variants.append((name, lib, knobs, runtimes[which]))
    nbytes = rt.weight_nbytes()
    for which, r in runtimes.items():
        weights = [t for t in r._keep if t.numel() * t.element_size() >= 1 << 20]
        print(f"{args.shape} bf16, {r.isa}, {args.threads} threads, {nbytes / 1e6:.1f} MB per token; "
              f"{'' if which == 'base' else which + ': '}weights on huge pages: {huge_page_share(weights) * 100:.0f}% "
              "(estimate from /proc/self/smaps)")
    buf = torch.ones((1 << 29) // 8, dtype=torch.int64)
    print(f"probe buffer on huge pages: {huge_page_share([buf]) * 100:.0f}%")
    row, tok = torch.zeros(1, dtype=torch.long), torch.tensor([5])
    res: dict[str, list[tuple[float, float]]] = {v[0]: [] for v in variants}
    steps_of: dict[str, list[float]] = {v[0]: [] for v in variants}
    cpu_of: dict[str, list[float]] = {v[0]: [] for v in variants}
    pos = 35
    for _ in range(args.rounds):
        for name, lib, knobs, rt in variants:
            for lb in {id(base_lib): base_lib, id(lib): lib}.values():
                for k, v in KNOB_DEFAULTS.items():
                    lb.solo_set_knob(k.encode(), v)
                for k, v in knobs:
                    if k:
                        lb.solo_set_knob(k, v)
            rt._lib = lib
            rt.skip_matmuls(any(not k for k, _ in knobs))
            probe = 0.0
            for streams in (1, 4):  # the better of one and four streams per thread (roofline.py's kernels)
                start = time.perf_counter()
                base_lib.solo_stream_read(buf.data_ptr(), buf.numel() * 8, 1, args.threads, streams)
                probe = max(probe, buf.numel() * 8 / (time.perf_counter() - start) / 1e9)
            rt.decode(row, tok, torch.tensor([pos]))  # one untimed step: the variant's first
            times = []
            for i in range(args.steps):
                start, cpu = time.perf_counter(), time.process_time()
                rt.decode(row, tok, torch.tensor([pos + 1 + i]))
                times.append(time.perf_counter() - start)
                cpu_of[name].append((time.process_time() - cpu) / args.threads)
            step = sum(times) / len(times)
            res[name].append((1 / step, nbytes / step / 1e9 / probe))
            steps_of[name] += times
        pos = 35  # every round decodes the same positions
    for r in runtimes.values():
        r._lib = base_lib
        r.skip_matmuls(False)
    width = max(len(n) for n in res)
    first = res[variants[0][0]]
    for name, rows in res.items():
        tok_s = statistics.median(r[0] for r in rows)
        frac = statistics.median(r[1] for r in rows)
        paired = statistics.median(r[0] / f[0] for r, f in zip(rows, first, strict=True))
        print(f"{name:{width}s} {tok_s:7.2f} tok/s  {frac * 100:5.1f}% of the round's probe  "
              f"x{paired:.3f} vs {variants[0][0]} (median of same-round ratios)  "
              f"rounds [{', '.join(f'{r[0]:.1f}' for r in rows)}]")
    # On a loaded machine the fastest steps are the ones that ran with every thread on a core: their
    # times estimate the variants' idle speed better than the means do.
    for name, times in steps_of.items():
        ts = sorted(times)
        print(f"{name:{width}s} fastest step {1 / ts[0]:6.2f} tok/s, 10th percentile {1 / ts[len(ts) // 10]:6.2f}, "
              f"median {1 / ts[len(ts) // 2]:6.2f} ({len(ts)} steps)")
    # CPU time per step and thread: on a machine whose cores are shared, a step's wall time includes the time
    # its threads waited for a core; its CPU time does not (but includes barrier spinning, and other processes
    # still share the memory bandwidth). Cleanest with --threads 1.
    for name, times in cpu_of.items():
        ts = sorted(times)
        print(f"{name:{width}s} by CPU time per thread: median {1 / ts[len(ts) // 2]:6.2f} tok/s, "
              f"10th percentile {1 / ts[len(ts) // 10]:6.2f}")


if __name__ == "__main__":
    main()
