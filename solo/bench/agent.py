r"""`solo bench --agent TRACE`: replay a multi-turn agent trace and time the whole task.

A coding agent calls the model many times in a row, each prompt mostly the previous one plus an answer
and a tool result. This replays such a trace through `Engine.complete` (the Python API, one request at a
time, as an agent does) and reports total task time, TTFT per turn, decode tokens/s, cached prompt tokens
and speculative acceptance length; by default it also replays the trace with prefix caching and
speculation off (interleaved, repeat by repeat) and reports the speed-up and whether every turn's
tokens were identical.

Trace format (JSON; the shipped traces are in solo/bench/traces/):

    {
      "name": "edit-loop",
      "description": "what the agent does",
      "sampling": {"temperature": 0, "repetition_penalty": 1.0},   # SamplingParams fields for every turn
      "turns": [
        {"prompt": ["literal text", {"output_of": 0}, {"prompt_of": 0}], "max_tokens": 96},
        {"append": "text added after the previous turn's prompt and answer", "max_tokens": 32,
         "stop": ["\\n\\n"]}
      ]
    }

Each turn's prompt is either `prompt`, a list of parts joined together (a string is literal text,
{"output_of": i} is the text turn i generated, {"prompt_of": i} is turn i's prompt; turns count from 0),
or `append`: the previous turn's prompt, its answer, then this text (a tool result, the next
instruction). `max_tokens` and optional `stop` are per turn; other sampling fields come from "sampling".

With `--shape NAME` the trace runs on a real model's shape with random weights (`solo.bench.shapes`),
tokenized by `--tokenizer FOLDER` or the bundled model's tokenizer: TTFT per turn against a cold prefill
of the same prompt (the baseline's) is what it measures; the random model's text means nothing.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solo.errors import SoloError

TRACE_DIR = Path(__file__).resolve().parent / "traces"
"""Where the shipped traces live, in the package (a bare name given to --agent is looked up here)."""


@dataclass
class Turn:
    """One model call of a trace (see the module docstring)."""

    prompt: list[Any] | None
    append: str | None
    max_tokens: int
    stop: list[str] = field(default_factory=list)


@dataclass
class Trace:
    """A parsed trace file.

    Attributes:
        name: short name.
        description: what the agent does.
        sampling: SamplingParams fields shared by every turn.
        turns: the model calls, in order.
    """

    name: str
    description: str
    sampling: dict[str, Any]
    turns: list[Turn]

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read and check a trace file (a bare name is looked up in `TRACE_DIR`, ".json" optional).

        Raises:
            SoloError: a missing file, bad JSON, or a turn that breaks the format (named by index).
        """
        p = Path(path)
        if not p.exists() and not p.suffix:
            p = p.with_suffix(".json")
        if not p.exists() and (TRACE_DIR / p.name).exists():
            p = TRACE_DIR / p.name
        if not p.exists():
            shipped = ", ".join(sorted(f.stem for f in TRACE_DIR.glob("*.json")))
            raise SoloError(f"agent trace {str(path)!r} not found; give a JSON file or a shipped trace ({shipped})")
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SoloError(f"agent trace {p} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("turns"), list) or not data["turns"]:
            raise SoloError(f"agent trace {p} needs a non-empty \"turns\" list")
        turns = []
        for i, t in enumerate(data["turns"]):
            if not isinstance(t, dict) or ("prompt" in t) == ("append" in t):
                raise SoloError(f"turn {i} of {p} needs exactly one of \"prompt\" (a list of parts) or \"append\"")
            if "append" in t and i == 0:
                raise SoloError(f"turn 0 of {p} cannot \"append\" (there is no previous turn); use \"prompt\"")
            if not isinstance(t.get("max_tokens"), int) or t["max_tokens"] < 1:
                raise SoloError(f"turn {i} of {p} needs \"max_tokens\", an integer >= 1")
            prompt = t.get("prompt")
            if prompt is not None:
                if not isinstance(prompt, list):
                    raise SoloError(f"turn {i} of {p}: \"prompt\" must be a list of parts")
                for part in prompt:
                    ref = next(iter(part.values())) if isinstance(part, dict) and len(part) == 1 else None
                    ok = isinstance(part, str) or (
                        isinstance(part, dict) and set(part) <= {"output_of", "prompt_of"} and isinstance(ref, int)
                        and 0 <= ref < i)
                    if not ok:
                        raise SoloError(f"turn {i} of {p}: prompt part {part!r} is not text, {{\"output_of\": j}} "
                                        "or {\"prompt_of\": j} with j an earlier turn")
            turns.append(Turn(prompt, t.get("append"), t["max_tokens"], list(t.get("stop", []))))
        return cls(str(data.get("name", p.stem)), str(data.get("description", "")), dict(data.get("sampling", {})),
                   turns)


@dataclass
class TurnResult:
    """What one turn cost.

    Attributes:
        prompt_tokens, cached_tokens, completion_tokens: token counts.
        ttft_s: time to first token.
        total_s: the whole call (prompt encoding included).
        decode_tokens_per_s: after the first token (None with fewer than 2 tokens).
        acceptance_length: mean tokens per speculative verify step (None without speculation).
        token_ids: the generated ids (to check identical output across configurations).
        prompt_ids: the prompt's ids (peers replay them).
    """

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    total_s: float
    decode_tokens_per_s: float | None
    acceptance_length: float | None
    token_ids: list[int]
    prompt_ids: list[int] = field(default_factory=list)


def replay(engine: Any, trace: Trace) -> list[TurnResult]:  # noqa: ANN401
    """Run every turn of `trace` through `engine.complete`, in order.

    Raises:
        SoloError: a turn's prompt plus max_tokens does not fit the model's context (the message names it).
    """
    from solo.engine.sampling import SamplingParams

    prompts: list[str] = []
    outputs: list[str] = []
    results = []
    for i, turn in enumerate(trace.turns):
        if turn.append is not None:
            prompt = prompts[-1] + outputs[-1] + turn.append
        else:
            prompt = "".join(part if isinstance(part, str) else
                             (outputs[part["output_of"]] if "output_of" in part else prompts[part["prompt_of"]])
                             for part in turn.prompt)
        params = SamplingParams(**{**trace.sampling, "max_tokens": turn.max_tokens, "stop": turn.stop})
        start = time.perf_counter()
        try:
            result = engine.complete(prompt, params)
        except SoloError as exc:
            raise SoloError(f"turn {i} of trace {trace.name!r}: {exc}") from None
        total = time.perf_counter() - start
        prompts.append(prompt)
        outputs.append(result.text)
        s = result.stats
        results.append(TurnResult(s.prompt_tokens, s.cached_tokens, s.completion_tokens, s.ttft_s or 0.0, total,
                                  s.decode_tokens_per_s, s.acceptance_length, result.token_ids,
                                  result.prompt_token_ids))
    return results


def summarize_run(turns: list[TurnResult]) -> dict[str, Any]:
    """Totals of one replay: task time, TTFTs, decode speed over all turns, cached tokens, acceptance."""
    decode_tokens = sum(max(t.completion_tokens - 1, 0) for t in turns)
    decode_s = sum(t.total_s - t.ttft_s for t in turns)
    accept = [t.acceptance_length for t in turns if t.acceptance_length is not None]
    return {
        "task_s": sum(t.total_s for t in turns),
        "ttft_s": [t.ttft_s for t in turns],
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else None,
        "prompt_tokens": sum(t.prompt_tokens for t in turns),
        "cached_tokens": sum(t.cached_tokens for t in turns),
        "completion_tokens": sum(t.completion_tokens for t in turns),
        "acceptance_length": statistics.mean(accept) if accept else None,
        "turns": [t.__dict__ | {"token_ids": None, "prompt_ids": None} for t in turns],
    }


AGENT_PEERS = ("hf", "hf-eager", "llama.cpp")
"""Peers `--agent` accepts in `--compare` ("hf" = "hf-eager")."""


def replay_on_peer(peer: Any, turns: list[TurnResult]) -> list[TurnResult]:  # noqa: ANN401
    """Replay Solo's turns on a peer: the same prompt ids, the same number of generated tokens each.

    llama.cpp keeps its KV cache from one call to the next and prefills only what follows the longest
    prefix it holds (its server's prompt cache, on by default there), so its cached tokens are reported;
    transformers `generate` starts every call cold, which is what an agent driving it gets.
    """
    reuse = getattr(peer, "name", "").startswith("llama.cpp")
    results = []
    for t in turns:
        gen = max(t.completion_tokens, 1)
        r = peer.run(t.prompt_ids, gen, reuse_prefix=True) if reuse else peer.run(t.prompt_ids, gen)
        tps = r.decode_tokens / r.decode_s if r.decode_tokens and r.decode_s > 0 else None
        results.append(TurnResult(len(t.prompt_ids), r.cached_tokens, gen, r.ttft_s, r.ttft_s + r.decode_s, tps,
                                  None, [], []))
    return results


def check_agent_peers(compare: str | None) -> list[str]:
    """The peer names of `--compare` for `--agent` ("hf" becomes "hf-eager"), checked, without repeats.

    Raises:
        SoloError: no name in a given --compare, or a name `--agent` does not accept.
    """
    if compare is None:
        return []
    names = [n.strip() for n in compare.split(",") if n.strip()]
    if not names:
        raise SoloError(f"--compare needs peer names ({', '.join(AGENT_PEERS)}); leave it out for none")
    for name in names:
        if name not in AGENT_PEERS:
            raise SoloError(f"--agent compares with {', '.join(AGENT_PEERS)}; {name!r} is not one of them "
                            "(hf-compile would recompile for every prompt length)")
    return list(dict.fromkeys("hf-eager" if n == "hf" else n for n in names))


def agent_peers(names: list[str], engine: Any, raw_config: dict[str, Any]) -> list[Any]:  # noqa: ANN401
    """The peers (from `check_agent_peers`) that can run here; a skipped one is printed with its reason.

    llama.cpp runs in llama-cpp-python's worker process on a GGUF written from the same weights (the
    `llama.cpp` bench peer), keeping its KV cache across calls as llama.cpp's server does.
    """
    import torch

    from solo.bench.peers import PeerSkipped, PeerSpec

    peers = []
    for name in names:
        spec = PeerSpec(engine.model, raw_config, engine.model.dtype, None, engine.device,
                        torch.get_num_threads(), engine.config.context_length)
        if name == "llama.cpp":
            from solo.bench.peers.llamacpp import LlamaCppPeer

            try:
                peers.append(LlamaCppPeer(spec))
            except PeerSkipped as exc:
                print(f"peer skipped: llama.cpp: {exc}", file=sys.stderr)
            continue
        from solo.bench.peers.hf import HFPeer

        try:
            peers.append(HFPeer(spec, compiled=False))
        except PeerSkipped as exc:
            print(f"peer skipped: hf-eager: {exc}", file=sys.stderr)
    return peers


def ttft_ratios(runs: list[list[TurnResult]], baseline: list[list[TurnResult]]) -> list[float]:
    """Per turn: the median TTFT over `runs` divided by the median TTFT over `baseline` (same trace)."""
    return [statistics.median(r[i].ttft_s for r in runs) / statistics.median(b[i].ttft_s for b in baseline)
            for i in range(len(runs[0]))]


def shape_engines(args: Any, configs: dict[str, tuple[float | None, str]]) -> dict[str, Any]:  # noqa: ANN401
    """Engines on a named shape with random weights (`--shape`), one per configuration, sharing the weights.

    The prompts are text, so a tokenizer is needed: `--tokenizer FOLDER`, or the bundled model's (its ids
    all fall inside any shape's vocabulary; only the token counts differ from the real model's).

    Raises:
        SoloError: the tokenizer has more ids than the shape's vocabulary.
    """
    from solo.bench.shapes import shape_model_for_tokenizer
    from solo.engine.engine import Engine
    from solo.model.default_model import default_model_path
    from solo.model.generation_config import GenerationDefaults
    from solo.runtime import create_runtime

    folder = Path(args.tokenizer) if args.tokenizer else default_model_path()
    model, tokenizer, device = shape_model_for_tokenizer(args, folder)
    config = model.config
    defaults = GenerationDefaults(eos_token_ids=tuple(config.eos_token_ids))
    return {name: Engine(model, tokenizer, defaults, create_runtime(model, args.backend, device), folder,
                         f"{args.shape} (random weights)", prefix_cache_gb=pc, speculative=sp)
            for name, (pc, sp) in configs.items()}


def _fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def run_agent_bench(args: Any) -> int:  # noqa: ANN401
    """Run `solo bench --agent TRACE` and print the report.

    Flags used: the model flags or --shape (+ --tokenizer), --prefix-cache-gb / --no-prefix-cache,
    --speculative, --repeats, --agent-no-baseline, --compare (hf / hf-eager: transformers `generate` replays
    Solo's prompt ids and output lengths; llama.cpp: skipped unless its server is installed), --pause-ms,
    --json.

    Returns:
        0.

    Raises:
        SoloError: a bad trace, a model that cannot load, a turn that does not fit the context.
    """
    from solo.cli import prefix_cache_gb_from_args
    from solo.engine.engine import Engine

    trace = Trace.load(args.agent)
    print("loading model ...", file=sys.stderr)
    configs = {"solo": (prefix_cache_gb_from_args(args), args.speculative)}
    if not args.agent_no_baseline:
        configs["baseline (prefix cache off, speculative off)"] = (None, "off")
    peer_names = check_agent_peers(args.compare)
    if args.shape:
        engines = shape_engines(args, configs)
    else:
        engines = {name: Engine.load(args.model, device=args.device, dtype=args.dtype, backend=args.backend,
                                     revision=args.revision, quantize=args.quantize, prefix_cache_gb=pc,
                                     speculative=sp)
                   for name, (pc, sp) in configs.items()}
    for engine in engines.values():  # warm-up: first-call costs (allocator, kernels) out of the timings
        engine.complete("def f():\n", {"max_tokens": 4, "temperature": 0.0})
        if engine.prefix_cache is not None:
            engine.prefix_cache.clear()
    runs: dict[str, list[list[TurnResult]]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, engine in engines.items():  # interleaved, so drift of a shared machine hits both alike
            if engine.prefix_cache is not None:
                engine.prefix_cache.clear()  # every repeat starts cold
            if engine.session_history is not None:
                engine.session_history.sequences.clear()
            time.sleep(args.pause_ms / 1000)
            runs[name].append(replay(engine, trace))
    solo_engine = engines["solo"]
    peer_runs: dict[str, list[list[TurnResult]]] = {}
    if peer_names:
        if args.shape:
            from solo.bench.shapes import shape_raw_config

            raw = shape_raw_config(args.shape)
        else:
            raw = json.loads((solo_engine.model_dir / "config.json").read_text(encoding="utf-8"))
        for peer in agent_peers(peer_names, solo_engine, raw):
            print(f"replaying on {peer.name} ({peer.build_info}) ...", file=sys.stderr)
            peer_runs[peer.name] = []
            for solo_run in runs["solo"]:
                time.sleep(args.pause_ms / 1000)
                peer_runs[peer.name].append(replay_on_peer(peer, solo_run))
            peer.close()
    from solo.bench.report import machine_info, report_command, report_name, versions, write_output

    report: dict[str, Any] = {
        "command": report_command(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(solo_engine.device), "versions": versions(),
        "trace": trace.name, "description": trace.description, "turns": len(trace.turns),
        "model": report_name(solo_engine.name), "backend": solo_engine.backend_name,
        "speculative": solo_engine.speculative,
        "prefix_cache": solo_engine.prefix_cache is not None, "repeats": args.repeats, "configs": {},
    }
    print(f"\nagent trace {trace.name!r}: {len(trace.turns)} turns, {args.repeats} repeat(s), "
          f"model {solo_engine.name}, backend {solo_engine.backend_name}")
    for name, reps in {**runs, **peer_runs}.items():
        summaries = [summarize_run(r) for r in reps]
        best = min(summaries, key=lambda s: s["task_s"])
        report["configs"][name] = {"median_task_s": statistics.median(s["task_s"] for s in summaries),
                                   "runs": summaries}
        tps = _fmt(best["decode_tokens_per_s"], ".1f")
        print(f"\n{name}: task {statistics.median(s['task_s'] for s in summaries):.2f} s (median of "
              f"{len(summaries)}; best {best['task_s']:.2f} s), decode {tps} tok/s, "
              f"cached {best['cached_tokens']}/{best['prompt_tokens']} prompt tokens, acceptance "
              f"{_fmt(best['acceptance_length'], '.2f')} tok/step")
        print("  turn  prompt  cached  gen  TTFT ms  decode tok/s  accept")
        for i, t in enumerate(best["turns"]):
            print(f"  {i:4d}  {t['prompt_tokens']:6d}  {t['cached_tokens']:6d}  {t['completion_tokens']:3d}  "
                  f"{t['ttft_s'] * 1000:7.1f}  {_fmt(t['decode_tokens_per_s'], '12.1f')}  "
                  f"{_fmt(t['acceptance_length'], '.2f')}")
    if len(runs) > 1:
        base_name = next(n for n in runs if n != "solo")
        same = all(a.token_ids == b.token_ids for ra, rb in zip(runs["solo"], runs[base_name], strict=True)
                   for a, b in zip(ra, rb, strict=True))
        speedup = report["configs"][base_name]["median_task_s"] / report["configs"]["solo"]["median_task_s"]
        report["speedup_vs_baseline"] = speedup
        report["identical_tokens"] = same
        print(f"\nend to end: {speedup:.2f}x faster than the baseline; every turn's tokens identical: {same}")
        ratios = ttft_ratios(runs["solo"], runs[base_name])
        report["ttft_ratio_vs_baseline"] = ratios
        print("TTFT / the baseline's TTFT of the same prompt (a cold prefill), per turn (median over repeats): "
              + " ".join(f"{r:.0%}" for r in ratios))
        if len(ratios) > 1:
            print(f"from turn 1 on: at most {max(ratios[1:]):.0%}")
    for name in peer_runs:
        speedup = report["configs"][name]["median_task_s"] / report["configs"]["solo"]["median_task_s"]
        report[f"speedup_vs_{name}"] = speedup
        print(f"end to end: {speedup:.2f}x faster than {name} (same prompt ids and output lengths as Solo's)")
    if args.json:
        write_output("--json", args.json, json.dumps(report, indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
