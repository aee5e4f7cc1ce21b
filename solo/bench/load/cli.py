"""`solo bench --load WORKLOAD`: the flags and the run (see solo.bench.load)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from solo.errors import SoloError
from solo.server.heap import freeze_startup_heap, unfreeze_heap


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `solo bench --load` (MODEL, --dtype, --backend, --json and --plot are the bench's own)."""
    from solo.cli import argv_text, finite_float, output_path

    group = parser.add_argument_group("load test (solo bench --load)")
    group.add_argument("--load", default=None, metavar="WORKLOAD",
                       help="replay a workload (a shipped name: chat, code, soak; or a TOML file) against "
                            "`solo serve MODEL` started on loopback (or --url) and report latency against load")
    group.add_argument("--url", default=None, help="a running server on a loopback address instead of starting one")
    group.add_argument("--api-key", default=None, metavar="KEY",
                       help="the --url server's API key (its solo serve --api-key), sent as Authorization: Bearer")
    group.add_argument("--rates", default=None,
                       help="offered loads, comma-separated requests/s or multiples of the measured capacity "
                            "(e.g. 0.5x,1x,2x); default: the workload's")
    group.add_argument("--duration", type=finite_float, default=None, metavar="SECONDS",
                       help="length of each phase (default: the workload's)")
    group.add_argument("--max-requests", type=int, default=None, metavar="N",
                       help="most requests per phase (default: the workload's)")
    group.add_argument("--max-batch", type=int, default=None, metavar="N",
                       help="solo serve's --max-batch (default: the server's own, auto); the capacity run uses "
                            "as many closed-loop clients as the server has slots")
    group.add_argument("--prefill-chunk", type=int, default=None, metavar="TOKENS",
                       help="solo serve's --prefill-chunk (default: the server's own)")
    group.add_argument("--max-queue", type=int, default=None, metavar="M", help="solo serve's --max-queue")
    group.add_argument("--max-queue-wait", type=finite_float, default=None, metavar="SECONDS",
                       help="solo serve's --max-queue-wait (refuse requests predicted to wait longer for a slot)")
    group.add_argument("--serve-speculative", default=None, metavar="MODE",
                       help="solo serve's --speculative (default: the server's own, auto)")
    group.add_argument("--max-model-len", type=int, default=None, metavar="TOKENS", help="solo serve's --max-model-len")
    group.add_argument("--capacity-s", type=finite_float, default=20.0, metavar="SECONDS",
                       help="length of the closed-loop capacity run, when a rate is given as <k>x (default: 20)")
    group.add_argument("--verify", type=int, default=64, metavar="N",
                       help="distinct greedy requests re-sent alone to check outputs (default: 64; 0: none)")
    group.add_argument("--request-timeout", type=finite_float, default=300.0, metavar="SECONDS",
                       help="a request still unanswered after this counts as a timeout (default: 300)")
    group.add_argument("--markdown", type=output_path, default=None, metavar="OUT.md",
                       help="write the report as Markdown")
    group.add_argument("--note", default="", type=argv_text,
                       help="a line added to the report (e.g. that the machine was shared)")


# The decode benchmark's flags that mean nothing to a load test: refused when set, not silently ignored.
DECODE_BENCH_ONLY = ("prompt_len", "gen_len", "repeats", "compare", "peers_after_solo", "sweep_context", "contexts",
                      "sweep_gen_len", "sweep_fill", "probe_gib", "energy_s", "pause_ms", "cpu_hog",
                      "agent_no_baseline")
# Flags handed to the `solo serve` the load test starts, in that order: (the bench's flag, solo serve's).
_SERVE_PASS = (("dtype", "--dtype"), ("backend", "--backend"), ("device", "--device"), ("revision", "--revision"),
               ("threads", "--threads"), ("tp", "--tp"), ("max_batch", "--max-batch"),
               ("prefill_chunk", "--prefill-chunk"), ("max_queue", "--max-queue"),
               ("max_queue_wait", "--max-queue-wait"), ("serve_speculative", "--speculative"),
               ("max_model_len", "--max-model-len"), ("quantize", "--quantize"),
               ("prefix_cache_gb", "--prefix-cache-gb"), ("no_prefix_cache", "--no-prefix-cache"))
