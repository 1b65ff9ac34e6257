"""Pure parts of `job show`, `status` and `tail`: formatting and combining their sources."""

from __future__ import annotations

import orjson
import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from chronowheel import cli
from chronowheel.cli import job, status, tail
from chronowheel.core.wire import StateRecord
from chronowheel.ops import status as ops_status
from chronowheel.ops import tail as ops_tail
from chronowheel.ops.cluster import decode_assignment
from chronowheel.ops.format import count, human_ms, relative, rfc3339, table
from chronowheel.store.base import JobRow

T = 1_796_115_600_000  # 2026-12-01T09:00:00Z


def test_registered() -> None:
    for name in ("job", "status", "tail"):
        assert f"chronowheel.cli.{name}" in cli.COMMAND_MODULES


def test_rfc3339_is_utc_with_milliseconds() -> None:
    assert rfc3339(T) == "2026-12-01T09:00:00.000Z"
    assert rfc3339(T + 7) == "2026-12-01T09:00:00.007Z"
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"


@pytest.mark.parametrize(("ms", "text"), [
    (0, "0ms"), (999, "999ms"), (4_250, "4.2s"), (185_000, "3m05s"), (7_800_000, "2h10m"),
    (277_200_000, "3d5h"), (-1_500, "-1.5s")])
def test_human_ms(ms: int, text: str) -> None:
    assert human_ms(ms) == text


def test_relative_and_count() -> None:
    assert relative(T + 2_000, T) == "in 2.0s"
    assert relative(T - 61_000, T) == "1m01s ago"
    assert relative(T, T) == "now"
    assert count(1234567) == "1,234,567"


def test_table_aligns_columns_and_right_aligns_numbers() -> None:
    text = table(["A", "NUM", "Z"], [["xx", "1", ""], ["y", "1000", "end"]], right=(1,))
    assert text.splitlines() == ["A    NUM  Z", "xx     1", "y   1000  end"]


# --- job show -----------------------------------------------------------------------------

def test_job_describe_marks_a_published_occurrence() -> None:
    spec = orjson.dumps({"id": "r", "at": T})
    row = JobRow("r", 3, spec, 2, "scheduled", T, T + 5)
    v = job.describe(row, 16, watermark=T + 10, now_ms=T + 20)
    assert v["published"] is True
    assert (v["next_scheduled"], v["slot"]) == (rfc3339(T), rfc3339(T + 5))
    assert v["spec"] == {"id": "r", "at": T}
    assert job.describe(row, 16, watermark=T + 4, now_ms=T)["published"] is False
    assert job.describe(row, 16, watermark=None, now_ms=T)["published"] is None
    text = job.render(v, T + 20)
    assert "shard      3 of 16" in text
    assert "published  yes" in text
    assert f"next       {rfc3339(T)}  (20ms ago)" in text


def test_job_render_of_a_cancelled_job() -> None:
    row = JobRow("r", 0, orjson.dumps({"id": "r", "every": "1h"}), 3, "cancelled", None, None)
    text = job.render(job.describe(row, 4, None, T), T)
    assert "status     cancelled" in text and "next       none" in text
    assert "published" not in text and '"every": "1h"' in text


# --- status -------------------------------------------------------------------------------

def record(**kw: object) -> StateRecord:
    doc = {"shard": 2, "watermark": T, "horizon": T + 120_000, "wheel": 7, "node": "n1",
           "at": T} | kw
    return StateRecord.parse(orjson.dumps(doc), shard=2)


def test_state_record_parse_tolerates_the_seed_record() -> None:
    seed = StateRecord.parse(b'{"shard":0,"watermark":5,"node":"init","at":5}', shard=0)
    assert (seed.watermark, seed.horizon, seed.wheel, seed.node) == (5, None, None, "init")
    assert record().horizon == T + 120_000


