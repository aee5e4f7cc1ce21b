"""End-to-end GPU decode benchmark of the CUDA-graph runtime: tok/s against the HBM roofline and peers.

Batch-1 greedy generation on a named model shape with random bf16 weights (speed depends on shapes,
not values), timed as the engine runs it: prefill and the first token (TTFT), then the decode of the
remaining tokens, in block mode (`iter_blocks`: one host sync per K tokens) or token mode (`decode`
plus a host argmax per token). Every engine is warmed up at the exact timed lengths first, so tuning,
compilation and graph capture stay out of the numbers; each is timed `--repeats` times (median).

    python -m solo.runtime.cuda.bench --shape Llama-3.2-1B --engines triton,torch --json solo.json
    python -m solo.runtime.cuda.bench --shape Llama-3.2-1B --peer hf-compile --json hf.json
    python -m solo.runtime.cuda.bench --summarize solo.json hf.json ...   # one table from several runs
    python -m solo.runtime.cuda.bench --shape Llama-3.2-1B --engines megakernel:block:256,triton:block:16 \
        --with-peer hf-compile --json mk.json    # Solo engines and a peer in one run (one roofline)

Engines: "<step>[:block|:token][:K]" with a step from `solo.runtime.cuda.runtime.STEPS` (triton,
triton-pdl, torch, compiled, compiled-max-autotune), e.g. "triton:block:16", "triton:token", or
"megakernel" (`solo.runtime.megakernel`: K tokens per persistent-kernel launch), e.g. "megakernel:block:256".
Peers run in their own process (a slow compile can be cut off by a timeout without losing Solo's
numbers): "hf-compile" is transformers with a static cache and torch.compile(mode="reduce-overhead"),
through `solo.bench.peers.hf`.

The roofline divides the measured bandwidth (the larger of a device copy and a read-only reduction,
measured in the same process) by the bytes a token must read: every weight once plus the KV cache at
the mean context (`solo.bench.roofline.decode_bytes`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from solo.model.config import ModelConfig
from solo.model.transformer import Transformer


def shape_raw(name: str) -> dict[str, Any]:
    """The config.json fields of a named shape (from `solo.bench.shapes`).

    Raises:
        SystemExit: an unknown shape name.
    """
    from solo.bench.shapes import SHAPES

    if name not in SHAPES:
        raise SystemExit(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    return dict(SHAPES[name])


def build_random_model(config: ModelConfig, dtype: torch.dtype, device: str = "cuda", seed: int = 0,
                       std: float = 0.02) -> Transformer:
    """The eager model with N(0, std^2) matrices and unit norms, initialised on the device (fast)."""
    from solo.bench.shapes import build_model

    return build_model(config, dtype, seed=seed, std=std, device=device)


def roofline_bytes(config: ModelConfig, model: Transformer, context: int) -> dict[str, int]:
    """Bytes one decode token reads at `context` tokens: weights (LM head included, one embedding row), KV cache.

    Returns:
        {"weights", "kv_cache", "total"} in bytes.
    """
    try:
        from solo.bench.roofline import decode_bytes

        b = decode_bytes(config, _element_size(model), context)
        return {"weights": b.weights, "kv_cache": b.kv_cache, "total": b.total}
    except ImportError:
        from solo.runtime.cuda.weights import weight_bytes_per_token

        kv = 2 * config.num_layers * config.num_kv_heads * config.head_dim * context * _element_size(model)
        w = weight_bytes_per_token(model)
        return {"weights": w, "kv_cache": kv, "total": w + kv}


def _element_size(model: torch.nn.Module) -> int:
    return next(model.parameters()).element_size()


def parse_engine(spec: str, default_block: int) -> tuple[str, str, int]:
    """"triton:block:16" -> ("triton", "block", 16); mode defaults to block, K to `default_block`.

    Raises:
        SystemExit: a mode other than block or token.
    """
    parts = spec.split(":")
    step = parts[0]
    mode = parts[1] if len(parts) > 1 else "block"
    k = int(parts[2]) if len(parts) > 2 else default_block
    if mode not in ("block", "token"):
        raise SystemExit(f"engine {spec!r}: mode must be block or token")
    return step, mode, k


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def run_once(runtime: Any, prompt: list[int], gen_len: int, mode: str, k: int) -> dict[str, Any]:  # noqa: ANN401
    """One timed greedy generation of `gen_len` tokens in "block" (K tokens per sync) or "token" mode.

    Returns:
        {"ttft_s", "decode_s"} in seconds, "decode_tokens", host-sync counts and the generated "tokens".
    """
    from solo.runtime.cuda.state import SamplingSpec

    runtime.reserve(1, len(prompt) + gen_len + 1)
    ids = torch.tensor(prompt, dtype=torch.long)
    _sync(runtime.device)
    syncs = runtime.host_syncs
    start = time.perf_counter()
    token = int(runtime.prefill(0, ids).argmax())
    first = time.perf_counter()
    syncs_decode = runtime.host_syncs
    tokens = [token]
    if mode == "block":
        for block in runtime.iter_blocks(0, token, len(prompt), SamplingSpec(), frozenset(), gen_len - 1, k=k):
            tokens.extend(block)
    else:
        row = torch.zeros(1, dtype=torch.long)
        position = len(prompt)
        for _ in range(gen_len - 1):
            logits = runtime.decode(row, torch.tensor([token]), torch.tensor([position]))
            token = int(logits[0].argmax())
            tokens.append(token)
            position += 1
    _sync(runtime.device)
    end = time.perf_counter()
    return {"ttft_s": first - start, "decode_s": end - first, "decode_tokens": len(tokens) - 1,
            "host_syncs_total": runtime.host_syncs - syncs, "host_syncs_decode": runtime.host_syncs - syncs_decode,
            "tokens": tokens}


def summarize_runs(runs: list[dict[str, Any]], roofline_tps: float) -> dict[str, Any]:
    """Median / min / max of decode tokens/s and TTFT (ms), ms per token, host syncs per token, roofline fraction.

    Args:
        runs: `run_once` results.
        roofline_tps: the roofline's tokens per second (0 leaves the fraction None).
    """
    tps = sorted(r["decode_tokens"] / r["decode_s"] for r in runs)
    ttft = sorted(r["ttft_s"] for r in runs)
    tokens = sum(r["decode_tokens"] + 1 for r in runs)
    decode_tokens = sum(r["decode_tokens"] for r in runs)
    return {
        "decode_tok_s": {"median": statistics.median(tps), "min": tps[0], "max": tps[-1]},
        "ttft_ms": {"median": 1e3 * statistics.median(ttft), "min": 1e3 * ttft[0], "max": 1e3 * ttft[-1]},
        "ms_per_token": 1e3 / statistics.median(tps),
        "host_syncs_per_token": sum(r["host_syncs_total"] for r in runs) / tokens,
        "host_syncs_per_decode_token": sum(r["host_syncs_decode"] for r in runs) / decode_tokens,
        "roofline_fraction": statistics.median(tps) / roofline_tps if roofline_tps else None,
        "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs],
    }


def bench_solo(args: argparse.Namespace, report: dict[str, Any], model: Transformer, prompt: list[int],
               roofline_tps: float) -> None:
    """Time each Solo engine; results go into report["engines"] as they come (saved after each)."""
    from solo.runtime.cuda.runtime import CudaGraphRuntime

    tokens_by_engine: dict[str, list[int]] = {}
    for spec in args.engines.split(","):
        step, mode, k = parse_engine(spec, args.block_size)
        name = f"solo-{step}-{mode}" + (f"-k{k}" if mode == "block" else "")
        entry: dict[str, Any] = {"step": step, "mode": mode, "block_size": k if mode == "block" else 1}
        report["engines"][name] = entry
        try:
            t0 = time.perf_counter()
            if step == "megakernel":
                from solo.runtime.megakernel.runtime import MegakernelRuntime

                runtime = MegakernelRuntime(model, max_launch_tokens=max(k, 1))
            else:
                runtime = CudaGraphRuntime(model, step=step, block_size=max(k, 1), max_block=max(64, k))
            runtime.reserve(1, len(prompt) + args.gen_len + 1)
            run_once(runtime, prompt, args.gen_len, mode, k)  # tunes, compiles, captures
            entry["setup_s"] = time.perf_counter() - t0
            runs = [run_once(runtime, prompt, args.gen_len, mode, k) for _ in range(args.repeats)]
            entry.update(summarize_runs(runs, roofline_tps))
            entry["runtime"] = runtime.describe()
            tokens_by_engine[name] = runs[0]["tokens"]
            del runtime
        except Exception as exc:  # one engine failing must not hide the others
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:1000]}"
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        _save(args.json, report)
        print(_line(name, entry), file=sys.stderr)
    # Greedy agreement between engines on the same weights (bf16: they may drift apart after a while).
    names = list(tokens_by_engine)
    if names:
        ref = tokens_by_engine[names[0]]
        report["greedy_agreement"] = {
            n: next((i for i, (a, b) in enumerate(zip(ref, t, strict=False)) if a != b), min(len(ref), len(t)))
            for n, t in tokens_by_engine.items()
        }
        report["greedy_agreement_reference"] = names[0]


def _peer_runs(run: Any, prompt: list[int], gen_len: int, repeats: int) -> list[dict[str, Any]]:  # noqa: ANN401
    for _ in range(2):  # compile for the prefill and decode shapes, record the graphs
        run(prompt, gen_len)
    runs = []
    for _ in range(repeats):
        ttft_s, decode_s, decode_tokens = run(prompt, gen_len)
        runs.append({"ttft_s": ttft_s, "decode_s": decode_s, "decode_tokens": decode_tokens,
                     "host_syncs_total": 0, "host_syncs_decode": 0})
    return runs


def _solo_bench_peer(model: Transformer, raw: dict[str, Any], prompt: list[int], gen_len: int,
                     compiled: bool) -> tuple[Any, str]:  # noqa: ANN401
    """`solo bench`'s transformers peer (`solo.bench.peers.hf`), sharing Solo's weights."""
    from solo.bench.peers import PeerSpec
    from solo.bench.peers.hf import HFPeer

    spec = PeerSpec(model=model, raw_config=raw, dtype=model.dtype, quantize=None, device=model.device,
                    threads=torch.get_num_threads(), max_seq=len(prompt) + gen_len + 1)
    peer = HFPeer(spec, compiled=compiled)

    def run(prompt: list[int], gen_len: int) -> tuple[float, float, int]:
        r = peer.run(prompt, gen_len)
        return r.ttft_s, r.decode_s, r.decode_tokens

    return run, peer.build_info


def _own_hf_peer(raw: dict[str, Any], dtype: torch.dtype, compiled: bool,
                 device: str = "cuda") -> tuple[Any, str]:  # noqa: ANN401
    """A minimal transformers peer with its own random weights.

    `generate` with a static cache and its own torch.compile(mode="reduce-overhead") of the decode step;
    TTFT is a 1-token generate, the decode time the difference to a full one.
    """
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype", "dtype")}
    config = AutoConfig.for_model("llama", **fields)
    with torch.device(device):
        try:
            hf = AutoModelForCausalLM.from_config(config, dtype=dtype)
        except TypeError:
            hf = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    hf.eval().requires_grad_(False)
    mode = "eager"
    if compiled:
        # generate compiles the decode step itself (mode "reduce-overhead") and keeps the prefill eager.
        hf.generation_config.cache_implementation = "static"
        hf.generation_config.disable_compile = False
        mode = "static cache + generate's torch.compile(mode='reduce-overhead') of the decode step"

    def generate(ids: torch.Tensor, n: int) -> float:
        _sync(ids.device)
        start = time.perf_counter()
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0, eos_token_id=None)
        _sync(ids.device)
        if out.shape[1] != ids.shape[1] + n:
            raise RuntimeError(f"generate made {out.shape[1] - ids.shape[1]} tokens, not {n}")
        return time.perf_counter() - start

    @torch.inference_mode()
    def run(prompt: list[int], gen_len: int) -> tuple[float, float, int]:
        ids = torch.tensor([prompt], device=device)
        ttft = generate(ids, 1)
        total = generate(ids, gen_len)
        return ttft, total - ttft, gen_len - 1

    return run, f"transformers {transformers.__version__} (own peer), {mode}, {dtype}"


def bench_peer(args: argparse.Namespace, report: dict[str, Any], model: Transformer, raw: dict[str, Any],
               prompt: list[int], roofline_tps: float) -> None:
    """Time a transformers peer: `solo bench`'s (same weights), else a minimal one of our own."""
    entry: dict[str, Any] = {}
    report["engines"][args.peer] = entry
    compiled = args.peer == "hf-compile"
    t0 = time.perf_counter()
    try:
        run, entry["build"] = _solo_bench_peer(model, raw, prompt, args.gen_len, compiled)
        runs = _peer_runs(run, prompt, args.gen_len, args.repeats)
    except Exception as exc:
        entry["solo_bench_peer_error"] = f"{type(exc).__name__}: {str(exc)[:1000]}"
        try:
            run, entry["build"] = _own_hf_peer(raw, model.dtype, compiled)
            runs = _peer_runs(run, prompt, args.gen_len, args.repeats)
        except Exception as exc2:
            entry["error"] = f"{type(exc2).__name__}: {str(exc2)[:1000]}"
            runs = []
    entry["setup_s"] = time.perf_counter() - t0
    if runs:
        entry.update(summarize_runs(runs, roofline_tps))
        entry.pop("host_syncs_per_token")
        entry.pop("host_syncs_per_decode_token")
    _save(args.json, report)
    print(_line(args.peer, entry), file=sys.stderr)


