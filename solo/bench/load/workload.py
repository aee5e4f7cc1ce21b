"""Workload files (TOML): request classes, length distributions, arrivals, bursts, cancellations, the SLO.

The format is documented in workloads/README.md; `load_workload` checks every field and names a bad one.
Everything random (which class, lengths, sampling, arrival gaps, who cancels) comes from one seeded
`random.Random`, so a workload and a seed give the same requests at the same offsets every run.
"""

from __future__ import annotations

import math
import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solo.errors import SoloError

WORKLOADS_DIR = Path(__file__).parent / "workloads"
"""The shipped workloads: `solo bench --load NAME` finds NAME.toml here."""

MAX_PHASE_S = 3600.0
"""No phase runs longer than an hour, whatever the file or the flags say."""

MAX_REQUESTS = 100_000
"""No phase sends more requests than this."""

MAX_BURST_FACTOR = 100.0
"""The largest burst factor: planning a phase draws candidates at the peak rate and keeps rate / peak of them,
so its work grows with the factor (1e7 took 29 s, during which the bench answered no signal)."""


@dataclass
class RequestClass:
    """One kind of request in a workload (a `[[classes]]` table).

    Attributes:
        name: label in the report.
        weight: relative share of arrivals.
        endpoint: "chat" (/v1/chat/completions) or "completions" (/v1/completions).
        prompt_tokens: (low, high) prompt length in tokens, drawn log-uniformly; or None with `prompt_fraction`.
        prompt_fraction: (low, high) prompt length as a share of the server's max_model_len (near-limit prompts).
        max_tokens: the completion budgets to draw from (each equally likely).
        stream: share of requests streamed.
        greedy: share with temperature 0 (their output is checked against a lone run); the rest sample at
            temperature 0.8 with a seed.
        cancel: share of streamed requests whose client goes away mid-stream.
        cancel_after: (low, high) text chunks read before such a client disconnects.
        pool: distinct prompts of this class (drawn once; requests reuse them, so references stay few).
        style: "code" (a slice of source code) or "chat" (a question about a slice of code).
    """

    name: str
    weight: float = 1.0
    endpoint: str = "chat"
    prompt_tokens: tuple[int, int] | None = (16, 128)
    prompt_fraction: tuple[float, float] | None = None
    max_tokens: tuple[int, ...] = (32,)
    stream: float = 1.0
    greedy: float = 0.5
    cancel: float = 0.0
    cancel_after: tuple[int, int] = (1, 8)
    pool: int = 8
    style: str = "chat"


@dataclass
class Burst:
    """Arrivals at `factor` times the phase's rate from `at_s` for `length_s` seconds (a `[[bursts]]` table)."""

    at_s: float
    length_s: float
    factor: float


@dataclass
class Workload:
    """A parsed workload file.

    Attributes:
        name, description: from the file.
        classes: the request classes.
        rates: offered loads, requests/s; a string "0.5x" means 0.5 times the measured capacity.
        process: "poisson" (exponential gaps) or "uniform" (equal gaps).
        duration_s: length of each phase, seconds.
        max_requests: most requests sent per phase.
        max_requests_from: what set `max_requests`, as messages name it ("the workload's max_requests" or
            "--max-requests").
        bursts: rate spikes inside each phase.
        slo_ttft_s, slo_tpot_s: the SLO of goodput (a request counts when it completes within both).
        seed: seed of every random choice.
        retries: times a client refused with 503 retries after the server's Retry-After (at most 60 s each,
            as the official openai client does, whose default is 2); latency still counts from the first try.
    """

    name: str
    description: str = ""
    classes: list[RequestClass] = field(default_factory=list)
    rates: list[float | str] = field(default_factory=lambda: ["1x"])
    process: str = "poisson"
    duration_s: float = 30.0
    max_requests: int = 1000
    max_requests_from: str = "the workload's max_requests"
    bursts: list[Burst] = field(default_factory=list)
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.25
    seed: int = 0
    retries: int = 0


def _bad(path: str, where: str, what: str) -> SoloError:
    return SoloError(f"workload {path}: {where} {what}")


def _is_number(value: Any) -> bool:  # noqa: ANN401
    # TOML's true / false are not numbers here (Python counts bool as an int).
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:  # noqa: ANN401
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(value: Any, path: str, where: str) -> float:  # noqa: ANN401
    if not _is_number(value) or value <= 0:
        raise _bad(path, where, f"must be a number > 0; got {value!r}")
    return float(value)


def _pair(value: Any, path: str, where: str, kind: type) -> tuple:  # noqa: ANN401
    if (not isinstance(value, list) or len(value) != 2 or not all(_is_number(v) for v in value)
        or (kind is int and not all(_is_int(v) for v in value))
            or value[0] > value[1] or value[0] < 0):
        raise _bad(path, where, f"must be [low, high] with 0 <= low <= high; got {value!r}")
    return tuple(kind(v) for v in value)


