"""The playground page at `/` of `solo serve`: chat and completion with live TTFT, tok/s and roofline fraction.

Static files (solo/server/static/: HTML, JS, CSS; no build step) are served without the API key, since they hold
no data; the page sends the key (typed once, kept in the browser's localStorage) as `Authorization: Bearer` on
every API call, /playground/info included.

GET /playground/info describes what is served (model, device, backend, dtype, context) and the decode roofline:
bytes read per token (weights + KV cache at `roofline_context` tokens) over a memory-bandwidth probe run once,
at the first call (a 512 MiB read on CPUs, a few hundred ms), and the server's own mean decode tok/s from its
Prometheus histogram `solo_request_decode_tokens_per_second`.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse

from solo.server.errors import APIError, StrictJSONRoute

STATIC_DIR = Path(__file__).parent / "static"
# (the page itself only at /: its URLs are relative to it)
_FILES = {"playground.js": "text/javascript", "playground.css": "text/css"}
STATIC_PREFIX = "/static/"
ROOFLINE_CONTEXT = 256  # tokens in the KV cache at which the page's roofline is computed
_PROBE_BYTES = 512 * 2**20

router = APIRouter(route_class=StrictJSONRoute)
_probe_lock = threading.Lock()


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)  # (HEAD: Ollama's CLI probes it)
async def index() -> FileResponse:
    """The playground page."""
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


@router.api_route(STATIC_PREFIX + "{name}", methods=["GET", "HEAD"], include_in_schema=False)
async def static_file(name: str) -> FileResponse:
    """The page's script and style sheet (a fixed list: nothing else on disk is reachable)."""
    if name not in _FILES:
        raise APIError(404, f"no static file {name!r}")
    return FileResponse(STATIC_DIR / name, media_type=_FILES[name])


def _mean_decode_tokens_per_s(metrics: Any) -> float | None:  # noqa: ANN401
    total = count = 0.0
    for family in metrics.tokens_per_s.collect():
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                total = sample.value
            elif sample.name.endswith("_count"):
                count = sample.value
    return total / count if count else None


def _roofline(state: Any) -> dict[str, Any]:  # noqa: ANN401
    import torch

    from solo.bench.roofline import decode_bytes, probe_cpu_bandwidth, probe_cuda_bandwidth, roofline_tokens_per_s

    engine = state.engine
    with _probe_lock:
        cached = getattr(state, "_playground_roofline", None)
        if cached is not None:
            return cached
        model = engine.model
        elem = torch.finfo(model.dtype).bits // 8 if model.dtype.is_floating_point else 2
        quantize = state.settings.quantize
        per_token = decode_bytes(engine.config, elem, ROOFLINE_CONTEXT, quantize=quantize).total
        device = torch.device(engine.device)
        if device.type == "cuda":
            probe = probe_cuda_bandwidth(device, buffer_bytes=2**30, passes=5)
        else:
            probe = probe_cpu_bandwidth(_PROBE_BYTES, passes=3)
        cached = {"bytes_per_token": per_token, "bandwidth_gbps": probe.bandwidth_gbps,
                  "roofline_tokens_per_s": roofline_tokens_per_s(probe.bandwidth_gbps, per_token),
                  "roofline_context": ROOFLINE_CONTEXT}
        state._playground_roofline = cached
        return cached


@router.get("/playground/info")
async def info(request: Request) -> JSONResponse:
    """What is served and the decode roofline (see the module docstring)."""
    state = request.app.state.solo
    engine, _ = state.require_ready()
    roofline = await asyncio.to_thread(_roofline, state)
    return JSONResponse({
        "model": state.served_name,
        "device": str(engine.device),
        "backend": engine.backend_name,
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "quantize": state.settings.quantize,
        "context": state.max_model_len,
        "chat": engine.tokenizer.chat_template is not None,
        "server_mean_decode_tokens_per_s": _mean_decode_tokens_per_s(state.metrics),
        **roofline,
    })
