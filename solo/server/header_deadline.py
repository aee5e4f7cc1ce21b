"""A deadline for each request's headers: connections that send nothing, or dribble their headers, are closed.

uvicorn times out only the idle time after a response (`timeout_keep_alive`): a connection that never sends a
request, or sends its header lines one every few seconds (slow loris), stays open for as long as its client
likes, each holding a file descriptor (measured: 200 such connections held for 70 s, none closed). nginx
(`client_header_timeout`, 60 s) and Apache (`RequestReadTimeout`) bound the time a request's headers may take;
so does this protocol: a connection's first request must finish its headers within `HEADER_TIMEOUT_S` of the
connection, and every later request within that of its first byte, or the connection is closed. A request
whose headers are complete is never timed out here (a long stream, a slow body: the app's own limits apply).
"""

from __future__ import annotations

import asyncio
import logging

HEADER_TIMEOUT_S = 30.0
"""Seconds a request's headers may take, from the connection (first request) or the request's first byte."""

logger = logging.getLogger("solo.server")


def http_protocol() -> type | str:
    """The `http` setting of uvicorn: its httptools protocol with the header deadline, or "auto" without httptools.

    Returns:
        A subclass of uvicorn's `HttpToolsProtocol`, or "auto" (uvicorn's choice, no deadline) when httptools is
        not installed.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # (httptools is a dependency; uvicorn falls back to h11 without it)
        return "auto"

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, closing a connection whose request headers take too long."""

        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                logger.debug("closed a connection whose request headers took over %g s", HEADER_TIMEOUT_S)
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None:  # a later request on a kept-alive connection (the first: since connect)
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadlineProtocol
