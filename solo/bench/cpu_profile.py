"""Where a native CPU decode step's time goes: per-phase timing inside the step, per thread.

    python -m solo.bench.cpu_profile --shape Llama-3.2-1B [--steps 64] [--context 256] [--quantize int8]

Random weights of a bench shape (`solo bench --shape`), the CPU runtime, batch 1. The kernel's "profile" knob
makes every thread of the step add the time between phase marks (q/k/v product, its barrier wait, RoPE and
cache writes, attention, ...) to per-thread totals; this prints them per token, with the achieved read rate
of each matrix-vector phase over its wall time (the phase plus the barrier wait after it on thread 0), and
the step's total with and without profiling (the marks cost two clock reads per phase). An MoE layer's
phases are "moe router", "moe gate/up" and "moe down", each with its wait; under the default fused schedule
(moe.h) every expert work item falls in "moe down". Measurement only:
noisy on a shared machine, like every timing.
"""

from __future__ import annotations

import argparse
import ctypes
import time

import torch

# decode.cpp's PH_* order.
PHASES = ["embed", "qkv", "qkv wait", "qkv post", "attention", "attn wait", "o", "o wait", "residual",
          "gate/up+act", "mlp wait", "down", "down wait", "head",
          "moe router", "router wait", "moe gate/up", "moe gu wait", "moe down", "moe dn wait"]
# Matrix-vector phases: (phase, the barrier wait after it, the Layer/Model field(s) it reads).
GEMV_PHASES = [("qkv", "qkv wait", "qkv"), ("o", "o wait", "o"), ("gate/up+act", "mlp wait", "gate_up"),
               ("down", "down wait", "down"), ("head", None, "head"),
               ("moe router", "router wait", "router"), ("moe gate/up", "moe gu wait", "gate_up"),
               ("moe down", "moe dn wait", "down")]


def _mat_bytes(mat: ctypes.Structure) -> int:
    """Bytes a decode step reads from one native `Mat` (weights and scales)."""
    n, k, fmt = int(mat.rows), int(mat.cols), int(mat.format)
    if fmt == 0:  # bf16
        return 2 * n * k
    if fmt == 1:  # f32
        return 4 * n * k
    if fmt in (2, 5):  # int8 + a float32 scale per row
        return n * k + 4 * n
    if fmt == 7:  # bf16 packed for the amx level: rows padded to 16, columns to 32
        return 2 * (-(-n // 16) * 16) * (-(-k // 32) * 32)
    return n * k // 2 + 2 * n * (k // 32)  # int4 + a bf16 scale per group of 32


def profile(runtime: object, steps: int, context: int) -> dict[str, object]:
    """Time `steps` batch-1 decode steps from position `context` with the phase profile on.

    Args:
        runtime: a `solo.runtime.cpu.CpuRuntime` with at least context + 2 * steps + 2 positions reserved.
        steps: decode steps per measurement.
        context: the first step's position.

    Returns:
        {"threads", "ms_per_token", "ms_per_token_unprofiled", "phases": {name: [ms per token per thread]},
         "matrix_bytes": {phase: bytes per token}}.
    """
    lib, struct = runtime._lib, runtime._struct
    nt = runtime.num_threads
    runtime.threads.enabled = False  # the thread count stays fixed while measuring
    runtime.threads.threads = nt
    ids, rows = torch.tensor([5]), torch.tensor([0])

    def run(start: int) -> float:
        t0 = time.perf_counter()
        for i in range(steps):
            runtime.decode(rows, ids, torch.tensor([start + i]))
        return (time.perf_counter() - t0) / steps

    run(context)  # warm-up
    plain = run(context)
    lib.solo_set_knob(b"profile", 1)
    try:
        profiled = run(context + steps)
        out = (ctypes.c_double * (nt * len(PHASES)))()
        count = lib.solo_profile(out, nt)
    finally:
        lib.solo_set_knob(b"profile", 0)
    phases = {name: [out[t * len(PHASES) + p] / max(count, 1) / 1e6 for t in range(nt)]
              for p, name in enumerate(PHASES)}
    layers = [struct.layer[i] for i in range(runtime.config.num_layers)]
    moe = runtime._moe_layers if getattr(runtime, "_moe_layers", None) is not None else None
    moe_layers = [moe[i] for i in range(runtime.config.num_layers)] if moe is not None else []
    matrix_bytes = {}
    for phase, _, field in GEMV_PHASES:
        if phase.startswith("moe"):  # the selected experts (top_k of each MoE layer) and the router
            per = 1 if field == "router" else None
            matrix_bytes[phase] = sum(_mat_bytes(getattr(e, field)) * (per or int(e.top_k))
                                      for e in moe_layers if int(e.experts) > 0)
            continue
        mats = [struct.head] if field == "head" else [getattr(layer, field) for layer in layers]
        matrix_bytes[phase] = sum(_mat_bytes(m) for m in mats)
    if moe_layers and not any(phases["moe gate/up"]):  # the fused MoE schedule: all expert work in "moe down"
        matrix_bytes["moe down"] += matrix_bytes.pop("moe gate/up")
    return {"threads": nt, "ms_per_token": profiled * 1e3, "ms_per_token_unprofiled": plain * 1e3,
            "phases": phases, "matrix_bytes": matrix_bytes}


def report(result: dict[str, object]) -> str:
    """The table `profile` results print as."""
    nt = result["threads"]
    phases = result["phases"]
    lines = [f"{'phase':14s}" + "".join(f"  thread {t} ms" for t in range(nt)) + "   GB/s (bytes / wall)"]
    for name, per_thread in phases.items():
        rate = ""
        for phase, wait, _ in GEMV_PHASES:
            if phase == name and phase in result["matrix_bytes"]:
                wall = per_thread[0] + (phases[wait][0] if wait else 0.0)
                rate = f"{result['matrix_bytes'][phase] / (wall * 1e-3) / 1e9:8.1f}" if wall > 0 else ""
        lines.append(f"{name:14s}" + "".join(f"  {ms:11.3f}" for ms in per_thread) + f"   {rate}")
    lines.append(f"step: {result['ms_per_token']:.2f} ms/token profiled, {result['ms_per_token_unprofiled']:.2f} "
                 f"unprofiled; weights {sum(result['matrix_bytes'].values()) / 1e6:.1f} MB per token")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring."""
    from solo.bench.shapes import build_model, shape_config
    from solo.runtime.cpu import CpuRuntime

    parser = argparse.ArgumentParser(prog="python -m solo.bench.cpu_profile",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--shape", required=True, help="a `solo bench --shape` name")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per measurement")
    parser.add_argument("--context", type=int, default=256, help="position of the first timed step")
    parser.add_argument("--threads", type=int, default=None, help="decode threads (default: torch's)")
    parser.add_argument("--quantize", choices=["int8", "int4"], default=None)
    args = parser.parse_args(argv)
    model = build_model(shape_config(args.shape), torch.bfloat16)
    if args.quantize:
        from solo.runtime.quant import quantize_model

        model = quantize_model(model, args.quantize)
    runtime = CpuRuntime(model, rows=1, max_seq=args.context + 3 * args.steps + 2, num_threads=args.threads)
    runtime.reserve(1, args.context + 3 * args.steps + 2)
    print(f"{args.shape} bf16{' ' + args.quantize if args.quantize else ''}, {runtime.isa} kernels, "
          f"context {args.context}, {args.steps} steps (ms per token)")
    print(report(profile(runtime, args.steps, args.context)))


if __name__ == "__main__":
    main()
