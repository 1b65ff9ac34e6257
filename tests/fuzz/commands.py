"""A seeded generator of submit commands at and beyond every limit, as raw record bytes.

Each command is a `Case`: the key, value, partition and producer compression it is sent with,
and what the node must do with it (`Expect`). Kinds are picked by weight from `KINDS`, each at
least once per run (in order) before the random mix starts, so a small run still covers them
all; a kind's `cap` bounds how often an expensive one (a 256 KiB payload, a 10,000-date
calendar) appears in a large run. The per-field boundaries of a job (integer minimum/maximum,
string maxLength, enums, maxItems) are read from schema/submit.v1.schema.json, so a field added
to the schema without an edge case here fails `test_commands.py`.

Everything is derived from `random.Random(seed)` and the command's index: a failing command is
named by seed and index, and `python -m tests.fuzz.commands SEED INDEX` prints it again.
"""

from __future__ import annotations

import base64
import enum
import json
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from chronowheel.core.shard import shard_of

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "schema" / "submit.v1.schema.json"

DAY_MS = 86_400_000
MAX_PAYLOAD_BYTES = 262_144  # Settings.max_payload_bytes' default (the namespace keeps it)
MAX_ID_BYTES = 256
MAX_HEADERS_BYTES = 16_384
MAX_EXCLUDE_DATES = 1_000
MAX_CALENDAR_DATES = 10_000


class Expect(enum.Enum):
    GOOD = "good"
    """a valid one-shot due a few seconds ahead: fires exactly once, never early"""
    REJECT = "reject"
    """the contract says it is refused: on <ns>.rejected with a cw-reason"""
    EITHER = "either"
    """at or past a limit the contract allows or a server may refuse: applied (its row is
    stored) or on <ns>.rejected, never neither"""


@dataclass
class Case:
    index: int
    kind: str
    expect: Expect
    key: bytes | None
    value: bytes | None
    partition: int
    job_id: str | None = None
    """the job the command upserts (None: not an upsert, or no valid id)"""
    calendar: str | None = None
    """the calendar the command puts"""
    compression: str = "none"
    misrouted: bool = False
    """sent to a partition other than its shard's (the node forwards it)"""
    at_ms: int | None = None
    """a GOOD case's instant"""
    note: str = ""
    # filled in by the run
    offset: int = -1
    sent_partition: int = -1

    def describe(self, seed: int) -> str:
        value = self.value
        size = "None (tombstone)" if value is None else f"{len(value)} B"
        head = b"" if value is None else value[:160]
        return (f"#{self.index} {self.kind} [{self.expect.value}] seed={seed} "
                f"partition={self.sent_partition} offset={self.offset} "
                f"compression={self.compression} misrouted={self.misrouted} "
                f"key={_short(self.key)} value={size} {head!r}"
                + ("..." if value is not None and len(value) > 160 else "")
                + (f" ({self.note})" if self.note else ""))


def _short(data: bytes | None, n: int = 80) -> str:
    if data is None:
        return "None"
    return repr(data[:n]) + (f"...({len(data)} B)" if len(data) > n else "")


@dataclass
class Ctx:
    rng: random.Random
    index: int
    namespace: str
    shards: int
    now_ms: int
    calendars: list[str] = field(default_factory=list)
    """calendars put earlier in this run (cron jobs may name them)"""

    def jid(self, kind: str, extra: str = "") -> str:
        return f"fz{self.index}-{kind}{extra}"


@dataclass(frozen=True)
class Draft:
    value: bytes | None
    job_id: str | None = None
    key: bytes | str | None = "id"
    """the record key: "id" for the job id's UTF-8 (the contract), or the bytes to send"""
    calendar: str | None = None
    compression: str = "none"
    note: str = ""
    at_ms: int | None = None
    expect: Expect | None = None
    """overrides the kind's expectation (schema edges decide per value)"""


@dataclass(frozen=True)
class Kind:
    name: str
    expect: Expect
    build: Callable[[Ctx], Draft]
    fields: tuple[str, ...] = ()
    """job fields of the schema this kind drives to an edge"""
    weight: float = 1.0
    cap: int | None = None
    misroute: float = 0.1
    """share of its commands sent to the wrong partition"""


