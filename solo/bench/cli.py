"""`solo bench`: TTFT, decode tokens/s, the measured roofline, and peers side by side.

    solo bench --shape Qwen2.5-0.5B --compare hf,llama.cpp --json out.json
    solo bench path/to/model --quantize int8 --sweep-context --plot sweep.png
    solo bench --load chat --rates 0.5x,1x,2x --plot load.png      # serving under load (solo.bench.load)

Solo's repeats and each peer's are interleaved (Solo, peer A, peer B, Solo, ...) so drift of the
machine (clock, other load) hits all of them alike, with an idle pause before every run (--pause-ms) so
no engine's spin-waiting OpenMP threads are still on the cores when the next one starts. Peers are
optional: a missing one prints "peer skipped: <reason>".
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_DEFAULT_CONTEXTS = (128, 512, 1024, 2048, 4096)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `solo bench`."""
    from solo.bench.shapes import SHAPES
    from solo.cli import add_feature_arguments, add_model_arguments, finite_float, output_path

    add_model_arguments(parser)
    parser.add_argument("--agent", default=None, metavar="TRACE",
                        help="replay a multi-turn agent trace (a JSON file, format in solo/bench/agent.py, or a "
                        "shipped one by name: edit-loop, tool-loop, long-tool-loop, no-repeat) and report task "
                        "time, TTFT per turn, cached tokens, acceptance")
    parser.add_argument("--agent-no-baseline", action="store_true",
                        help="with --agent, skip the replay with prefix caching and speculation off")
    add_feature_arguments(parser)
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES),
                        help="benchmark a real model shape with random weights instead of MODEL (no download); with "
                        "--load, serve it (its vocabulary cut to the tokenizer's, see --tokenizer)")
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (default: 128)")
    parser.add_argument("--gen-len", type=int, default=256, help="generated tokens per run (default: 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each engine (default: 3)")
    parser.add_argument("--compare", default=None,
                        help="comma-separated peers: hf (= hf-eager,hf-compile), hf-eager, hf-compile, llama.cpp "
                             "(one peer per GGUF type matching the weights: F16 and BF16 for bf16, Q8_0 / Q4_0 "
                             "with --quantize), llama.cpp-<type> (one GGUF type: F32, F16, BF16, Q8_0, Q4_0)")
    # --quantize comes from add_model_arguments; with it, llama.cpp peers use Q8_0 / Q4_0.
    parser.add_argument("--peers-after-solo", action="store_true",
                        help="time Solo first, then free its weights and time each llama.cpp peer alone (not "
                        "interleaved): for a model that fits in memory once but not beside a peer's copy, e.g. "
                        "the full OLMoE-1B-7B in bf16 (13.8 GB) beside llama.cpp's GGUF on a 24 GiB machine")
    parser.add_argument("--sweep-context", action="store_true",
                        help="also measure decode speed at several context lengths")
    parser.add_argument("--contexts", default=None,
                        help="context lengths for --sweep-context (default: those of "
                        f"{','.join(map(str, _DEFAULT_CONTEXTS))} that fit the model, plus the longest that fits)")
    parser.add_argument("--sweep-gen-len", type=int, default=32, help="tokens decoded per sweep point (default: 32)")
    parser.add_argument("--sweep-fill", choices=("prefill", "random"), default="prefill",
                        help="how a sweep point's context is made: prefill a random prompt (default; every "
                             "engine), or fill Solo's KV cache with random keys and values (Solo only: decode "
                             "reads the cache whatever it holds, and a 32k-token prefill takes many minutes "
                             "on a small CPU)")
    parser.add_argument("--json", type=output_path, default=None, metavar="OUT",
                        help="write every number to this JSON file")
    parser.add_argument("--plot", type=output_path, default=None, metavar="OUT.png",
                        help="plot tok/s against context (with --sweep-context), or latency against load "
                             "(with --load)")
    parser.add_argument("--probe-gib", type=finite_float, default=2.0,
                        help="buffer of the CPU bandwidth probe in GiB; keep it far above the LLC (default: 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompt (default: 0)")
    parser.add_argument("--structured", action="store_true",
                        help="measure grammar-constrained decoding instead: decode tok/s with a JSON schema against "
                        "unconstrained, and the mask time per token (p50/p99)")
    parser.add_argument("--tokenizer", default=None, metavar="FOLDER",
                        help="with --shape and --structured, --agent or --load: the folder of the shape's real "
                        "tokenizer files (--agent and --load default to the bundled model's tokenizer)")
    parser.add_argument("--energy-s", type=finite_float, default=5.0, metavar="SECONDS",
                        help="window of repeated Solo runs over which energy per token is read from NVML (GPUs) or "
                        "RAPL (CPUs, where readable); 0 skips it (default: %(default)g)")
    parser.add_argument("--pause-ms", type=finite_float, default=500.0,
                        help="idle pause before every timed run and bandwidth probe, in ms, longer than OpenMP's "
                        "spin-wait after parallel work (LLVM libomp: 200 ms), so threads the previous engine "
                        "left spinning are asleep before the next one starts (default: %(default)g)")
    parser.add_argument("--lockstep", type=int, default=0, metavar="TOKENS",
                        help="time the engines in turns of TOKENS decode tokens (Solo, each llama.cpp peer, Solo, "
                        "...) through each run, with a short bandwidth probe between every two turns, instead of "
                        "one whole run after another: each turn has its own roofline and the engines' ratio is "
                        "taken turn by turn, for a machine whose memory speed moves within seconds (a VM); "
                        "Solo and llama.cpp peers only (default: off)")
    parser.add_argument("--cpu-hog", type=int, default=0, metavar="N",
                        help="run N busy-loop processes beside every timed run (a machine where other work holds "
                        "cores: how decode threads behave when one of them is preempted; default: none)")
    from solo.bench.load.cli import add_arguments as add_load_arguments

    add_load_arguments(parser)


def default_contexts(context_length: int, gen_len: int) -> list[int]:
    """The sweep's default context lengths for a model: the standard ones that fit, plus the longest that fits.

    Args:
        context_length: the model's context in tokens.
        gen_len: tokens decoded at each point (each point needs context + gen_len + 1 tokens).
    """
    top = context_length - gen_len - 1
    fitting = [c for c in _DEFAULT_CONTEXTS if c <= top]
    if top >= 1 and (not fitting or top > fitting[-1]):
        fitting.append(top)
    return fitting


def _parse_contexts(text: str) -> list[int]:
    try:
        contexts = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"--contexts must be comma-separated token counts such as 512,2048; got {text!r}") from None
    if not contexts or min(contexts) < 1:
        raise ValueError(f"--contexts needs at least one context length >= 1; got {text!r}")
    return contexts


