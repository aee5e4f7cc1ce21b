"""Running the app under uvicorn, with Solo's graceful shutdown.

On SIGTERM (or SIGINT) uvicorn stops listening and waits for in-flight responses. Solo adds: new
generation requests on open connections get 503, /health turns 503, and requests still running after
`shutdown_grace_s` are ended by the scheduler with finish_reason "abort", so every stream still ends with
its last chunk and `data: [DONE]`. Then the scheduler stops and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn
from uvicorn.logging import DefaultFormatter

from solo.engine.engine import Engine
from solo.errors import SoloError
from solo.server.app import create_app
from solo.server.header_deadline import http_protocol
from solo.server.heap import limit_malloc_arenas
from solo.server.state import ServerSettings, ServerState

# After a second signal ended the requests: the time their last events get to reach the clients before the
# exit is forced (a connection still sending its request body would hold it until uvicorn's deadline).
_CUT_SHORT_FLUSH_S = 1.0


class SoloServer(uvicorn.Server):
    """uvicorn's server with a drain step before its shutdown.

    Args:
        config: uvicorn config whose app is a `create_app` app.
        state: that app's state.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.cut_short = False  # a second signal came: the requests were ended at once, then the exit forced
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's, noting the event loop a second signal's work is handed to."""
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if sockets and self.started:  # (uvicorn says where it listens only for the sockets it binds itself)
            logging.getLogger("uvicorn.error").info("Uvicorn running on http://[%s]:%d (Press CTRL+C to quit)",
                                                    self.config.host, sockets[0].getsockname()[1])

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Refuse new work, give in-flight requests the grace period, end the rest, then shut down."""
        self.state.begin_drain()
        deadline = asyncio.get_running_loop().call_later(self.state.settings.shutdown_grace_s, self.state.abort_all)
        try:
            await super().shutdown(sockets)
        finally:
            deadline.cancel()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """As uvicorn's, but a second SIGINT or SIGTERM ends the grace period first (uvicorn: SIGINT only).

        The second signal ends every request as the grace period's end does (streams with an abort and
        `[DONE]`, a queued request with a 503), then forces the exit a moment later: forced at once, uvicorn
        answered a queued request with a bare 500 and cut streams off mid-chunk. A third forces it at once.
        """
        if self.should_exit and not self.cut_short and self._loop is not None:
            self.cut_short = True
            self._captured_signals.append(sig)
            self._loop.call_soon_threadsafe(self._end_requests_then_exit)
            return
        if self.should_exit:
            self.force_exit = True
        super().handle_exit(sig, frame)

    def _end_requests_then_exit(self) -> None:
        self.state.abort_all()
        asyncio.get_running_loop().call_later(_CUT_SHORT_FLUSH_S, setattr, self, "force_exit", True)

    @property
    def port(self) -> int | None:
        """The port actually bound (useful with port 0), once started."""
        for server in self.servers:
            for sock in server.sockets:
                return sock.getsockname()[1]
        return None


def build_server(settings: ServerSettings, host: str = "127.0.0.1", port: int = 8000,
                 load_engine: Callable[[], Engine] | None = None, log_level: str = "info",
                 access_log: bool = True) -> SoloServer:
    """An unstarted server; `.run()` blocks until shutdown, `.should_exit = True` stops it.

    A model that fails to load stops the server; `server.state.error` then holds the reason.

    Raises:
        SoloError: invalid settings.
    """
    holder: list[SoloServer] = []

    def on_fatal(_: BaseException) -> None:
        if holder:
            holder[0].should_exit = True

    app = create_app(settings, load_engine, on_fatal)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=access_log, lifespan="on",
        # uvicorn's own deadline comes after Solo's grace period, as a last resort.
        timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5,
        http=http_protocol(),  # (slow or silent clients' connections closed: header_deadline.py)
    )
    server = SoloServer(config, app.state.solo)
    holder.append(server)
    return server


def _cannot_listen(host: str, port: int, exc: OSError) -> SoloError:
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # (an IPv6 address in brackets, as in URLs)
    return SoloError(f"cannot listen on {address} ({exc.strerror}); pick another --port or --host")