# Those meaningless with --url, whose server already runs (--max-batch there sizes the capacity run's clients).
_SERVE_FLAGS = tuple(f for f, _ in _SERVE_PASS if f != "max_batch")


# The load test's own flags (besides --json / --plot, which every mode has).
_LOAD_ONLY = ("url", "api_key", "rates", "duration", "max_requests", "max_batch", "prefill_chunk", "max_queue",
              "max_queue_wait", "serve_speculative", "max_model_len", "capacity_s", "verify", "request_timeout",
              "markdown", "note")


def load_flags_given(args: argparse.Namespace) -> list[str]:
    """The load test's flags set to other than their defaults (`solo bench` refuses them without --load)."""
    return ["--" + f.replace("_", "-") for f in changed_flags(args, _LOAD_ONLY)]


def changed_flags(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """The `solo bench` flags (argparse dests) among `names` set to other than their defaults, in that order."""
    defaults = bench_defaults()
    return [f for f in names if getattr(args, f, defaults.get(f)) != defaults.get(f)]


@functools.cache
def bench_defaults() -> dict[str, Any]:
    """`solo bench`'s flag defaults by dest, from its parser (read only: the dict is shared)."""
    from solo.bench.cli import add_arguments as add_bench_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_bench_arguments(parser)
    return vars(parser.parse_args([]))


def serve_arguments(args: argparse.Namespace) -> list[str]:
    """`solo serve` flags for the server a load test starts, from `solo bench --load` flags.

    Raises:
        SoloError: a flag of the decode benchmark (--prompt-len, --compare, --speculative, ...), which a load
            test cannot honour, or a server flag beside --url (that server already runs with its own).
    """
    changed = changed_flags(args, (*DECODE_BENCH_ONLY, "speculative", *_SERVE_FLAGS))
    unused = [f for f in changed if f in DECODE_BENCH_ONLY]
    if unused:
        flags = ", ".join("--" + f.replace("_", "-") for f in unused)
        raise SoloError(f"{flags}: flags of the decode benchmark, which --load does not run; the load test's "
                        "prompts and outputs come from its workload (see `solo bench --help`, load test)")
    if "speculative" in changed:
        raise SoloError("--speculative sets the decode benchmark's speculation; for the server a load test starts "
                        "use --serve-speculative")
    if args.url:
        given = [f for f in changed if f in _SERVE_FLAGS]
        if given:
            flags = ", ".join("--" + f.replace("_", "-") for f in given)
            raise SoloError(f"{flags}: flags of the `solo serve` that --load starts; with --url the server already "
                            "runs with its own: set them where it was started, or drop --url")
        return []
    defaults = bench_defaults()
    serve: list[str] = []
    for name, flag in _SERVE_PASS:
        value = getattr(args, name, defaults[name])
        if name in ("dtype", "backend") or value != defaults[name]:  # (those two always: the report shows them)
            serve += _flag(flag, value)
    return serve


def _flag(flag: str, value: Any) -> list[str]:  # noqa: ANN401
    # One flag as command-line words: a switch alone, a float without trailing zeros.
    if value is True:
        return [flag]
    return [flag, f"{value:g}" if isinstance(value, float) else str(value)]


def _exit_on_sigterm(signum: int, frame: Any) -> None:  # noqa: ANN401
    raise SystemExit(128 + signum)


def _run_until_sigterm(coro: Any) -> Any:  # noqa: ANN401
    """`asyncio.run(coro)`, a SIGTERM cancelling it (then SystemExit, as `_exit_on_sigterm`).

    Raised from the signal handler anywhere in the event loop's code, the SystemExit could leave a lock of the loop
    or its executor held, and the run's teardown then waited on it (a test saw the bench hang past 60 s).
    """
    async def main() -> Any:  # noqa: ANN401
        loop, task, stopped = asyncio.get_running_loop(), asyncio.current_task(), []
        try:
            loop.add_signal_handler(signal.SIGTERM, lambda: (stopped.append(True), task.cancel()))
        except (ValueError, RuntimeError, NotImplementedError):  # (not the main thread, or no such support)
            return await coro
        try:
            return await coro
        except asyncio.CancelledError:
            if stopped:
                raise SystemExit(128 + signal.SIGTERM) from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(main())
    finally:  # (remove_signal_handler leaves the default action: the handler of the synchronous parts again)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _shape_model(args: argparse.Namespace) -> tuple[str, tempfile.TemporaryDirectory, str]:
    # A temporary folder the server loads (removed after the run): the shape's layers, a real tokenizer.
    from solo.bench.load.shape_folder import write_shape_folder
    from solo.model.default_model import default_model_path

    tokenizer = Path(args.tokenizer) if args.tokenizer else default_model_path()
    tmp = tempfile.TemporaryDirectory(prefix="solo-bench-shape-")
    try:
        print(f"writing {args.shape} with random weights and the tokenizer of {tokenizer.name}", file=sys.stderr)
        raw = write_shape_folder(args.shape, Path(tmp.name), tokenizer, args.dtype, args.seed)
    except BaseException:
        tmp.cleanup()
        raise
    label = (f"{args.shape} shape, random weights, vocabulary cut to the {tokenizer.name} tokenizer's "
             f"{raw['vocab_size']}")
    print(label, file=sys.stderr)
    return tmp.name, tmp, label


def _machine(args: argparse.Namespace) -> dict[str, Any]:
    # machine_info of the host; for a server this run starts on CUDA, its GPU's name through NVML or
    # nvidia-smi, so the load generator opens no CUDA context of its own on the GPU the server uses.
    import torch

    from solo.bench.report import machine_info

    info = machine_info(torch.device("cpu"))
    device = getattr(args, "device", None)
    if not getattr(args, "url", None) and device and str(device).startswith("cuda"):
        info["gpu"] = _gpu_name(torch.device(device).index or 0)
    return info


def _gpu_name(index: int) -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            return name.decode() if isinstance(name, bytes) else str(name)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # (no NVML, or NVML without this GPU: try the driver's tool)
        pass
    try:
        out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip() or "CUDA GPU"
    except (OSError, subprocess.SubprocessError):
        return "CUDA GPU"


def _command(args: argparse.Namespace) -> str:
    # Rebuilt from the flags (not sys.argv), so the report never quotes local paths of a caller's shell.
    parts = ["solo", "bench"] + ([Path(args.model).name] if args.model else []) + ["--load", Path(args.load).name]
    if getattr(args, "shape", None):
        parts += ["--shape", args.shape] + (["--tokenizer", Path(args.tokenizer).name] if args.tokenizer else [])
        parts += ["--seed", str(args.seed)] if args.seed else []
    defaults = bench_defaults()
    for flag in ("url", "rates", "duration", "max_requests", "max_batch", "prefill_chunk", "max_queue",
                 "max_queue_wait", "serve_speculative", "max_model_len", "capacity_s", "verify", "dtype", "backend",
                 "quantize", "device", "revision", "threads", "tp", "prefix_cache_gb", "no_prefix_cache",
                 "request_timeout", "note"):
        value = getattr(args, flag, defaults[flag])
        if value != defaults[flag]:
            parts += _flag(f"--{flag.replace('_', '-')}", value)
    for flag in ("json", "markdown", "plot"):
        if getattr(args, flag, None):
            parts += [f"--{flag}", Path(getattr(args, flag)).name]
    return shlex.join(parts)


def main(args: argparse.Namespace) -> int:
    """Run the load test; print the Markdown report and write --json / --markdown / --plot.

    Returns:
        0 when no request got a 5xx other than 503 or went unanswered (no connection, a reset, a timeout, a cut
        or malformed reply: a server that died or hung) and no output was wrong, else 1.

    Raises:
        SoloError: a bad workload or flag, a server that cannot start, a non-loopback --url.
    """
    import httpx

    from solo.bench.load.report import markdown, plot_load, summarize_phase
    from solo.bench.load.runner import (
        build_prompts,
        check_loopback,
        check_outputs,
        closed_loop_capacity,
        cpu_load,
        energy_uj,
        idle_baseline,
        run_phase,
        server_slots,
        start_server,
        use_api_key,
    )
    from solo.bench.load.workload import MAX_PHASE_S, MAX_REQUESTS, load_workload, parse_rate
    from solo.bench.report import check_output_path, versions, write_output

    shape = getattr(args, "shape", None)
    if shape and (args.model or args.url):
        raise SoloError("--shape serves random weights of a shape; give MODEL, --url or --shape, not several")
    if not shape and (getattr(args, "tokenizer", None) or getattr(args, "seed", 0)):
        raise SoloError("--tokenizer and --seed make a --shape's model; without --shape the load test serves MODEL "
                        "(or the bundled model) as it is")
    if args.api_key is not None and not args.url:
        raise SoloError("--api-key is the key of a server given with --url; the server --load starts takes no key")
    workload = load_workload(args.load)
    if args.rates is not None:
        workload.rates = [parse_rate(r) for r in args.rates.split(",")]  # (an empty item is refused by name)
    if args.duration is not None:
        if not 0 < args.duration <= MAX_PHASE_S:
            raise SoloError(f"--duration must be in (0, {MAX_PHASE_S:g}] seconds; got {args.duration}")
        workload.duration_s = args.duration
    if args.max_requests is not None:
        if not 1 <= args.max_requests <= MAX_REQUESTS:
            raise SoloError(f"--max-requests must be in [1, {MAX_REQUESTS}]; got {args.max_requests}")
        workload.max_requests = args.max_requests
        workload.max_requests_from = "--max-requests"
    if Path(args.load).name != args.load and not Path(args.load).is_file():
        raise SoloError(f"--load {args.load}: no such file")
    for flag, bad, bound in (("--max-batch", args.max_batch is not None and args.max_batch < 1, ">= 1"),
                             ("--capacity-s", not args.capacity_s > 0, "> 0"),
                             ("--verify", args.verify < 0, ">= 0"),
                             ("--request-timeout", not args.request_timeout > 0, "> 0")):
        if bad:
            value = getattr(args, flag[2:].replace("-", "_"))
            raise SoloError(f"{flag} must be {bound}, got {value:g}")
    if args.plot:
        from solo.bench.plot import require_matplotlib

        require_matplotlib(args.plot)
    for flag, value in (("--json", args.json), ("--plot", args.plot), ("--markdown", args.markdown)):
        if value:
            check_output_path(flag, value)

    server = None
    serve_args = serve_arguments(args)
    if args.revision is not None and (shape or not args.model or Path(args.model).exists()):
        raise SoloError("--revision picks a Hugging Face Hub id's branch, tag or commit; the model here is a local "
                        "folder, the bundled model or a --shape: drop --revision")
    shape_dir, shape_label, finished, frozen = None, "", False, False
    # SIGTERM (a `timeout`, a CI job's end) as an exception, so the server stops and the shape folder goes.
    main_thread = threading.current_thread() is threading.main_thread()  # (only it may set handlers)
    sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        if args.url:
            base = check_loopback(args.url)
            use_api_key(args.api_key)
            server_desc = f"{base} (already running)"
        else:
            model = args.model
            if shape:
                model, shape_dir, shape_label = _shape_model(args)
            server = start_server(model, serve_args)
            base = server.base_url
            shown = [f"<{shape} random weights>"] if shape else ([args.model] if args.model else [])
            server_desc = "solo serve " + shlex.join([*shown, *serve_args])
        meta: dict[str, Any] = {
            "command": _command(args),
            "server": server_desc, "machine": _machine(args),
            "versions": versions(), "cpu_load_before": cpu_load(), "note": args.note,
        }
        phases = []
        timeout = args.request_timeout
        energy_start = energy_uj()
        prompts = build_prompts(base, workload, workload.seed)
        meta["model"], meta["max_model_len"] = prompts.model, prompts.max_model_len
        if shape:
            meta["model"] = shape_label
        for note in prompts.notes:
            meta["note"] = f"{meta['note']} {note}.".strip()
            print(note, file=sys.stderr)
        # The load generator's own oldest-generation collections walk torch's import heap (~30-45 ms each,
        # longer beside a busy server) and hold every stream's reads meanwhile: charged to the server's TTFT.
        if not gc.get_freeze_count():  # (a caller that froze its own heap keeps it frozen)
            frozen = True
            freeze_startup_heap()
        idle = _run_until_sigterm(idle_baseline(base, prompts, workload, timeout))
        clients = args.max_batch or server_slots(base) or 8
        meta["capacity_clients"] = meta["server_slots"] = clients
        capacity = None
        if any(isinstance(r, str) for r in workload.rates):
            print(f"measuring capacity: {clients} closed-loop clients for {args.capacity_s:g} s", file=sys.stderr)
            capacity = _run_until_sigterm(closed_loop_capacity(base, prompts, workload, clients, args.capacity_s,
                                                        workload.seed + 1, timeout))
            meta["capacity_rps"] = capacity
            if capacity <= 0:
                raise SoloError("no request completed in the capacity run; see the server's log")
        missed = [b for b in workload.bursts if b.at_s >= workload.duration_s]
        if missed:
            print(f"note: {len(missed)} of the workload's bursts start after a {workload.duration_s:g} s phase ends "
                  f"(at {', '.join(f'{b.at_s:g}' for b in missed)} s): not run; raise --duration to include them",
                  file=sys.stderr)
        rss = server.rss_bytes if server is not None else None
        for i, rate in enumerate(workload.rates):
            rps = capacity * float(rate[:-1]) if isinstance(rate, str) else rate
            label = f"{rate} ({rps:.3g} req/s)" if isinstance(rate, str) else f"{rate:g} req/s"
            print(f"phase {label}: {workload.duration_s:g} s", file=sys.stderr)
            phases.append(_run_until_sigterm(run_phase(base, prompts, workload, rps, label, workload.duration_s,
                                                workload.max_requests, workload.seed + 100 + i, timeout, rss)))
        check = None
        if args.verify:
            check = _run_until_sigterm(check_outputs(base, prompts, workload, phases, timeout, args.verify))
        finished = True
    except httpx.TransportError as exc:
        raise SoloError(f"no answer from the server at {base} ({exc}); is `solo serve` running there?") from None
    finally:
        use_api_key(None)
        if frozen:
            unfreeze_heap()
        if main_thread:
            signal.signal(signal.SIGTERM, sigterm)
        status = server.stop() if server is not None else None
        if shape_dir is not None:
            shape_dir.cleanup()
        if server is not None:  # the server's log: kept (and named) unless the run and the server ended well
            if finished and status == 0:
                server.log_path.unlink(missing_ok=True)
            else:
                print(f"solo serve's log (exit status {status}): {server.log_path}", file=sys.stderr)
    energy_end = energy_uj()
    if energy_start is not None and energy_end is not None and energy_end >= energy_start:
        meta["energy_j"] = (energy_end - energy_start) / 1e6
    meta["cpu_load_after"] = cpu_load()
    meta["server_exit_status"] = status
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    # RSS drift is measured after a warm-up of a quarter of the phase (at most 60 s): allocator pools and the
    # queue fill first.
    summaries = [summarize_phase(p, workload, idle, warmup_s=min(60.0, p.duration_s / 4)) for p in phases]
    result = {"meta": meta, "workload": {"name": workload.name, "description": workload.description,
                                         "slo_ttft_s": workload.slo_ttft_s, "slo_tpot_s": workload.slo_tpot_s,
                                         "bursts": [vars(b) for b in workload.bursts],
                                         "classes": [vars(c) for c in workload.classes]},
              "idle": idle, "phases": summaries, "output_check": check}
    report = markdown(result)
    print(report)
    if args.json:
        write_output("--json", args.json, json.dumps(result, indent=2, default=str) + "\n")
    if args.markdown:
        write_output("--markdown", args.markdown, report)
    if args.plot:
        plot_load(result, args.plot)
    bad = sum(p["http_5xx"] - p["http_503"] + p["unanswered"] for p in summaries) + (check["wrong"] if check else 0)
    return 1 if bad else 0