def _load(args: argparse.Namespace, device: Any) -> tuple[Any, dict[str, Any], str, str]:  # noqa: ANN401
    import torch

    from solo.bench.shapes import build_model, shape_config, shape_raw_config
    from solo.engine.engine import load_dtype
    from solo.model.config import ModelConfig
    from solo.model.hub import resolve_model_dir
    from solo.model.weights import load_weights

    # (the dtype `Engine.load` and so `solo run` would load: float16 checkpoints as bfloat16 for the CPU kernels)
    if args.shape:
        config = shape_config(args.shape)
        dtype = load_dtype(args.dtype, config, None, device, args.backend)
        model = build_model(config, dtype, seed=args.seed, device=device)
        key = f"shape:{args.shape}:{args.seed}:{dtype}"
        return model, shape_raw_config(args.shape), f"{args.shape} (random weights)", key
    folder = resolve_model_dir(args.model, args.revision)
    config = ModelConfig.from_file(folder)
    dtype = load_dtype(args.dtype, config, folder, device, args.backend)
    model = load_weights(folder, config, dtype, device)
    raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    mtime = max(p.stat().st_mtime for p in folder.glob("*.safetensors"))
    _ = torch
    from solo.bench.report import report_name

    return model, raw, report_name(str(args.model or folder.name)), f"folder:{folder.resolve()}:{mtime}:{dtype}"


def _stats(results: list[Any]) -> dict[str, Any]:  # noqa: ANN401
    from solo.bench.report import summarize

    tps = [r.decode_tokens_per_s for r in results]
    speed = summarize(tps)
    out = {
        "ttft_s": summarize([r.ttft_s for r in results]),
        "decode_tokens_per_s": speed,
        # The median speed's reciprocal (an even count's median of the reciprocals is another number).
        "ms_per_token": {"median": 1000.0 / speed["median"], "min": 1000.0 / speed["max"],
                         "max": 1000.0 / speed["min"]},
        "runs": [{"ttft_s": r.ttft_s, "decode_s": r.decode_s, "decode_tokens": r.decode_tokens,
                  "host_syncs": r.host_syncs} for r in results],
    }
    syncs = [r.host_syncs for r in results if r.host_syncs is not None]
    if syncs:
        out["host_syncs_per_token"] = sum(syncs) / sum(r.decode_tokens for r in results)
    return out


def _interleaved(engines: list[Any], prompt: list[int], gen_len: int, repeats: int, skipped: dict[str, str],
                 between: Any = None, pause_s: float = 0.0, point_probe: Callable[[], float] | None = None,  # noqa: ANN401
                 around: dict[str, list[list[float]]] | None = None) -> dict[str, list[Any]]:
    """Run every engine `repeats` times, one after another in each round (Solo, peer A, peer B, Solo, ...).

    Args:
        between: called before each round (the bandwidth probe), or None.
        pause_s: idle seconds before every run and every `between` call, the same for every engine, so
            OpenMP threads still spin-waiting after the previous engine's work (llama.cpp's LLVM libomp
            spins for 200 ms by default) have gone to sleep and cannot take the next engine's cores.
        point_probe: a short bandwidth probe (returns GB/s) run right before and right after every run (the
            probe after one run is the probe before the next); each run's pair [before, after] is appended
            to `around[engine name]`, in the order of that engine's results. On a machine whose bandwidth
            moves between spells (a VM), the run's best probe can come from a faster spell than a run's own.
    """
    from solo.bench.peers import PeerSkipped

    results: dict[str, list[Any]] = {e.name: [] for e in engines}
    for _ in range(repeats):
        if between is not None:
            time.sleep(pause_s)
            between()
        before = None
        for engine in engines:
            if engine.name in skipped:
                continue
            if point_probe is not None and before is None:
                time.sleep(pause_s)
                before = point_probe()
            time.sleep(pause_s)
            try:
                results[engine.name].append(engine.run(prompt, gen_len))
            except PeerSkipped as exc:
                skipped[engine.name] = str(exc)
                print(f"peer skipped: {engine.name}: {exc}", file=sys.stderr)
                continue
            if point_probe is not None and around is not None:
                time.sleep(pause_s)
                after = point_probe()
                around.setdefault(engine.name, []).append([before, after])
                before = after
    return {k: v for k, v in results.items() if v}


def _lockstep(engines: list[Any], prompt: list[int], gen_len: int, repeats: int, turn_tokens: int,  # noqa: ANN401
              skipped: dict[str, str], pause_s: float, point_probe: Callable[[], float],
              between: Callable[[], Any] | None = None
              ) -> tuple[dict[str, list[Any]], dict[str, list[dict[str, Any]]]]:
    """Run every engine `repeats` times, the engines taking turns of `turn_tokens` decode tokens within a run.

    Each round prefills every engine (`begin`, one after another), then Solo decodes `turn_tokens` tokens,
    then each peer the same tokens, then Solo again, until each has `gen_len` tokens. A short bandwidth
    probe runs between every two turns, so each turn has the probes right before and after it, seconds
    apart at most: on a machine whose memory speed moves between spells of seconds (a VM), a whole run of
    another engine can fall in another spell, a neighbouring turn far less often.

    Args:
        engines: runners with `begin(prompt, gen_len) -> ttft_s` and `advance(tokens) -> seconds`.
        pause_s: idle seconds before every turn and every probe (OpenMP threads left spinning go to sleep).
        point_probe: the short probe, returns GB/s.
        between: called before each round (the run's full bandwidth probe), or None.

    Returns:
        A RunResult per round for each engine (its turns' decode times added up), and each engine's turns
        in order: {"round", "position" (the context at the turn's start), "tokens", "decode_s",
        "bandwidth_gbps_around": [before, after]}. A peer that fails (PeerSkipped) is left out of both,
        rounds it finished included: its turns would pair with only part of Solo's.
    """
    from solo.bench.peers import PeerSkipped, RunResult

    results: dict[str, list[Any]] = {e.name: [] for e in engines}
    turns: dict[str, list[dict[str, Any]]] = {e.name: [] for e in engines}
    for round_index in range(repeats):
        if between is not None:
            time.sleep(pause_s)
            between()
        ttft: dict[str, float] = {}
        decode_s: dict[str, float] = {}
        for engine in engines:
            if engine.name in skipped:
                continue
            time.sleep(pause_s)
            try:
                ttft[engine.name] = engine.begin(prompt, gen_len)
                decode_s[engine.name] = 0.0
            except PeerSkipped as exc:
                skipped[engine.name] = str(exc)
                print(f"peer skipped: {engine.name}: {exc}", file=sys.stderr)
        time.sleep(pause_s)
        before = point_probe()
        done = 1
        while done < gen_len:
            tokens = min(turn_tokens, gen_len - done)
            for engine in engines:
                if engine.name not in decode_s or engine.name in skipped:
                    continue
                time.sleep(pause_s)
                try:
                    seconds = engine.advance(tokens)
                except PeerSkipped as exc:
                    skipped[engine.name] = str(exc)
                    print(f"peer skipped: {engine.name}: {exc}", file=sys.stderr)
                    continue
                time.sleep(pause_s)
                after = point_probe()
                turns[engine.name].append({"round": round_index, "position": len(prompt) + done - 1,
                                           "tokens": tokens, "decode_s": seconds,
                                           "bandwidth_gbps_around": [before, after]})
                decode_s[engine.name] += seconds
                before = after
            done += tokens
        for name, seconds in decode_s.items():
            if name not in skipped:
                results[name].append(RunResult(ttft_s=ttft[name], decode_s=seconds, decode_tokens=gen_len - 1))
    return ({k: v for k, v in results.items() if v and k not in skipped},
            {k: v for k, v in turns.items() if v and k not in skipped})


# Flags of the decode benchmark that --structured and --agent take; the others would be ignored, so they are
# refused (the load test checks its own, solo.bench.load.cli.serve_arguments).
_MODE_TAKES = {"structured": ("gen_len", "repeats", "pause_ms"),
               "agent": ("compare", "repeats", "pause_ms", "agent_no_baseline")}


