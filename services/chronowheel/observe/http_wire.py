"""HTTP/1.x on the wire for the /metrics and /healthz endpoint: a request's head read into a
`RequestHead` (or refused with the status to answer), and a response's bytes. Pure: no I/O.

Only what that endpoint needs: GET and HEAD without a body, answered with a complete body and
its `Content-Length` (never chunked). The grammar is RFC 9112's, strictly: a request line of
exactly three parts, header fields `name: value` with a token for the name, no line folding,
no duplicate `Content-Length`. Anything else is refused, with the connection closed after the
answer, since the next request's start could not be found with any confidence.

Written for this endpoint instead of importing an HTTP server: the node and the worker serve
it, and importing aiohttp took about 0.3 s of CPU at every start of either (an SSL context
built at import, and the whole client), which a node joining a loaded cluster takes from
the other processes on its cores.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

# The characters of a token (RFC 9110, 5.6.2): a method or a header field's name.
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                   b"abcdefghijklmnopqrstuvwxyz")
_VERSIONS = {b"HTTP/1.1": (1, 1), b"HTTP/1.0": (1, 0)}


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    """The request target as sent (path and query)."""
    version: tuple[int, int]
    headers: dict[str, str]
    """Field names lower-cased; a repeated field's values joined by ", "."""

    @property
    def has_body(self) -> bool:
        return ("transfer-encoding" in self.headers
                or self.headers.get("content-length", "0") != "0")

    @property
    def keep_alive(self) -> bool:
        """Whether the client lets the connection serve another request after this one."""
        options = {o.strip().lower() for o in self.headers.get("connection", "").split(",")}
        if self.version >= (1, 1):
            return "close" not in options
        return "keep-alive" in options


@dataclass(frozen=True)
class Refused:
    """A request head that cannot be served: the status to answer, and why (for the log)."""

    status: int
    reason: str


def head_end(buffer: bytes | bytearray) -> tuple[int, int] | None:
    """Where the head in `buffer` ends: (its length, the length of it and the empty line
    after it), or None while that empty line has not arrived. A bare LF ends a line too."""
    ends = [(i, i + n) for i, n in ((buffer.find(b"\r\n\r\n"), 4), (buffer.find(b"\n\n"), 2))
            if i >= 0]
    return min(ends) if ends else None


def parse_head(head: bytes, *, max_line_size: int, max_field_size: int,
               max_headers: int) -> RequestHead | Refused:
    """The request line and header fields in `head` (without the empty line ending it)."""
    lines = [line[:-1] if line.endswith(b"\r") else line for line in head.split(b"\n")]
    request_line, fields = lines[0], lines[1:]
    if len(request_line) > max_line_size:
        return Refused(414, f"request line of {len(request_line)} bytes, over {max_line_size}")
    parts = request_line.split(b" ")
    if len(parts) != 3:
        return Refused(400, "request line is not 'METHOD TARGET VERSION'")
    method, target, version = parts
    if not method or not set(method) <= _TOKEN:
        return Refused(400, "method is not a token")
    if version not in _VERSIONS:
        if version.startswith(b"HTTP/"):
            return Refused(505, "HTTP version other than 1.0 and 1.1")
        return Refused(400, "no HTTP version")
    if not target.startswith(b"/") or any(b <= 0x20 or b >= 0x7F for b in target):
        return Refused(400, "request target is not an absolute path")
    if len(fields) > max_headers:
        return Refused(431, f"{len(fields)} header fields, over {max_headers}")
    headers: dict[str, str] = {}
    for field in fields:
        if len(field) > max_field_size:
            return Refused(431, f"a header field of {len(field)} bytes, over {max_field_size}")
        name, colon, value = field.partition(b":")
        if not colon or not name or not set(name) <= _TOKEN:
            return Refused(400, "a header field is not 'name: value' (or is folded)")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        if key == "content-length" and (key in headers or not text.isdigit()):
            return Refused(400, "Content-Length repeated or not a number")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    if "content-length" in headers:
        headers["content-length"] = str(int(headers["content-length"]))  # "00" is 0
    return RequestHead(method.decode("ascii"), target.decode("ascii"),
                       _VERSIONS[version], headers)


def response(status: int, content_type: str, body: bytes, *, head_only: bool = False,
             close: bool = False, keep_alive_1_0: bool = False,
             extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A complete response. `head_only` (a HEAD) leaves the body out but keeps its length;
    `close` says the connection ends after it; `keep_alive_1_0` answers an HTTP/1.0 client
    that asked to keep it."""
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
             f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}",
             *(f"{name}: {value}" for name, value in extra)]
    if close:
        lines.append("Connection: close")
    elif keep_alive_1_0:
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body)
