"""The HTTP endpoint for /metrics and /healthz, served by the node and by the worker.

Listens on loopback unless `http_host` says otherwise. /metrics and /healthz are public; any
other path needs `Authorization: Bearer <CHRONOWHEEL_HTTP_TOKEN>` (chronowheel.security).

`/healthz` is the readiness signal (503 while the process should get no traffic or is behind,
with the reason in the JSON body); `/healthz/live` only says that the process answers, so a
liveness probe restarts a hung process but never one that is merely catching up.

HTTP parsing is aiohttp's low-level server; around each connection sits a guard that bounds
what one client can hold (`HttpLimits`):

- the request line and each header field are capped in size, the header count too (aiohttp
  answers 400 and closes);
- the bytes received for one request (line, headers, anything after them) are capped; beyond
  that the server answers 431 and closes;
- every request has a deadline, from its first byte (or the connection opening) until its
  response is handed to the socket: a client that trickles its headers, or that does not read
  the answer, is cut off when it passes;
- an idle keep-alive connection is closed after `keepalive_s`;
- at most `max_connections` connections are open; one more is answered 503 and closed;
- only GET and HEAD are served (405 otherwise), and a request with a body is answered 413
  and its connection closed: nothing here reads a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from chronowheel.security import bearer_allowed
from chronowheel.settings import Secret
from chronowheel.timeouts import within

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpLimits:
    """What one client may make the endpoint hold. The defaults fit Prometheus scrapes and
    kubelet probes (a request line and a handful of short headers, one request per scrape)
    with room to spare."""

    max_line_size: int = 4096
    """Bytes of the request line."""
    max_field_size: int = 4096
    """Bytes of one header field (name and value)."""
    max_headers: int = 32
    """Header fields of one request."""
    max_request_bytes: int = 16384
    """Bytes received for one request before its response (line, headers and anything
    after them); more and the connection is answered 431 and closed."""
    request_timeout_s: float = 10.0
    """From a request's first byte (or the connection opening) until its response is handed
    to the socket; past it the connection is dropped."""
    keepalive_s: float = 1.0
    """How long a connection may sit idle between a response and the next request. Scrapes
    and probes come seconds apart, so a longer wait would only hold connection slots; a
    client sending several requests in a row reuses its connection."""
    max_connections: int = 32
    """Open connections; one more is answered 503 and closed."""


_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n")
_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain\r\n"
              b"Content-Length: 18\r\nConnection: close\r\n\r\nrequest too large\n")
_ALLOWED_METHODS = ("GET", "HEAD")


class HttpEndpoint:
    def __init__(self, registry: CollectorRegistry,
                 health: Callable[[], tuple[bool, dict[str, object]]],
                 port: int, host: str = "127.0.0.1", *, token: Secret | None = None,
                 limits: HttpLimits | None = None) -> None:
        self._registry = registry
        self._health = health
        self._port = port
        self._host = host
        self._token = token
        self.limits = limits or HttpLimits()
        self._server: asyncio.Server | None = None
        self._web: web.Server | None = None
        self._guards: dict[asyncio.BaseTransport, _Guard] = {}
        self.refused = 0
        """Connections turned away because `max_connections` were open."""
        self._refusal_logged = 0.0

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections open now (refused ones not counted)."""
        return len(self._guards)

    def buffered_bytes(self) -> int:
        """Bytes the open connections hold: received for the request under way, and queued
        to be sent."""
        return sum(g.received + g.write_buffered() for g in self._guards.values())

    async def start(self) -> None:
        lim = self.limits
        self._web = web.Server(
            self._serve, access_log=None, logger=_ParseErrors(log, {}),
            max_line_size=lim.max_line_size, max_field_size=lim.max_field_size,
            max_headers=lim.max_headers,
            # aiohttp's own wait for a request, from the connection opening or the last
            # response: a backstop behind the guard's deadline and idle timer.
            keepalive_timeout=lim.request_timeout_s + lim.keepalive_s,
            lingering_time=0)
        web_server = self._web
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Guard(self, web_server()), self._host, self._port,
            backlog=lim.max_connections)
        log.info("serving /metrics and /healthz on http://%s:%d", self._host, self.port)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for guard in list(self._guards.values()):
            guard.drop()
        if self._web is not None:
            with contextlib.suppress(TimeoutError):
                await within(self._web.shutdown(1.0), 2.0)
        await self._server.wait_closed()

    # --- connections ------------------------------------------------------------------------
    def _admit(self, guard: _Guard) -> bool:
        if len(self._guards) >= self.limits.max_connections:
            self.refused += 1
            now = time.monotonic()
            if now - self._refusal_logged > 60:
                self._refusal_logged = now
                log.warning("HTTP endpoint: %d connections open, refusing more (%d so far)",
                            len(self._guards), self.refused)
            return False
        assert guard.transport is not None
        self._guards[guard.transport] = guard
        return True

    def _forget(self, guard: _Guard) -> None:
        if guard.transport is not None and self._guards.get(guard.transport) is guard:
            del self._guards[guard.transport]

    # --- requests ---------------------------------------------------------------------------
    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        guard = self._guards.get(request.transport) if request.transport else None
        if guard is not None:
            guard.request_started()
        resp = self._respond(request)
        try:
            await resp.prepare(request)
            await resp.write_eof()
        finally:
            if guard is not None:
                guard.request_done()
        return resp

    def _respond(self, request: web.BaseRequest) -> web.Response:
        if request.method not in _ALLOWED_METHODS:
            resp = _text(405, "method not allowed\n")
            resp.headers["Allow"] = ", ".join(_ALLOWED_METHODS)
            resp.force_close()
            return resp
        if request.body_exists:
            resp = _text(413, "a request body is not accepted\n")
            resp.force_close()
            return resp
        path = request.raw_path
        route = path.split("?", 1)[0]
        if not bearer_allowed(path, request.headers, self._token):
            resp = _text(401, "bearer token required\n")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="chronowheel"'
            return resp
        if route.startswith("/metrics"):
            return _body(200, CONTENT_TYPE_LATEST, generate_latest(self._registry))
        if route == "/healthz/live":
            return _body(200, "application/json", b'{"ok":true}')
        if route.startswith("/healthz"):
            ok, detail = self._health()
            return _body(200 if ok else 503, "application/json",
                         orjson.dumps({"ok": ok, **detail}))
        return _text(404, "not found\n")


