"""Benchmarks of the decode kernels on a CUDA GPU: achieved GB/s per model shape, against measured HBM.

Each kernel module's `__main__` calls one of the `*_benchmark_main` functions here; `main` runs them all
for the model shapes and writes one JSON report:

    python -m solo.runtime.triton.benchtools --json kernels.json [--shapes Llama-3.2-1B,Laneformer-2B]

Method (warm up first, time with CUDA events, report medians, keep the working set out of the L2):
- HBM ceiling: a 2 GiB device-to-device copy (bytes read + written) and a read-only reduction.
- Each kernel is tuned first (`tuning.tune`, which also fills the tuning cache the runtime uses), then
  timed: `do_bench` (median, L2 flushed between runs, one launch each: includes launch latency), and
  "graph": a CUDA graph of back-to-back launches rotating over enough weight copies that they never fit
  the 60 MB L2, replayed and timed with events; on Hopper also "graph_pdl", the same with programmatic
  dependent launch (each kernel's first weight tiles load while the previous kernel finishes). The graph
  numbers are what a decode step sees (kernels back to back in one graph); GB/s counts the weights and
  vectors each launch must read and write once.
- cuBLAS (`torch.nn.functional.linear` at batch 1) is timed the same way for reference.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from solo.runtime.triton.tuning import time_graph

_GIB = 1 << 30
_L2_BYTES = 60 * (1 << 20)

# Model shapes whose kernels are benchmarked (dims as the public configs give them).
SHAPES: dict[str, dict[str, int]] = {
    "Llama-3.2-1B": dict(hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192, vocab=128256),
    "Laneformer-2B": dict(hidden=3072, heads=32, kv_heads=16, head_dim=96, ffn=12288, vocab=32000),
}


def hbm_probe(device: torch.device | str = "cuda", nbytes: int = 2 * _GIB, reps: int = 10) -> dict[str, float]:
    """Measured HBM bandwidth: device-to-device copy (read + write) and a read-only sum.

    Args:
        device: the CUDA device.
        nbytes: buffer size in bytes (default 2 GiB).
        reps: timed repetitions per method.

    Returns:
        {"bytes": buffer bytes, "copy_gbps_best", "copy_gbps_median", "read_gbps_best", "read_gbps_median"},
        bandwidths in GB/s (1e9 bytes per second; the copy counts bytes read plus bytes written).
    """
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    result: dict[str, float] = {"bytes": float(src.numel() * 4)}
    for name, fn, moved in (("copy", lambda: dst.copy_(src), 2 * src.numel() * 4),
                            ("read", lambda: src.sum(), src.numel() * 4)):
        fn()
        torch.cuda.synchronize()
        rates = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            rates.append(moved / (start.elapsed_time(end) / 1e3) / 1e9)
        rates.sort()
        result[f"{name}_gbps_best"] = rates[-1]
        result[f"{name}_gbps_median"] = rates[len(rates) // 2]
    return result


def copies_for(nbytes: int, minimum: int = 2, maximum: int = 48) -> int:
    """How many copies of an operand of `nbytes` bytes keep a rotation's working set at >= 3x the L2 (60 MB).

    Clamped to [minimum, maximum].
    """
    return max(minimum, min(maximum, math.ceil(3 * _L2_BYTES / max(1, nbytes))))


def do_bench_s(fn: Callable[[], Any]) -> float:
    """`triton.testing.do_bench` median, in seconds."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=50, return_mode="median") / 1e3


def _entry(name: str, nbytes: int, graph_s: float | None, bench_s: float | None, hbm_gbps: float,
           graph_pdl_s: float | None = None, **extra: Any) -> dict[str, Any]:  # noqa: ANN401
    entry: dict[str, Any] = {"kernel": name, "bytes": nbytes, **extra}
    for label, seconds in (("graph", graph_s), ("graph_pdl", graph_pdl_s), ("do_bench", bench_s)):
        if seconds:
            entry[f"{label}_us"] = seconds * 1e6
            entry[f"{label}_gbps"] = nbytes / seconds / 1e9
            entry[f"{label}_hbm_fraction"] = nbytes / seconds / 1e9 / hbm_gbps if hbm_gbps else None
    return entry


