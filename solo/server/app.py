"""The FastAPI application: `create_app(settings)` wires state, routes, errors, auth, CORS and metrics.

    app = create_app(ServerSettings(model="path/to/model", max_batch=8))
    uvicorn.run(app)   # or solo.server.runner.SoloServer for graceful shutdown

The engine never imports FastAPI; this package depends on the engine, not the reverse.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from solo import __version__
from solo.engine.engine import Engine
from solo.server.anthropic_messages import anthropic_error
from solo.server.anthropic_messages import router as messages_router
from solo.server.errors import APIError, install_error_handlers, shutting_down
from solo.server.llama_server import router as llama_server_router
from solo.server.metrics import ServerMetrics
from solo.server.ollama import ollama_error
from solo.server.ollama import router as ollama_router
from solo.server.playground import STATIC_PREFIX
from solo.server.playground import router as playground_router
from solo.server.responses import router as responses_router
from solo.server.routes import router
from solo.server.state import ServerSettings, ServerState, host_name

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/models",
          "/v1/models/{model}", "/tokenize", "/detokenize", "/health", "/metrics", "/", "/playground/info",
          "/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/ps", "/api/version", "/version",
          "/v1/messages/count_tokens", "/completion", "/infill", "/props", "/apply-template")
"""Labels of `solo_requests_total` by route; any other path counts as "other"."""
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"
"""Browser origins allowed by default (CORS): pages served from this machine, any port."""
_OPEN_ROUTES = ("/health", "/api/version", "/version")  # reachable without the API key (probes; Ollama's and
# vLLM's clients' first call)
_OPEN_PAGES = ("/", *(STATIC_PREFIX + name for name in ("playground.js", "playground.css")))
"""The playground's static files: no data in them; the page sends the key on its API calls."""


def _route_label(path: str) -> str:
    # One label for every model id keeps the metric's label set bounded.
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return path if path in ROUTES else "other"


def _error_reply(path: str, error: APIError) -> JSONResponse:
    # An error in the shape of the API the path belongs to (Anthropic's, Ollama's, OpenAI's).
    if path.rstrip("/") == "/v1/messages" or path.startswith("/v1/messages/"):
        return anthropic_error(error)
    return ollama_error(error) if path.startswith("/api/") else error.response()


async def _unless_ended(receive: Receive, ended: asyncio.Event) -> Message:
    # The next message of a request body, or the shutdown's 503 once `ended` is set first.
    if ended.is_set():
        raise shutting_down()
    message = asyncio.ensure_future(receive())
    end = asyncio.ensure_future(ended.wait())
    try:
        await asyncio.wait((message, end), return_when=asyncio.FIRST_COMPLETED)
    finally:
        end.cancel()
    if not message.done():
        message.cancel()
        raise shutting_down()
    return message.result()


