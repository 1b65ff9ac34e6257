"""The HTTP endpoint for /metrics and /healthz, served by the node and by the worker.

Listens on loopback unless `http_host` says otherwise. /metrics and /healthz are public; any
other path needs `Authorization: Bearer <CHRONOWHEEL_HTTP_TOKEN>` (chronowheel.security).

`/healthz` is the readiness signal (503 while the process should get no traffic or is behind,
with the reason in the JSON body); `/healthz/live` only says that the process answers, so a
liveness probe restarts a hung process but never one that is merely catching up.

HTTP is read and written by `observe/http_wire.py` (GET and HEAD, no bodies); each connection
is an asyncio protocol that bounds what one client can hold (`HttpLimits`):

- the request line and each header field are capped in size, the header count too (answered
  414 or 431 and closed);
- the bytes received for one request (line, headers, anything after them) are capped; beyond
  that the server answers 431 and closes;
- every request has a deadline, from its first byte (or the connection opening) until its
  response is handed to the socket: a client that trickles its headers, or that does not read
  the answer, is cut off when it passes;
- an idle keep-alive connection is closed after `keepalive_s`;
- at most `max_connections` connections are open; one more is answered 503 and closed;
- only GET and HEAD are served (405 otherwise), and a request with a body is answered 413
  and its connection closed: nothing here reads a body;
- while the socket does not take the answers (the client does not read them), the connection
  reads nothing more either: pipelined requests wait in the kernel, not here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from chronowheel.observe.http_wire import Refused, RequestHead, head_end, parse_head, response
from chronowheel.security import bearer_allowed
from chronowheel.settings import Secret

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


_REFUSED = response(503, "text/plain", b"too many connections\n", close=True)
_TOO_LARGE = response(431, "text/plain", b"request too large\n", close=True)
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
        self._connections: dict[asyncio.BaseTransport, _Connection] = {}
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
        return len(self._connections)

    def buffered_bytes(self) -> int:
        """Bytes the open connections hold: received for the request under way, and queued
        to be sent."""
        return sum(c.received + c.write_buffered() for c in self._connections.values())

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self._host, self._port,
            backlog=self.limits.max_connections)
        log.info("serving /metrics and /healthz on http://%s:%d", self._host, self.port)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections.values()):
            connection.drop()
        await self._server.wait_closed()

    # --- connections ------------------------------------------------------------------------
    def _admit(self, connection: _Connection) -> bool:
        if len(self._connections) >= self.limits.max_connections:
            self.refused += 1
            now = time.monotonic()
            if now - self._refusal_logged > 60:
                self._refusal_logged = now
                log.warning("HTTP endpoint: %d connections open, refusing more (%d so far)",
                            len(self._connections), self.refused)
            return False
        assert connection.transport is not None
        self._connections[connection.transport] = connection
        return True

    def _forget(self, connection: _Connection) -> None:
        transport = connection.transport
        if transport is not None and self._connections.get(transport) is connection:
            del self._connections[transport]

    # --- requests ---------------------------------------------------------------------------
    def answer(self, request: RequestHead) -> tuple[bytes, bool]:
        """The response to `request`, and whether the connection closes after it."""
        close = not request.keep_alive
        head_only = request.method == "HEAD"

        def reply(status: int, content_type: str, body: bytes,
                  extra: tuple[tuple[str, str], ...] = ()) -> bytes:
            return response(status, content_type, body, head_only=head_only, close=close,
                            keep_alive_1_0=request.version < (1, 1), extra=extra)

        if request.method not in _ALLOWED_METHODS:
            close = True
            return reply(405, "text/plain", b"method not allowed\n",
                         (("Allow", ", ".join(_ALLOWED_METHODS)),)), close
        if request.has_body:
            close = True
            return reply(413, "text/plain", b"a request body is not accepted\n"), close
        path = request.target
        route = path.split("?", 1)[0]
        if not bearer_allowed(path, request.headers, self._token):
            return reply(401, "text/plain", b"bearer token required\n",
                         (("WWW-Authenticate", 'Bearer realm="chronowheel"'),)), close
        if route.startswith("/metrics"):
            return reply(200, CONTENT_TYPE_LATEST, generate_latest(self._registry)), close
        if route == "/healthz/live":
            return reply(200, "application/json", b'{"ok":true}'), close
        if route.startswith("/healthz"):
            ok, detail = self._health()
            return reply(200 if ok else 503, "application/json",
                         orjson.dumps({"ok": ok, **detail})), close
        return reply(404, "text/plain", b"not found\n"), close


class _Connection(asyncio.Protocol):
    """One connection: requests read from its bytes and answered in order, within the
    endpoint's limits."""

    def __init__(self, endpoint: HttpEndpoint) -> None:
        self._endpoint = endpoint
        self._limits = endpoint.limits
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        """Received and not yet answered: the request under way and any pipelined after it."""
        self._admitted = False
        self._closing = False
        self._paused = False  # the socket takes no more answers for now
        self._deadline: asyncio.TimerHandle | None = None
        self._idle: asyncio.TimerHandle | None = None

    @property
    def received(self) -> int:
        """Bytes received and not yet answered."""
        return len(self._buffer)

    # asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if not self._endpoint._admit(self):
            self._closing = True
            self.transport.write(_REFUSED)
            self.transport.close()
            return
        self._admitted = True
        self._arm_deadline()

    def data_received(self, data: bytes) -> None:
        if not self._admitted or self._closing:
            return
        if self._deadline is None:  # the first byte of the next request
            self._arm_deadline()
        self._buffer += data
        self._serve()

    def eof_received(self) -> bool | None:
        return None  # the transport closes once what was written has been sent

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._closing = True
        self._buffer.clear()
        if self._admitted:
            self._endpoint._forget(self)

    def pause_writing(self) -> None:
        self._paused = True
        if self.transport is not None and not self._closing:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self.transport is not None and not self._closing:
            self.transport.resume_reading()
            self._serve()

    # the request cycle ----------------------------------------------------------------------
    def _serve(self) -> None:
        """Answer every complete request received, in order, while the socket takes them."""
        while not self._paused and not self._closing:
            end = head_end(self._buffer)
            if end is None or end[0] > self._limits.max_request_bytes:
                if len(self._buffer) > self._limits.max_request_bytes:
                    self._close_with(_TOO_LARGE)
                return
            length, consumed = end
            head = bytes(self._buffer[:length])
            del self._buffer[:consumed]
            lim = self._limits
            request = parse_head(head, max_line_size=lim.max_line_size,
                                 max_field_size=lim.max_field_size,
                                 max_headers=lim.max_headers)
            if isinstance(request, Refused):
                log.debug("HTTP endpoint: refused a malformed request (%d, %s)",
                          request.status, request.reason)
                self._close_with(response(request.status, "text/plain",
                                          f"{request.reason}\n".encode(), close=True))
                return
            try:
                answer, close = self._endpoint.answer(request)
            except Exception:
                log.exception("HTTP endpoint: answering %s %s failed", request.method,
                              request.target)
                self._close_with(response(500, "text/plain", b"internal error\n", close=True))
                return
            if close:
                self._close_with(answer)
                return
            assert self.transport is not None
            self.transport.write(answer)
            self._request_done()

    def _request_done(self) -> None:
        """The response was handed to the socket: the next request's deadline starts with its
        first byte (already here when pipelined), else the connection may sit idle for
        `keepalive_s`."""
        if self._buffer:
            self._arm_deadline()
            return
        self._cancel_timers()
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self._limits.keepalive_s, self._idle_over)

    def _close_with(self, data: bytes) -> None:
        """Send `data` last and close (the deadline still drops it if the client never reads)."""
        assert self.transport is not None
        self._closing = True
        self._buffer.clear()
        self.transport.write(data)
        self.transport.close()

    def write_buffered(self) -> int:
        if self.transport is None or self.transport.is_closing():
            return 0
        return self.transport.get_write_buffer_size()

    def drop(self) -> None:
        """Cut the connection now, whatever it is doing."""
        self._cancel_timers()
        self._closing = True
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
        if self.transport is None:
            return
        self._closing = True
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # an answer never read: close() would wait for it forever
        else:
            self.transport.close()

    def _cancel_timers(self) -> None:
        for handle in (self._deadline, self._idle):
            if handle is not None:
                handle.cancel()
        self._deadline = self._idle = None
