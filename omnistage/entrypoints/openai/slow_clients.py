"""Bounds on slow clients: a request's header and body must arrive in time, and the
number of open connections is capped, so a few sockets that send a byte now and then
(slowloris) cannot hold the server.

- Header: `HeaderTimeoutProtocol`, uvicorn's h11 protocol with a timer. It starts when a
  connection opens, and again at the first byte of each further request on a kept-alive
  connection, and stops when the request's header is complete. Bytes that keep arriving
  do not restart it. When it fires the connection is closed (no response: the request is
  not known yet). uvicorn's own keep-alive timeout still closes a connection that sends
  nothing between requests.
- Body: `BodyTimeoutMiddleware`. Once the header is in, the body must arrive within
  `read_timeout_s`, plus one second for each `min_body_bytes_per_s` bytes received (a
  large upload on a slow but live link goes on; a trickle of a few bytes a second does
  not). A client that stalls or trickles gets a 408 in OpenAI's shape and the
  connection is closed. Only reading the body is timed: a response (an SSE stream) can
  take as long as it takes, while the server waits for the client to disconnect.
- Connections: `max_connections`, uvicorn's `limit_concurrency` answered in OpenAI's
  shape: once that many connections are open, or requests are in flight, a new request
  gets a 503 error body at once and its connection is closed. An open WebSocket
  (/v1/realtime) counts as a connection, and an upgrade beyond the cap is such a 503.

`server_config` builds the uvicorn config `serve` runs with these bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11
import uvicorn
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from omnistage.entrypoints.openai.errors import OpenAIError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlowClientLimits:
    """How long a client may take to send its request, and how many may be connected."""

    header_timeout_s: float = 10.0
    """A request's header (request line and fields) must be complete this long after the
    connection opened, or after the request's first byte on a kept-alive connection."""
    read_timeout_s: float = 30.0
    """The request's body must have arrived this long after its header (plus the
    allowance `min_body_bytes_per_s` gives)."""
    min_body_bytes_per_s: float = 1024.0
    """Each this many bytes of body received give the body one second more."""
    max_connections: int = 1024
    """Open connections (or requests in flight) beyond which a new request gets a 503."""

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "read_timeout_s", "min_body_bytes_per_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a finite number of seconds > 0, got {value!r}")
        if not isinstance(self.max_connections, int) or self.max_connections < 2:
            raise ValueError(
                f"max_connections: must be an integer >= 2, got {self.max_connections!r}"
            )


class SlowClientConfig(uvicorn.Config):
    """uvicorn's config serving over `HeaderTimeoutProtocol` with `limits`."""

    def __init__(self, app: Any, limits: SlowClientLimits, **kwargs: Any) -> None:
        super().__init__(
            app, http=HeaderTimeoutProtocol, limit_concurrency=limits.max_connections, **kwargs
        )
        self.limits = limits


