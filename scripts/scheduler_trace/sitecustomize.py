"""Scheduler event trace of a `solo serve` process, for finding where a load test's TTFT goes (analysis only).

Python imports `sitecustomize` at start-up from the path; with this folder on PYTHONPATH and SOLO_TRACE set,
a `solo serve` process (one started by `solo bench --load` too) appends JSON lines to $SOLO_TRACE: every
submitted request, every prefill call, every decode step (and the prompt pieces prefilled inside it) and
`decode_spans` call, every native kernel call
(batch, threads) and every request's first token, with `time.perf_counter()` times. `analyze.py` reads them.
It wraps the scheduler's private methods, so it follows their names; nothing else is changed.

    SOLO_TRACE=trace.jsonl PYTHONPATH=scripts/scheduler_trace solo bench --load chat --rates 8 ...
    python scripts/scheduler_trace/analyze.py trace.jsonl
"""

import os
import sys

_PATH = os.environ.get("SOLO_TRACE")

if _PATH and "serve" in sys.argv:
    import itertools
    import json
    import time

    from solo.runtime import cpu as _cpu
    from solo.server import scheduler as _s

    _out = open(_PATH, "a", buffering=1)  # noqa: SIM115 (open for the process's life)
    _ids = itertools.count()

    def _log(**kw):
        _out.write(json.dumps(kw) + "\n")

    def _wrap(owner, name, make):
        setattr(owner, name, make(getattr(owner, name)))

    def _submit(orig):
        def submit(self, requests, loop, priority=0):
            now = time.perf_counter()
            for r in requests:
                r._trace_id = next(_ids)
                _log(ev="submit", id=r._trace_id, t=now, start=r.start_time, prompt=len(r.prompt_ids))
            return orig(self, requests, loop, priority)
        return submit

    def _prefill(orig):
        def prefill(self, seq, n):
            t0 = time.perf_counter()
            orig(self, seq, n)
            _log(ev="prefill", id=getattr(seq.request, "_trace_id", -1), t0=t0, t1=time.perf_counter(), n=n,
                 at=seq.prefill_at - n, ready=seq.ready)
        return prefill

    def _step(orig):
        def decode_step(self, seqs, pieces=()):
            t0 = time.perf_counter()
            before = [len(s.request.output_ids) for s in seqs]
            orig(self, seqs, pieces) if pieces else orig(self, seqs)  # (older schedulers: no pieces)
            t1 = time.perf_counter()
            _log(ev="step", t0=t0, t1=t1, rows=len(seqs),
                 tokens=sum(len(s.request.output_ids) - b for s, b in zip(seqs, before, strict=True)),
                 pieces=len(pieces), piece_tokens=sum(n for _, n in pieces))
            for seq, n in pieces:  # prompt pieces prefilled inside the step: the step's time is theirs too
                _log(ev="piece", id=getattr(seq.request, "_trace_id", -1), t0=t0, t1=t1, n=n,
                     at=seq.prefill_at - n, ready=seq.ready)
        return decode_step

    def _emit(orig):
        def emit(self, seq, event):
            if event.token_ids and len(seq.request.output_ids) == len(event.token_ids):
                _log(ev="first", id=getattr(seq.request, "_trace_id", -1), t=time.perf_counter())
            return orig(self, seq, event)
        return emit

    def _spans(orig):
        def decode_spans(runtime, rows, token_lists, starts, **kwargs):
            t0 = time.perf_counter()
            out = orig(runtime, rows, token_lists, starts, **kwargs)
            _log(ev="spans", t0=t0, t1=time.perf_counter(), rows=len(rows), entries=sum(map(len, token_lists)))
            return out
        return decode_spans

    def _calls_of_their_own(orig):
        def span_step(self, seqs, pieces=()):
            if seqs:  # a decode step (logged by decode_step)
                return orig(self, seqs, pieces)
            t0 = time.perf_counter()  # new requests' tails in a call of their own: before a step or in a pause
            orig(self, seqs, pieces)
            t1 = time.perf_counter()
            for seq, n in pieces:
                _log(ev="piece", id=getattr(seq.request, "_trace_id", -1), t0=t0, t1=t1, n=n,
                     at=seq.prefill_at - n, ready=seq.ready, own_call=True)
        return span_step

    def _pause(orig):
        def serve_arrivals_mid_step(self):  # a pause inside a step (the calls made in it are logged too)
            t0, served = time.perf_counter(), self.mid_step_prefills
            orig(self)
            if self.mid_step_prefills > served:
                _log(ev="pause", t0=t0, t1=time.perf_counter(), served=self.mid_step_prefills - served)
        return serve_arrivals_mid_step

    def _kernel(orig):
        def step(self, rows, token_ids, positions, flags, between=None):
            threads = self.threads.threads
            t0 = time.perf_counter()
            out = orig(self, rows, token_ids, positions, flags, between)
            _log(ev="kernel", t0=t0, t1=time.perf_counter(), b=int(rows.numel()), th=threads, flags=flags,
                 paused=between is not None)
            return out
        return step

    _wrap(_s.Scheduler, "submit", _submit)
    _wrap(_s.Scheduler, "_prefill", _prefill)
    _wrap(_s.Scheduler, "_decode_step", _step)
    _wrap(_s.Scheduler, "_emit", _emit)
    if hasattr(_s, "decode_spans"):
        _wrap(_s, "decode_spans", _spans)
    _wrap(_s.Scheduler, "_span_step", _calls_of_their_own)
    if hasattr(_s.Scheduler, "_serve_arrivals_mid_step"):
        _wrap(_s.Scheduler, "_serve_arrivals_mid_step", _pause)
    _wrap(_cpu.CpuRuntime, "_step", _kernel)
