"""`solo bench --structured`: the cost of grammar-constrained decoding at batch 1.

Runs the same prompt with greedy decoding unconstrained and constrained by a JSON Schema (an array of
objects whose minItems keeps the output going for the whole generation), interleaved, and reports decode
tokens/s of each, the slowdown, and the mask time per token (p50 / p99): the time a token waits on the
critical path for its mask, and the time the mask computation takes, with the mask computed on a host thread
during the decode step and computed inline (the engine picks one by whether a core is free for the thread).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

BENCH_SCHEMA = {
    "type": "array",
    "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999},
                                               "name": {"type": "string", "pattern": "^[A-Za-z ]{1,16}$"},
                                               "active": {"type": "boolean"}},
              "required": ["id", "name", "active"], "additionalProperties": False},
    "minItems": 1000,
}
"""The benchmark's schema: nested objects, bounded integers, patterned strings; never done before --gen-len."""

PROMPT = "A JSON list of users with an id, a name and whether the account is active:\n"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure and print; returns the report (also written to --json by the caller).

    Raises:
        SoloError: loading the model failed, or --shape was given (the benchmark needs a tokenizer).
    """
    from solo.bench.report import machine_info, report_command, report_name, versions
    from solo.engine.constraints import TokenConstraint
    from solo.engine.engine import Engine
    from solo.engine.sampling import SamplingParams
    from solo.errors import SoloError

    print("loading model ...", file=sys.stderr)
    if args.shape:
        engine = _shape_engine(args)
    else:
        if args.tokenizer:
            raise SoloError("--tokenizer goes with --shape (a model folder brings its own tokenizer)")
        engine = Engine.load(args.model, device=args.device, dtype=args.dtype, backend=args.backend,
                             revision=args.revision, quantize=args.quantize)
    response_format = {"type": "json_schema", "json_schema": {"name": "users", "schema": BENCH_SCHEMA}}
    free = SamplingParams(max_tokens=args.gen_len, temperature=0, ignore_eos=True)
    constrained = SamplingParams(max_tokens=args.gen_len, temperature=0, response_format=response_format)
    engine.complete(PROMPT, free.copy(max_tokens=8))  # warm-up: weights paged in, kernels built
    start = time.perf_counter()
    engine.complete(PROMPT, constrained.copy(max_tokens=8))
    compile_s = time.perf_counter() - start
    rates: dict[str, list[float]] = {"unconstrained": [], "json_schema": [], "json_schema_inline_mask": []}
    wait_s, compute_s, forced, tokens, token_s = [], [], 0, 0, []
    inline_wait_s: list[float] = []
    print(f"timing {args.repeats} interleaved repeats ...", file=sys.stderr)
    runs = (("unconstrained", free), ("json_schema", constrained), ("json_schema_inline_mask", constrained))
    for _ in range(args.repeats):
        for name, params in runs:
            time.sleep(args.pause_ms / 1000.0)
            TokenConstraint.overlap = name != "json_schema_inline_mask"
            try:
                request = engine.make_request(PROMPT, params)
                events = list(engine.run(request))
            finally:
                TokenConstraint.overlap = None
            stats = events[-1].stats
            rates[name].append(stats.decode_tokens_per_s or 0.0)
            if name == "json_schema_inline_mask":
                inline_wait_s += request.constraint.mask_wait_s[1:]
            elif request.constraint is not None:
                wait_s += request.constraint.mask_wait_s[1:]  # the first mask is the prefill's
                token_s += stats.token_times_s[1:]
                compute_s += request.constraint.mask_compute_s[1:]
                forced += request.constraint.forced_tokens
                tokens += stats.completion_tokens
    free_tps, json_tps = statistics.median(rates["unconstrained"]), statistics.median(rates["json_schema"])
    report = {
        "command": report_command(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": report_name(engine.name), "backend": engine.runtime.name, "device": str(engine.runtime.device),
        "gen_len": args.gen_len, "repeats": args.repeats, "machine": machine_info(engine.runtime.device),
        "versions": versions(), "schema": BENCH_SCHEMA, "grammar_backend": request.constraint.compiled.backend
        if request.constraint else None,
        "decode_tokens_per_s": {k: {"median": statistics.median(v), "all": v} for k, v in rates.items()},
        "slowdown": free_tps / json_tps - 1.0 if json_tps else None,
        "default_mask_mode": "host thread" if engine.constraints.overlap else "inline",
        "slowdown_inline_mask": free_tps / statistics.median(rates["json_schema_inline_mask"]) - 1.0
        if statistics.median(rates["json_schema_inline_mask"]) else None,
        "inline_mask_us": {"p50": _percentile(inline_wait_s, 0.5) * 1e6, "p99": _percentile(inline_wait_s, 0.99) * 1e6},
        "mask_wait_us": {"p50": _percentile(wait_s, 0.5) * 1e6, "p99": _percentile(wait_s, 0.99) * 1e6},
        "mask_compute_us": {"p50": _percentile(compute_s, 0.5) * 1e6, "p99": _percentile(compute_s, 0.99) * 1e6},
        "forced_token_fraction": forced / tokens if tokens else 0.0,
        # Robust to a busy machine: what the mask adds to a token, measured within the same tokens.
        "mask_share_of_token_time": sum(wait_s) / sum(token_s) if token_s else None,
        "first_compile_s": compile_s,
    }
    _print(report)
    return report


def _shape_engine(args: argparse.Namespace) -> Any:  # noqa: ANN401
    """An engine on a named shape with random weights and the tokenizer folder given by --tokenizer.

    Raises:
        SoloError: --tokenizer is missing, or the tokenizer has more ids than the shape's vocabulary.
    """
    from pathlib import Path

    from solo.bench.shapes import shape_model_for_tokenizer
    from solo.engine.engine import Engine
    from solo.errors import SoloError
    from solo.model.generation_config import GenerationDefaults
    from solo.runtime import create_runtime

    if not args.tokenizer:
        raise SoloError("--structured --shape needs --tokenizer FOLDER (the model's tokenizer files): the grammar "
                        "masks depend on the real vocabulary")
    model, tokenizer, device = shape_model_for_tokenizer(args, Path(args.tokenizer))
    config = model.config
    runtime = create_runtime(model, args.backend, device)
    defaults = GenerationDefaults(eos_token_ids=tuple(config.eos_token_ids))
    return Engine(model, tokenizer, defaults, runtime, Path(args.tokenizer), f"{args.shape} (random weights)")


def _print(r: dict[str, Any]) -> None:
    from solo.bench.report import machine_line

    m = r["machine"]
    d = r["decode_tokens_per_s"]
    print(f"model: {r['model']} | backend {r['backend']} | device {r['device']} | grammar engine "
          f"{r['grammar_backend']}")
    print(machine_line(m))
    print(f"{r['gen_len']} tokens, greedy, {r['repeats']} interleaved repeats (median); this machine's default "
          f"mask mode: {r['default_mask_mode']}")
    print(f"  unconstrained  {d['unconstrained']['median']:8.2f} tok/s")
    print(f"  JSON schema    {d['json_schema']['median']:8.2f} tok/s  -> slowdown {r['slowdown']:+.1%} (mask on a host "
          "thread during the decode step)")
    print(f"  JSON schema    {d['json_schema_inline_mask']['median']:8.2f} tok/s  -> slowdown "
          f"{r['slowdown_inline_mask']:+.1%} (mask computed inline: p50 {r['inline_mask_us']['p50']:.0f} us, "
          f"p99 {r['inline_mask_us']['p99']:.0f} us per token)")
    print(f"  mask on the critical path per token: p50 {r['mask_wait_us']['p50']:.0f} us, "
          f"p99 {r['mask_wait_us']['p99']:.0f} us (computed on a host thread during the decode step: p50 "
          f"{r['mask_compute_us']['p50']:.0f} us, p99 {r['mask_compute_us']['p99']:.0f} us); "
          f"{r['forced_token_fraction']:.0%} of tokens forced (no sampling); the mask is "
          f"{r['mask_share_of_token_time']:.1%} of the constrained tokens' time; first grammar compile "
          f"{r['first_compile_s'] * 1e3:.0f} ms")