def _body(status: int, content_type: str, body: bytes) -> web.Response:
    return web.Response(status=status, body=body, headers={"Content-Type": content_type})


def _text(status: int, text: str) -> web.Response:
    return _body(status, "text/plain", text.encode())


class _ParseErrors(logging.LoggerAdapter):
    """aiohttp's error logger: a request it could not parse (too long, too many headers,
    garbage) is the client's fault and logged at debug level, without the offending bytes;
    anything else keeps its traceback."""

    def exception(self, msg: object, *args: object, exc_info: object = True,
                  **kwargs: object) -> None:
        if isinstance(exc_info, HttpProcessingError) and (exc_info.code or 400) < 500:
            self.logger.debug("HTTP endpoint: refused a malformed request (%s, %s)",
                              exc_info.code, type(exc_info).__name__)
            return
        self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)


class _Guard(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, the endpoint's limits around it."""

    def __init__(self, endpoint: HttpEndpoint, inner: RequestHandler) -> None:
        self._endpoint = endpoint
        self._inner = inner
        self._limits = endpoint.limits
        self.transport: asyncio.Transport | None = None
        self.received = 0
        """Bytes received since the last response was handed to the socket."""
        self._admitted = False
        self._deadline: asyncio.TimerHandle | None = None
        self._idle: asyncio.TimerHandle | None = None

    # asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if not self._endpoint._admit(self):
            self.transport.write(_REFUSED)
            self.transport.close()
            return
        self._admitted = True
        self._arm_deadline()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted or self.transport is None or self.transport.is_closing():
            return
        if self._deadline is None:  # the first byte of the next request
            self._arm_deadline()
        self.received += len(data)
        if self.received > self._limits.max_request_bytes:
            self.received = 0
            self.transport.write(_TOO_LARGE)
            self.transport.close()  # the deadline still drops it if the client never reads
            return
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._admitted:
            self._inner.eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self.received = 0
        if self._admitted:
            self._endpoint._forget(self)
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()

    # the request cycle ----------------------------------------------------------------------
    def request_started(self) -> None:
        if self._deadline is None:  # a pipelined request, read before the last response
            self._arm_deadline()

    def request_done(self) -> None:
        """The response was handed to the socket: the next request starts from nothing, and
        the connection may now sit idle for `keepalive_s`."""
        self.received = 0
        self._cancel_timers()
        if self.transport is not None and not self.transport.is_closing():
            loop = asyncio.get_running_loop()
            self._idle = loop.call_later(self._limits.keepalive_s, self._idle_over)

    def write_buffered(self) -> int:
        if self.transport is None or self.transport.is_closing():
            return 0
        return self.transport.get_write_buffer_size()

    def drop(self) -> None:
        """Cut the connection now, whatever it is doing."""
        self._cancel_timers()
        if self.transport is not None:
            self.transport.abort()

    def _arm_deadline(self) -> None:
        self._cancel_timers()
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self._limits.request_timeout_s, self._deadline_over)

    def _deadline_over(self) -> None:
        self._deadline = None
        log.debug("HTTP endpoint: a request passed its %.1f s deadline; dropping the "
                  "connection", self._limits.request_timeout_s)
        self.drop()

    def _idle_over(self) -> None:
        self._idle = None
        if self.transport is not None:
            self.transport.close()

    def _cancel_timers(self) -> None:
        for handle in (self._deadline, self._idle):
            if handle is not None:
                handle.cancel()
        self._deadline = self._idle = None
