"""The /metrics and /healthz endpoint on 127.0.0.1 against raw sockets: what it serves, and
what one client can make it hold (header size and count, a per-request deadline, idle
keep-alive, a connection cap, no request bodies, bounded buffering)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable

import orjson
import pytest
from chronowheel.node.metrics import NodeMetrics
from chronowheel.observe.http import HttpEndpoint, HttpLimits
from chronowheel.settings import Secret
from chronowheel.timeouts import within

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@contextlib.asynccontextmanager
async def serving(limits: HttpLimits | None = None, *, healthy: bool = True,
                  token: Secret | None = None) -> AsyncIterator[HttpEndpoint]:
    endpoint = HttpEndpoint(NodeMetrics().registry,
                            lambda: (healthy, {"shards": [1, 2]} if healthy else {"why": "lag"}),
                            0, "127.0.0.1", token=token, limits=limits)
    await endpoint.start()
    try:
        yield endpoint
    finally:
        await endpoint.stop()


async def connect(endpoint: HttpEndpoint) -> Conn:
    return await asyncio.open_connection("127.0.0.1", endpoint.port)


async def response(reader: asyncio.StreamReader, *, head_only: bool = False
                   ) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers (names lower-cased), body (by Content-Length)."""
    head = await within(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    length = 0 if head_only else int(headers.get("content-length", "0"))
    body = await within(reader.readexactly(length), 5) if length else b""
    return status, headers, body


async def request(endpoint: HttpEndpoint, text: str) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await connect(endpoint)
    try:
        writer.write(text.encode())
        await writer.drain()
        return await response(reader, head_only=text.startswith("HEAD"))
    finally:
        writer.close()


async def get(endpoint: HttpEndpoint, path: str, extra: str = "") -> tuple[int, bytes]:
    status, _headers, body = await request(
        endpoint, f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n")
    return status, body


async def closed_by_server(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """Everything the server still sends until it closes the connection (a reset counts as
    closed); fails if it is still open after `timeout_s`."""
    data = b""
    try:
        while chunk := await within(reader.read(65536), timeout_s):
            data += chunk
    except ConnectionResetError:
        pass
    return data


async def until(predicate: Callable[[], bool], timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


# --- what it serves --------------------------------------------------------------------------


async def test_metrics_health_and_liveness_answer_as_before() -> None:
    async with serving() as endpoint:
        status, headers, body = await request(
            endpoint, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=")
        assert b"chronowheel_" in body
        status, headers, body = await request(
            endpoint, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (status, headers["content-type"]) == (200, "application/json")
        assert orjson.loads(body) == {"ok": True, "shards": [1, 2]}
        assert await get(endpoint, "/healthz/live") == (200, b'{"ok":true}')
        assert (await get(endpoint, "/nowhere"))[0] == 401  # no token configured
    async with serving(healthy=False) as endpoint:
        status, body = await get(endpoint, "/healthz?verbose=1")
        assert status == 503 and orjson.loads(body) == {"ok": False, "why": "lag"}
        assert (await get(endpoint, "/healthz/live"))[0] == 200


async def test_a_path_beyond_the_public_ones_needs_the_bearer_token() -> None:
    async with serving(token=Secret("tok-9")) as endpoint:
        status, headers, body = await request(
            endpoint, "GET /debug HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert status == 401 and headers["www-authenticate"] == 'Bearer realm="chronowheel"'
        assert b"tok-9" not in body
        assert (await get(endpoint, "/debug", "Authorization: Bearer tok-9\r\n"))[0] == 404


async def test_head_answers_the_headers_without_a_body() -> None:
    async with serving() as endpoint:
        reader, writer = await connect(endpoint)
        writer.write(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /healthz/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, headers, _ = await response(reader, head_only=True)
        assert status == 200 and int(headers["content-length"]) > 100
        # The very next bytes are the second response: the HEAD sent no body.
        status, _, body = await response(reader)
        assert (status, body) == (200, b'{"ok":true}')
        writer.close()


async def test_keep_alive_serves_two_requests_on_one_connection_then_closes_when_idle(
        ) -> None:
    async with serving(HttpLimits(keepalive_s=0.3)) as endpoint:
        reader, writer = await connect(endpoint)
        for path in ("/healthz", "/metrics"):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status, headers, body = await response(reader)
            assert status == 200 and len(body) == int(headers["content-length"])
            assert headers.get("connection", "").lower() != "close"
        assert endpoint.connections == 1
        started = time.monotonic()
        assert await closed_by_server(reader, 5) == b""
        assert time.monotonic() - started < 3
        await until(lambda: endpoint.connections == 0)
        writer.close()


async def test_http_1_0_is_answered_and_closed_unless_it_asks_to_keep_alive() -> None:
    async with serving() as endpoint:
        reader, writer = await connect(endpoint)
        writer.write(b"GET /healthz/live HTTP/1.0\r\n\r\n")
        status, headers, body = await response(reader)
        assert (status, headers["connection"].lower(), body) == (200, "close", b'{"ok":true}')
        assert await closed_by_server(reader, 5) == b""
        writer.close()
        reader, writer = await connect(endpoint)
        for _ in range(2):
            writer.write(b"GET /healthz/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            status, headers, _ = await response(reader)
            assert (status, headers["connection"].lower()) == (200, "keep-alive")
        writer.close()


async def test_a_client_that_half_closes_after_its_request_still_gets_the_answer() -> None:
    async with serving() as endpoint:
        reader, writer = await connect(endpoint)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        writer.write_eof()
        status, _, body = await response(reader)
        assert status == 200 and orjson.loads(body)["ok"] is True
        assert await closed_by_server(reader, 5) == b""
        writer.close()


async def test_a_failing_health_check_is_a_500_and_the_endpoint_goes_on() -> None:
    calls = 0

    def health() -> tuple[bool, dict[str, object]]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("health check bug")
        return True, {}

    endpoint = HttpEndpoint(NodeMetrics().registry, health, 0)
    await endpoint.start()
    try:
        assert (await get(endpoint, "/healthz"))[0] == 500
        assert (await get(endpoint, "/healthz"))[0] == 200
    finally:
        await endpoint.stop()


# --- what one client can make it hold ---------------------------------------------------------


async def test_an_oversize_header_is_refused_and_the_server_still_serves() -> None:
    async with serving() as endpoint:
        status, _, body = await request(
            endpoint, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + "a" * 20_000 + "\r\n\r\n")
        assert status in (400, 431)
        assert b"aaaa" * 50 not in body  # not echoed back at length
        status, _, _ = await request(
            endpoint, "GET /" + "m" * 20_000 + " HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status in (400, 414, 431)
        assert await get(endpoint, "/healthz/live") == (200, b'{"ok":true}')


async def test_too_many_headers_are_refused() -> None:
    async with serving(HttpLimits(max_headers=8)) as endpoint:
        many = "".join(f"X-H{i}: v\r\n" for i in range(20))
        status, _, _ = await request(endpoint, f"GET /healthz HTTP/1.1\r\nHost: x\r\n{many}\r\n")
        assert status in (400, 431)
        few = "".join(f"X-H{i}: v\r\n" for i in range(5))
        assert (await get(endpoint, "/healthz", few))[0] == 200


async def test_a_client_trickling_its_headers_is_cut_off_at_the_deadline() -> None:
    async with serving(HttpLimits(request_timeout_s=0.5)) as endpoint:
        reader, writer = await connect(endpoint)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sent = 0

        async def trickle() -> None:
            nonlocal sent
            with contextlib.suppress(ConnectionError):
                for _ in range(200):  # would take 20 s
                    writer.write(b"a")
                    await writer.drain()
                    sent += 1
                    await asyncio.sleep(0.1)

        trickler = asyncio.create_task(trickle())
        started = time.monotonic()
        try:
            assert await closed_by_server(reader, 5) == b""  # dropped, no answer
        finally:
            trickler.cancel()
        assert time.monotonic() - started < 3
        assert sent < 40
        await until(lambda: endpoint.connections == 0)
        writer.close()
        assert (await get(endpoint, "/healthz"))[0] == 200


async def test_a_client_that_never_reads_its_answer_is_cut_off_at_the_deadline() -> None:
    # The deadline is long enough that a busy machine still sees the answers back up before
    # the cut (the waits poll every 10 ms; a 0.5 s deadline was missed at a load average of 22).
    async with serving(HttpLimits(request_timeout_s=2.0)) as endpoint:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # so the answers back up
        sock.connect(("127.0.0.1", endpoint.port))
        sock.setblocking(False)
        _reader, writer = await asyncio.open_connection(sock=sock)
        # Pipelined requests (MBs of answers), none of the answers read: sending stalls.
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 400)
        await until(lambda: endpoint.buffered_bytes() > 0, timeout_s=10)
        most = 0

        def gone() -> bool:
            nonlocal most
            most = max(most, endpoint.buffered_bytes())
            return endpoint.connections == 0

        await until(gone, timeout_s=10)
        assert most < 256 * 1024  # what sits queued for the socket stays bounded meanwhile
        writer.close()


async def test_a_connection_that_sends_nothing_is_closed_at_the_deadline() -> None:
    async with serving(HttpLimits(request_timeout_s=0.3)) as endpoint:
        reader, writer = await connect(endpoint)
        assert await closed_by_server(reader, 5) == b""
        writer.close()


async def test_connections_beyond_the_cap_are_refused_not_queued() -> None:
    async with serving(HttpLimits(max_connections=2)) as endpoint:
        held = [await connect(endpoint) for _ in range(2)]
        await until(lambda: endpoint.connections == 2)
        reader, writer = await connect(endpoint)
        data = await closed_by_server(reader, 5)
        assert data == b"" or data.startswith(b"HTTP/1.1 503 ")
        writer.close()
        assert endpoint.refused == 1 and endpoint.connections == 2
        # A held connection is still served, and once one goes a new one is admitted.
        r0, w0 = held[0]
        w0.write(b"GET /healthz/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await response(r0))[0] == 200
        held[1][1].close()
        await until(lambda: endpoint.connections == 1)
        assert (await get(endpoint, "/healthz"))[0] == 200
        w0.close()


async def test_a_request_body_is_refused() -> None:
    async with serving() as endpoint:
        reader, writer = await connect(endpoint)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
                     + b"x" * 1000)
        status, headers, _ = await response(reader)
        assert status == 413 and headers["connection"].lower() == "close"
        await closed_by_server(reader, 5)
        writer.close()
        status, headers, _ = await request(
            endpoint, "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
        assert status == 405 and headers["allow"] == "GET, HEAD"
        await until(lambda: endpoint.connections == 0)


async def test_a_held_connection_keeps_a_bounded_number_of_bytes() -> None:
    cap = 2048
    async with serving(HttpLimits(max_request_bytes=cap, request_timeout_s=30)) as endpoint:
        reader, writer = await connect(endpoint)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        most = 0
        with contextlib.suppress(ConnectionError):
            for i in range(640):  # 64 KB of short headers if nothing stopped it
                writer.write(f"X-Pad-{i % 10}: {'p' * 88}\r\n".encode())
                await writer.drain()
                await asyncio.sleep(0)
                most = max(most, endpoint.buffered_bytes())
                if reader.at_eof() or writer.is_closing():
                    break
        data = await closed_by_server(reader, 5)
        assert data == b"" or data.startswith(b"HTTP/1.1 431 ")
        assert 0 < most <= cap + 100
        await until(lambda: endpoint.buffered_bytes() == 0 and endpoint.connections == 0)
        writer.close()


async def test_the_byte_cap_is_per_request_on_a_kept_alive_connection() -> None:
    async with serving(HttpLimits(max_request_bytes=512)) as endpoint:
        reader, writer = await connect(endpoint)
        for _ in range(30):  # 30 requests of ~100 bytes: far beyond 512 in all
            writer.write(b"GET /healthz/live HTTP/1.1\r\nHost: x\r\nUser-Agent: t\r\n"
                         b"Accept: */*\r\nX-Scrape: " + b"s" * 20 + b"\r\n\r\n")
            assert (await response(reader))[0] == 200
        writer.close()


async def test_stop_drops_held_connections() -> None:
    endpoint = HttpEndpoint(NodeMetrics().registry, lambda: (True, {}), 0,
                            limits=HttpLimits(request_timeout_s=60))
    await endpoint.start()
    reader, writer = await connect(endpoint)
    writer.write(b"GET /healthz HTTP/1.1\r\n")
    await until(lambda: endpoint.connections == 1)
    started = time.monotonic()
    await endpoint.stop()
    assert time.monotonic() - started < 3
    assert await closed_by_server(reader, 5) == b""
    writer.close()


@pytest.mark.parametrize("line", [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
                                  b"GARBAGE\r\n\r\n"])
async def test_garbage_gets_an_error_and_a_closed_connection(line: bytes) -> None:
    async with serving() as endpoint:
        reader, writer = await connect(endpoint)
        writer.write(line)
        data = await closed_by_server(reader, 5)
        assert data == b"" or data.split(b" ", 2)[1] in (b"400", b"405", b"501")
        writer.close()
        assert (await get(endpoint, "/healthz"))[0] == 200