def _share(value: Any, path: str, where: str) -> float:  # noqa: ANN401
    if not _is_number(value) or not 0 <= value <= 1:
        raise _bad(path, where, f"must be a share between 0 and 1; got {value!r}")
    return float(value)


def parse_rate(text: str | float, path: str = "--rates") -> float | str:
    """A rate: a number of requests/s (> 0), or "<k>x" for k times the measured capacity.

    Raises:
        SoloError: anything else.
    """
    if isinstance(text, int | float) and not isinstance(text, bool) and text > 0 and math.isfinite(text):
        return float(text)
    if isinstance(text, str):
        t = text.strip()
        try:
            value = float(t[:-1] if t.endswith("x") else t)
        except ValueError:
            value = -1.0
        if value > 0 and math.isfinite(value):
            return f"{value:g}x" if t.endswith("x") else value
    raise SoloError(f"{path}: a rate is requests/s (e.g. 2.5) or a multiple of capacity (e.g. 1.5x); got {text!r}")


def load_workload(name_or_path: str) -> Workload:
    """Read a workload: a shipped name ("chat", "code", "soak") or a TOML file's path.

    Raises:
        SoloError: no such workload, invalid TOML, or a field out of range (named in the message).
    """
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        shipped = WORKLOADS_DIR / f"{name_or_path}.toml"
        if not shipped.is_file():
            names = ", ".join(sorted(p.stem for p in WORKLOADS_DIR.glob("*.toml")))
            raise SoloError(f"--load {name_or_path}: no such file, and not a shipped workload ({names})")
        path = shipped
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SoloError(f"workload {path}: not valid TOML ({exc})") from None
    return parse_workload(raw, str(path))


_TOP = {"name", "description", "seed", "retries", "rates", "process", "duration_s", "max_requests", "bursts", "slo",
        "classes"}
_BURST = {"at_s", "length_s", "factor"}
_CLASS = {"name", "weight", "endpoint", "prompt_tokens", "prompt_fraction", "max_tokens", "stream", "greedy",
          "cancel", "cancel_after", "pool", "style"}


