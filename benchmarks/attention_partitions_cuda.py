r"""Diagnostic of the CUDA flash-decoding attention (not a `solo bench` report): partitionings side by side.

A decode step's attention reads the keys and values of positions 0..pos from a cache sized for the longest
sequence. This times `solo.runtime.triton.attention.decode_attention` (the kernel and the combine, replayed
in a CUDA graph) at several positions of one cache, for each partitioning given as
"name=min_partition:ctas_per_sm[:grid_partition]" (dynamic lengths, the default plan's kind; see
`AttentionPlan`) or "name=fixed:N" (every partition N keys, the plan before dynamic lengths), and prints
microseconds per call and the GB/s of the keys and values read:

    python benchmarks/attention_partitions_cuda.py --shape Llama-3.2-1B --max-seq 131072 \
        --positions 128,8192,32768,131000 --variant fixed=fixed:1024 --variant default=128:4:256

Needs a CUDA GPU. Measurement only, like every timing.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from solo.bench.shapes import shape_config
from solo.runtime.triton.attention import (
    CTAS_PER_SM,
    GRID_PARTITION,
    MIN_PARTITION,
    AttentionPlan,
    decode_attention,
)


def _plan(spec: str, max_seq: int, heads: int, kv_heads: int, head_dim: int, sms: int) -> AttentionPlan:
    fields = spec.split(":")
    if fields[0] == "fixed":
        return AttentionPlan(max_seq, heads, kv_heads, head_dim, "cuda", sms, partition=int(fields[1]))
    grid = {"grid_partition": int(fields[2])} if len(fields) > 2 else {}
    return AttentionPlan(max_seq, heads, kv_heads, head_dim, "cuda", sms, min_partition=int(fields[0]),
                         ctas_per_sm=int(fields[1]), **grid)


def main() -> None:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--shape", default="Llama-3.2-1B", help="a `solo bench --shape` name (its attention geometry)")
    ap.add_argument("--max-seq", type=int, default=131072, help="cache length (positions per row)")
    ap.add_argument("--positions", default="128,2048,8192,32768,131000")
    ap.add_argument("--variant", action="append", default=[],
                    help="name=min_partition:ctas_per_sm[:grid_partition] or name=fixed:N (repeatable; default: "
                    "the plan's default)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    cfg = shape_config(args.shape)
    heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    variants = [v.split("=", 1) for v in args.variant] or [
        ["default", f"{MIN_PARTITION}:{CTAS_PER_SM}:{GRID_PARTITION}"]]
    positions = [int(p) for p in args.positions.split(",")]
    kc = torch.randn(1, kv_heads, args.max_seq, head_dim, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(heads * head_dim, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    state = torch.zeros(8, dtype=torch.int64, device="cuda")
    results: dict[str, object] = {"shape": args.shape, "max_seq": args.max_seq, "gpu": torch.cuda.get_device_name(0),
                                  "positions": positions, "variants": {}}
    print(f"{args.shape}: {heads} heads, {kv_heads} KV heads, head_dim {head_dim}, cache {args.max_seq} positions, "
          f"{results['gpu']} ({sms} SMs); us per call (GB/s of keys and values)")
    reference = {}
    for name, spec in variants:
        plan = _plan(spec, args.max_seq, heads, kv_heads, head_dim, sms)
        row = []
        for pos in positions:
            state[1] = pos

            def call(plan: AttentionPlan = plan) -> None:
                decode_attention(q, kc, vc, state, out, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                                 scale=head_dim**-0.5, plan=plan)

            call()
            torch.cuda.synchronize()
            if pos not in reference:
                reference[pos] = out.clone()
            err = float((out.float() - reference[pos].float()).abs().max())
            us = triton.testing.do_bench_cudagraph(call, rep=50) * 1e3
            gbps = 2 * kv_heads * (pos + 1) * head_dim * 2 / (us * 1e-6) / 1e9
            row.append({"position": pos, "us": round(us, 2), "kv_gbps": round(gbps, 1), "max_abs_diff": err})
        results["variants"][name] = {"spec": spec, "partition": plan.partition, "num_parts": plan.num_parts,
                                     "points": row}
        print(f"{name:>10} ({spec}, {plan.num_parts} partitions per KV head): "
              + "  ".join(f"{p['position']}: {p['us']:.1f} ({p['kv_gbps']:.0f})" for p in row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