def test_shard_status_lag_only_when_behind() -> None:
    ok = ops_status.shard_status(2, "c@h", record(), 12, now_ms=T + 1_500, behind_ms=5_000)
    assert (ok.watermark_age_ms, ok.lag_ms, ok.horizon_ahead_ms) == (1_500, None, 118_500)
    late = ops_status.shard_status(2, None, record(), 0, now_ms=T + 60_000, behind_ms=5_000)
    assert late.lag_ms == 60_000 and late.horizon_ahead_ms == 60_000
    none = ops_status.shard_status(5, None, None, 3, now_ms=T, behind_ms=5_000)
    assert none.watermark_ms is None and none.due_rows == 3


def test_status_render() -> None:
    rows = [ops_status.shard_status(0, "aiokafka@10.0.0.1", record(), 1234, T + 1_000, 5_000),
            ops_status.shard_status(1, None, record(), 0, T + 90_000, 5_000)]
    text = status.render(rows, group_state="Stable", members=1, minutes=10, now_ms=T,
                         behind_ms=5_000)
    lines = text.splitlines()
    assert lines[0].split() == ["SHARD", "OWNER", "LAST", "WRITER", "WATERMARK", "AGE", "LAG",
                                "HORIZON", "WHEEL", "DUE", "10m"]
    assert lines[1].split() == ["0", "aiokafka@10.0.0.1", "n1", rfc3339(T), "1.0s", "-",
                                "+1m59s", "7", "1,234"]
    assert lines[2].split()[:2] == ["1", "(none)"]
    assert "1m30s" in lines[2]  # its lag
    assert "2 shards, 1 owned by 1 group member(s)" in lines[3]
    assert "1 behind (lag > 5.0s), worst 1m30s" in lines[3]


def test_decode_assignment() -> None:
    raw = ConsumerProtocolMemberAssignment(
        0, [("ns.submit", [3, 1]), ("other", [0])], b"").encode()
    assert decode_assignment(raw, "ns.submit") == [1, 3]
    assert decode_assignment(b"", "ns.submit") == []


# --- tail ---------------------------------------------------------------------------------

def fired(value: bytes | None, **headers: str) -> ops_tail.TailMessage:
    return ops_tail.TailMessage("ns.fired", 3, 17, T + 4, b"r1", value,
                            tuple((k, v.encode()) for k, v in headers.items()))


def test_payload_view() -> None:
    assert ops_tail.payload_view(b'{"a": 1}') == ("payload", {"a": 1})
    assert ops_tail.payload_view(b"hello") == ("payload_text", "hello")
    assert ops_tail.payload_view(b"\xff\x00") == ("payload_b64", "/wA=")
    assert ops_tail.payload_view(b"") == ("payload", None)


def test_format_fired_message() -> None:
    m = fired(b'{"to": "ada"}', **{"cw-job-id": "r1", "cw-scheduled-at": str(T),
                                   "cw-fired-at": str(T + 4), "cw-attempt": "1",
                                   "cw-occurrence": f"r1@{T}", "trace": "abc"})
    assert tail.format_message(m).splitlines() == [
        f"ns.fired[3]@17  key=r1  scheduled={rfc3339(T)}  fired={rfc3339(T + 4)}  late=4ms  "
        "attempt=1",
        f"  headers  cw-job-id=r1 cw-occurrence=r1@{T} trace=abc",
        '  payload  {"to":"ada"}']


def test_format_other_messages() -> None:
    text = tail.format_message(fired(None))
    assert f"time={rfc3339(T + 4)}" in text and "headers  (none)" in text
    assert "payload  (empty)" in text
    assert 'payload  text "plain words"' in tail.format_message(fired(b"plain words"))
    assert "payload  base64 /wA=" in tail.format_message(fired(b"\xff\x00"))


def test_message_json() -> None:
    doc = ops_tail.message_json(fired(b"[1,2]", **{"cw-attempt": "2"}))
    assert doc == {"topic": "ns.fired", "partition": 3, "offset": 17, "timestamp_ms": T + 4,
                   "key": "r1", "headers": {"cw-attempt": "2"}, "payload": [1, 2]}
    assert ops_tail.message_json(fired(b"\xff"))["payload_b64"] == "/w=="