class _Gate:
    """ASGI middleware: the Host and API-key checks (before anything else, even JSON parsing), and counting.

    Every response is counted by route and status.

    Args:
        app: the wrapped application.
        api_key: required as `Authorization: Bearer <key>` (or `x-api-key: <key>`, Anthropic's way) on every route
            but /health; None disables it.
        metrics: where requests are counted.
        allowed_hosts: names the Host header may carry (any port); None or "*": any.
        max_body_bytes: a larger request body is refused with 413, by its Content-Length before it is read, or
            as its chunks arrive past the bound; None: no bound.
        requests_ended: once set (the shutdown's grace period is over), a request still sending its body is
            answered 503 `shutting_down` (uvicorn's deadline would cancel it later, with a bare 500).
        allowed_origins: browser origins that may call the API (CORS's list; None: `LOCAL_ORIGINS`; "*": any). A
            request whose `Origin` header names another (and not this server itself) is refused with 403, as
            Ollama refuses it: CORS only hides the reply from such a page, and a form's text/plain POST (no
            preflight) would still run.
    """

    def __init__(self, app: ASGIApp, api_key: str | None, metrics: ServerMetrics,
                 allowed_hosts: list[str] | None = None, max_body_bytes: int | None = None,
                 requests_ended: asyncio.Event | None = None, allowed_origins: list[str] | None = None) -> None:
        self.app = app
        self.allowed_origins = None if allowed_origins is None else set(allowed_origins)
        self.max_body_bytes = max_body_bytes
        self.requests_ended = requests_ended
        self.expected = None if api_key is None else api_key.encode()
        self.metrics = metrics
        hosts = allowed_hosts or ["*"]
        self.allowed_hosts = None if "*" in hosts else {host_name(h) for h in hosts}

    def _host_refused(self, scope: Scope) -> APIError | None:
        if self.allowed_hosts is None:
            return None
        given = dict(scope.get("headers", ())).get(b"host", b"").decode("latin-1").strip()
        if not given:  # (HTTP/1.0 without one: not a browser, which always sends it)
            return None
        # "name:port", "[v6]:port", "name" -> the name ("[v6]" keeps its brackets)
        name = given[: given.index("]") + 1] if given.startswith("[") and "]" in given else given.rsplit(":", 1)[0]
        name = host_name(name)
        if name in self.allowed_hosts:
            return None
        return APIError(403, f"the Host header names {name!r}, which this server does not answer (it answers "
                        f"{', '.join(sorted(self.allowed_hosts))}: a guard against DNS rebinding); to reach it by "
                        f"that name, start it with --allowed-hosts {name}",
                        code="host_not_allowed")

    def _origin_refused(self, scope: Scope) -> APIError | None:
        headers = scope.get("headers", ())
        origins = [value.decode("latin-1").strip() for name, value in headers if name == b"origin"]
        if not origins or (self.allowed_origins is not None and "*" in self.allowed_origins):
            return None
        named = dict(headers)
        # The server's own pages (the playground): the browser says so (Sec-Fetch-Site, which a page cannot
        # set; behind a reverse proxy the Host is the proxy's upstream), or the Origin is the Host.
        if named.get(b"sec-fetch-site", b"").strip().lower() == b"same-origin":
            return None
        host = named.get(b"host", b"").decode("latin-1").strip().lower()
        for origin in origins:  # (every one: a second Origin header must not hide the first)
            if self.allowed_origins is None and re.fullmatch(LOCAL_ORIGINS, origin):
                continue
            if self.allowed_origins is not None and origin in self.allowed_origins:
                continue
            if host and origin.lower().partition("://")[2] == host:
                continue
            return APIError(403, f"requests from browser pages of origin {origin!r:.100} are refused (a page on "
                            "another site must not drive this server); to allow that origin, start the server with "
                            "--allowed-origins naming it", code="origin_not_allowed")
        return None

    def _too_large(self) -> APIError:
        mib = self.max_body_bytes / 2**20 if self.max_body_bytes else 0
        return APIError(413, f"the request body is larger than this server takes ({mib:g} MiB); send less, or "
                        "start the server with a larger --max-body-mb", code="request_too_large")

    def _body_refused(self, scope: Scope) -> APIError | None:
        headers = dict(scope.get("headers", ()))
        encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
        if encoding not in ("", "identity"):  # (it was read as the JSON's bytes: "not UTF-8 (byte 0x8b ...)")
            return APIError(415, f"the request body is sent with Content-Encoding {encoding!r}, which Solo does not "
                            "decode; send it uncompressed", code="unsupported_content_encoding")
        if self.max_body_bytes is None:
            return None
        length = headers.get(b"content-length", b"")
        return self._too_large() if length.isdigit() and int(length) > self.max_body_bytes else None

    def _bounded(self, receive: Receive) -> Receive:
        # A body without a Content-Length (chunked) is counted as it arrives: past the bound, the route's
        # reading of it raises the 413 (FastAPI's body parsing keeps it as the cause of its 400: see errors.py).
        # Until the body is whole, the shutdown's end of requests raises its 503 the same way.
        if self.max_body_bytes is None and self.requests_ended is None:
            return receive
        limit, seen, whole, ended = self.max_body_bytes, 0, False, self.requests_ended

        async def counted() -> Message:
            nonlocal seen, whole
            if whole or ended is None:
                message = await receive()
            else:
                message = await _unless_ended(receive, ended)
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if limit is not None and seen > limit:
                    raise self._too_large()
                whole = whole or not message.get("more_body", False)
            else:
                whole = True  # (a disconnect)
            return message

        return counted

    def _authorized(self, scope: Scope) -> bool:
        if self.expected is None or scope["path"] in _OPEN_ROUTES or scope["path"] in _OPEN_PAGES:
            return True
        headers = dict(scope.get("headers", ()))
        key = headers.get(b"x-api-key")  # Anthropic's clients send the key so
        if key is not None and secrets.compare_digest(key.strip(), self.expected):
            return True
        scheme, _, credentials = headers.get(b"authorization", b"").strip().partition(b" ")
        # The scheme is case-insensitive (RFC 7235, section 2.1): "bearer KEY" is as good as "Bearer KEY".
        return scheme.lower() == b"bearer" and secrets.compare_digest(credentials.strip(), self.expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # if the app dies before answering, uvicorn sends a 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refused = self._host_refused(scope) or self._origin_refused(scope) or self._body_refused(scope)
            if refused is not None:
                await _error_reply(scope["path"], refused)(scope, receive, send_and_note)
            elif self._authorized(scope):
                await self.app(scope, self._bounded(receive), send_and_note)
            else:
                error = APIError(401, "missing or incorrect API key; send it as 'Authorization: Bearer <key>' (or "
                                 "'x-api-key: <key>')", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await _error_reply(scope["path"], error)(scope, receive, send_and_note)
        finally:
            route = _route_label(scope["path"])
            self.metrics.requests.labels(route, str(status)).inc()


def create_app(settings: ServerSettings, load_engine: Callable[[], Engine] | None = None,
               on_fatal: Callable[[BaseException], None] | None = None) -> FastAPI:
    """Build the server application. The model starts loading (in the background) when the app starts.

    Args:
        settings: what to serve and how (validated here).
        load_engine: builds the engine on a worker thread; default `Engine.load` with the settings.
        on_fatal: called on the event loop if the model cannot be loaded (the CLI stops the server).

    Returns:
        The FastAPI app; its `state.solo` is the `ServerState`.

    Raises:
        SoloError: invalid settings.
    """
    settings.validate()
    state = ServerState(settings, load_engine, on_fatal)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(state.load())
        try:
            yield
        finally:
            loading.cancel()
            await state.close()

    app = FastAPI(title="Solo", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.solo = state
    install_error_handlers(app, reply=_error_reply)
    app.include_router(router)
    app.include_router(responses_router)
    app.include_router(messages_router)
    app.include_router(ollama_router)
    app.include_router(llama_server_router)
    app.include_router(playground_router)
    app.add_middleware(_Gate, api_key=settings.api_key, metrics=state.metrics,
                       allowed_hosts=settings.allowed_hosts, max_body_bytes=int(settings.max_body_mb * 2**20),
                       requests_ended=state.requests_ended, allowed_origins=settings.allowed_origins)
    # Outermost (added last), so a browser's preflight, which never carries the API key, is answered here.
    cors: dict[str, Any] = {"allow_origins": settings.allowed_origins} if settings.allowed_origins is not None \
        else {"allow_origin_regex": LOCAL_ORIGINS}
    # Any request header (the OpenAI and Anthropic browser SDKs send x-stainless-*), never credentials
    # (cookies); Retry-After readable on a 503.
    app.add_middleware(CORSMiddleware, allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                       expose_headers=["Retry-After"], **cors)
    return app