def _randn(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(dtype)


def _bench_weight_kernel(name: str, nbytes: int, run: Callable[[torch.Tensor, Any, bool], Any],
                         ws: list[torch.Tensor], kernel: str, shape: dict[str, Any], candidates: tuple,
                         default: Any, hbm_gbps: float, **extra: Any) -> dict[str, Any]:  # noqa: ANN401
    """Tune a weight-streaming kernel as the decode step does, then time it three ways.

    Args:
        name: report name.
        nbytes: bytes one launch must move.
        run: run(weight, config, pdl) launches the kernel once.
        ws: weight copies rotated through (`copies_for`).
        kernel, shape: the tuning key's kernel name and shape fields (`tuning.make_key`, plus `pdl`).
        candidates, default: `tuning.tune`'s candidates and reference.
        hbm_gbps: GB/s denominator of the fractions.
        extra: more report fields.

    Returns:
        The report entry: graph (back to back, no PDL), graph_pdl (back to back with programmatic dependent
        launch, Hopper only: weight tiles load before each kernel's wait) and do_bench timings.
    """
    from solo.runtime.triton import tuning
    from solo.runtime.triton.common import pdl_mode, pdl_supported

    pdl = pdl_supported()
    key = tuning.make_key(kernel, **shape, pdl=pdl_mode(pdl))
    config = tuning.tune(key, candidates, lambda c: run(ws[0], c, False), default,
                         graph_launches=lambda c: [lambda w=w: run(w, c, pdl) for w in ws])

    def graph_s(use_pdl: bool) -> float:
        return time_graph([lambda w=w: run(w, config, use_pdl) for w in ws])

    return _entry(name, nbytes, graph_s(False), do_bench_s(lambda: run(ws[0], config, False)), hbm_gbps,
                  graph_pdl_s=graph_s(True) if pdl else None, config=repr(config), **extra)


def bench_gemv(n: int, k: int, hbm_gbps: float, residual: bool = True, label: str = "") -> list[dict[str, Any]]:
    """Split-K GEMV (tuned) and cuBLAS on [n, k] bf16 weights.

    Args:
        n, k: weight shape [N, K].
        hbm_gbps: measured HBM bandwidth in GB/s (the denominator of `*_hbm_fraction`).
        residual: time the residual-add epilogue.
        label: suffix of the report's kernel names.

    Returns:
        Report entries (bytes moved, microseconds and GB/s per timing method, the chosen configuration).
    """
    from solo.runtime.triton import gemv

    copies = copies_for(n * k * 2)
    ws = [_randn(n, k) for _ in range(copies)]
    x, res, out = _randn(k), _randn(n), torch.empty(n, dtype=torch.bfloat16, device="cuda")
    default = gemv.default_config(n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    workspaces = {c: gemv.SplitKWorkspace(n, c, "cuda") for c in (default, *gemv.CANDIDATES) if c.split_k > 1}

    def run(w: torch.Tensor, c: gemv.GemvConfig, pdl: bool) -> torch.Tensor:
        return gemv.gemv(w, x, out, residual=res if residual else None, config=c, workspace=workspaces.get(c),
                         pdl=pdl)

    nbytes = n * k * 2 + k * 2 + n * 2 * (2 if residual else 1)
    results = [_bench_weight_kernel(f"gemv{label}", nbytes, run, ws, "gemv",
                                    dict(n=n, k=k, residual=residual, dtype="bfloat16"), gemv.CANDIDATES, default,
                                    hbm_gbps, n=n, k=k)]
    xs = x.view(1, k)
    results.append(_entry(f"cublas_linear{label}", n * k * 2 + k * 2 + n * 2,
                          time_graph([lambda w=w: torch.nn.functional.linear(xs, w) for w in ws]),
                          do_bench_s(lambda: torch.nn.functional.linear(xs, ws[0])), hbm_gbps, n=n, k=k))
    return results


def bench_rmsnorm_gemv(n: int, k: int, hbm_gbps: float, label: str = "") -> list[dict[str, Any]]:
    """RMSNorm + GEMV (the LM head) on [n, k] bf16 weights, tuned, with float32 output (args as `bench_gemv`)."""
    from solo.runtime.triton import rmsnorm_gemv

    copies = copies_for(n * k * 2)
    ws = [_randn(n, k) for _ in range(copies)]
    x, norm = _randn(k), _randn(k)
    out = torch.empty(n, dtype=torch.float32, device="cuda")
    default = rmsnorm_gemv.default_config(n, k, torch.cuda.get_device_properties(0).multi_processor_count)

    def run(w: torch.Tensor, c: rmsnorm_gemv.RmsNormGemvConfig, pdl: bool) -> torch.Tensor:
        return rmsnorm_gemv.rmsnorm_gemv(x, norm, w, 1e-5, out, config=c, pdl=pdl)

    nbytes = n * k * 2 + 2 * k * 2 + n * 4
    return [_bench_weight_kernel(f"rmsnorm_gemv{label}", nbytes, run, ws, "rmsnorm_gemv",
                                 dict(n=n, k=k, dtype="bfloat16"), rmsnorm_gemv.CANDIDATES, default, hbm_gbps,
                                 n=n, k=k)]


def bench_qkv_rope(shape: dict[str, int], hbm_gbps: float, label: str = "") -> list[dict[str, Any]]:
    """RMSNorm + QKV + RoPE + cache write for a `SHAPES` entry, bf16, tuned (other args as `bench_gemv`)."""
    from solo.runtime.triton import qkv_rope

    h, hq, hkv, hd = shape["hidden"], shape["heads"], shape["kv_heads"], shape["head_dim"]
    rows = (hq + 2 * hkv) * hd
    copies = copies_for(rows * h * 2)
    ws = [_randn(rows, h) for _ in range(copies)]
    x, norm = _randn(h), _randn(h)
    cos, sin = torch.randn(1024, hd // 2, device="cuda"), torch.randn(1024, hd // 2, device="cuda")
    state = torch.zeros(8, dtype=torch.int64, device="cuda")
    state[1] = 300
    q = torch.empty(hq * hd, dtype=torch.bfloat16, device="cuda")
    kc = torch.zeros(1, hkv, 1024, hd, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)

    def run(w: torch.Tensor, c: qkv_rope.QkvRopeConfig, pdl: bool) -> torch.Tensor:
        qkv_rope.qkv_rope(x, norm, w, 1e-5, cos, sin, state, q, kc, vc, num_heads=hq, num_kv_heads=hkv,
                          head_dim=hd, config=c, pdl=pdl)
        return q

    nbytes = rows * h * 2 + 2 * h * 2 + rows * 2
    return [_bench_weight_kernel(f"qkv_rope{label}", nbytes, run, ws, "qkv_rope",
                                 dict(hidden=h, heads=hq, kv_heads=hkv, head_dim=hd, dtype="bfloat16"),
                                 qkv_rope.CANDIDATES, qkv_rope.QkvRopeConfig(), hbm_gbps, n=rows, k=h)]


def bench_gated_mlp(shape: dict[str, int], hbm_gbps: float, label: str = "") -> list[dict[str, Any]]:
    """RMSNorm + gate/up + SiLU for a `SHAPES` entry, bf16, tuned (other args as `bench_gemv`)."""
    from solo.runtime.triton import swiglu

    h, f = shape["hidden"], shape["ffn"]
    copies = copies_for(2 * f * h * 2)
    ws = [_randn(2 * f, h) for _ in range(copies)]
    x, norm = _randn(h), _randn(h)
    out = torch.empty(f, dtype=torch.bfloat16, device="cuda")

    def run(w: torch.Tensor, c: swiglu.GatedMlpConfig, pdl: bool) -> torch.Tensor:
        return swiglu.gated_mlp(x, w, out, norm_weight=norm, eps=1e-5, config=c, pdl=pdl)

    nbytes = 2 * f * h * 2 + 2 * h * 2 + f * 2
    return [_bench_weight_kernel(f"gated_mlp{label}", nbytes, run, ws, "gated_mlp",
                                 dict(f=f, hidden=h, act="silu", dtype="bfloat16"), swiglu.CANDIDATES,
                                 swiglu.GatedMlpConfig(), hbm_gbps, n=2 * f, k=h)]


def bench_attention(shape: dict[str, int], context: int, hbm_gbps: float, label: str = "") -> list[dict[str, Any]]:
    """Flash-decoding attention at `context` tokens (bf16 cache sized to the context; args as `bench_gemv`)."""
    from solo.runtime.triton import attention

    hq, hkv, hd = shape["heads"], shape["kv_heads"], shape["head_dim"]
    kv_bytes = 2 * hkv * context * hd * 2
    copies = copies_for(kv_bytes, maximum=16)
    caches = [(_randn(1, hkv, context, hd), _randn(1, hkv, context, hd)) for _ in range(copies)]
    q, out = _randn(hq * hd), torch.empty(hq * hd, dtype=torch.bfloat16, device="cuda")
    state = torch.zeros(8, dtype=torch.int64, device="cuda")
    state[1] = context - 1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = attention.AttentionPlan(context, hq, hkv, hd, "cuda", sms)

    def launch(kc: torch.Tensor, vc: torch.Tensor) -> Callable[[], Any]:
        return lambda: attention.decode_attention(q, kc, vc, state, out, num_heads=hq, num_kv_heads=hkv,
                                                  head_dim=hd, scale=hd**-0.5, plan=plan)

    return [_entry(f"attention{label}", kv_bytes + 2 * hq * hd * 2, time_graph([launch(*c) for c in caches]),
                   do_bench_s(launch(*caches[0])), hbm_gbps, context=context, min_partition=plan.partition,
                   partitions=plan.num_parts)]


def bench_sampling(vocab: int, hbm_gbps: float, label: str = "") -> list[dict[str, Any]]:
    """Greedy and Gumbel-max sampling steps over float32 logits [vocab] (two launches each; hbm_gbps in GB/s)."""
    from solo.runtime.cuda.state import DecodeState, SamplingSpec
    from solo.runtime.triton import sampling

    st = DecodeState(vocab, 16, torch.device("cuda"))
    st.start(0, 0, 0, 1 << 30, SamplingSpec(temperature=0.8, seed=1), frozenset())
    logits = torch.randn(vocab, device="cuda")
    plan = sampling.SamplerPlan(vocab, "cuda")
    results = []
    for mode in (sampling.MODE_GREEDY, sampling.MODE_SAMPLE):
        def run(mode: int = mode) -> None:
            sampling.sample_step(logits, st.state, st.params, st.threshold, st.stop_mask, st.out_tokens, 0, mode, plan)

        results.append(_entry(f"sample_mode{mode}{label}", vocab * 4, time_graph([run]), do_bench_s(run), hbm_gbps,
                              vocab=vocab))
    return results


def _guarded(results: list[dict[str, Any]], name: str, fn: Callable[[], list[dict[str, Any]]]) -> None:
    start = time.perf_counter()
    try:
        entries = fn()
        for e in entries:
            e["seconds_total"] = round(time.perf_counter() - start, 2)
        results.extend(entries)
    except Exception as exc:  # one kernel failing must not hide the others
        results.append({"kernel": name, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
    torch.cuda.empty_cache()


def run_shape(name: str, shape: dict[str, int], hbm_gbps: float, contexts: tuple[int, ...]) -> list[dict[str, Any]]:
    """Every decode kernel of one model shape (hbm_gbps in GB/s; contexts in tokens for attention)."""
    h, hq, hd, f, v = shape["hidden"], shape["heads"], shape["head_dim"], shape["ffn"], shape["vocab"]
    tag = f"[{name}]"
    results: list[dict[str, Any]] = []
    _guarded(results, f"qkv_rope{tag}", lambda: bench_qkv_rope(shape, hbm_gbps, tag))
    _guarded(results, f"o_proj{tag}", lambda: bench_gemv(h, hq * hd, hbm_gbps, True, f"[o]{tag}"))
    _guarded(results, f"gated_mlp{tag}", lambda: bench_gated_mlp(shape, hbm_gbps, tag))
    _guarded(results, f"down_proj{tag}", lambda: bench_gemv(h, f, hbm_gbps, True, f"[down]{tag}"))
    _guarded(results, f"lm_head{tag}", lambda: bench_rmsnorm_gemv(v, h, hbm_gbps, f"[head]{tag}"))
    for context in contexts:
        _guarded(results, f"attention{tag}", lambda c=context: bench_attention(shape, c, hbm_gbps, f"[{c}]{tag}"))
    _guarded(results, f"sampling{tag}", lambda: bench_sampling(v, hbm_gbps, tag))
    return results


def _print_table(report: dict[str, Any]) -> None:
    hbm = report["hbm"]
    print(f"HBM: copy {hbm.get('copy_gbps_median', 0):.0f} GB/s (read+write), read {hbm.get('read_gbps_median', 0):.0f}"
          " GB/s (median)")
    print(f"{'kernel':<44} {'MB':>8} {'graph us':>9} {'GB/s':>7} {'%HBM':>5} {'PDL us':>7} {'%HBM':>5} "
          f"{'bench us':>9} {'GB/s':>7}  config")
    for e in report["kernels"]:
        if "error" in e:
            print(f"{e['kernel']:<44} ERROR {e['error'][:150]}")
            continue
        frac, pdl_frac = e.get("graph_hbm_fraction"), e.get("graph_pdl_hbm_fraction")
        print(f"{e['kernel']:<44} {e['bytes'] / 1e6:>8.2f} {e.get('graph_us', 0):>9.1f} {e.get('graph_gbps', 0):>7.0f} "
              f"{(frac or 0) * 100:>4.0f}% {e.get('graph_pdl_us', 0):>7.1f} {(pdl_frac or 0) * 100:>4.0f}% "
              f"{e.get('do_bench_us', 0):>9.1f} {e.get('do_bench_gbps', 0):>7.0f}  {e.get('config', '')}")


def main(argv: list[str] | None = None) -> int:
    """Benchmark every kernel for the chosen shapes; write --json; print a table."""
    parser = argparse.ArgumentParser(description="achieved GB/s of Solo's decode kernels")
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated shape names")
    parser.add_argument("--contexts", default="384,4096,32768", help="attention context lengths")
    parser.add_argument("--only", default=None, help="run only kernels whose group name contains this")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark", file=sys.stderr)
        return 1
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        pass
    report["hbm"] = hbm_probe()
    hbm = report["hbm"]["copy_gbps_median"]
    contexts = tuple(int(c) for c in args.contexts.split(",") if c)
    report["kernels"] = []
    for name in args.shapes.split(","):
        if name in SHAPES:
            report["kernels"].extend(run_shape(name, SHAPES[name], hbm, contexts))
            if args.json:  # partial results survive a timeout
                with open(args.json, "w") as f:
                    json.dump(report, f, indent=1)
    _print_table(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _single(kind: str) -> None:
    # Entry of a kernel module's __main__: the same report, one kernel group (name matching `kind`).
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark", file=sys.stderr)
        return
    hbm = hbm_probe()
    results: list[dict[str, Any]] = []
    for name, shape in SHAPES.items():
        results.extend(e for e in run_shape(name, shape, hbm["copy_gbps_median"], (384, 32768))
                       if e["kernel"].startswith(kind))
    _print_table({"hbm": hbm, "kernels": results})


def gemv_benchmark_main() -> None:
    """`python -m solo.runtime.triton.gemv`."""
    _single("gemv")


def rmsnorm_gemv_benchmark_main() -> None:
    """`python -m solo.runtime.triton.rmsnorm_gemv`."""
    _single("rmsnorm_gemv")


def qkv_rope_benchmark_main() -> None:
    """`python -m solo.runtime.triton.qkv_rope`."""
    _single("qkv_rope")


def attention_benchmark_main() -> None:
    """`python -m solo.runtime.triton.attention`."""
    _single("attention")


def gated_mlp_benchmark_main() -> None:
    """`python -m solo.runtime.triton.swiglu`."""
    _single("gated_mlp")


def sampling_benchmark_main() -> None:
    """`python -m solo.runtime.triton.sampling`."""
    _single("sample")


if __name__ == "__main__":
    sys.exit(main())
