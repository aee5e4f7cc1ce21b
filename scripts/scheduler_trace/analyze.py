"""Where each request's server-side TTFT went, from a scheduler trace (see sitecustomize.py in this folder).

Per request: handler (arrival to submit), wait (submit to the start of its own prefill) split into time
inside decode steps, inside other requests' prefills and the rest (scheduler Python, the GIL, idle), its
own prefill (its prefill calls, or the decode steps its prompt's pieces rode in), and how many whole decode
steps it waited. Percentiles of each part, and the mean parts of
the slowest 2% and 10% by TTFT.

    python scripts/scheduler_trace/analyze.py [--window A:B] trace.jsonl [more.jsonl ...]

--window A:B keeps the requests submitted A..B seconds after the first one (and the steps and calls that
started then): with `solo bench --load`, the rate phase after the capacity run (see the submit times).
"""

import collections
import json
import statistics
import sys


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def analyze(path, window=None):
    ev = [json.loads(line) for line in open(path)]
    if window is not None:  # only requests submitted within [a, b] s of the first submit (one load phase)
        t0 = min(e["t"] for e in ev if e["ev"] == "submit")
        ev = [e for e in ev if e["ev"] != "submit" or window[0] <= e["t"] - t0 <= window[1]]
        a, b = t0 + window[0], t0 + window[1]
        ev = [e for e in ev if e["ev"] in ("submit", "first") or a <= e["t0"] <= b]
    steps = [e for e in ev if e["ev"] == "step"]
    prefills = [e for e in ev if e["ev"] == "prefill"]
    spans = [e for e in ev if e["ev"] == "spans"]
    kernel = [e for e in ev if e["ev"] == "kernel"]

    def inside(a, b, items):
        return sum(max(0.0, min(b, x["t1"]) - max(a, x["t0"])) for x in items)

    subs, own, first = {}, collections.defaultdict(list), {}
    for e in ev:
        if e["ev"] == "submit":
            subs[e["id"]] = e
        elif e["ev"] in ("prefill", "piece"):  # its own prefill calls, or the steps its prompt rode in
            own[e["id"]].append(e)
        elif e["ev"] == "first":
            first.setdefault(e["id"], e["t"])
    rows = []
    for i, s in subs.items():
        if i not in first or i not in own:
            continue
        own[i].sort(key=lambda x: x["t0"])
        p0 = own[i][0]["t0"]
        wait = p0 - s["t"]
        steps_in, pre_in = inside(s["t"], p0, steps), inside(s["t"], p0, prefills)
        rows.append(dict(ttft=first[i] - s["start"], handler=s["t"] - s["start"], wait=wait, in_steps=steps_in,
                         in_prefills=pre_in, other=wait - steps_in - pre_in,
                         own_prefill=sum(p["t1"] - p["t0"] for p in own[i]),
                         whole_steps=sum(1 for x in steps if x["t0"] >= s["t"] and x["t1"] <= p0)))
    rows.sort(key=lambda r: r["ttft"])
    ms = lambda xs: "/".join(f"{1000 * pct(xs, p):.0f}" for p in (50, 90, 99))  # noqa: E731
    print(f"{path}: {len(rows)} requests, {len(steps)} decode steps, {len(prefills)} prefill calls")
    print(f"  decode step ms p50/p90/p99 {ms([x['t1'] - x['t0'] for x in steps])}; "
          f"prefill call ms {ms([x['t1'] - x['t0'] for x in prefills])}")
    mixed = [x for x in steps if x.get("pieces")]
    if mixed:
        print(f"  steps with prompt pieces: {len(mixed)} ({sum(x['pieces'] for x in mixed)} pieces, "
              f"{sum(x['piece_tokens'] for x in mixed)} prompt tokens); their ms p50/p90/p99 "
              f"{ms([x['t1'] - x['t0'] for x in mixed])}")
    if spans:
        emitted, entries = sum(x["tokens"] for x in steps), [x["entries"] for x in spans]
        print(f"  entries per step p50/p90 {pct(entries, 50)}/{pct(entries, 90)};"
              f" tokens emitted per entry fed {emitted / max(1, sum(entries)):.2f}")
    if kernel:
        threads = collections.Counter(x["th"] for x in kernel)
        in_steps = sum(x["t1"] - x["t0"] for x in steps)
        print(f"  kernel calls by thread count {dict(threads)}; time in steps {in_steps:.1f} s,"
              f" in kernel calls {sum(x['t1'] - x['t0'] for x in kernel):.1f} s")
    keys = ["ttft", "handler", "wait", "in_steps", "in_prefills", "other", "own_prefill"]
    print("  server TTFT parts, ms p50/p90/p99 of each: " + ", ".join(f"{k} {ms([r[k] for r in rows])}" for k in keys))
    waited = collections.Counter(min(r["whole_steps"], 3) for r in rows)
    print(f"  whole decode steps waited before the own prefill: 0: {waited[0]}, 1: {waited[1]}, 2: {waited[2]}, "
          f"3+: {waited[3]}")
    for share in (0.02, 0.10):
        tail = rows[int((1 - share) * len(rows)):]
        if tail:
            print(f"  slowest {share:.0%} ({len(tail)}), mean ms: "
                  + ", ".join(f"{k} {1000 * statistics.mean(r[k] for r in tail):.0f}" for k in keys))


if __name__ == "__main__":
    args, window = sys.argv[1:], None
    if args and args[0] == "--window":  # --window A:B  seconds after the first submit, e.g. the rate phase
        window = tuple(float(x) for x in args[1].split(":"))
        args = args[2:]
    for p in args:
        analyze(p, window)