def check_address(host: str, port: int) -> None:
    """Refuse an address this server could not listen on.

    A friendly error before uvicorn's own, which exits the process with status 1.

    Every address the host resolves to is bound at once, as the server will (uvicorn binds them all: `localhost`
    is ::1 and 127.0.0.1 on many systems): one checked alone let a port taken on another address fail only after
    the model loaded.

    Raises:
        SoloError: the host does not resolve, or an address cannot be bound (in use, not this machine's).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise SoloError(f"cannot resolve --host {host!r} ({exc.strerror})") from None
    with contextlib.ExitStack() as held:
        for family, kind, proto, _, address in {(i[0], i[4]): i for i in infos}.values():  # (each address once)
            try:
                sock = held.enter_context(socket.socket(family, kind, proto))
            except OSError:  # (a family this kernel lacks, as IPv6 under ipv6.disable=1: the server skips it too)
                continue
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # (as the server binds it: IPv6 alone, but "::" is dual-stack here)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if host == "::" else 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise _cannot_listen(host, port, exc) from None


def dual_stack_listener(host: str, port: int) -> socket.socket | None:
    """For `--host ::`, a listening socket that takes IPv4 clients too; None for any other host.

    uvicorn's event loop binds "::" with IPV6_V6ONLY set (asyncio and uvloop make one socket per address family,
    and "::" resolves to IPv6 alone), so IPv4 clients were refused; llama-server, Ollama and vLLM serve both
    families on "::", as dual-stack hosts and Kubernetes pods expect.

    Raises:
        SoloError: the address cannot be bound.
    """
    if host != "::" or not socket.has_dualstack_ipv6():
        return None
    try:
        return socket.create_server(("::", port), family=socket.AF_INET6, backlog=2048, dualstack_ipv6=True)
    except OSError as exc:
        raise _cannot_listen(host, port, exc) from None


def raise_open_file_limit() -> tuple[int, int] | None:
    """Raise the soft limit on open files to the hard limit; returns (old soft, new soft), or None.

    Each client connection holds a file descriptor. Linux's usual soft limit (1024) lets a few hundred idle
    or slow connections starve `accept` of descriptors, stalling every new client; the hard limit is
    usually far higher. (Go's runtime does the same at start-up.)
    """
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return None
    return soft, target


def _log_to_console(level: str) -> None:
    # uvicorn configures its own loggers only; Solo's messages (model loaded, failures) use its format and level.
    logger = logging.getLogger("solo")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(uvicorn.config.LOG_LEVELS[level])  # (uvicorn's names: "trace" is none of Python's)


class _ShutdownCancelFilter(logging.Filter):
    """Drop uvicorn's tracebacks of the requests a shutdown cancels.

    A forced exit (a second signal) says so in one line, and a graceful one's deadline in uvicorn's ("Cancel N
    running task(s)"): a connection still sending its body at the deadline was one traceback each.
    """

    def __init__(self, server: uvicorn.Server) -> None:
        super().__init__()
        self.server = server

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a cancelled request's "Exception in ASGI application" during a shutdown."""
        cancelled = (record.exc_info is not None and isinstance(record.exc_info[1], asyncio.CancelledError)) or \
            str(record.msg).rstrip().endswith("CancelledError")  # (the lifespan's, logged as its traceback's text)
        return not (self.server.should_exit and cancelled)


def serve(settings: ServerSettings, host: str, port: int, log_level: str = "info", access_log: bool = True) -> int:
    """Run the server in this (main) thread until SIGTERM/SIGINT; returns the exit status.

    `log_level` (one of `solo.server.cli.LOG_LEVELS`) applies to Solo's log lines and uvicorn's; `access_log` False
    drops the line uvicorn writes per request.

    0 after a graceful shutdown; 1 when a second signal cut the grace period short (requests ended). Stopped
    while the model loads, the process exits at once (status 0), without waiting for the load.

    The caller checks the address first (`check_address`; the CLI does before it checks the model).

    Raises:
        SoloError: invalid settings, `--host ::` that cannot be bound, or a model that could not be loaded (the CLI
            prints it, exit status 2).
    """
    listener = dual_stack_listener(host, port)
    if sys.stdout is None:  # (`>&-`: uvicorn's formatters ask it whether it is a terminal; the access log goes there)
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (for the process's life)
    _log_to_console(log_level)
    raise_open_file_limit()
    limit_malloc_arenas()  # before the server's threads start
    server = build_server(settings, host, port, log_level=log_level, access_log=access_log)

    def note(sig: int, frame: FrameType | None) -> None:
        # uvicorn re-raises the signal it caught once shut down; a Python handler here turns that into a
        # no-op, so a graceful shutdown exits 0 instead of dying by the signal.
        del sig, frame

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    quiet = _ShutdownCancelFilter(server)
    logging.getLogger("uvicorn.error").addFilter(quiet)
    try:
        server.run(sockets=None if listener is None else [listener])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logging.getLogger("uvicorn.error").removeFilter(quiet)
    if server.state.loading:  # stopped during the load, which no thread can interrupt: exit without waiting for it
        print("solo: stopped while the model was loading", file=sys.stderr, flush=True)
        sys.stdout.flush()
        launch = sys.modules.get("solo.distributed.launch")
        if launch is not None:  # (tensor-parallel ranks spawned for the load would go on loading)
            launch.stop_spawned_ranks()
        os._exit(0)  # (a GGUF conversion cut here leaves its temporary folder: the next one prunes it)
    error = server.state.error
    if error is not None:
        raise SoloError(f"cannot load the model: {error}") from None
    if server.force_exit or server.cut_short:  # a second Ctrl-C / SIGTERM: the grace period was cut short
        print("solo: forced shutdown (a second signal): the requests still running were ended", file=sys.stderr)
        return 1
    if not server.started:
        raise SoloError(f"could not start the server on {host}:{port} (see the log above)")
    return 0
