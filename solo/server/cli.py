"""`solo serve`: an OpenAI-compatible HTTP server (the server itself lives in solo.server.app).

    solo serve [MODEL] --port 8000 --max-batch auto --max-queue 64 [--api-key KEY]

Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, POST /v1/messages, GET /v1/models,
Ollama's /api/*, llama-server's /completion and /infill, POST /tokenize, POST /detokenize, GET /health (503 while
loading, 200 when ready), GET /metrics (Prometheus); the README's "Serve" section has them all.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
"""`solo serve --log-level` values (Python's logging levels, as uvicorn names them)."""


def _gb_or_auto(value: str) -> float | None:
    # --prefix-cache-gb's type for `solo serve`: a number of GB, or "auto" (None: sized from memory), as it defaults
    from solo.cli import finite_float

    return None if value.strip().lower() == "auto" else finite_float(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `solo serve`."""
    from solo.cli import (
        add_context_argument,
        add_feature_arguments,
        add_model_arguments,
        add_template_arguments,
        argv_text,
        finite_float,
    )
    from solo.engine.reasoning import REASONING_PARSERS

    add_model_arguments(parser)
    add_template_arguments(parser, tools=True)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1; 0.0.0.0: every IPv4 address; ::: every IPv6 "
                             "and IPv4 address)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    parser.add_argument("--api-key", default=os.environ.get("SOLO_API_KEY") or None, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on every API route and /metrics (not /health, "
                             "/version, nor the playground page at /, which calls the API with the key you type in); "
                             "default: "
                             "$SOLO_API_KEY, which keeps the key out of the process list (vLLM's VLLM_API_KEY)")
    parser.add_argument("--allowed-origins", type=_comma_list("origins (e.g. http://localhost:3000)"), default=None,
                        metavar="ORIGINS",
                        help="comma-separated browser origins (CORS) that may call the API, e.g. "
                             "http://localhost:3000, or * for any (default: pages served from this machine: "
                             "localhost, 127.0.0.1 or [::1] on any port)")
    parser.add_argument("--allowed-hosts", type=_comma_list("host names (e.g. mybox.lan)"), default=None,
                        metavar="HOSTS",
                        help="comma-separated names the Host header may carry besides localhost, 127.0.0.1 "
                             "and [::1], e.g. mybox.lan, or * for any (default: with a loopback --host, those "
                             "three only, against DNS rebinding; otherwise any)")
    parser.add_argument("--log-level", "--uvicorn-log-level", default="info", type=str.lower,
                        choices=LOG_LEVELS,
                        help="the least severe log lines written, the server's and uvicorn's (default: info; vLLM's "
                             "--uvicorn-log-level is the same flag)")
    parser.add_argument("--disable-access-log", "--disable-uvicorn-access-log", action="store_true",
                        help="no line per HTTP request (health probes and scrapes included), as vLLM's "
                             "--disable-uvicorn-access-log")
    parser.add_argument("--served-model-name", default=None, metavar="NAME", type=argv_text,
                        help="the name clients send as `model` (default: MODEL as given, or the bundled "
                             "model's name)")
    parser.add_argument("--max-batch", type=_slots, default=None, metavar="N",
                        help="KV-cache slots: requests generated together (default: auto, 8 to 32 as a quarter "
                             "of free memory holds full-length slots; more slots let a request start at once "
                             "instead of queueing)")
    parser.add_argument("--max-queue", type=int, default=64, metavar="M",
                        help="requests that may wait for a slot; more get 503 + Retry-After (default: 64)")
    parser.add_argument("--reasoning-parser", default="auto", choices=REASONING_PARSERS,
                        help="split a thinking model's <think> ... </think> block out of chat replies into "
                             "reasoning_content (as vLLM's reasoning parsers): auto = when the chat template writes "
                             "such blocks (Qwen3, DeepSeek-R1 distills, QwQ, SmolLM3), none = never; qwen3 and "
                             "deepseek_r1 = always (default: auto)")
    parser.add_argument("--max-queue-wait", type=finite_float, default=None, metavar="SECONDS",
                        help="also refuse (503 + Retry-After) a request whose predicted wait for a slot exceeds "
                             "SECONDS: at the rate slots have been freeing (from the 8th finished request on), or "
                             "the median time by which enough running requests end, from how long recent requests "
                             "ran; bounds admitted requests' TTFT under load (default: off, only --max-queue bounds "
                             "the queue)")
    add_context_argument(parser, "; tokens per slot: lower it to save KV-cache memory")
    parser.add_argument("--prefill-chunk", type=int, default=None, metavar="TOKENS",
                        help="prompt tokens prefilled per scheduler step: a longer prompt is prefilled in chunks "
                             "with decode steps of the running requests between them (default: "
                             "256; 0: whole prompts)")
    parser.add_argument("--decode-batching", choices=("auto", "isolated", "fused"), default="auto",
                        help="auto (default): one batched decode call per step when the runtime is "
                             "batch-invariant, else one call per request; isolated: always one call per "
                             "request (each request's arithmetic identical to running alone); fused: always "
                             "batched (on a runtime that is not batch-invariant, last-bit differences)")
    add_feature_arguments(parser)
    for action in parser._actions:  # the server sizes its store from memory unless told (ServerSettings)
        if action.dest == "prefix_cache_gb":
            action.default, action.metavar = None, "GB|auto"
            action.type = _gb_or_auto
            action.help = ("reuse the KV cache of earlier prompts that start the same way; GB of KV snapshots kept "
                           "besides the live cache rows, preallocated at start-up (default: auto = as large as "
                           "the KV cache, at most 1 GB)")
    parser.add_argument("--max-body-mb", type=finite_float, default=16.0, metavar="MIB",
                        help="largest request body taken; a larger one gets 413 before it is read whole, so a "
                             "few huge bodies cannot exhaust memory (parsed, JSON takes up to about 25x its "
                             "size; default: 16)")
    parser.add_argument("--shutdown-grace", type=finite_float, default=30.0, metavar="SECONDS",
                        help="on SIGTERM, how long in-flight requests may run before they are ended (default: 30)")


def _slots(text: str) -> int | None:
    # "auto" (or nothing): chosen from free memory at start-up (solo.server.kv_memory.auto_slots).
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of slots or 'auto', got {text!r}") from None


def _comma_list(example: str) -> Callable[[str], list[str]]:
    # An argparse type: "a,b" -> ["a", "b"] (ServerSettings.validate checks each); `example` goes in the error.
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated {example} or *")
        return items

    return parse


def main(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM/SIGINT; returns 0 after a graceful shutdown.

    Raises:
        SoloError: a bad flag value, or a model that cannot be loaded.
    """
    from solo.cli import prefix_cache_gb_from_args
    from solo.errors import SoloError
    from solo.server.runner import check_address, serve
    from solo.server.scheduler import DEFAULT_PREFILL_CHUNK
    from solo.server.state import ServerSettings, allowed_hosts_for

    if args.host.startswith("[") and args.host.endswith("]"):  # ("[::]", "[::1]": as in URLs)
        args.host = args.host[1:-1]
    if not 0 <= args.port <= 65535:
        raise SoloError(f"--port must be in [0, 65535], got {args.port}")
    from solo.engine.engine import check_load_flags, resolve_device
    from solo.model.hub import check_local_model, resolve_dtype

    # What fails the model's load is refused here, before the server says it is listening (as vLLM checks).
    device = resolve_device(args.device)
    resolve_dtype(args.dtype, None)
    if args.tp < 1:
        raise SoloError(f"--tp must be >= 1, got {args.tp}")
    check_load_flags(device, args.backend, args.tp, args.quantize, args.speculative)
    check_address(args.host, args.port)  # (before a GGUF file's conversion, which may take minutes)
    check_local_model(args.model, args.revision, args.max_model_len)
    settings = ServerSettings(
        model=args.model, device=args.device, dtype=args.dtype, backend=args.backend, revision=args.revision,
        quantize=args.quantize, chat_template=args.chat_template, tool_call_parser=args.tool_call_parser,
        served_model_name=args.served_model_name, api_key=args.api_key, allowed_origins=args.allowed_origins,
        allowed_hosts=allowed_hosts_for(args.host, args.allowed_hosts),
        max_batch=args.max_batch,
        max_queue=args.max_queue, max_queue_wait_s=args.max_queue_wait, max_model_len=args.max_model_len,
        decode_batching=args.decode_batching,
        prefill_chunk=DEFAULT_PREFILL_CHUNK if args.prefill_chunk is None else args.prefill_chunk,
        shutdown_grace_s=args.shutdown_grace,
        prefix_cache_gb="auto" if args.prefix_cache_gb is None and not args.no_prefix_cache
        else prefix_cache_gb_from_args(args),
        speculative=args.speculative, tp=args.tp, reasoning_parser=args.reasoning_parser,
        max_body_mb=args.max_body_mb,
    )
    return serve(settings, args.host, args.port, log_level=args.log_level, access_log=not args.disable_access_log)