def _line(name: str, e: dict[str, Any]) -> str:
    if "error" in e:
        return f"{name:<28} ERROR {e['error'][:300]}"
    if "decode_tok_s" not in e:
        return f"{name:<28} (no result)"
    frac = e.get("roofline_fraction")
    syncs = e.get("host_syncs_per_token")
    return (f"{name:<28} {e['decode_tok_s']['median']:>8.1f} tok/s [{e['decode_tok_s']['min']:.0f}-"
            f"{e['decode_tok_s']['max']:.0f}]  {e['ms_per_token']:.3f} ms/tok  TTFT {e['ttft_ms']['median']:.1f} ms  "
            f"roofline {frac * 100 if frac else 0:.1f}%" + (f"  syncs/tok {syncs:.3f}" if syncs is not None else ""))


def _save(path: str | None, report: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1, default=str))


def summarize_files(paths: list[str]) -> dict[str, Any]:
    """Merge bench JSON files: per shape, every engine, best Solo engine vs each peer."""
    shapes: dict[str, Any] = {}
    for p in paths:
        try:
            data = json.loads(Path(p).read_text())
        except (OSError, ValueError):
            continue
        shape = shapes.setdefault(data.get("shape", "?"), {"engines": {}, "roofline": data.get("roofline")})
        shape["engines"].update(data.get("engines", {}))
        if data.get("roofline"):
            shape["roofline"] = data["roofline"]
    for shape in shapes.values():
        ok = {n: e for n, e in shape["engines"].items() if "decode_tok_s" in e}
        solo = {n: e for n, e in ok.items() if n.startswith("solo-")}
        if solo:
            best = max(solo, key=lambda n: solo[n]["decode_tok_s"]["median"])
            shape["best_solo"] = best
            best_tps = solo[best]["decode_tok_s"]["median"]
            shape["best_solo_tok_s"] = best_tps
            shape["best_solo_roofline_fraction"] = solo[best].get("roofline_fraction")
            shape["best_solo_host_syncs_per_token"] = solo[best].get("host_syncs_per_token")
            shape["speedup_vs_peers"] = {n: best_tps / e["decode_tok_s"]["median"]
                                         for n, e in ok.items() if not n.startswith("solo-")}
    return shapes


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(description="GPU decode benchmark of the CUDA-graph runtime")
    parser.add_argument("--shape", default="Llama-3.2-1B", help="model shape (solo.bench.shapes)")
    parser.add_argument("--engines", default="triton:block,triton-pdl:block,triton:token,torch:block",
                        help="Solo engines, comma-separated (see the module docstring); '' for none")
    parser.add_argument("--peer", default=None, choices=("hf-compile", "hf-eager"),
                        help="time a transformers peer instead of Solo")
    parser.add_argument("--with-peer", default=None, choices=("hf-compile", "hf-eager"),
                        help="also time this transformers peer after the Solo engines, in the same run")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the report here (updated after each engine)")
    parser.add_argument("--summarize", nargs="+", default=None, metavar="JSON",
                        help="merge earlier reports into one summary (printed as JSON) and exit")
    args = parser.parse_args(argv)
    if args.summarize:
        summary = summarize_files(args.summarize)
        print(json.dumps(summary, indent=1, default=str))
        _save(args.json, summary)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    from solo.runtime.triton.benchtools import hbm_probe

    raw = shape_raw(args.shape)
    config = ModelConfig.from_dict(dict(raw))
    if config.lanes is not None:
        print(f"{args.shape} is a lane model, which has no CUDA runtime yet (lane models run eager off the CPU); "
              f"its dense twin {args.shape}-dense reads the same bytes per token", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"shape": args.shape, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "prompt_len": args.prompt_len, "gen_len": args.gen_len, "repeats": args.repeats,
                              "dtype": "bfloat16", "engines": {}}
    hbm = hbm_probe()
    report["hbm"] = hbm
    model = build_random_model(config, torch.bfloat16, seed=args.seed)
    nbytes = roofline_bytes(config, model, args.prompt_len + args.gen_len // 2)
    bandwidth = max(hbm["copy_gbps_median"], hbm["read_gbps_median"])
    roofline_tps = bandwidth * 1e9 / nbytes["total"]
    report["roofline"] = {"bytes_per_token": nbytes, "bandwidth_gbps": bandwidth, "tokens_per_s": roofline_tps,
                          "context": args.prompt_len + args.gen_len // 2}
    print(f"{args.shape}: {nbytes['total'] / 1e9:.3f} GB/token, HBM {bandwidth:.0f} GB/s -> roofline "
          f"{roofline_tps:.0f} tok/s", file=sys.stderr)
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(3, config.vocab_size, (args.prompt_len,), generator=gen).tolist()
    _save(args.json, report)
    if args.peer:
        bench_peer(args, report, model, raw, prompt, roofline_tps)
    elif args.engines:
        bench_solo(args, report, model, prompt, roofline_tps)
        if args.with_peer:
            args.peer = args.with_peer
            bench_peer(args, report, model, raw, prompt, roofline_tps)
    _save(args.json, report)
    for name, e in report["engines"].items():
        print(_line(name, e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
