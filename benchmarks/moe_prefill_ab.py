"""Diagnostic of the native CPU runtime's MoE prefill: the native grouped experts against the eager block.

Not a `solo bench` report: TTFT of the native grouped experts (`solo.runtime.cpu_moe.moe_prefill`, the
default) against the eager MoE block that prefill ran before, interleaved in one process on the same runtime
and prompt, so a loaded machine's noise hits both alike.

    python benchmarks/moe_prefill_ab.py --shape Qwen3-30B-A3B-2L --prompt-len 512 --rounds 4

Each round times one whole `CpuRuntime.prefill` per setting (attention, dense parts and LM head included). The
eager block's oneDNN matmuls generate a kernel for every new (tokens, rows, cols) shape; its first rounds pay
for that, the later ones find most shapes cached (a real prompt's expert counts differ from the last one's).
"""

from __future__ import annotations

import argparse
import time

import torch

from solo.bench.shapes import build_model, shape_config
from solo.runtime import cpu_moe
from solo.runtime.cpu import CpuRuntime


def main() -> None:
    """Print per-setting prefill times (s) and the ratio of the medians."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--shape", default="Qwen3-30B-A3B-2L")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    cfg = shape_config(args.shape)
    model = build_model(cfg, torch.bfloat16)
    rt = CpuRuntime(model, num_threads=args.threads)
    rt.reserve(1, args.prompt_len + 8)
    ids = torch.randint(0, cfg.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0))
    native = cpu_moe.moe_prefill

    def eager(lib, struct, layer, block, normed, threads):
        return block(normed[None])[0].contiguous()

    settings = {"native": native, "eager block": eager}
    times: dict[str, list[float]] = {name: [] for name in settings}
    rt.prefill(0, ids)  # warm-up: the dense parts' oneDNN kernels
    for _ in range(args.rounds):
        for name, fn in settings.items():
            cpu_moe.moe_prefill = fn
            time.sleep(0.3)
            start = time.perf_counter()
            rt.prefill(0, ids)
            times[name].append(time.perf_counter() - start)
    cpu_moe.moe_prefill = native
    print(f"{args.shape}, bf16, prompt {args.prompt_len} tokens, {rt.num_threads} threads")
    medians = {}
    for name, ts in times.items():
        medians[name] = sorted(ts)[len(ts) // 2]
        print(f"{name:12s} " + " ".join(f"{t:.3f}" for t in ts) + f" s; min {min(ts):.3f}, median {medians[name]:.3f}")
    print(f"eager / native (medians): {medians['eager block'] / medians['native']:.2f}x")


if __name__ == "__main__":
    main()
