"""A minimal HTTP endpoint for /metrics and /healthz (no web framework needed for three routes),
served by the node and by the worker.

Listens on loopback unless `http_host` says otherwise. /metrics and /healthz are public; any
other path needs `Authorization: Bearer <CHRONOWHEEL_HTTP_TOKEN>` (chronowheel.security).

`/healthz` is the readiness signal (503 while the process should get no traffic or is behind,
with the reason in the JSON body); `/healthz/live` only says that the process answers, so a
liveness probe restarts a hung process but never one that is merely catching up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from chronowheel.security import bearer_allowed
from chronowheel.settings import Secret
from chronowheel.timeouts import within

log = logging.getLogger(__name__)


class HttpEndpoint:
    def __init__(self, registry: CollectorRegistry,
                 health: Callable[[], tuple[bool, dict[str, object]]],
                 port: int, host: str = "127.0.0.1", *, token: Secret | None = None) -> None:
        self._registry = registry
        self._health = health
        self._port = port
        self._host = host
        self._token = token
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)
        log.info("serving /metrics and /healthz on http://%s:%d", self._host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await within(reader.readline(), 5)
            headers: dict[str, str] = {}
            while (raw := await within(reader.readline(), 5)) not in (
                    b"\r\n", b"\n", b""):
                name, _, value = raw.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            parts = line.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else "/"
            if not bearer_allowed(path, headers, self._token):
                status, ctype, body = 401, "text/plain", b"bearer token required\n"
            elif path.startswith("/metrics"):
                status, ctype, body = 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
            elif path.split("?", 1)[0] == "/healthz/live":
                status, ctype, body = 200, "application/json", b'{"ok":true}'
            elif path.startswith("/healthz"):
                ok, detail = self._health()
                status, ctype = (200 if ok else 503), "application/json"
                body = orjson.dumps({"ok": ok, **detail})
            else:
                status, ctype, body = 404, "text/plain", b"not found\n"
            reason = {200: "OK", 401: "Unauthorized", 404: "Not Found",
                      503: "Service Unavailable"}[status]
            extra = 'WWW-Authenticate: Bearer realm="chronowheel"\r\n' if status == 401 else ""
            writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n{extra}"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