def server_config(
    app: Any, limits: SlowClientLimits | None = None, **kwargs: Any
) -> uvicorn.Config:
    """The uvicorn config serving `app` with `limits` (default `SlowClientLimits()`);
    `kwargs` are uvicorn's (host, port, log_level, ...)."""
    return SlowClientConfig(app, limits or SlowClientLimits(), **kwargs)


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol closing a connection whose request header is not complete
    `header_timeout_s` after the connection opened or the request's first byte."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        limits = config.limits if isinstance(config, SlowClientConfig) else SlowClientLimits()
        self.header_timeout_s = limits.header_timeout_s
        self.header_timer: asyncio.TimerHandle | None = None
        self.upgraded = False
        # uvicorn's own cap answers a plain-text 503: ours checks the same counts first.
        self.max_connections, self.limit_concurrency = self.limit_concurrency, None
        if self.max_connections is not None:
            self.app = self._capped(self.app, self.max_connections)

    def _capped(self, app: ASGIApp, limit: int) -> ASGIApp:
        """`app`, answering a 503 in OpenAI's shape (and closing) when this connection or
        request is beyond `limit` (uvicorn's test: its task is counted already here)."""

        async def capped(scope: Scope, receive: Receive, send: Send) -> None:
            if len(self.connections) >= limit or len(self.tasks) > limit:
                logger.warning("connection limit (%d) reached: answering 503", limit)
                error = OpenAIError(
                    f"the server has {limit} connections open, its limit; try again later",
                    HTTPStatus.SERVICE_UNAVAILABLE,
                )
                response = error.response()
                response.headers["connection"] = "close"
                await response(scope, receive, send)
                return
            await app(scope, receive, send)

        return capped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._awaiting_header():
            self._arm_header_timer()  # the first byte of a further request; no restart
        else:
            self._cancel_header_timer()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        # The connection is the WebSocket protocol's from now on: its header is complete,
        # and the timer must not close it later.
        self.upgraded = True
        self._cancel_header_timer()
        # uvicorn upgrades before any app runs, so `_capped` never sees the request: an open
        # WebSocket counts as a connection, and one beyond the cap is refused here.
        if self.max_connections is not None and len(self.connections) >= self.max_connections:
            self._refuse_upgrade(self.max_connections)
            return
        super().handle_websocket_upgrade(event)

    def _refuse_upgrade(self, limit: int) -> None:
        """A 503 in OpenAI's shape for a WebSocket upgrade over the cap; then close."""
        logger.warning("connection limit (%d) reached: refusing a WebSocket upgrade", limit)
        body = (
            OpenAIError(
                f"the server has {limit} connections open, its limit; try again later",
                HTTPStatus.SERVICE_UNAVAILABLE,
            )
            .response()
            .body
        )
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for part in (
            h11.Response(status_code=503, headers=headers, reason=b"Service Unavailable"),
            h11.Data(data=bytes(body)),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(part) or b"")
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _awaiting_header(self) -> bool:
        """No request of this connection is being answered: the next one's header is due."""
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        if self.header_timer is None and not self.upgraded and not self.transport.is_closing():
            self.header_timer = self.loop.call_later(self.header_timeout_s, self._header_late)

    def _cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_late(self) -> None:
        self.header_timer = None
        if self.transport.is_closing() or not self._awaiting_header():
            return
        logger.info(
            "%s: closing the connection: no complete request header within %g s",
            f"{self.client[0]}:{self.client[1]}" if self.client else "client",
            self.header_timeout_s,
        )
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()


class BodyTimeoutMiddleware:
    """408 (and the connection closed) for a request body that does not arrive in time
    (see the module)."""

    def __init__(self, app: ASGIApp, limits: SlowClientLimits) -> None:
        self.app = app
        self.timeout_s = limits.read_timeout_s
        self.min_bytes_per_s = limits.min_body_bytes_per_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = asyncio.get_running_loop().time()
        received, body_done, late, started = 0, False, False, False

        async def timed() -> Message:
            nonlocal received, body_done, late
            if body_done or late:  # after the body: waiting for a disconnect, untimed
                return await receive()
            deadline = start + self.timeout_s + received / self.min_bytes_per_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                late = True  # the route sees its client gone; the 408 is ours to send
                return {"type": "http.disconnect"}
            received += len(message.get("body", b""))
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def unless_late(message: Message) -> None:
            nonlocal started
            if late and not started:
                return  # what the route answers a client it thinks gone is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, timed, unless_late)
        except Exception:
            if not late:
                raise
        if late and not started:
            await self._too_slow(received).response()(scope, receive, send)

    def _too_slow(self, received: int) -> _RequestTimeout:
        return _RequestTimeout(
            f"request body: not received in time ({received} bytes within "
            f"{self.timeout_s:g} s plus 1 s per {self.min_bytes_per_s:g} bytes; the server's "
            "--read-timeout-s)",
            HTTPStatus.REQUEST_TIMEOUT,
            code="request_timeout",
        )


class _RequestTimeout(OpenAIError):
    """A 408 that closes the connection (the rest of the body is never read)."""

    def response(self) -> JSONResponse:
        response = super().response()
        response.headers["Connection"] = "close"
        return response