def parse_workload(raw: dict[str, Any], path: str = "<workload>") -> Workload:  # noqa: C901
    """Check and convert a workload's TOML table (see workloads/README.md).

    Raises:
        SoloError: an unknown key or a value out of range, naming it.
    """
    unknown = set(raw) - _TOP
    if unknown:
        raise _bad(path, "key", f"{sorted(unknown)[0]!r} is unknown; known keys: {', '.join(sorted(_TOP))}")
    for key in ("name", "description"):
        if key in raw and not isinstance(raw[key], str):
            raise _bad(path, key, f"must be a string; got {raw[key]!r}")
    w = Workload(name=raw.get("name", Path(path).stem), description=raw.get("description", ""))
    w.seed = raw.get("seed", 0)
    if not _is_int(w.seed):
        raise _bad(path, "seed", f"must be an integer; got {w.seed!r}")
    w.retries = raw.get("retries", 0)
    if not _is_int(w.retries) or not 0 <= w.retries <= 10:
        raise _bad(path, "retries", f"must be an integer in [0, 10]; got {w.retries!r}")
    rates = raw.get("rates", ["1x"])
    if not isinstance(rates, list):
        raise _bad(path, "rates", f'must be a list of rates (e.g. ["0.5x", "1x", 3.0]); got {rates!r}')
    w.rates = [parse_rate(r, f"workload {path}: rates") for r in rates]
    if not w.rates:
        raise _bad(path, "rates", "must list at least one rate")
    w.process = raw.get("process", "poisson")
    if w.process not in ("poisson", "uniform"):
        raise _bad(path, "process", f"must be 'poisson' or 'uniform'; got {w.process!r}")
    w.duration_s = raw.get("duration_s", 30.0)
    if not _is_number(w.duration_s) or not 0 < w.duration_s <= MAX_PHASE_S:
        raise _bad(path, "duration_s", f"must be in (0, {MAX_PHASE_S:g}]; got {w.duration_s!r}")
    w.max_requests = raw.get("max_requests", 1000)
    if not _is_int(w.max_requests) or not 1 <= w.max_requests <= MAX_REQUESTS:
        raise _bad(path, "max_requests", f"must be an integer in [1, {MAX_REQUESTS}]; got {w.max_requests!r}")
    bursts = raw.get("bursts", [])
    if not isinstance(bursts, list):
        raise _bad(path, "bursts", "must be a list of [[bursts]] tables")
    for i, b in enumerate(bursts):
        where = f"bursts[{i}]"
        if not isinstance(b, dict):
            raise _bad(path, where, "must be a [[bursts]] table of at_s, length_s and factor")
        unknown, missing = sorted(set(b) - _BURST), sorted(_BURST - set(b))
        if unknown:
            raise _bad(path, where, f"key {unknown[0]!r} is unknown; a burst takes at_s, length_s and factor")
        if missing:
            raise _bad(path, where, f"lacks {missing[0]!r}; a burst takes at_s, length_s and factor")
        for key in sorted(_BURST):
            if not _is_number(b[key]) or b[key] < 0:
                raise _bad(path, f"{where}.{key}", f"must be a number >= 0; got {b[key]!r}")
        if not 0 < b["factor"] <= MAX_BURST_FACTOR:
            raise _bad(path, f"{where}.factor", f"must be in (0, {MAX_BURST_FACTOR:g}]; got {b['factor']!r}")
        w.bursts.append(Burst(float(b["at_s"]), float(b["length_s"]), float(b["factor"])))
    slo = raw.get("slo", {})
    if not isinstance(slo, dict):
        raise _bad(path, "slo", "must be a [slo] table of ttft_s and tpot_s")
    if set(slo) - {"ttft_s", "tpot_s"}:
        raise _bad(path, "slo", f"key {sorted(set(slo) - {'ttft_s', 'tpot_s'})[0]!r} is unknown; [slo] takes ttft_s "
                                "and tpot_s")
    w.slo_ttft_s = _positive(slo.get("ttft_s", 2.0), path, "slo.ttft_s")
    w.slo_tpot_s = _positive(slo.get("tpot_s", 0.25), path, "slo.tpot_s")
    classes = raw.get("classes", [])
    if not isinstance(classes, list) or not classes:
        raise _bad(path, "classes", "must list at least one [[classes]] table")
    for i, c in enumerate(classes):
        where = f"classes[{i}]"
        if not isinstance(c, dict):
            raise _bad(path, where, "must be a table")
        unknown = set(c) - _CLASS
        if unknown:
            raise _bad(path, where, f"key {sorted(unknown)[0]!r} is unknown; known: {', '.join(sorted(_CLASS))}")
        name = c.get("name", f"class{i}")
        if not isinstance(name, str) or not name.strip():
            raise _bad(path, f"{where}.name", f"must be a non-empty string; got {name!r}")
        if any(other.name == name for other in w.classes):
            own = "" if "name" in c else " (the default name of a class without one)"
            raise _bad(path, f"{where}.name", f"{name!r}{own} names another class too; give each class its own name")
        rc = RequestClass(name=name)
        rc.weight = _positive(c.get("weight", 1.0), path, f"{where}.weight")
        rc.endpoint = c.get("endpoint", "chat")
        if rc.endpoint not in ("chat", "completions"):
            raise _bad(path, f"{where}.endpoint", f"must be 'chat' or 'completions'; got {rc.endpoint!r}")
        rc.style = c.get("style", "chat" if rc.endpoint == "chat" else "code")
        if rc.style not in ("chat", "code"):
            raise _bad(path, f"{where}.style", f"must be 'chat' or 'code'; got {rc.style!r}")
        if "prompt_fraction" in c and "prompt_tokens" in c:
            raise _bad(path, where, "give prompt_tokens or prompt_fraction, not both")
        if "prompt_fraction" in c:
            rc.prompt_tokens = None
            rc.prompt_fraction = _pair(c["prompt_fraction"], path, f"{where}.prompt_fraction", float)
            if rc.prompt_fraction[1] >= 1:
                raise _bad(path, f"{where}.prompt_fraction", "must stay below 1 (room for the completion)")
        else:
            rc.prompt_tokens = _pair(c.get("prompt_tokens", [16, 128]), path, f"{where}.prompt_tokens", int)
            if rc.prompt_tokens[0] < 1:
                raise _bad(path, f"{where}.prompt_tokens", "must be at least 1 token")
        mt = c.get("max_tokens", [32])
        mt = [mt] if _is_int(mt) else mt
        if not isinstance(mt, list) or not mt or not all(_is_int(v) and v >= 1 for v in mt):
            raise _bad(path, f"{where}.max_tokens", f"must be a list of token counts >= 1; got {mt!r}")
        rc.max_tokens = tuple(mt)
        rc.stream = _share(c.get("stream", 1.0), path, f"{where}.stream")
        rc.greedy = _share(c.get("greedy", 0.5), path, f"{where}.greedy")
        rc.cancel = _share(c.get("cancel", 0.0), path, f"{where}.cancel")
        rc.cancel_after = _pair(c.get("cancel_after", [1, 8]), path, f"{where}.cancel_after", int)
        # Nothing given is left without effect: a cancel share with no streamed requests, or a cancel_after
        # with no cancellations.
        if rc.cancel > 0 and rc.stream == 0:
            raise _bad(path, f"{where}.cancel", "is a share of the streamed requests, and stream = 0 streams none: "
                                                "raise stream or drop cancel")
        if "cancel_after" in c and rc.cancel == 0:
            raise _bad(path, f"{where}.cancel_after", "applies to cancelled streams, and cancel = 0 (the default) "
                                                      "cancels none: set cancel or drop cancel_after")
        rc.pool = c.get("pool", 8)
        if not _is_int(rc.pool) or not 1 <= rc.pool <= 256:
            raise _bad(path, f"{where}.pool", f"must be an integer in [1, 256]; got {rc.pool!r}")
        w.classes.append(rc)
    return w


