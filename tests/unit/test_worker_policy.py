"""Pure parts of the worker's failure handling and of reading an occurrence."""

from __future__ import annotations

import base64

import orjson
import pytest
from chronowheel.core.model import DAY_MS, Retry, ValidationPolicy, parse_command
from chronowheel.worker.occurrence import MalformedOccurrence, Occurrence
from chronowheel.worker.policy import (
    DeadLetter,
    dead_headers,
    error_text,
    gives_up,
    retry_command,
    retry_delay_ms,
)

FIRED = [
    ("cw-job-id", b"reminder-42"),
    ("cw-scheduled-at", b"1796115600000"),
    ("cw-attempt", b"2"),
    ("cw-occurrence", b"reminder-42@1796115600000"),
    ("cw-max-attempts", b"5"),
    ("cw-backoff-ms", b"10000"),
    ("trace", b"abc123"),
    ("cw-fired-at", b"1796115600004"),
]


def occurrence(headers: list[tuple[str, bytes]] = FIRED, value: bytes = b'{"to":"ada"}',
               ) -> Occurrence:
    return Occurrence.from_record("emails.send", 3, 17, value, headers)


def replaced(name: str, value: bytes | None) -> list[tuple[str, bytes]]:
    out = [(k, v) for k, v in FIRED if k != name]
    return out if value is None else [*out, (name, value)]


def test_occurrence_fields() -> None:
    occ = occurrence()
    assert (occ.job_id, occ.scheduled_ms, occ.fired_ms, occ.attempt) == (
        "reminder-42", 1796115600000, 1796115600004, 2)
    assert (occ.max_attempts, occ.backoff_ms) == (5, 10000)
    assert occ.occurrence == "reminder-42@1796115600000"
    assert (occ.topic, occ.partition, occ.offset) == ("emails.send", 3, 17)
    assert occ.json() == {"to": "ada"}
    assert occ.headers["trace"] == "abc123" and occ.headers["cw-attempt"] == "2"
    assert occ.job_headers == {"trace": "abc123"}
    assert not occ.is_last_attempt


def test_occurrence_defaults_for_older_messages() -> None:
    occ = occurrence([(k, v) for k, v in FIRED if k not in ("cw-max-attempts", "cw-backoff-ms")])
    assert (occ.max_attempts, occ.backoff_ms) == (5, 10_000)


@pytest.mark.parametrize("headers, message", [
    (replaced("cw-occurrence", None), "missing header cw-occurrence"),
    ([], "missing header cw-job-id"),
    (replaced("cw-attempt", b"two"), "cw-attempt: not a decimal integer"),
    (replaced("cw-attempt", b"0"), "cw-attempt: must be at least 1"),
    (replaced("cw-max-attempts", b"0"), "cw-max-attempts: must be at least 1"),
])
def test_not_an_occurrence(headers: list[tuple[str, bytes]], message: str) -> None:
    with pytest.raises(MalformedOccurrence, match=message):
        occurrence(headers)


def test_backoff_doubles_per_failed_attempt_and_is_capped_at_a_day() -> None:
    assert [retry_delay_ms(1000, a) for a in (1, 2, 3, 4)] == [1000, 2000, 4000, 8000]
    assert retry_delay_ms(10_000, 30) == DAY_MS
    assert retry_delay_ms(DAY_MS, 100) == DAY_MS
    assert retry_delay_ms(0, 5) == 0
    with pytest.raises(ValueError):
        retry_delay_ms(1000, 0)


def test_retry_command_parses_back_as_the_next_attempt_of_the_same_occurrence() -> None:
    occ = occurrence()
    key, value = retry_command(occ, now_ms=1796115700000)
    assert key == b"reminder-42"
    policy = ValidationPolicy(allowed_topic_pattern=r"emails\..+")
    cmd = parse_command(value, key=key, policy=policy, now_ms=1796115700000)
    assert cmd == Retry(id="reminder-42", scheduled_ms=1796115600000, attempt=3,
                        at_ms=1796115700000 + 20_000, topic="emails.send",
                        payload=b'{"to":"ada"}', headers=(("trace", "abc123"),),
                        max_attempts=5, backoff_ms=10_000)


def test_retry_command_keeps_binary_payloads_and_clamps_what_the_node_would_reject() -> None:
    occ = occurrence(replaced("cw-backoff-ms", str(3 * DAY_MS).encode()), value=b"\x00\xff")
    _, value = retry_command(occ, now_ms=0)
    doc = orjson.loads(value)
    assert base64.b64decode(doc["payload_b64"]) == b"\x00\xff"
    assert doc["backoff"] == "1d"
    assert doc["at"] == DAY_MS  # attempt 2 failed: 2 x backoff, capped at a day


def test_gives_up_on_the_last_attempt_or_when_asked() -> None:
    assert not gives_up(occurrence(), ValueError())
    assert gives_up(occurrence(replaced("cw-attempt", b"5")), ValueError())
    assert gives_up(occurrence(replaced("cw-attempt", b"7")), ValueError())
    assert gives_up(occurrence(), DeadLetter("bad address"))
    huge = replaced("cw-max-attempts", b"1000")
    assert gives_up(occurrence([*[(k, v) for k, v in huge if k != "cw-attempt"],
                                ("cw-attempt", b"100")]), ValueError())


def test_error_text_names_the_type_and_is_truncated_on_a_character_boundary() -> None:
    assert error_text(ValueError("no such user")) == "ValueError: no such user"
    assert error_text(TimeoutError()) == "TimeoutError"
    long = error_text(RuntimeError("é" * 5000), limit=101)
    assert long.startswith("RuntimeError: é") and long.endswith("...")
    assert len(long.encode()) <= 101


def test_dead_headers_keep_the_original_and_replace_stale_failure_headers() -> None:
    raw = (*occurrence().raw_headers, ("cw-error", b"old"))
    out = dead_headers(raw, KeyError("x"), 1234, "emails.send", 3, 17)
    d = dict(out)
    assert [k for k, _ in out].count("cw-error") == 1
    assert d["cw-error"] == b"KeyError: 'x'"
    assert d["cw-failed-at"] == b"1234"
    assert d["cw-source-topic"] == b"emails.send"
    assert (d["cw-source-partition"], d["cw-source-offset"]) == (b"3", b"17")
    assert d["cw-occurrence"] == b"reminder-42@1796115600000" and d["trace"] == b"abc123"


@pytest.mark.parametrize(("header", "origin"), [("cw-triggered", "trigger"),
                                                ("cw-backfill", "backfill")])
def test_a_retry_of_a_requested_occurrence_keeps_its_origin(header: str, origin: str) -> None:
    occ = occurrence(replaced(header, b"fix-1"))
    key, value = retry_command(occ, now_ms=1796115700000)
    policy = ValidationPolicy(allowed_topic_pattern=r"emails\..+")
    cmd = parse_command(value, key=key, policy=policy, now_ms=1796115700000)
    assert isinstance(cmd, Retry)
    assert (cmd.origin, cmd.request_id) == (origin, "fix-1")
    assert cmd.headers == (("trace", "abc123"),)  # the marker is not a job header