def _refuse_unused_flags(args: argparse.Namespace) -> None:
    from solo.bench.load.cli import DECODE_BENCH_ONLY, changed_flags
    from solo.errors import SoloError

    mode = "structured" if args.structured else "agent" if args.agent else None
    if mode is None:
        return
    # --seed stays: it seeds a --shape's random weights in every mode.
    unused = ["--" + f.replace("_", "-") for f in changed_flags(args, (*DECODE_BENCH_ONLY, "plot"))
              if f not in _MODE_TAKES[mode]]
    if unused:
        raise SoloError(f"{', '.join(unused)}: not used by --{mode} (it takes "
                        f"{', '.join('--' + f.replace('_', '-') for f in _MODE_TAKES[mode])}); drop them")
    if args.repeats < 1 or (mode == "structured" and args.gen_len < 1):
        raise SoloError(f"--repeats and --gen-len must be >= 1, got {args.repeats} and {args.gen_len}")


def main(args: argparse.Namespace) -> int:
    """Run the benchmark, print the report, and write --json / --plot.

    Returns:
        The exit status (0).

    Raises:
        SoloError: conflicting or out-of-range flags, --quantize off the CPU, an unknown peer, a prompt plus
            generation longer than the model's context, or any error loading the model.
    """
    from solo.errors import SoloError

    modes = [flag for flag, on in (("--load", args.load), ("--agent", args.agent), ("--structured", args.structured))
             if on]
    if len(modes) > 1:
        raise SoloError(f"{' and '.join(modes)} run different benchmarks; give one of them")
    if not args.load:
        from solo.bench.load.cli import load_flags_given

        given = load_flags_given(args)
        if given:
            raise SoloError(f"{', '.join(given)}: flags of the load test; add --load WORKLOAD (e.g. --load chat) "
                            "or drop them")
    _refuse_unused_flags(args)
    if args.tp != 1 and (args.structured or args.agent):  # (each ran on one process, --tp unsaid)
        raise SoloError(f"--tp times decoding sharded over ranks; {'--structured' if args.structured else '--agent'} "
                        "runs on one process: drop one of them")
    if args.tokenizer is not None and not args.load:  # (the load test words its own refusal)
        if not (args.shape and modes):  # (it was ignored there, a missing folder included)
            raise SoloError("--tokenizer gives --shape's random weights a real tokenizer for --structured, --agent or "
                            "--load (a model folder brings its own, the decode benchmark needs none): drop it")
        if not Path(args.tokenizer).expanduser().is_dir():
            raise SoloError(f"--tokenizer {args.tokenizer}: no such folder; give the folder of a model's tokenizer "
                            "files")
    other_mode = next((flag for flag, on in (("--load", args.load), ("--agent", args.agent),
                                             ("--structured", args.structured), ("--tp", args.tp != 1)) if on), None)
    if args.lockstep and other_mode:
        raise SoloError(f"--lockstep times decode turns of Solo and llama.cpp peers; {other_mode} runs another "
                        "benchmark that has no turns: drop one of them")
    if args.load:
        from solo.bench.load.cli import main as load_main

        return load_main(args)
    if args.agent:
        from solo.bench.agent import run_agent_bench

        return run_agent_bench(args)
    import torch

    from solo.bench.peers import PeerSkipped, PeerSpec, expand_names, load_peer, peer_variants
    from solo.bench.report import (
        check_output_path,
        machine_info,
        ratio_by_memory_speed,
        report_command,
        rss_bytes,
        summarize,
        versions,
        write_output,
    )
    from solo.bench.roofline import decode_bytes, probe_bandwidth, roofline_tokens_per_s
    from solo.bench.runner import (
        TOKEN_CHECK_LEN,
        SoloRunner,
        cpu_hog,
        greedy_tokens,
        quant_quality,
        time_outside_matmuls,
        token_check,
    )
    from solo.engine.engine import resolve_device
    from solo.errors import SoloError
    from solo.runtime import create_runtime

    if args.tp != 1:  # tensor parallelism: decode speed and time blocked on communication (solo.distributed)
        from solo.bench.load.cli import DECODE_BENCH_ONLY, changed_flags
        from solo.distributed.bench import main_tp

        # The TP bench runs the eager model sharded, with no peers: flags it would not honour are refused.
        unused = ["--" + f.replace("_", "-") for f in changed_flags(
            args, (*DECODE_BENCH_ONLY, "plot", "quantize", "backend", "speculative", "prefix_cache_gb",
                   "no_prefix_cache")) if f not in ("prompt_len", "gen_len", "repeats")]
        if unused:
            raise SoloError(f"{', '.join(unused)}: not used by --tp (it times the eager model sharded over ranks, "
                            "with --prompt-len, --gen-len, --repeats); drop them")

        return main_tp(args)
    from solo.bench.load.cli import changed_flags

    ignored = changed_flags(args, ("speculative", "prefix_cache_gb", "no_prefix_cache"))
    if ignored:  # (a break test measured "the n-gram speedup" with --speculative ngram: the same tok/s, no word)
        raise SoloError(f"{', '.join('--' + f.replace('_', '-') for f in ignored)}: used by --agent only; the "
                        f"{'structured-output' if args.structured else 'decode'} benchmark times plain decoding of "
                        "one prompt: drop them")
    if args.model and args.shape:
        raise SoloError("give either MODEL or --shape, not both")
    if args.structured:
        from solo.bench.structured import run as run_structured

        if args.json:
            check_output_path("--json", args.json)
        report = run_structured(args)
        if args.json:
            write_output("--json", args.json, json.dumps(report, indent=2) + "\n")
        return 0
    for flag, value, low, why in (
            ("--prompt-len", args.prompt_len, 1, ""),
            ("--gen-len", args.gen_len, 2, " (decode speed needs a second token)"),
            ("--repeats", args.repeats, 1, ""), ("--pause-ms", args.pause_ms, 0, ""),
            ("--cpu-hog", args.cpu_hog, 0, ""), ("--energy-s", args.energy_s, 0, " (0 skips the energy measurement)"),
            ("--sweep-gen-len", args.sweep_gen_len, 2, "")):
        if value < low:
            raise SoloError(f"{flag} must be >= {low}{why}, got {value:g}")
    if not args.probe_gib > 0:
        raise SoloError(f"--probe-gib must be > 0, got {args.probe_gib:g}")
    if args.compare is not None and not args.compare.strip(","):
        raise SoloError("--compare needs peer names (hf, hf-eager, hf-compile, llama.cpp); leave it out for none")
    for flag in changed_flags(args, ("contexts", "sweep_gen_len", "sweep_fill")):
        if not args.sweep_context:
            name = "--" + flag.replace("_", "-")
            raise SoloError(f"{name} sets the context sweep's {'lengths' if flag == 'contexts' else 'runs'}; "
                            "add --sweep-context")

    for flag, value in (("--json", args.json), ("--plot", args.plot)):
        if value:
            check_output_path(flag, value)
    pause_s = args.pause_ms / 1000.0
    try:
        peer_names = expand_names(args.compare.split(",")) if args.compare else []
        contexts = _parse_contexts(args.contexts) if args.sweep_context and args.contexts is not None else []
    except ValueError as exc:
        raise SoloError(str(exc)) from None
    if args.plot and not args.sweep_context:
        raise SoloError("--plot draws the context sweep; add --sweep-context")
    if args.quantize and any(name.startswith("hf") for name in peer_names):
        # transformers would run the unquantized weights: its numbers would not be the same model's.
        raise SoloError(f"--compare {','.join(n for n in peer_names if n.startswith('hf'))} runs transformers on "
                        f"the unquantized weights, so it cannot be compared with --quantize {args.quantize}; drop "
                        "the hf peers (llama.cpp compares at the matching GGUF type) or --quantize")
    if args.peers_after_solo and (not peer_names or any(not n.startswith("llama.cpp") for n in peer_names)
                                  or args.sweep_context):
        raise SoloError("--peers-after-solo times llama.cpp peers after Solo's weights are freed: give --compare "
                        "llama.cpp (or llama.cpp-<type>) only, and no --sweep-context")
    if args.lockstep < 0:
        raise SoloError(f"--lockstep must be >= 1 (tokens per turn), or 0 for whole runs; got {args.lockstep}")
    if args.lockstep and (args.peers_after_solo or any(n.startswith("hf") for n in peer_names)):
        raise SoloError("--lockstep alternates engines within a run, which Solo and llama.cpp peers support: drop "
                        "the hf peers and --peers-after-solo, or --lockstep")
    if args.plot:
        from solo.bench.plot import require_matplotlib

        require_matplotlib(args.plot)
    device = resolve_device(args.device)
    print("loading model ...", file=sys.stderr)
    model, raw_config, model_label, cache_key = _load(args, device)
    config = model.config
    dense_dtype = model.dtype
    solo_model = model
    if args.quantize:
        if device.type != "cpu":
            raise SoloError("--quantize is implemented for the CPU runtime only")
        from solo.runtime.quant import quantize_model

        solo_model = quantize_model(model, args.quantize)
    runtime = create_runtime(solo_model, args.backend, device)
    solo = SoloRunner(runtime)
    rng = random.Random(args.seed)
    prompt = [rng.randrange(3, config.vocab_size) for _ in range(args.prompt_len)]
    if args.sweep_context and args.contexts is None:
        contexts = default_contexts(config.context_length, args.sweep_gen_len)
        if not contexts:
            raise SoloError(f"--sweep-gen-len {args.sweep_gen_len} leaves no context to sweep: each point needs "
                            f"its context + {args.sweep_gen_len + 1} tokens and the model's context is "
                            f"{config.context_length}; lower --sweep-gen-len below {config.context_length - 1}")
        print(f"context sweep at {','.join(map(str, contexts))} tokens (the model's context is "
              f"{config.context_length})", file=sys.stderr)
    if args.prompt_len + args.gen_len > config.context_length:  # (as solo run's prompt + --max-tokens)
        raise SoloError(f"--prompt-len {args.prompt_len} + --gen-len {args.gen_len} is "
                        f"{args.prompt_len + args.gen_len} tokens but the model's context is "
                        f"{config.context_length}; lower them")
    max_context = max([args.prompt_len + args.gen_len, *[c + args.sweep_gen_len for c in contexts]]) + 1
    too_long = [c for c in contexts if c + args.sweep_gen_len + 1 > config.context_length]
    if too_long:
        raise SoloError(f"--contexts {too_long[0]} with --sweep-gen-len {args.sweep_gen_len} needs "
                        f"{too_long[0] + args.sweep_gen_len + 1} tokens but the model's context is "
                        f"{config.context_length}; use contexts up to "
                        f"{config.context_length - args.sweep_gen_len - 1}")

    print("measuring read bandwidth ...", file=sys.stderr)
    probe_bytes = int(args.probe_gib * 2**30)
    probes = [probe_bandwidth(device, probe_bytes)]
    # Page in the weights, build kernels (and block graphs), allocate the cache at the timed runs' length, and
    # prefill the timed prompt's length once (an H200's first 128-token prefill after a 16-token warm-up took
    # 756 ms against 17-20 ms after it).
    solo.warm_up(prompt, reserve_tokens=max_context)
    rss_now, _ = rss_bytes()
    memory: dict[str, Any] = {"process_rss_bytes_after_warmup": rss_now}
    if device.type == "cuda":
        memory["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)

    quality = None
    if args.quantize:
        print("measuring quantization quality against the dense model ...", file=sys.stderr)
        dense_runtime = create_runtime(model, args.backend, device)
        quality = quant_quality(dense_runtime, runtime, prompt[:32], steps=64)
        del dense_runtime

    engines: list[Any] = [solo]
    skipped: dict[str, str] = {}
    spec = PeerSpec(model=model, raw_config=raw_config, dtype=dense_dtype, quantize=args.quantize, device=device,
                    threads=torch.get_num_threads(), max_seq=max_context, extra={"cache_key": cache_key})
    token_checks: dict[str, dict[str, Any]] = {}
    deferred: list[str] = []  # peers timed after Solo's weights are freed (--peers-after-solo)
    check_prompt = prompt[:32]
    solo_check: tuple[list[int], Any] | None = None
    peer_list = [variant for peer_name in peer_names for variant in peer_variants(peer_name, spec)]
    if args.quantize and peer_list and config.lanes is None and all(n.startswith("llama.cpp-") for n in peer_list):
        # A quantized run needs the dense weights only to write the peers' GGUFs: write them now and free
        # the dense model before any peer loads (the full OLMoE-1B-7B in int8 fits 24 GiB beside llama.cpp's
        # Q8_0 only so: 13.8 GB dense + 7 GB Solo + 7.3 GB llama.cpp otherwise).
        from solo.bench.peers.llamacpp import cached_gguf, check_llamacpp_peer

        for name in peer_list:
            try:  # no GGUF is written for a peer that cannot run
                cached_gguf(spec, check_llamacpp_peer(spec, name.removeprefix("llama.cpp-")))
            except PeerSkipped as exc:
                skipped[name] = str(exc)
                print(f"peer skipped: {name}: {exc}", file=sys.stderr)
        spec.model = model = None
        gc.collect()
        memory["dense_model_freed_before_peers"] = True
    for name in peer_list:
        if name in skipped:  # said above, before the dense model was freed
            continue
        if config.lanes is not None:
            skipped[name] = "no peer runs lane models (Laneformer)"
            print(f"peer skipped: {name}: {skipped[name]}", file=sys.stderr)
            continue
        print(f"preparing peer {name} ...", file=sys.stderr)
        peer = None
        try:
            if args.peers_after_solo:  # write its GGUF now, while Solo's weights are here; run it later
                from solo.bench.peers.llamacpp import cached_gguf, check_llamacpp_peer

                # (no GGUF is written for a peer that cannot run)
                cached_gguf(spec, check_llamacpp_peer(spec, name.removeprefix("llama.cpp-")))
                if solo_check is None:
                    tokens, logits = greedy_tokens(runtime, check_prompt, TOKEN_CHECK_LEN)
                    solo_check = (tokens, logits[0].topk(5).indices.tolist())
                deferred.append(name)
                continue
            peer = load_peer(name, spec)
            if hasattr(peer, "generate"):
                if solo_check is None:
                    tokens, logits = greedy_tokens(runtime, check_prompt, TOKEN_CHECK_LEN)
                    solo_check = (tokens, logits[0].topk(5).indices.tolist())
                token_checks[name] = check = token_check(solo_check[0], solo_check[1],
                                                         peer.generate(check_prompt, TOKEN_CHECK_LEN))
                if not check["passed"]:
                    raise PeerSkipped(f"its greedy tokens are not Solo's on the same ids ({check['summary']}): the "
                                      "conversion or the peer is wrong, so its speed is not counted")
            # Warm-up; a compiled peer gets the full shape so its compilation (static cache sized by the
            # prompt and the generation) happens here and not in the timed runs.
            peer.run(prompt, args.gen_len) if name.endswith("compile") else peer.run(prompt[:16], 8)
            engines.append(peer)
        except PeerSkipped as exc:
            skipped[name] = str(exc)
            print(f"peer skipped: {name}: {exc}", file=sys.stderr)
            if peer is not None:
                peer.close()
    torch.set_num_threads(spec.threads)

    print(f"timing {args.repeats} {'repeat' if args.repeats == 1 else 'repeats'}"
          f"{' of solo' if deferred else ' interleaved' if engines[1:] else ''}"
          + (f" in turns of {args.lockstep} tokens" if args.lockstep else "") + " ...", file=sys.stderr)
    # The probe runs again before every round of repeats (and after the last): the roofline uses the
    # best bandwidth seen in this run, so a busy moment during one probe cannot flatter the fraction.
    # A shorter probe also runs between every two runs, for each run's own roofline (the "pt roof" column).
    around: dict[str, list[list[float]]] = {}

    def point_probe() -> float:
        return probe_bandwidth(device, probe_bytes, passes=2).bandwidth_gbps

    turns: dict[str, list[dict[str, Any]]] = {}
    with cpu_hog(args.cpu_hog):
        if args.lockstep:
            results, turns = _lockstep(engines, prompt, args.gen_len, args.repeats, args.lockstep, skipped, pause_s,
                                       point_probe,
                                       between=lambda: probes.append(probe_bandwidth(device, probe_bytes, passes=3)))
        else:
            results = _interleaved(engines, prompt, args.gen_len, args.repeats, skipped,
                                   between=lambda: probes.append(probe_bandwidth(device, probe_bytes, passes=3)),
                                   pause_s=pause_s, point_probe=point_probe, around=around)
    # Solo's own extra measurements (energy, time outside the weight streaming) while its runtime is here.
    energy = _energy(device, solo, prompt, args, pause_s)
    time.sleep(pause_s)  # a peer's spinning threads must leave the cores first, as before every timed run
    outside = time_outside_matmuls(runtime, prompt, steps=max(8, args.gen_len // 2))
    backend_name, kernel_isa = runtime.name, getattr(runtime, "isa", None)
    # int8 / int4 on the CPU: integer dot products with int8-quantized activations, or the float path.
    int_dot = getattr(runtime, "int_dot_primitive", None) if args.quantize and getattr(runtime, "int_dot", False) \
        else None
    if deferred:
        _, rss_peak = rss_bytes()
        memory["process_rss_peak_bytes_with_solo"] = rss_peak
        print("freeing Solo's weights for the peers ...", file=sys.stderr)
        solo.runtime = None
        spec.model = None
        del runtime, model, solo_model
        gc.collect()
        memory["process_rss_after_freeing_solo_bytes"] = rss_bytes()[0]
        for name in deferred:
            print(f"preparing peer {name} ...", file=sys.stderr)
            peer = None
            try:
                peer = load_peer(name, spec)
                assert solo_check is not None
                token_checks[name] = check = token_check(solo_check[0], solo_check[1],
                                                         peer.generate(check_prompt, TOKEN_CHECK_LEN))
                if not check["passed"]:
                    raise PeerSkipped(f"its greedy tokens are not Solo's on the same ids ({check['summary']}): the "
                                      "conversion or the peer is wrong, so its speed is not counted")
                peer.run(prompt[:16], 8)
                print(f"timing {args.repeats} repeats of {name} ...", file=sys.stderr)
                results.update(_interleaved([peer], prompt, args.gen_len, args.repeats, skipped,
                                            between=lambda: probes.append(probe_bandwidth(device, probe_bytes,
                                                                                          passes=3)),
                                            pause_s=pause_s, point_probe=point_probe, around=around))
                memory[f"{peer.name}_process_rss_peak_bytes"] = peer.peak_rss_bytes()
                engines.append(peer)
            except PeerSkipped as exc:
                skipped[name] = str(exc)
                print(f"peer skipped: {name}: {exc}", file=sys.stderr)
            finally:
                if peer is not None:
                    peer.close()
    time.sleep(pause_s)
    probes.append(probe_bandwidth(device, probe_bytes, passes=3))
    probe = max(probes, key=lambda p: p.bandwidth_gbps)
    elem = torch.tensor([], dtype=dense_dtype).element_size()
    mean_context = args.prompt_len + args.gen_len // 2
    nbytes = decode_bytes(config, elem, mean_context, args.quantize)
    roofline = roofline_tokens_per_s(probe.bandwidth_gbps, nbytes.total)
    _, rss_peak = rss_bytes()
    memory["process_rss_peak_bytes"] = rss_peak
    for engine in engines:
        if hasattr(engine, "peak_rss_bytes") and not deferred:  # peers in their own process (llama.cpp)
            memory[f"{engine.name}_process_rss_peak_bytes"] = engine.peak_rss_bytes()
    report: dict[str, Any] = {
        "command": report_command(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": model_label, "device": str(device), "dtype": str(dense_dtype).replace("torch.", ""),
        "quantize": args.quantize, "backend": backend_name, "kernel_isa": kernel_isa, "int_dot": int_dot,
        "prompt_len": args.prompt_len, "cpu_hog_processes": args.cpu_hog,
        "peers_after_solo": bool(deferred),
        "gen_len": args.gen_len, "repeats": args.repeats, "pause_s": pause_s, "lockstep_tokens": args.lockstep,
        "machine": machine_info(device), "versions": versions(),
        "bandwidth": {**vars(probe), "samples_gbps": [p.bandwidth_gbps for p in probes]},
        "roofline": {"context": mean_context, "weight_bytes": nbytes.weights, "kv_cache_bytes": nbytes.kv_cache,
                     "bytes_per_token": nbytes.total, "tokens_per_s": roofline,
                     "routed_expert_bytes": nbytes.experts},
        "parameters": {"total": config.num_parameters(), "active_per_token": config.num_active_parameters()},
        "memory": memory,
        "engines": {}, "peers_skipped": skipped,
    }
    for engine in engines:
        if engine.name in results:
            entry = _stats(results[engine.name])
            entry["build"] = engine.build_info
            entry["roofline_fraction"] = entry["decode_tokens_per_s"]["median"] / roofline
            pairs = around.get(engine.name, [])
            if len(pairs) == len(entry["runs"]):
                fractions = []
                for run, result, pair in zip(entry["runs"], results[engine.name], pairs, strict=True):
                    run["bandwidth_gbps_around"] = pair
                    own_roofline = roofline_tokens_per_s(max(pair), nbytes.total)
                    fractions.append(result.decode_tokens_per_s / own_roofline if own_roofline > 0 else float("nan"))
                entry["point_roofline_fraction"] = summarize(fractions)
            if turns.get(engine.name):  # --lockstep: "pt roof" per turn instead of per run
                entry["turns"] = _with_turn_fractions(turns[engine.name], config, elem, args.quantize)
                entry["point_roofline_fraction"] = summarize([t["roofline_fraction"] for t in entry["turns"]])
            if engine.name in token_checks:
                entry["token_check"] = token_checks[engine.name]
            report["engines"][engine.name] = entry
    solo_runs = results.get("solo", [])
    for name, entry in report["engines"].items():
        # Interleaved repeats pair each peer run with Solo's run of the same round (minutes apart at most, so
        # in the same spell of a machine whose speed drifts); the per-round ratios say how steady Solo / peer is.
        if name != "solo" and solo_runs and name not in deferred and len(results[name]) == len(solo_runs):
            entry["solo_ratio_by_round"] = summarize([
                s.decode_tokens_per_s / p.decode_tokens_per_s if p.decode_tokens_per_s > 0 else float("nan")
                for s, p in zip(solo_runs, results[name], strict=True)])
    for name, entry in report["engines"].items():
        # Turn by turn: Solo's turn and the peer's turn of the same tokens, seconds apart.
        if name != "solo" and turns.get("solo") and turns.get(name):
            solo_turns = {(t["round"], t["position"]): t for t in turns["solo"]}
            paired = [(t, solo_turns[key]) for t in turns[name] if (key := (t["round"], t["position"])) in solo_turns
                      and solo_turns[key]["decode_s"] > 0]
            ratios = [t["decode_s"] / s["decode_s"] for t, s in paired]  # Solo's tok/s over the peer's, same tokens
            if ratios:
                entry["solo_ratio_by_turn"] = summarize(ratios)
                probes = [[*(t.get("bandwidth_gbps_around") or []), *(s.get("bandwidth_gbps_around") or [])]
                          for t, s in paired]
                by_speed = ratio_by_memory_speed(ratios, probes)
                if by_speed:
                    entry["solo_ratio_by_memory_speed"] = by_speed
    best = best_peers(report["engines"])
    if best:
        report["best_peer"] = best
    if args.quantize:
        from solo.bench.peers.llamacpp import FORMAT_NOTES

        notes = {t: note for t, note in FORMAT_NOTES.items() if f"llama.cpp-{t}" in report["engines"]}
        if notes:
            report["format_notes"] = notes
    if quality is not None:
        report["quantization_quality"] = vars(quality)
    report["energy"] = energy
    if outside is not None and "solo" in report["engines"]:
        outside_s, step_s = outside
        report["engines"]["solo"]["outside_matmuls"] = {
            "s_per_token": outside_s, "step_s": step_s, "fraction_of_step": outside_s / step_s,
            # Above the whole step: the two timings' noise is larger than what they would split.
            "noisy": outside_s > step_s,
            "method": "decode steps at the same context with the matrix-vector products replaced by zero writes, "
                      "timed right after the same steps whole",
        }
    from solo.bench.roofline import instrument_warnings, last_level_cache_bytes

    report["warnings"] = instrument_warnings(
        nbytes.weights, nbytes.total, probe.bandwidth_gbps,
        {name: e["decode_tokens_per_s"]["median"] for name, e in report["engines"].items()},
        last_level_cache_bytes() if device.type == "cpu" else None)
    if contexts:
        report["sweep"] = _sweep(engines, skipped, config, elem, args, probe.bandwidth_gbps, contexts, rng,
                                 lambda: probe_bandwidth(device, probe_bytes, passes=2).bandwidth_gbps)
    _print_report(report)
    if args.json:
        write_output("--json", args.json, json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot and "sweep" in report:
        from solo.bench.plot import plot_sweep

        title = f"{model_label}, {report['dtype']}{' ' + args.quantize if args.quantize else ''}, {device}"
        plot_sweep(report["sweep"], title, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    for engine in engines[1:]:
        if engine.name not in deferred:  # those are closed already
            engine.close()
    return 0


def _energy(device: Any, solo: Any, prompt: list[int], args: argparse.Namespace, pause_s: float  # noqa: ANN401
            ) -> dict[str, Any]:
    """Solo's joules per generated token over a window of repeated runs (see solo.bench.energy)."""
    from solo.bench.energy import measure, open_counter

    if args.energy_s == 0:
        return {"measurable": False, "reason": "skipped: --energy-s 0"}
    counter, reason = open_counter(device)
    if counter is None:
        return {"measurable": False, "reason": reason}
    print(f"measuring energy over {args.energy_s:g} s of runs ...", file=sys.stderr)
    time.sleep(pause_s)
    result = measure(counter, lambda: solo.run(prompt, args.gen_len).decode_tokens + 1, args.energy_s)
    scope = "the GPU board" if device.type == "cuda" else "the CPU package(s): other work on the machine counts too"
    return {"measurable": True, "engine": "solo", "scope": scope,
            "includes": f"prefill of the {args.prompt_len}-token prompt of each run", **result}


def _sweep(engines: list[Any], skipped: dict[str, str], config: Any, elem: int, args: argparse.Namespace,  # noqa: ANN401
           bandwidth_gbps: float, contexts: list[int], rng: random.Random,
           point_probe: Callable[[], float] | None = None) -> dict[str, Any]:
    """Decode tok/s of every engine at each context, with the roofline there.

    `roofline_tokens_per_s` uses the run's best probe (`bandwidth_gbps`); with `point_probe` (GB/s of a short
    probe) the bandwidth is also probed right before and right after each point, and
    `point_roofline_tokens_per_s` uses the better of those two: on a machine whose bandwidth moves between
    spells (a VM), the run's best probe can come from a faster spell than the one a point ran in. With
    `--lockstep N` each point decodes in turns of N tokens with a probe between every two turns, and
    `turn_roofline_fraction` holds, per point, Solo's turns' fractions of their own rooflines (median [min-max]);
    `turns` each point's turns of Solo.
    """
    from solo.bench.report import summarize
    from solo.bench.roofline import decode_bytes, roofline_tokens_per_s

    lockstep = getattr(args, "lockstep", 0)
    sweep: dict[str, Any] = {"contexts": contexts, "gen_len": args.sweep_gen_len,
                             "fill": getattr(args, "sweep_fill", "prefill"), "roofline_tokens_per_s": [],
                             "engines": {e.name: [] for e in engines if e.name not in skipped}}
    if point_probe is not None:
        sweep["point_bandwidth_gbps"] = []  # [before, after] each point
        sweep["point_roofline_tokens_per_s"] = []
    for context in contexts:
        print(f"sweep: context {context} ...", file=sys.stderr)
        prompt = [rng.randrange(3, config.vocab_size) for _ in range(context)]
        nbytes = decode_bytes(config, elem, context + args.sweep_gen_len // 2, args.quantize)
        sweep["roofline_tokens_per_s"].append(roofline_tokens_per_s(bandwidth_gbps, nbytes.total))
        before = point_probe() if point_probe is not None else None
        after = None
        fill_random = getattr(args, "sweep_fill", "prefill") == "random"
        if lockstep and point_probe is not None:  # in turns, a probe between every two turns
            # With a random cache Solo alone (the prompt's length is the context); else every engine.
            turned = [_RandomCacheRunner(engines[0], args.seed)] if fill_random else engines
            runs, point_turns = _lockstep(turned, prompt, args.sweep_gen_len, 1, lockstep, skipped,
                                          args.pause_ms / 1000.0, point_probe)
            turn_list = _with_turn_fractions(point_turns.get(engines[0].name, []), config, elem, args.quantize)
            if fill_random and turn_list:  # Solo's last turn ended the point: its probe is the point's "after"
                after = turn_list[-1]["bandwidth_gbps_around"][1]
            sweep.setdefault("turns", []).append(turn_list)
            sweep.setdefault("turn_roofline_fraction", []).append(
                summarize([t["roofline_fraction"] for t in turn_list]))
        elif fill_random:  # Solo alone, after a cache of random keys/values
            time.sleep(args.pause_ms / 1000.0)
            runs = {engines[0].name: [engines[0].run_filled(context, args.sweep_gen_len, seed=args.seed)]}
        else:
            for engine in engines:
                if engine.name.endswith("compile") and engine.name not in skipped:
                    engine.run(prompt, args.sweep_gen_len)  # recompiles for the new cache size, untimed
            runs = _interleaved(engines, prompt, args.sweep_gen_len, 1, skipped, pause_s=args.pause_ms / 1000.0)
        for name, values in sweep["engines"].items():
            values.append(runs[name][0].decode_tokens_per_s if name in runs else None)
        if before is not None:
            after = point_probe() if after is None else after
            sweep["point_bandwidth_gbps"].append([before, after])
            sweep["point_roofline_tokens_per_s"].append(roofline_tokens_per_s(max(before, after), nbytes.total))
    return sweep


class _RandomCacheRunner:
    """Solo's runner for `--sweep-fill random` in turns: `begin` fills the KV cache instead of a prefill.

    The prompt's length is the context (its ids are not used), the keys and values are random, and no TTFT is
    timed (0).
    """

    def __init__(self, solo: Any, seed: int) -> None:  # noqa: ANN401
        self.solo, self.name, self.seed = solo, solo.name, seed

    def begin(self, prompt: list[int], gen_len: int) -> float:
        self.solo.begin_filled(len(prompt), gen_len, seed=self.seed)
        return 0.0

    def advance(self, tokens: int) -> float:
        return self.solo.advance(tokens)


def _with_turn_fractions(turns: list[dict[str, Any]], config: Any, elem: int, quantize: str | None  # noqa: ANN401
                         ) -> list[dict[str, Any]]:
    """`_lockstep`'s turns, each with "roofline_fraction" added.

    The fraction is the turn's decode speed over the roofline at the better of its two probes, the bytes per
    token counted at the turn's middle position (nan without a speed or a probe).
    """
    from solo.bench.roofline import decode_bytes, roofline_tokens_per_s

    out = []
    for turn in turns:
        roof = roofline_tokens_per_s(max(turn["bandwidth_gbps_around"]),
                                     decode_bytes(config, elem, turn["position"] + turn["tokens"] // 2, quantize).total)
        fraction = turn["tokens"] / turn["decode_s"] / roof if roof > 0 and turn["decode_s"] > 0 else float("nan")
        out.append({**turn, "roofline_fraction": fraction})
    return out


def best_peers(engines: dict[str, Any]) -> dict[str, str]:
    """The fastest decoding variant of each peer family with several ({"llama.cpp": "llama.cpp-BF16"}).

    Args:
        engines: report entries by engine name; variants are named "<family>-<variant>".
    """
    best: dict[str, str] = {}
    for name, entry in engines.items():
        if not name.startswith("llama.cpp-"):
            continue
        current = best.get("llama.cpp")
        speed = entry["decode_tokens_per_s"]["median"]
        if current is None or speed > engines[current]["decode_tokens_per_s"]["median"]:
            best["llama.cpp"] = name
    return best


def _print_report(r: dict[str, Any]) -> None:
    from solo.bench.report import machine_line

    m, bw, rf = r["machine"], r["bandwidth"], r["roofline"]
    print(f"model: {r['model']} | {r['dtype']}{' + ' + r['quantize'] if r['quantize'] else ''} | device {r['device']}"
          f" | backend {r['backend']}" + (f" ({r['kernel_isa']} kernels)" if r.get("kernel_isa") else "")
          + (f"; activations int8 per 32, {r['int_dot']} integer dot products" if r.get("int_dot") else
             "; float activations (SOLO_CPU_INT_DOT=0)" if r.get("quantize") and r.get("backend") == "cpu" else ""))
    print(machine_line(m))
    order = ("repeats, Solo's first, then each peer's alone after Solo's weights were freed (--peers-after-solo)"
             if r.get("peers_after_solo") else
             f"repeats in turns of {r['lockstep_tokens']} decode tokens (Solo, each peer, Solo, ...)"
             if r.get("lockstep_tokens") else "interleaved repeats")
    print(f"prompt {r['prompt_len']} tokens, {r['gen_len']} generated, {r['repeats']} {order} "
          f"(median [min-max]), {r['pause_s'] * 1e3:.0f} ms idle before each "
          + ("turn and each probe; a run's tok/s is its turns' tokens over their time" if r.get("lockstep_tokens")
             else "run"))
    if r.get("cpu_hog_processes"):
        print(f"beside {r['cpu_hog_processes']} busy-loop process(es) (--cpu-hog) during the timed runs and probes")
    print(f"roofline: {rf['bytes_per_token'] / 1e6:.1f} MB read per decode token (weights "
          f"{rf['weight_bytes'] / 1e6:.1f} MB + KV cache {rf['kv_cache_bytes'] / 1e6:.1f} MB at context "
          f"{rf['context']}); read bandwidth {bw['bandwidth_gbps']:.1f} GB/s (best of {len(bw['samples_gbps'])} probes "
          f"in this run: {', '.join(f'{x:.1f}' for x in bw['samples_gbps'])}; {bw['method']}, "
          f"{bw['buffer_bytes'] / 2**30:.2g} GiB) -> roofline {rf['tokens_per_s']:.1f} tok/s")
    params = r["parameters"]
    if params["active_per_token"] != params["total"]:
        print(f"mixture of experts: {params['total'] / 1e9:.2f}B parameters, {params['active_per_token'] / 1e9:.2f}B "
              f"active per token; the roofline counts the active bytes only (routed experts "
              f"{rf['routed_expert_bytes'] / 1e6:.1f} MB per token)")
    solo = r["engines"].get("solo")
    points = any("point_roofline_fraction" in e for e in r["engines"].values())
    header = f"{'engine':<15} {'decode tok/s':>24} {'ms/token':>9} {'TTFT ms':>22} {'roofline':>9} {'solo x':>7}"
    print(header + (f" {'pt roof':>17}" if points else ""))
    for name, e in r["engines"].items():
        d, t = e["decode_tokens_per_s"], e["ttft_s"]
        ratio = solo["decode_tokens_per_s"]["median"] / d["median"] if solo else float("nan")
        pt = e.get("point_roofline_fraction")
        places = 1 if t["max"] < 0.1 else 0  # a short TTFT's range in tenths: "4.5 [4-4]" read as a contradiction
        print(f"{name:<15} {d['median']:>8.2f} [{d['min']:.2f}-{d['max']:.2f}] {e['ms_per_token']['median']:>9.2f} "
              f"{t['median'] * 1e3:>8.1f} [{t['min'] * 1e3:.{places}f}-{t['max'] * 1e3:.{places}f}] "
              f"{e['roofline_fraction']:>8.0%} "
              f"{ratio:>6.2f}x" + (f" {pt['median']:>5.0%} [{pt['min']:.0%}-{pt['max']:.0%}]" if pt else ""))
    if points:
        unit = "turn" if r.get("lockstep_tokens") else "run"
        print(f"  roofline: the median run against the run's best probe; pt roof: each {unit} against the better of "
              f"two short probes right before and after it (median [min-max] over {unit}s)")
    for name, e in r["engines"].items():
        if name != "solo" and solo:
            ttft_ratio = e["ttft_s"]["median"] / solo["ttft_s"]["median"]
            decode_ratio = solo["decode_tokens_per_s"]["median"] / e["decode_tokens_per_s"]["median"]
            check = f" | greedy tokens vs Solo: {e['token_check']['summary']}" if "token_check" in e else ""
            rounds = e.get("solo_ratio_by_turn") or e.get("solo_ratio_by_round")
            unit = "turn by turn" if "solo_ratio_by_turn" in e else "round by round"
            by_round = f" ({unit}: {rounds['median']:.2f}x [{rounds['min']:.2f}-{rounds['max']:.2f}])" \
                if rounds else ""
            speed = e.get("solo_ratio_by_memory_speed")
            if speed:
                parts = [f"{label} {speed['split_gbps']:.0f} GB/s {speed[key]['median']:.2f}x "
                         f"({speed[key + '_turns']} pairs)"
                         for key, label in (("slow", "below"), ("fast", "above")) if speed[key]]
                if parts:
                    by_round += f" (pairs of turns with memory probed {' / '.join(parts)})"
            print(f"  {name}: {e['build']} | Solo decode {decode_ratio:.2f}x{by_round}, Solo TTFT {ttft_ratio:.2f}x "
                  f"faster{check}")
    for family, name in r.get("best_peer", {}).items():
        e = r["engines"][name]
        if solo and name != "solo":
            best_ttft_s = min(v["ttft_s"]["median"] for n, v in r["engines"].items() if n.startswith(family))
            print(f"best {family}: {name} ({e['decode_tokens_per_s']['median']:.2f} tok/s): Solo decode "
                  f"{solo['decode_tokens_per_s']['median'] / e['decode_tokens_per_s']['median']:.2f}x; "
                  f"{family}'s best TTFT {best_ttft_s * 1e3:.1f} ms")
    for note in r.get("format_notes", {}).values():
        print(f"format: {note}")
    for name, reason in r["peers_skipped"].items():
        print(f"peer skipped: {name}: {reason}")
    for line in r.get("warnings", []):
        print(f"warning: {line}")
    if solo and "outside_matmuls" in solo:
        o = solo["outside_matmuls"]
        if o.get("noisy"):
            print(f"time outside weight streaming: not measurable in this run (the steps without matrix-vector "
                  f"products took {o['s_per_token'] * 1e3:.2f} ms/token, the whole steps {o['step_s'] * 1e3:.2f}: "
                  "noise larger than the split; more --gen-len or --repeats, on a quiet machine)")
        else:
            print(f"time outside weight streaming: {o['s_per_token'] * 1e3:.2f} ms/token = "
                  f"{o['fraction_of_step']:.1%} of the step ({o['method']})")
    if solo and "host_syncs_per_token" in solo:
        print(f"host synchronisations per decode token: {solo['host_syncs_per_token']:.2f}")
    energy = r.get("energy")
    if energy is not None and energy["measurable"] and energy["joules_per_token"] is not None:
        tpj = energy["tokens_per_joule"]
        print(f"energy (Solo): {energy['joules_per_token']:.3f} J/token, {tpj:.2f} tokens/J "
              f"({energy['counter']}, {energy['mean_watts']:.0f} W over {energy['seconds']:.1f} s; {energy['scope']})")
    elif energy is not None:
        print(f"energy: not measurable here ({energy.get('reason', 'the counter did not advance')})")
    mem = r["memory"]
    line = f"memory: process RSS after Solo warm-up {mem['process_rss_bytes_after_warmup'] / 2**30:.2f} GiB, " \
           f"peak {mem['process_rss_peak_bytes'] / 2**30:.2f} GiB (in-process peers included)"
    for key, value in mem.items():
        if key.endswith("_process_rss_peak_bytes"):
            line += f", {key.removesuffix('_process_rss_peak_bytes')} process peak {value / 2**30:.2f} GiB"
    if "cuda_max_allocated_bytes" in mem:
        line += f", CUDA max allocated {mem['cuda_max_allocated_bytes'] / 2**30:.2f} GiB"
    print(line)
    q = r.get("quantization_quality")
    if q:
        print(f"quantization vs {r['dtype']}: top-1 agreement {q['top1_agreement']:.1%} over {q['steps']} "
              f"teacher-forced steps, identical greedy prefix {q['greedy_prefix']}/{q['steps']} tokens, "
              "mean |logit error| "
              f"{q['mean_abs_logit_error']:.4f} (max {q['max_abs_logit_error']:.3f}; dense logits' std "
              f"{q['logit_std']:.3f})")
    if "sweep" in r:
        s = r["sweep"]
        fill = " after a KV cache of random keys and values (no prefill; Solo only)" \
            if s.get("fill") == "random" else ""
        print(f"context sweep ({s['gen_len']} tokens decoded at each context{fill}), tok/s:")
        names = list(s["engines"])
        solo_values = s["engines"].get("solo")
        points = s.get("point_roofline_tokens_per_s")
        by_turn = s.get("turn_roofline_fraction")
        print(f"{'context':>8} {'roofline':>9} " + " ".join(f"{n:>11}" for n in names)
              + (f" {'solo/roof':>9}" if solo_values else "")
              + (f" {'GB/s at pt':>13} {'pt roof':>8}" + (f" {'solo/pt':>8}" if solo_values else "") if points else "")
              + (f" {'solo/turn roof':>16}" if by_turn else ""))
        for i, c in enumerate(s["contexts"]):
            vals = " ".join(f"{v[i]:>11.2f}" if v[i] is not None else f"{'-':>11}" for v in s["engines"].values())
            roof = s["roofline_tokens_per_s"][i]
            solo_i = solo_values[i] if solo_values else None
            share = f" {solo_i / roof:>9.0%}" if solo_i is not None and roof else (f" {'-':>9}" if solo_values else "")
            extra = ""
            if points:
                before, after = s["point_bandwidth_gbps"][i]
                extra = f" {before:>6.1f}/{after:<6.1f} {points[i]:>8.2f}"
                if solo_values:
                    extra += f" {solo_i / points[i]:>8.0%}" if solo_i is not None and points[i] else f" {'-':>8}"
            if by_turn:
                t = by_turn[i]
                extra += f" {t['median']:>6.0%} [{t['min']:.0%}-{t['max']:.0%}]"
            print(f"{c:>8} {roof:>9.2f} {vals}{share}{extra}")
        if points:
            print("  roofline: the run's best probe; pt roof: the better of two short probes right before and "
                  "after the point (GB/s at pt)")
        if by_turn:
            print(f"  solo/turn roof: the point decoded in turns of {r['lockstep_tokens']} tokens, each against the "
                  "better of the probes right before and after it (median [min-max] over turns)")