# --- byte builders ------------------------------------------------------------------------

def upsert_bytes(job: dict[str, Any]) -> bytes:
    doc = {"v": 1, "op": "upsert", "job": job}
    try:
        return orjson.dumps(doc)
    except TypeError:  # integers past 64 bits
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def upsert_raw(job_id_json: bytes, rest: bytes) -> bytes:
    """An upsert assembled from JSON text, for what orjson would not write (deep nesting,
    duplicate keys, invalid UTF-8)."""
    return b'{"v":1,"op":"upsert","job":{"id":' + job_id_json + rest + b"}}"


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def days_from(start: date, n: int) -> list[str]:
    return [(start + timedelta(days=k)).isoformat() for k in range(n)]


def nested(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * depth + b"1" + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def _text(rng: random.Random, n: int) -> str:
    """n characters of mixed ASCII (compresses a little, not entirely)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 "
    chunk = "".join(rng.choice(alphabet) for _ in range(min(n, 4096)))
    return (chunk * (n // len(chunk) + 1))[:n] if chunk else ""


def _utf8_id(prefix: str, size: int) -> str:
    """An id of exactly `size` UTF-8 bytes: the prefix, then 4-, 2- and 1-byte characters."""
    out = prefix
    pieces = ["𝄞", "é", "\u202e", "x"]
    while len(out.encode()) < size:
        room = size - len(out.encode())
        for p in pieces:
            if len(p.encode()) <= room:
                out += p
                break
    return out


# --- kinds --------------------------------------------------------------------------------

def good(c: Ctx) -> Draft:
    at = c.now_ms + c.rng.randint(2_000, 6_000)
    jid = c.jid("good")
    return Draft(upsert_bytes({"id": jid, "at": at, "payload": {"i": c.index}}), jid, at_ms=at)


def _payload(c: Ctx, kind: str, size: int, **extra: Any) -> Draft:
    jid = c.jid(kind)
    body = _text(c.rng, size)
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms + 3_000, "payload": body, **extra}),
                 jid, note=f"payload string of {size} chars")


def payload_near_max(c: Ctx) -> Draft:
    return _payload(c, "pnear", MAX_PAYLOAD_BYTES - 2 - c.rng.randint(0, 64))


def payload_over_max(c: Ctx) -> Draft:
    return _payload(c, "pover", MAX_PAYLOAD_BYTES - 1 + c.rng.randint(0, 1_000))


def payload_60k(c: Ctx) -> Draft:
    return _payload(c, "p60k", c.rng.randint(51_200, 61_440))


def payload_b64_60k(c: Ctx) -> Draft:
    jid = c.jid("b64")
    data = c.rng.randbytes(c.rng.randint(51_200, 61_440))
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms + 3_000,
                               "payload_b64": base64.b64encode(data).decode()}), jid,
                 note=f"payload_b64 of {len(data)} bytes")


def payload_b64_over(c: Ctx) -> Draft:
    jid = c.jid("b64over")
    data = c.rng.randbytes(MAX_PAYLOAD_BYTES + 1)
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms + 3_000,
                               "payload_b64": base64.b64encode(data).decode()}), jid)


def payload_and_b64(c: Ctx) -> Draft:
    jid = c.jid("both")
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms, "payload": 1, "payload_b64": "AA=="}),
                 jid)


def deep(c: Ctx) -> Draft:
    jid = c.jid("deep")
    depth = c.rng.choice([60, 62, 63, 64, 65, 254, 255, 1023, 1024, 1025,
                          c.rng.randint(60, 2000)])
    shape = c.rng.choice(["array", "object"])
    value = upsert_raw(orjson.dumps(jid), b',"at":%d,"payload":' % (c.now_ms + 3_000)
                       + nested(depth, shape))
    return Draft(value, jid, note=f"payload nested {depth} deep ({shape})")


def deep_headers(c: Ctx) -> Draft:
    jid = c.jid("deephdr")
    depth = c.rng.randint(60, 2000)
    value = upsert_raw(orjson.dumps(jid), b',"at":%d,"headers":{"h":' % c.now_ms
                       + nested(depth, "object") + b"}")
    return Draft(value, jid, note=f"header value nested {depth} deep")


def id_max(c: Ctx) -> Draft:
    jid = _utf8_id(c.jid("idmax") + "-", MAX_ID_BYTES)
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms + 3_000}), jid,
                 note="id of exactly 256 UTF-8 bytes")


def id_over(c: Ctx) -> Draft:
    jid = _utf8_id(c.jid("idover") + "-", MAX_ID_BYTES + c.rng.choice([1, 2, 3, 1000]))
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms}), jid)


CONTROL = ["\x00", "\r\n", "\r", "\n", "\u202e", "\ufeff", "\t", "\u2028", "\x7f", "\U0010ffff"]


def id_control(c: Ctx) -> Draft:
    jid = c.jid("idctl") + "".join(c.rng.sample(CONTROL, 3)) + "end"
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms + 3_000, "payload": jid}), jid,
                 note="id with control characters")


def id_empty(c: Ctx) -> Draft:
    return Draft(upsert_bytes({"id": "", "at": c.now_ms}), None, key=b"")


def headers_control(c: Ctx) -> Draft:
    jid = c.jid("hdrctl")
    headers = {f"h{k}{ch}x": f"v{ch}{ch}" for k, ch in enumerate(CONTROL)}
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms + 3_000, "headers": headers}), jid)


def headers_at_limit(c: Ctx) -> Draft:
    jid = c.jid("hdrmax")
    name = "x-big"
    value = "v" * (MAX_HEADERS_BYTES - len(name))
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms + 3_000, "headers": {name: value}}),
                 jid, note="headers of exactly 16 KiB")


def headers_over(c: Ctx) -> Draft:
    jid = c.jid("hdrover")
    name = "x-big"
    value = "v" * (MAX_HEADERS_BYTES - len(name) + 1)
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms, "headers": {name: value}}), jid)


def headers_reserved(c: Ctx) -> Draft:
    jid = c.jid("hdrcw")
    name = c.rng.choice(["cw-job-id", "CW-Occurrence", "Cw-x", "cW-"])
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms, "headers": {name: "1"}}), jid)


def at_far_past(c: Ctx) -> Draft:
    jid = c.jid("past")
    at = c.rng.choice([0, 1, "1970-01-01T00:00:00Z", "1970-01-01T00:00:00.001+14:00",
                       c.now_ms - 3650 * DAY_MS])
    return Draft(upsert_bytes({"id": jid, "at": at}), jid, note=f"at={at!r}")


def at_far_future(c: Ctx) -> Draft:
    jid = c.jid("future")
    at = c.now_ms + c.rng.choice([3650 * DAY_MS - DAY_MS, 3652 * DAY_MS, 3653 * DAY_MS - 1])
    return Draft(upsert_bytes({"id": jid, "at": at}), jid, note=f"at={iso(at)}")


def at_beyond(c: Ctx) -> Draft:
    jid = c.jid("beyond")
    at = c.rng.choice(["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", 2**63 - 1, 2**64, -1,
                       -(2**63), "2026-02-30T00:00:00Z", "2026-01-01T24:00:00Z",
                       c.now_ms + 3654 * DAY_MS, "", "now", 1e300])
    return Draft(upsert_bytes({"id": jid, "at": at}), jid, note=f"at={at!r}")


def cron_20y(c: Ctx) -> Draft:
    jid = c.jid("cron20y")
    job = {"id": jid, "cron": "0 0 29 2 */7", "exclude_dates": ["2032-02-29"],
           "tz": c.rng.choice(["UTC", "Pacific/Kiritimati", "America/New_York"])}
    return Draft(upsert_bytes(job), jid, note="next run 2060-02-29, 34 years away")


def cron_rare(c: Ctx) -> Draft:
    jid = c.jid("cronrare")
    expr = c.rng.choice(["0 0 29 2 1", "0 0 31 2 *", "0 0 30 2 *", "59 23 31 12 5#5",
                         "0 0 29 2 MON#5", "0 0 L 2 SUN", "0 0 29W 2 *"])
    return Draft(upsert_bytes({"id": jid, "cron": expr}), jid, note=f"cron {expr!r}")


SECOND_POOL = 3


def cron_seconds(c: Ctx) -> Draft:
    # A small pool of ids: each keeps firing every second until the namespace is dropped.
    jid = f"fz-tick-{c.rng.randrange(SECOND_POOL)}"
    return Draft(upsert_bytes({"id": jid, "cron": "* * * * * *", "catch_up": "all",
                               "max_catch_up": 10_000}), jid)


def every_tiny(c: Ctx) -> Draft:
    jid = c.jid("every")
    every = c.rng.choice(["1ms", "999ms", "0s", "0ms", "00s", "-1s", "1us", ""])
    return Draft(upsert_bytes({"id": jid, "every": every}), jid, note=f"every={every!r}")


def every_huge(c: Ctx) -> Draft:
    jid = c.jid("everybig")
    every = c.rng.choice(["3650d", "7300d", "100000d", "99999999999d"])
    job: dict[str, Any] = {"id": jid, "every": every, "window": "1d"}
    if c.rng.random() < 0.5:
        job["start"] = iso(c.now_ms + 3650 * DAY_MS - DAY_MS)
    return Draft(upsert_bytes(job), jid, note=f"every={every}")


def exclude_1000(c: Ctx) -> Draft:
    jid = c.jid("excl")
    today = datetime.fromtimestamp(c.now_ms / 1000, UTC).date() - timedelta(days=1)
    cron = c.rng.choice(["0 12 * * *", "* * * * *", "* * * * * *", "*/5 * * * * *"])
    return Draft(upsert_bytes({"id": jid, "cron": cron,
                               "exclude_dates": days_from(today, MAX_EXCLUDE_DATES)}), jid,
                 note=f"cron {cron!r} excluding the next 1000 days")


def exclude_over(c: Ctx) -> Draft:
    jid = c.jid("exclover")
    return Draft(upsert_bytes({"id": jid, "cron": "0 12 * * *",
                               "exclude_dates": days_from(date(2030, 1, 1),
                                                          MAX_EXCLUDE_DATES + 1)}), jid)


def calendar_max(c: Ctx) -> Draft:
    name = f"fz{c.index}-cal"
    today = datetime.fromtimestamp(c.now_ms / 1000, UTC).date() - timedelta(days=1)
    c.calendars.append(name)
    return Draft(orjson.dumps({"v": 1, "op": "put_calendar", "name": name,
                               "dates": days_from(today, MAX_CALENDAR_DATES)}),
                 calendar=name, key=name.encode(), note="10,000 consecutive dates from today")


def calendar_over(c: Ctx) -> Draft:
    name = f"fz{c.index}-calover"
    return Draft(orjson.dumps({"v": 1, "op": "put_calendar", "name": name,
                               "dates": days_from(date(2000, 1, 1), MAX_CALENDAR_DATES + 1)}),
                 key=name.encode())


def cron_calendar(c: Ctx) -> Draft:
    jid = c.jid("croncal")
    name = c.rng.choice(c.calendars) if c.calendars else "fz-no-such-calendar"
    cron = c.rng.choice(["0 12 * * *", "* * * * * *"])
    return Draft(upsert_bytes({"id": jid, "cron": cron, "calendar": name}), jid,
                 note=f"cron {cron!r} with calendar {name}")


def dup_keys(c: Ctx) -> Draft:
    jid = c.jid("dup")
    other = jid + "-other"
    variant = c.rng.randrange(3)
    if variant == 0:  # two ids: the key names the last
        value = upsert_raw(orjson.dumps(other), b',"id":' + orjson.dumps(jid)
                           + b',"at":%d' % (c.now_ms + 3_000))
    elif variant == 1:  # two instants, the first in the past
        value = upsert_raw(orjson.dumps(jid), b',"at":0,"at":%d' % (c.now_ms + 3_000))
    else:  # two ops at the top
        value = (b'{"v":1,"op":"cancel","op":"upsert","job":{"id":' + orjson.dumps(jid)
                 + b',"at":%d}}' % (c.now_ms + 3_000))
    return Draft(value, jid, note=f"duplicate keys, variant {variant}")


def invalid_utf8(c: Ctx) -> Draft:
    jid = c.jid("utf8")
    bad = c.rng.choice([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80",
                        b"\xe2\x82"])
    where = c.rng.randrange(3)
    if where == 0:  # in the id (and the key)
        raw_id = jid.encode() + bad
        return Draft(upsert_raw(b'"' + raw_id + b'"', b',"at":%d' % c.now_ms), None,
                     key=raw_id, note=f"invalid UTF-8 {bad!r} in the id")
    if where == 1:  # in the payload
        return Draft(upsert_raw(orjson.dumps(jid), b',"at":%d,"payload":"' % c.now_ms + bad
                                + b'"'), jid, note=f"invalid UTF-8 {bad!r} in the payload")
    return Draft(upsert_raw(orjson.dumps(jid), b',"at":%d,"headers":{"h' % c.now_ms + bad
                            + b'":"v"}'), jid, note=f"invalid UTF-8 {bad!r} in a header name")


def escaped_surrogate(c: Ctx) -> Draft:
    jid = c.jid("surr")
    return Draft(upsert_raw(orjson.dumps(jid), b',"at":%d,"payload":"\\ud800x"' % c.now_ms),
                 jid, note="payload with an escaped lone surrogate")


def not_json(c: Ctx) -> Draft:
    value = c.rng.choice([None, b"", b"{", b"null", b"[]", b'{"v":1}', b"\x00" * 16,
                          b'{"v":1,"op":"upsert","job":{"id":"x"', b"\xef\xbb\xbf{}",
                          b'{"v":1.0,"op":"upsert","job":{"id":"x","at":0}}',
                          b'{"v":true,"op":"upsert","job":{"id":"x","at":0}}'])
    return Draft(value, None, key=c.jid("junk").encode())


def wrong_key(c: Ctx) -> Draft:
    jid = c.jid("wrongkey")
    key = c.rng.choice([jid.encode() + b"x", jid.upper().encode(), jid.encode() + b"\x00",
                        b"\xff" + jid.encode()])
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms}), jid, key=key)


def no_key(c: Ctx) -> Draft:
    jid = c.jid("nokey")
    return Draft(upsert_bytes({"id": jid, "at": c.now_ms + 3_000}), jid, key=None)


def good_misrouted(c: Ctx) -> Draft:
    d = good(c)
    return Draft(d.value, d.job_id, at_ms=d.at_ms, note="sent to the wrong partition")


def compressed_expand(c: Ctx) -> Draft:
    jid = c.jid("zip")
    n = c.rng.choice([MAX_PAYLOAD_BYTES + 1, 1_100_000, 3_000_000])
    value = upsert_raw(orjson.dumps(jid), b',"at":%d,"payload":"' % c.now_ms + b"a" * n + b'"')
    return Draft(value, jid, compression="gzip",
                 note=f"{n}-byte payload in a gzip batch of a few KB")


def zstd_expand(c: Ctx) -> Draft:
    d = compressed_expand(c)
    return Draft(d.value, d.job_id, compression="zstd", note=d.note.replace("gzip", "zstd"))


def good_zstd(c: Ctx) -> Draft:
    # Further ahead than `good`: the zstd producer is a JVM started per chunk.
    at = c.now_ms + c.rng.randint(12_000, 16_000)
    jid = c.jid("goodzstd")
    return Draft(upsert_bytes({"id": jid, "at": at, "payload": {"i": c.index}}), jid,
                 at_ms=at, compression="zstd")


def compressed_60k(c: Ctx) -> Draft:
    d = _payload(c, "zip60k", c.rng.randint(51_200, 61_440))
    return Draft(d.value, d.job_id, compression="gzip", note=d.note)


def bad_fields(c: Ctx) -> Draft:
    jid = c.jid("badf")
    base: dict[str, Any] = {"id": jid, "at": c.now_ms}
    extra: dict[str, Any] = c.rng.choice([
        {"paylaod": 1}, {"topic": f"{c.namespace}.submit"}, {"topic": "__consumer_offsets"},
        {"topic": "x" * 300}, {"topic": ""}, {"tz": "UTC"}, {"every": "1s"},
        {"cron": "0 0 * * *"}, {"catch_up": "all"}, {"window": "2d"}, {"backoff": "2d"},
        {"payload_b64": "not base64!"}, {"headers": {"h": 1}}, {"headers": []},
        {"tenant": ""}, {"id": None}, {"id": 42}, {"calendar": "x"},
    ])
    job = {**base, **extra}
    if job.get("id") is not jid:
        return Draft(upsert_bytes(job), None, key=jid.encode(), note=f"fields {extra}")
    return Draft(upsert_bytes(job), jid, note=f"fields {extra}")


# --- schema edges -------------------------------------------------------------------------

def load_schema() -> dict[str, Any]:
    return dict(json.loads(SCHEMA.read_text()))


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    out = dict(node)
    while "$ref" in out:
        ref = out.pop("$ref")
        target = schema["$defs"][ref.rsplit("/", 1)[1]]
        out = {**target, **out}
    return out


RECURRING_ONLY = {"start", "end", "catch_up", "max_catch_up", "concurrency"}
CRON_ONLY = {"tz", "dst", "exclude_dates", "calendar"}


def schema_edges(schema: dict[str, Any]) -> list[tuple[str, Any, Expect]]:
    """(field, value, expectation) at and past each numeric, length, enum and count limit
    the schema states for a job field."""
    edges: list[tuple[str, Any, Expect]] = []
    for name, node in schema["$defs"]["job"]["properties"].items():
        spec = _resolve(schema, node)
        if spec.get("type") == "integer":
            lo, hi = spec["minimum"], spec["maximum"]
            edges += [(name, lo, Expect.EITHER), (name, hi, Expect.EITHER),
                      (name, lo - 1, Expect.REJECT), (name, hi + 1, Expect.REJECT),
                      (name, 10**30, Expect.REJECT), (name, float(hi), Expect.EITHER),
                      (name, str(hi), Expect.REJECT), (name, True, Expect.EITHER)]
        if spec.get("type") == "string" and "maxLength" in spec and name not in ("cron", "tz"):
            n = spec["maxLength"]
            edges += [(name, "t" * n, Expect.EITHER), (name, "t" * (n + 1), Expect.REJECT),
                      (name, "é" * n, Expect.EITHER)]
        for option in spec.get("enum", ()):
            edges.append((name, option, Expect.EITHER))
        if "enum" in spec:
            edges += [(name, "", Expect.REJECT), (name, spec["enum"][0].upper(), Expect.REJECT)]
    edges += [
        ("tz", "Etc/GMT-14", Expect.EITHER), ("tz", "Mars/Olympus_Mons", Expect.REJECT),
        ("tz", "../../etc/passwd", Expect.REJECT), ("tz", "x" * 65, Expect.REJECT),
        ("cron", "@yearly", Expect.EITHER), ("cron", "* " * 128, Expect.REJECT),
        ("cron", "60 * * * *", Expect.REJECT), ("cron", "0 0 0 0 0", Expect.REJECT),
        ("window", "1d", Expect.EITHER), ("window", "86400001ms", Expect.REJECT),
        ("backoff", "1d", Expect.EITHER), ("backoff", "25h", Expect.REJECT),
        ("start", "1970-01-01T00:00:00Z", Expect.EITHER), ("end", 0, Expect.EITHER),
        ("every", "1s", Expect.EITHER), ("payload", None, Expect.EITHER),
        ("payload", 2**64, Expect.EITHER), ("payload_b64", "", Expect.EITHER),
        ("topic", "fuzz.out", Expect.REJECT), ("calendar", "x" * 129, Expect.REJECT),
        ("exclude_dates", ["1969-12-31"], Expect.REJECT),
        ("exclude_dates", ["2030-02-29"], Expect.REJECT),
        ("exclude_dates", [], Expect.EITHER),
        ("headers", {"": "v"}, Expect.REJECT), ("id", "é" * 128, Expect.EITHER),
        ("at", iso(0), Expect.EITHER), ("max_catch_up", 0, Expect.REJECT),
        ("max_lateness", "1s", Expect.EITHER), ("max_lateness", "999ms", Expect.REJECT),
        ("max_lateness", "3653d", Expect.EITHER), ("max_lateness", "3654d", Expect.REJECT),
    ]
    return edges


_EDGES: list[tuple[str, Any, Expect]] | None = None


def edges() -> list[tuple[str, Any, Expect]]:
    global _EDGES
    if _EDGES is None:
        _EDGES = schema_edges(load_schema())
    return _EDGES


def schema_edge(c: Ctx) -> Draft:
    name, value, expect = c.rng.choice(edges())
    jid = c.jid("edge", f"-{name}")
    job: dict[str, Any] = {"id": jid}
    if name in CRON_ONLY:
        job["cron"] = "0 3 * * *"
    elif name in RECURRING_ONLY or name in ("window",):
        job["every"] = "1h"
    elif name not in ("at", "cron", "every"):
        job["at"] = c.now_ms + 3_000
    if name == "id":
        jid = value
        job["id"] = value
        if name == "id" and not isinstance(value, str):
            return Draft(upsert_bytes(job), None, key=None, expect=expect)
    elif name == "cron":
        job.pop("at", None)
        job["cron"] = value
    else:
        job[name] = value
    if name == "window":
        job["every"] = "2d"
    if name in ("start", "end"):
        job["every"] = "1h"
    return Draft(upsert_bytes(job), jid, expect=expect, note=f"{name}={value!r:.60}")


KINDS: tuple[Kind, ...] = (
    Kind("good", Expect.GOOD, good, weight=30, misroute=0.0),
    Kind("good_misrouted", Expect.GOOD, good_misrouted, weight=4, misroute=1.0),
    Kind("payload_near_max", Expect.EITHER, payload_near_max, ("payload",), cap=40),
    Kind("payload_over_max", Expect.REJECT, payload_over_max, ("payload",), cap=40),
    Kind("payload_60k", Expect.EITHER, payload_60k, ("payload",), weight=2, cap=400),
    Kind("payload_b64_60k", Expect.EITHER, payload_b64_60k, ("payload_b64",), cap=200),
    Kind("payload_b64_over", Expect.REJECT, payload_b64_over, ("payload_b64",), cap=20),
    Kind("payload_and_b64", Expect.REJECT, payload_and_b64, ("payload", "payload_b64")),
    Kind("deep", Expect.EITHER, deep, ("payload",), weight=2),
    Kind("deep_headers", Expect.EITHER, deep_headers, ("headers",)),
    Kind("id_max", Expect.EITHER, id_max, ("id",)),
    Kind("id_over", Expect.REJECT, id_over, ("id",)),
    Kind("id_control", Expect.EITHER, id_control, ("id",), weight=2),
    Kind("id_empty", Expect.REJECT, id_empty, ("id",), misroute=0.0),
    Kind("headers_control", Expect.EITHER, headers_control, ("headers",)),
    Kind("headers_at_limit", Expect.EITHER, headers_at_limit, ("headers",)),
    Kind("headers_over", Expect.REJECT, headers_over, ("headers",)),
    Kind("headers_reserved", Expect.REJECT, headers_reserved, ("headers",)),
    Kind("at_far_past", Expect.EITHER, at_far_past, ("at",)),
    Kind("at_far_future", Expect.EITHER, at_far_future, ("at",)),
    Kind("at_beyond", Expect.REJECT, at_beyond, ("at",)),
    Kind("cron_20y", Expect.EITHER, cron_20y, ("cron", "exclude_dates", "tz")),
    Kind("cron_rare", Expect.EITHER, cron_rare, ("cron",)),
    Kind("cron_seconds", Expect.EITHER, cron_seconds, ("cron", "catch_up", "max_catch_up"),
         weight=0.5),
    Kind("every_tiny", Expect.REJECT, every_tiny, ("every",)),
    Kind("every_huge", Expect.EITHER, every_huge, ("every", "window", "start")),
    Kind("exclude_1000", Expect.EITHER, exclude_1000, ("exclude_dates",), cap=40),
    Kind("exclude_over", Expect.REJECT, exclude_over, ("exclude_dates",), cap=40),
    Kind("calendar_max", Expect.EITHER, calendar_max, ("calendar",), cap=10, misroute=0.0),
    Kind("calendar_over", Expect.REJECT, calendar_over, ("calendar",), cap=10, misroute=0.0),
    Kind("cron_calendar", Expect.EITHER, cron_calendar, ("calendar",), cap=40),
    Kind("dup_keys", Expect.EITHER, dup_keys, ("id", "at")),
    Kind("invalid_utf8", Expect.REJECT, invalid_utf8, ("id", "payload", "headers")),
    Kind("escaped_surrogate", Expect.EITHER, escaped_surrogate, ("payload",)),
    Kind("not_json", Expect.REJECT, not_json),
    Kind("wrong_key", Expect.REJECT, wrong_key, ("id",)),
    Kind("no_key", Expect.EITHER, no_key, ("id",)),
    Kind("compressed_expand", Expect.REJECT, compressed_expand, ("payload",), cap=10),
    Kind("zstd_expand", Expect.REJECT, zstd_expand, ("payload",), cap=5, misroute=0.0),
    Kind("good_zstd", Expect.GOOD, good_zstd, weight=0.5, cap=20, misroute=0.0),
    Kind("compressed_60k", Expect.EITHER, compressed_60k, ("payload",), cap=200),
    Kind("bad_fields", Expect.REJECT, bad_fields, ("topic", "tenant")),
    Kind("schema_edge", Expect.EITHER, schema_edge, weight=6),
)


def fields_covered() -> set[str]:
    out = {f for k in KINDS for f in k.fields}
    out |= {name for name, _v, _e in edges()}
    return out


class Generator:
    """Cases in order; `next(now_ms)` builds the next one at the time it is sent (so a GOOD
    case's instant stays a few seconds ahead however long a large run takes to send)."""

    def __init__(self, seed: int, namespace: str, shards: int) -> None:
        self.seed = seed
        self.namespace = namespace
        self.shards = shards
        self.index = 0
        self.counts: dict[str, int] = {}
        self.calendars: list[str] = []

    def pick(self, rng: random.Random) -> Kind:
        if self.index < len(KINDS):
            return KINDS[self.index]
        open_kinds = [k for k in KINDS if k.cap is None or self.counts.get(k.name, 0) < k.cap]
        return rng.choices(open_kinds, weights=[k.weight for k in open_kinds])[0]

    def next(self, now_ms: int) -> Case:
        i = self.index
        rng = random.Random(self.seed * 1_000_003 + i)
        kind = self.pick(rng)
        self.index += 1
        self.counts[kind.name] = self.counts.get(kind.name, 0) + 1
        ctx = Ctx(rng, i, self.namespace, self.shards, now_ms, self.calendars)
        d = kind.build(ctx)
        key = d.job_id.encode() if d.key == "id" and d.job_id is not None else d.key
        assert not isinstance(key, str)
        route = d.calendar or d.job_id
        home = shard_of(route, self.shards) if route is not None else rng.randrange(self.shards)
        misrouted = self.shards > 1 and rng.random() < kind.misroute
        partition = (home + 1 + rng.randrange(self.shards - 1)) % self.shards if misrouted \
            else home
        return Case(i, kind.name, d.expect or kind.expect, key, d.value, partition,
                    job_id=d.job_id, calendar=d.calendar, compression=d.compression,
                    misrouted=misrouted, at_ms=d.at_ms, note=d.note)

    def cases(self, n: int, now_ms: Callable[[], int]) -> Iterator[Case]:
        for _ in range(n):
            yield self.next(now_ms())


def main(argv: list[str]) -> None:
    """Print the case of SEED at INDEX (its instants relative to now)."""
    import time

    seed, index = int(argv[0]), int(argv[1])
    gen = Generator(seed, "chronowheel", int(argv[2]) if len(argv) > 2 else 2)
    now = time.time_ns() // 1_000_000
    case = next(c for c in gen.cases(index + 1, lambda: now) if c.index == index)
    print(case.describe(seed))


if __name__ == "__main__":
    main(sys.argv[1:])
