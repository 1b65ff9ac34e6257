"""The endpoint's request heads and responses (observe/http_wire.py): what is read, what is
refused and with which status."""

from __future__ import annotations

import pytest
from chronowheel.observe.http_wire import Refused, RequestHead, head_end, parse_head, response

LIMITS = {"max_line_size": 100, "max_field_size": 60, "max_headers": 4}


def parse(head: bytes) -> RequestHead | Refused:
    return parse_head(head, **LIMITS)


def test_a_request_line_and_its_fields() -> None:
    got = parse(b"GET /healthz?x=1 HTTP/1.1\r\nHost: a\r\nX-A:  one \r\nx-a: two\r\n"
                b"Content-Length: 00")
    assert got == RequestHead("GET", "/healthz?x=1", (1, 1),
                              {"host": "a", "x-a": "one, two", "content-length": "0"})
    assert isinstance(got, RequestHead) and not got.has_body and got.keep_alive


@pytest.mark.parametrize(("head", "body", "keep"), [
    (b"GET / HTTP/1.1\r\nConnection: close", False, False),
    (b"GET / HTTP/1.1\r\nConnection: Upgrade, Close", False, False),
    (b"GET / HTTP/1.0", False, False),
    (b"GET / HTTP/1.0\r\nConnection: keep-alive", False, True),
    (b"GET / HTTP/1.1\r\nContent-Length: 3", True, True),
    (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked", True, True),
])
def test_body_and_keep_alive(head: bytes, body: bool, keep: bool) -> None:
    got = parse(head)
    assert isinstance(got, RequestHead)
    assert (got.has_body, got.keep_alive) == (body, keep)


@pytest.mark.parametrize(("head", "status"), [
    (b"GET /" + b"a" * 100 + b" HTTP/1.1", 414),
    (b"GARBAGE", 400),
    (b"GET  / HTTP/1.1", 400),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
    (b"G(T / HTTP/1.1", 400),
    (b"GET / HTTP/2.0", 505),
    (b"GET / FTP/1.1", 400),
    (b"GET http://x/ HTTP/1.1", 400),
    (b"GET /a\x7fb HTTP/1.1", 400),
    (b"GET / HTTP/1.1\r\n" + b"X: v\r\n" * 5, 431),
    (b"GET / HTTP/1.1\r\nX-Big: " + b"b" * 60, 431),
    (b"GET / HTTP/1.1\r\nNo colon", 400),
    (b"GET / HTTP/1.1\r\nX : spaced name", 400),
    (b"GET / HTTP/1.1\r\nX: a\r\n folded", 400),
    (b"GET / HTTP/1.1\r\n: no name", 400),
    (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1", 400),
    (b"GET / HTTP/1.1\r\nContent-Length: -1", 400),
])
def test_what_is_refused_and_with_which_status(head: bytes, status: int) -> None:
    got = parse(head)
    assert isinstance(got, Refused) and got.status == status, got


def test_the_head_ends_at_the_first_empty_line_crlf_or_bare_lf() -> None:
    assert head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /x") == (23, 27)
    assert head_end(b"GET / HTTP/1.1\nHost: a\n\nrest") == (22, 24)
    assert head_end(b"GET / HTTP/1.1\r\nHost: a\r\n") is None
    got = parse(b"GET / HTTP/1.1\nHost: a")
    assert isinstance(got, RequestHead) and got.headers == {"host": "a"}


def test_a_response_with_its_length_and_a_head_without_its_body() -> None:
    full = response(404, "text/plain", b"not found\n", extra=(("X-A", "1"),))
    assert full == (b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: 10\r\nX-A: 1\r\n\r\nnot found\n")
    head = response(200, "application/json", b"{}", head_only=True, close=True)
    assert head == (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 2\r\nConnection: close\r\n\r\n")
    assert b"Connection: keep-alive\r\n" in response(200, "text/plain", b"", keep_alive_1_0=True)
