"""The load report: percentiles, goodput under the SLO, errors by kind, RSS drift; Markdown and a plot."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from solo.bench.load.client import Outcome
from solo.bench.load.runner import PhaseResult
from solo.bench.load.workload import Workload


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _pcts(values: list[float]) -> dict[str, float | None]:
    return {f"p{int(q * 100)}": percentile(values, q) for q in (0.5, 0.9, 0.99)}


def meets_slo(o: Outcome, workload: Workload) -> bool:
    """True for a completed request within the SLO.

    TTFT and TPOT where measured; a non-streamed request by its e2e against slo_ttft_s + slo_tpot_s x (tokens - 1).
    """
    if not o.completed:
        return False
    if o.ttft_s is None:
        budget = workload.slo_ttft_s + workload.slo_tpot_s * max(0, o.completion_tokens - 1)
        return o.e2e_s is not None and o.e2e_s <= budget
    return o.ttft_s <= workload.slo_ttft_s and (o.tpot_s is None or o.tpot_s <= workload.slo_tpot_s)


def rss_drift(samples: list[tuple[float, int]], warmup_s: float) -> dict[str, Any]:
    """Server RSS after warm-up: first and last sample past `warmup_s`, max, and drift (last / first - 1)."""
    after = [rss for t, rss in samples if t >= warmup_s] or [rss for _, rss in samples]
    if not after:
        return {}
    first, last = after[0], after[-1]
    return {"after_warmup_mib": round(first / 2**20, 1), "end_mib": round(last / 2**20, 1),
            "max_mib": round(max(after) / 2**20, 1), "drift_pct": round(100 * (last / first - 1), 2)}


def _over_own_idle(o: Outcome, idle_prompts: list[dict[str, float | None]] | None) -> float | None:
    # A request's TTFT over the idle TTFT of its own prompt in the same prefix-cache state: warm after a full
    # hit (or when the server did not say: a cancelled stream gets no usage; warm is the smaller, stricter
    # base), new when the server reused less than the whole prompt.
    if o.ttft_s is None or o.prompt is None or not idle_prompts or o.prompt >= len(idle_prompts):
        return None
    base = idle_prompts[o.prompt]
    new = base.get("new_ttft_s", base.get("cold_ttft_s"))
    idle = new if o.prefix_hit is False else (base["warm_ttft_s"] or new)
    return o.ttft_s / idle if idle else None


def _unanswered(kind: str) -> bool:
    # An error kind where the server gave no whole answer: no connection, a reset, a timeout, a cut or malformed
    # reply (not an HTTP status, which the server chose, nor the generator's own saturation, nor a wrong output,
    # which the output check counts).
    return not kind[:3].isdigit() and kind not in ("client saturated", "wrong output")


def summarize_phase(phase: PhaseResult, workload: Workload, idle: dict[str, dict[str, Any]],
                    warmup_s: float = 30.0) -> dict[str, Any]:
    """Every number of one phase (see the Markdown table for their meaning)."""
    outs = phase.outcomes
    done = [o for o in outs if o.completed]
    errors = Counter(o.error for o in outs if o.error)
    if phase.saturated:
        errors["client saturated"] = phase.saturated
    good = sum(meets_slo(o, workload) for o in done)
    statuses = Counter(str(o.status) if o.status is not None else "none" for o in outs)
    ttft = [o.ttft_s for o in done if o.ttft_s is not None]
    idle_ttft = {name: v["ttft_s"] for name, v in idle.items() if v.get("ttft_s")}
    ratios = {}
    for name, base in idle_ttft.items():
        p99 = percentile([o.ttft_s for o in done if o.cls == name and o.ttft_s is not None], 0.99)
        if p99 is not None and base:
            ratios[name] = round(p99 / base, 2)
    same_prompt = {}
    for name, v in idle.items():
        per_request = [r for o in done if o.cls == name and (r := _over_own_idle(o, v.get("prompts"))) is not None]
        p99 = percentile(per_request, 0.99)
        if p99 is not None:
            same_prompt[name] = round(p99, 2)
    # Rates over the phase: its arrival window (the duration, or up to where max_requests ended the arrivals), or
    # longer where requests were still running after it; not the time to the last answer alone, which at a low
    # rate ends long before the window does and would report more completions per second than were offered.
    span_s = max(phase.wall_s, phase.arrivals_end_s or phase.duration_s)
    return {
        "label": phase.label,
        "offered_rps": round(phase.rate_rps, 4),
        "duration_s": phase.duration_s,
        "wall_s": round(phase.wall_s, 2),
        "span_s": round(span_s, 2),
        "sent": len(outs),
        "arrivals_end_s": phase.arrivals_end_s,
        "max_requests_from": workload.max_requests_from,
        "arrivals_rps": round(len(outs) / (phase.arrivals_end_s or phase.duration_s), 4),
        "completed": len(done),
        "cancelled": sum(o.cancelled for o in outs),
        "throughput_rps": round(len(done) / span_s, 4) if span_s else None,
        "completed_per_hour": round(3600 * len(done) / span_s) if span_s else None,
        "goodput_rps": round(good / span_s, 4) if span_s else None,
        "goodput_share": round(good / len(outs), 4) if outs else None,
        "generated_tokens": sum(o.completion_tokens for o in done),
        "ttft_s": _pcts(ttft),
        "tpot_s": _pcts([o.tpot_s for o in done if o.tpot_s is not None]),
        "e2e_s": _pcts([o.e2e_s for o in done if o.e2e_s is not None]),
        "p99_ttft_over_idle": ratios,
        "p99_ttft_over_idle_same_prompt": same_prompt,
        "statuses": dict(statuses),
        "http_5xx": sum(n for s, n in statuses.items() if s.startswith("5")),
        "http_503": statuses.get("503", 0),
        "retried_503": sum(o.refusals for o in outs),
        "errors": dict(errors),
        "unanswered": sum(n for kind, n in errors.items() if _unanswered(kind)),
        "error_examples": {kind: next(o.error_message for o in outs if o.error == kind and o.error_message)
                           for kind in errors if any(o.error == kind and o.error_message for o in outs)},
        "retry_after_s": _pcts([o.retry_after_s for o in outs if o.retry_after_s is not None]),
        "rss": rss_drift(phase.rss_samples, warmup_s),
        "server_latency_s": phase.server_latency,
        "send_lag_s": _pcts([o.send_lag_s for o in outs if o.send_lag_s is not None]),
        "rss_mib": [[round(t, 1), round(v / 2**20, 1)] for t, v in phase.rss_samples[::5]],
        "requests": _requests(outs),
    }


def _requests(outs: list[Outcome]) -> list[dict[str, Any]]:
    # Every request of the phase, compactly (times in ms from the phase's first scheduled arrival), for
    # looking at where the tail comes from.
    if not outs:
        return []
    t0 = min(o.offered_at for o in outs)

    def ms(v: float | None) -> int | None:
        return None if v is None else round(v * 1000)

    return [{"cls": o.cls, "at": ms(o.offered_at - t0), "status": o.status, "error": o.error,
             "cancelled": o.cancelled, "refusals": o.refusals, "lag": ms(o.send_lag_s), "ttft": ms(o.ttft_s),
             "e2e": ms(o.e2e_s), "tokens": o.completion_tokens, "prompt": o.prompt, "cached": o.cached_tokens,
             "prompt_tokens": o.prompt_tokens}
            for o in outs]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _bursts_line(bursts: list[dict[str, float]], durations: list[float]) -> list[str]:
    # The workload's bursts, and those its phases were too short to reach (they would go unsaid otherwise).
    if not bursts:
        return []
    shortest = min(durations, default=0.0)
    said = [f"{b['factor']:g}x the rate for {b['length_s']:g} s at {b['at_s']:g} s"
            + (" (not reached: a phase lasts " f"{shortest:g} s)" if b["at_s"] >= shortest else "") for b in bursts]
    return [f"- Bursts: {'; '.join(said)}"]


def markdown(result: dict[str, Any]) -> str:
    """The report as Markdown: what was run, then one table row per phase, then errors and checks."""
    meta, phases = result["meta"], result["phases"]
    w = result["workload"]
    lines = [
        f"# `solo bench --load {w['name']}`",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"- Workload: {w['name']}" + (f" ({w['description']})" if w.get("description") else "")
        + f"; SLO: TTFT <= {w['slo_ttft_s']} s and TPOT <= {w['slo_tpot_s']} s",
        *_bursts_line(w.get("bursts") or [], [p["duration_s"] for p in phases]),
        f"- Server: {meta['server']}" + (f" ({meta['server_slots']} slots)" if meta.get("server_slots") else ""),
        f"- Model: {meta.get('model', '?')}",
        f"- Machine: {meta['machine'].get('cpu')} ({meta['machine'].get('cpu_cores')} CPUs)"
        + (f", {meta['machine']['gpu']}" if meta["machine"].get("gpu") else "") + "; load average before: "
        f"{meta['cpu_load_before']}, after: {meta.get('cpu_load_after')}",
    ]
    if meta.get("capacity_rps"):
        lines.append(f"- Capacity (closed loop, {meta['capacity_clients']} clients): {meta['capacity_rps']:.3f} "
                     "requests/s")
    if meta.get("note"):
        lines.append(f"- {meta['note']}")
    idle = result.get("idle", {})
    if idle:
        lines.append("- Idle server, one request alone: " + "; ".join(
            f"{k}: TTFT {_ms(v['ttft_s'])} ms, e2e {_ms(v['e2e_s'])} ms" for k, v in idle.items()))
    lines += [
        "",
        "Client-side times from each request's scheduled arrival (ms). Goodput: completed within the SLO. Goodput "
        "and done/hour count over the phase's arrival window (or longer, while requests still ran after it). "
        "p99 TTFT / idle: the phase's p99 over the class's idle TTFT (cold prompts); p99 of TTFT / own prompt's "
        "idle: each request's TTFT over the idle TTFT of the same prompt in the same prefix-cache state (warm "
        "after a full prefix-cache hit or when the server did not say, else the prompt's first send), the p99 "
        "of those ratios.",
        "",
        "| phase | offered (req/s) | sent | done | cancelled | 503 final / retried | other errors | TTFT p50/p90/p99 | "
        "TPOT p50/p90/p99 | e2e p50/p90/p99 | goodput (req/s) | done/hour | p99 TTFT / idle | "
        "p99 of TTFT / own prompt's idle | RSS drift |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in phases:
        # (arrivals the generator could not send are not the server's errors: listed below the table)
        other = sum(n for k, n in p["errors"].items() if not k.startswith("503") and k != "client saturated")
        t, tp, e = p["ttft_s"], p["tpot_s"], p["e2e_s"]
        ratio = ", ".join(f"{k} {v}x" for k, v in p["p99_ttft_over_idle"].items()) or "-"
        own = ", ".join(f"{k} {v}x" for k, v in p.get("p99_ttft_over_idle_same_prompt", {}).items()) or "-"
        drift = f"{p['rss']['drift_pct']}%" if p["rss"] else "-"
        lines.append(
            f"| {p['label']} | {p['offered_rps']:.3g} | {p['sent']} | {p['completed']} | {p['cancelled']} | "
            f"{p['http_503']} / {p['retried_503']} | {other} | {_ms(t['p50'])}/{_ms(t['p90'])}/{_ms(t['p99'])} | "
            f"{_ms(tp['p50'])}/{_ms(tp['p90'])}/{_ms(tp['p99'])} | {_ms(e['p50'])}/{_ms(e['p90'])}/{_ms(e['p99'])} | "
            f"{p['goodput_rps']:.3g} | {p['completed_per_hour']} | {ratio} | {own} | {drift} |")
    for p in phases:
        if p["errors"].get("client saturated"):
            lines += ["", f"{p['label']}: {p['errors']['client saturated']} arrivals not sent: the load generator "
                          "already held its bound of open requests (client saturated; not in `sent`)."]
    for p in phases:
        if p.get("arrivals_end_s"):
            lines += ["", f"{p['label']}: {p.get('max_requests_from', 'max_requests')} ended the arrivals at "
                          f"{p['arrivals_end_s']:.1f} s of the phase's {p['duration_s']:g} s."]
    lines += ["", "Errors by kind:", ""]
    for p in phases:
        lines.append(f"- {p['label']}: " + (", ".join(f"{k}: {n}" for k, n in sorted(p["errors"].items())) or "none"))
        for kind, message in sorted(p.get("error_examples", {}).items()):
            lines.append(f"  - {kind}, the first message: {message}")
    check = result.get("output_check")
    if check:
        lines += ["", f"Greedy outputs checked against the same request alone: {check['checked']} compared "
                      f"({check['references']} references), {check['wrong']} wrong, {check['unchecked']} unchecked."]
    server = [(p["label"], p.get("server_latency_s") or {}) for p in phases]
    if any(lat.get("queue") for _, lat in server):
        lines += ["", "Where TTFT goes, server side (from its histograms; bucket upper bounds, ms; arrival = the "
                      "request handler's start): time to a KV-cache slot / to the start of the request's prefill / "
                      "to its first token, p50/p90/p99:", ""]
        for label, lat in server:
            parts = [lat.get(k) or {} for k in ("queue", "prefill_wait", "ttft")]
            lines.append(f"- {label}: " + " / ".join("/".join(_ms(q.get(f"p{n}")) for n in (50, 90, 99))
                                                      for q in parts))
        lag = [(p["label"], p.get("send_lag_s") or {}) for p in phases]
        lines += ["", "Load generator's own lateness (scheduled arrival to send, ms, p50/p90/p99): " + "; ".join(
            f"{label}: " + "/".join(_ms(q.get(f"p{n}")) for n in (50, 90, 99)) for label, q in lag)]
    rss = [(p["label"], p["rss"]) for p in phases if p["rss"]]
    if rss:
        lines += ["", "Server RSS (MiB) after warm-up / end / max: " + "; ".join(
            f"{label}: {r['after_warmup_mib']} / {r['end_mib']} / {r['max_mib']} ({r['drift_pct']}%)"
            for label, r in rss)]
    if meta.get("energy_j") is not None:
        lines += ["", f"Energy (RAPL package counters, whole machine): {meta['energy_j']:.0f} J"]
    return "\n".join(lines) + "\n"


def plot_load(result: dict[str, Any], path: str | Path) -> None:
    """TTFT and e2e p50/p99 against offered load (left), goodput and throughput against it (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = sorted(result["phases"], key=lambda p: p["offered_rps"])
    x = [p["offered_rps"] for p in phases]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, name in (("ttft_s", "TTFT"), ("e2e_s", "e2e")):
        for q, style in (("p50", "-o"), ("p99", "--o")):
            ys = [p[key][q] for p in phases]
            left.plot(x, [None if y is None else y * 1000 for y in ys], style, label=f"{name} {q}")
    left.set_xlabel("offered load (requests/s)")
    left.set_ylabel("latency (ms)")
    left.set_yscale("log")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    right.plot(x, [p["throughput_rps"] for p in phases], "-o", label="completed")
    right.plot(x, [p["goodput_rps"] for p in phases], "-s", label="goodput (within SLO)")
    right.plot(x, x, ":", color="grey", label="offered")
    right.set_xlabel("offered load (requests/s)")
    right.set_ylabel("requests/s")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle(f"solo bench --load {result['workload']['name']}: {result['meta'].get('model', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
