r"""`solo bench --agent TRACE`: replay a multi-turn agent trace and time the whole task.

A coding agent calls the model many times in a row, each prompt mostly the previous one plus an answer
and a tool result. This replays such a trace through `Engine.complete` (the Python API, one request at a
time, as an agent does) and reports total task time, TTFT per turn, decode tokens/s, cached prompt tokens
and speculative acceptance length; by default it also replays the trace with prefix caching and
speculation off (interleaved, repeat by repeat) and reports the speed-up and whether every turn's
tokens were identical.

Trace format (JSON; examples in benchmarks/traces/):

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

TRACE_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "traces"
"""Where the repository's traces live (a bare name given to --agent is looked up here)."""


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
            raise SoloError(f"agent trace {str(path)!r} not found; give a JSON file (examples in benchmarks/traces/)")
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
    """

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    total_s: float
    decode_tokens_per_s: float | None
    acceptance_length: float | None
    token_ids: list[int]


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
                                  s.decode_tokens_per_s, s.acceptance_length, result.token_ids))
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
        "turns": [t.__dict__ | {"token_ids": None} for t in turns],
    }


def _fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def run_agent_bench(args: Any) -> int:  # noqa: ANN401
    """Run `solo bench --agent TRACE` and print the report.

    Flags used: the model flags, --prefix-cache-gb / --no-prefix-cache, --speculative, --repeats,
    --agent-no-baseline, --pause-ms, --json.

    Returns:
        0.

    Raises:
        SoloError: a bad trace, a model that cannot load, a turn that does not fit the context.
    """
    from solo.cli import prefix_cache_gb_from_args
    from solo.engine.engine import Engine

    trace = Trace.load(args.agent)
    if args.shape:
        raise SoloError("--agent replays text prompts through the model's tokenizer; give a MODEL, not --shape")
    print("loading model ...", file=sys.stderr)
    configs = {"solo": (prefix_cache_gb_from_args(args), args.speculative)}
    if not args.agent_no_baseline:
        configs["baseline (prefix cache off, speculative off)"] = (None, "off")
    engines = {name: Engine.load(args.model, device=args.device, dtype=args.dtype, backend=args.backend,
                                 revision=args.revision, quantize=args.quantize, prefix_cache_gb=pc, speculative=sp)
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
    report: dict[str, Any] = {
        "trace": trace.name, "description": trace.description, "turns": len(trace.turns),
        "backend": solo_engine.runtime.name, "speculative": solo_engine.speculative,
        "prefix_cache": solo_engine.prefix_cache is not None, "repeats": args.repeats, "configs": {},
    }
    print(f"\nagent trace {trace.name!r}: {len(trace.turns)} turns, {args.repeats} repeat(s), "
          f"backend {solo_engine.runtime.name}")
    for name, reps in runs.items():
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
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