@dataclass
class PlannedRequest:
    """One request of a phase, fixed before the phase starts.

    Attributes:
        offset_s: when to send it, seconds after the phase starts (latency counts from here).
        cls: its class.
        prompt: index into the class's prompt pool.
        max_tokens: completion budget.
        stream: streamed or not.
        greedy: temperature 0 (else temperature 0.8 with `seed`).
        seed: the sampling seed.
        cancel_after: text chunks after which the client disconnects, or None.
    """

    offset_s: float
    cls: RequestClass
    prompt: int
    max_tokens: int
    stream: bool
    greedy: bool
    seed: int
    cancel_after: int | None


def rate_at(workload: Workload, rate: float, t: float) -> float:
    """Arrival rate (requests/s) at `t` seconds into a phase of base `rate`, bursts included."""
    # (a factor below 1 is a lull; where bursts overlap, the largest factor)
    active = [b.factor for b in workload.bursts if b.at_s <= t < b.at_s + b.length_s]
    return rate * (max(active) if active else 1.0)


def _next_uniform_arrival(workload: Workload, rate: float, t: float) -> float:
    # Equal gaps in arrivals, not in time: the next arrival is where the rate's integral since `t` reaches 1, so
    # a gap that starts in a lull (or a burst) ends at the rate that follows it (1 / rate(t) made one arrival in
    # a lull of x0.01 put the next 100 gaps away, past the lull and the phase).
    edges = sorted({e for b in workload.bursts for e in (b.at_s, b.at_s + b.length_s) if e > t})
    need = 1.0
    for edge in [*edges, math.inf]:
        r = rate_at(workload, rate, t)
        if (edge - t) * r >= need:
            return t + need / r
        need -= (edge - t) * r
        t = edge
    return math.inf  # (not reached: the last piece is unbounded)


def plan_phase(workload: Workload, rate: float, duration_s: float, max_requests: int,
               seed: int) -> list[PlannedRequest]:
    """The requests of one phase at `rate` requests/s: arrival offsets and every random choice.

    Poisson arrivals with bursts are drawn by thinning (Lewis and Shedler, 1979): candidates at the
    peak rate, each kept with probability rate(t) / peak.

    Args:
        workload: the workload.
        rate: base arrival rate, requests/s (> 0).
        duration_s: the phase's length; no arrival at or after it.
        max_requests: stop after this many.
        seed: the phase's seed.
    """
    rng = random.Random(seed)
    peak = max(rate_at(workload, rate, b.at_s) for b in workload.bursts) if workload.bursts else rate
    peak = max(peak, rate)
    weights = [c.weight for c in workload.classes]
    out: list[PlannedRequest] = []
    t = 0.0
    while len(out) < max_requests:
        if workload.process == "poisson":
            t += rng.expovariate(peak)
            keep = rng.random() * peak < rate_at(workload, rate, t)
        else:
            t = _next_uniform_arrival(workload, rate, t)
            keep = True
        if t >= duration_s:
            break
        if not keep:
            continue
        cls = rng.choices(workload.classes, weights)[0]
        stream = rng.random() < cls.stream
        cancel = stream and rng.random() < cls.cancel
        out.append(PlannedRequest(
            offset_s=t, cls=cls, prompt=rng.randrange(cls.pool), max_tokens=rng.choice(cls.max_tokens),
            stream=stream, greedy=rng.random() < cls.greedy, seed=rng.randrange(2**31),
            cancel_after=rng.randint(*cls.cancel_after) if cancel else None,
        ))
    return out


def prompt_lengths(cls: RequestClass, max_model_len: int, seed: int) -> list[int]:
    """Token lengths of a class's prompt pool (log-uniform in prompt_tokens, or shares of max_model_len).

    Each is capped so that the prompt plus the class's largest max_tokens fits max_model_len.
    """
    rng = random.Random(seed)
    room = max(1, max_model_len - max(cls.max_tokens) - 1)
    out = []
    for _ in range(cls.pool):
        if cls.prompt_fraction is not None:
            n = int(rng.uniform(*cls.prompt_fraction) * max_model_len)
        else:
            lo, hi = cls.prompt_tokens or (16, 128)
            n = round(math.exp(rng.uniform(math.log(lo), math.log(max(lo, hi)))))
        out.append(max(1, min(n, room)))
    return out
