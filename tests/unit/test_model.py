"""Wire format v1: the parser, the JSON Schema, the README examples, and the encode helpers."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from chronowheel.core import model, wire
from chronowheel.core.durations import DURATION_PATTERN, format_duration
from chronowheel.core.model import (
    Cancel,
    Command,
    JobSpec,
    Retry,
    Upsert,
    ValidationPolicy,
    encode_cancel,
    encode_retry,
    encode_upsert,
    internal_topics,
    parse_command,
)
from chronowheel.errors import UNSAFE_CHARACTERS, ConfigError, ValidationError
from chronowheel.settings import Settings
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from tests.property_budget import examples

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "schema" / "submit.v1.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
README = (ROOT / "schema" / "README.md").read_text()

DAY = 86_400_000
NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
POLICY = ValidationPolicy(allowed_topic_pattern=r"emails\..+")
HORIZON = POLICY.max_horizon_ms



def safe_text(**kw: Any) -> st.SearchStrategy[str]:
    """Text a job id or header name may hold: none of the characters the parser refuses."""
    return st.text(alphabet=st.characters(codec="utf-8", exclude_characters=UNSAFE_CHARACTERS),
                   **kw)

def parse(doc: Any, *, key: bytes | None = None, policy: ValidationPolicy = POLICY) -> Command:
    raw = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return parse_command(raw, key=key, policy=policy, now_ms=NOW)


def job(**fields: Any) -> dict[str, Any]:
    """An upsert command; `at` defaults to a valid one-shot unless a schedule is given."""
    if not {"at", "cron", "every"} & fields.keys():
        fields["at"] = NOW + 1000
    return {"v": 1, "op": "upsert", "job": {"id": "j-1", **fields}}


def spec_of(doc: Any, *, key: bytes | None = None, policy: ValidationPolicy = POLICY) -> JobSpec:
    command = parse(doc, key=key, policy=policy)
    assert isinstance(command, Upsert)
    return command.job


def spec(**fields: Any) -> JobSpec:
    return spec_of(job(**fields))


def error(
    doc: Any, *, key: bytes | None = None, policy: ValidationPolicy = POLICY
) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        parse(doc, key=key, policy=policy)
    return info.value


_DROP = object()  # marks a field retry_doc should leave out


def retry_doc(**fields: Any) -> dict[str, Any]:
    doc = {
        "v": 1,
        "op": "retry",
        "id": "j-1",
        "scheduled_at": NOW - 5000,
        "attempt": 2,
        "at": NOW + 10_000,
        "topic": "emails.send",
        "payload_b64": "aGk=",
    }
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not _DROP}


def schema_valid(doc: Any) -> bool:
    return VALIDATOR.is_valid(doc)


# --------------------------------------------------------------------------------------------
# The schema file and the README


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_schema_patterns_are_the_parsers_patterns() -> None:
    defs = SCHEMA["$defs"]
    assert defs["duration"]["pattern"] == DURATION_PATTERN
    assert defs["topic"]["pattern"] == model.TOPIC_PATTERN
    assert defs["base64"]["pattern"] == model.BASE64_PATTERN
    assert defs["job"]["properties"]["tz"]["pattern"] == model.TZ_PATTERN
    assert defs["epochMs"]["maximum"] == model.MAX_EPOCH_MS
    assert defs["jobId"]["maxLength"] == POLICY.max_id_bytes
    assert defs["job"]["properties"]["max_catch_up"]["maximum"] == POLICY.max_max_catch_up
    # Longest base64 text whose decoded size can still be within the payload limit.
    assert defs["base64"]["maxLength"] == 4 * -(-POLICY.max_payload_bytes // 3)
    assert set(defs["job"]["properties"]) == model.JOB_FIELDS
    assert set(defs["upsert"]["properties"]) == model.UPSERT_FIELDS
    assert set(defs["cancel"]["properties"]) == model.CANCEL_FIELDS
    assert set(defs["retry"]["properties"]) == model.RETRY_FIELDS
    assert set(defs["pause"]["properties"]) == model.PAUSE_FIELDS
    assert set(defs["resume"]["properties"]) == model.RESUME_FIELDS
    assert set(defs["trigger"]["properties"]) == model.TRIGGER_FIELDS
    assert set(defs["backfill"]["properties"]) == model.BACKFILL_FIELDS
    assert defs["requestId"]["pattern"] == model.REQUEST_ID_PATTERN
    assert set(defs["putCalendar"]["properties"]) == model.PUT_CALENDAR_FIELDS
    assert set(defs["deleteCalendar"]["properties"]) == model.DELETE_CALENDAR_FIELDS
    assert defs["calendarName"]["pattern"] == model.CALENDAR_NAME_PATTERN


def _readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def test_readme_has_examples_of_every_op() -> None:
    ops = [json.loads(block)["op"] for block in _readme_blocks("json")]
    assert {"upsert", "cancel", "retry", "pause", "resume", "trigger", "backfill"} <= set(ops)
    assert len(ops) >= 6


@pytest.mark.parametrize("block", _readme_blocks("json"))
def test_readme_examples_pass_schema_and_parser(block: str) -> None:
    doc = json.loads(block)
    VALIDATOR.validate(doc)
    key = doc.get("id") or doc.get("name") or doc["job"]["id"]  # calendar ops: their name
    command = parse(block.encode(), key=key.encode())
    assert command.op == doc["op"]


def test_readme_examples_parse_to_what_they_say() -> None:
    first = orjson.loads(_readme_blocks("json")[0])
    command = parse(first)
    assert isinstance(command, Upsert)
    assert command.job.at_ms == 1_796_115_600_000  # 2026-12-01T09:00:00Z
    assert command.job.topic == "emails.send"
    assert command.job.payload == b'{"to":"ada@example.com","template":"reminder"}'
    assert command.job.headers == (("trace", "abc123"),)
    # The fired-message example in the README shows exactly this payload.
    assert command.job.payload.decode() in README


README_REJECTIONS: dict[str, tuple[Any, bytes | None]] = {
    "job.tz: unknown time zone (got 'Europe/Lundon')": (
        job(cron="0 9 * * *", tz="Europe/Lundon"),
        None,
    ),
    "job: exactly one of at, cron, every (got ['at', 'every'])": (job(at=NOW, every="1m"), None),
    "job.headers.cw-attempt: names starting with 'cw-' are reserved (got 'cw-attempt')": (
        job(headers={"cw-attempt": "7"}),
        None,
    ),
    "job.tpoic: unknown field (did you mean 'topic'?) (got 'emails.send')": (
        job(tpoic="emails.send"),
        None,
    ),
    "key: record key must equal the job id 'reminder-42' (got b'reminder-43')": (
        {"v": 1, "op": "cancel", "id": "reminder-42"},
        b"reminder-43",
    ),
}


def test_readme_rejection_reasons_are_real() -> None:
    (block,) = [b for b in _readme_blocks("text") if "unknown time zone" in b]
    shown = set(block.strip().splitlines())
    assert shown == set(README_REJECTIONS)
    for message, (doc, key) in README_REJECTIONS.items():
        assert str(error(doc, key=key)) == message


BOTH_REJECT: list[tuple[str, dict[str, Any]]] = [
    ("unknown top-level field", {"v": 1, "op": "cancel", "id": "x", "force": True}),
    ("unknown job field", job(priority=1)),
    ("wrong version", {"v": 2, "op": "cancel", "id": "x"}),
    ("no schedule", {"v": 1, "op": "upsert", "job": {"id": "x"}}),
    ("two schedules", job(at=NOW, every="1m")),
    ("naive time", job(at="2026-12-01T09:00:00")),
    ("negative epoch", job(at=-1)),
    ("tz without cron", job(every="1m", tz="UTC")),
    ("dst without cron", job(at=NOW, dst="skip")),
    ("start on a one-shot", job(at=NOW, start=NOW)),
    ("catch_up on a one-shot", job(at=NOW, catch_up="all")),
    ("zero every", job(every="0s")),
    ("every under the minimum period", job(every="0s999ms")),
    ("bad duration", job(every="1m1h")),
    ("empty id", job(id="")),
    ("reserved header", job(headers={"cw-job-id": "x"})),
    ("non-string header", job(headers={"a": 1})),
    ("both payloads", job(payload=1, payload_b64="")),
    ("bad base64", job(payload_b64="abc")),
    ("bad topic characters", job(topic="a b")),
    ("Kafka-internal topic", job(topic="__consumer_offsets")),
    ("bad enum", job(cron="* * * * *", catch_up="latest")),
    ("max_attempts too high", job(max_attempts=101)),
    ("max_lateness under a second", job(max_lateness="999ms")),
    ("max_lateness zero", job(max_lateness="0s")),
    ("max_lateness not a duration", job(max_lateness=5000)),
    ("tenant too long", job(tenant="x" * 129)),
    ("retry attempt 1", retry_doc(attempt=1)),
    ("retry without payload", retry_doc(payload_b64=_DROP)),
    ("pause with extra field", {"v": 1, "op": "pause", "id": "x", "at": NOW}),
    ("resume without id", {"v": 1, "op": "resume"}),
    ("trigger without request id", {"v": 1, "op": "trigger", "id": "x"}),
    ("trigger with a bad request id", {"v": 1, "op": "trigger", "id": "x", "request_id": "a b"}),
    ("backfill without to", {"v": 1, "op": "backfill", "id": "x", "request_id": "r",
                             "from": NOW - 60_000}),
    ("retry origin without request id", retry_doc(origin="trigger")),
    ("retry with an unknown origin", retry_doc(origin="manual", request_id="r")),
    ("backfill with a naive from", {"v": 1, "op": "backfill", "id": "x", "request_id": "r",
                                    "from": "2025-12-01T00:00:00", "to": NOW}),
]


@pytest.mark.parametrize(("why", "doc"), BOTH_REJECT, ids=[w for w, _ in BOTH_REJECT])
def test_schema_and_parser_both_reject(why: str, doc: dict[str, Any]) -> None:
    assert not schema_valid(doc)
    error(doc)


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


# Each deliberate difference listed in schema/README.md, shown to be real: the schema lets it
# through and the parser does not.
SCHEMA_ONLY_PASSES: list[tuple[str, dict[str, Any], str]] = [
    ("zone existence", job(cron="0 9 * * *", tz="Europe/Lundon"), "job.tz"),
    ("cron semantics", job(cron="61 * * * *"), "job.cron"),
    ("at horizon", job(at=NOW + HORIZON + 1), "job.at"),
    ("start horizon", job(every="1h", start=NOW + HORIZON + 1), "job.start"),
    ("retry at horizon", retry_doc(at=NOW + HORIZON + 1), "at"),
    ("end after start", job(every="1h", start=NOW, end=NOW), "job.end"),
    ("id bytes", job(id="é" * 200), "job.id"),
    ("payload size", job(payload="x" * POLICY.max_payload_bytes), "job.payload"),
    ("header size", job(headers={"h": "x" * 20_000}), "job.headers"),
    ("topic allowlist", job(topic="billing.charge"), "job.topic"),
    ("internal topic", job(topic="chronowheel.submit"), "job.topic"),
    ("calendar", job(at="2026-02-30T00:00:00Z"), "job.at"),
    ("before 1970", job(at="1969-12-31T23:00:00Z"), "job.at"),
    ("window at most 1d", job(window="2d"), "job.window"),
    ("window shorter than every", job(every="1m", window="1m"), "job.window"),
    ("backoff at most 1d", job(backoff="2d"), "job.backoff"),
    ("max_lateness at most 3653d", job(max_lateness="3654d"), "job.max_lateness"),
    ("max_lateness longer than window", job(window="1m", max_lateness="1m"),
     "job.max_lateness"),
    ("attempt within max_attempts", retry_doc(attempt=4, max_attempts=3), "attempt"),
    ("integer-valued float", job(max_attempts=3.0), "job.max_attempts"),
    ("trailing newline", job(every="15m\n"), "job.every"),
    ("nesting depth", job(payload=_nested(63)), "$"),
    ("stored size", job(payload="x" * 30_000), "job"),
    ("TTL reach", job(cron="0 0 29 2 */7", exclude_dates=["2032-02-29"]), "job.cron"),
]


@pytest.mark.parametrize(
    ("why", "doc", "path"), SCHEMA_ONLY_PASSES, ids=[w for w, _, _ in SCHEMA_ONLY_PASSES]
)
def test_documented_differences_are_real(why: str, doc: dict[str, Any], path: str) -> None:
    assert schema_valid(doc)
    assert error(doc).path == path


# --------------------------------------------------------------------------------------------
# Top level


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b"{'v': 1}", "not valid JSON"),
        (b"NaN", "not valid JSON"),
        (b'{"v": 1, "op": "cancel", "id": "\xff"}', "not valid UTF-8"),
        (b"\xef\xbb\xbf{}", "not valid JSON"),  # a byte order mark is not JSON
        (b"[]", "must be a JSON object"),
        (b'"upsert"', "must be a JSON object"),
        (b"null", "must be a JSON object"),
    ],
)
def test_whole_document_errors_use_path_dollar(raw: bytes, rule: str) -> None:
    err = error(raw)
    assert err.path == "$"
    assert rule in err.rule


@pytest.mark.parametrize("version", [2, 0, "1", 1.0, True, None, [1]])
def test_version_must_be_integer_one(version: Any) -> None:
    err = error({"v": version, "op": "cancel", "id": "x"})
    assert (err.path, err.value) == ("v", version)
    assert "unsupported version" in err.rule


def test_version_and_op_are_required() -> None:
    assert str(error({"op": "cancel", "id": "x"})) == "v: required"
    err = error({"v": 1, "id": "x"})
    assert err.path == "op" and err.rule.startswith("required")


@pytest.mark.parametrize("op", ["Upsert", "delete", "", 1, None])
def test_op_must_be_known(op: Any) -> None:
    err = error({"v": 1, "op": op, "id": "x"})
    assert (err.path, err.value) == ("op", op)
    assert err.rule == ("must be one of upsert, cancel, retry, pause, resume, trigger, backfill, "
                        "put_calendar, delete_calendar")


def test_unknown_fields_are_rejected_at_every_level_with_a_hint() -> None:
    err = error({"v": 1, "op": "upsert", "jbo": {}})
    assert err.path == "jbo" and "did you mean 'job'" in err.rule
    err = error({"v": 1, "op": "cancel", "id": "x", "job": {}})
    assert err.path == "job" and err.rule.startswith("unknown field")
    err = error(job(tx="Europe/London"))
    assert err.path == "job.tx" and "did you mean 'tz'" in err.rule
    assert err.value == "Europe/London"
    err = error(job(zzz=1))
    assert err.path == "job.zzz" and err.rule == "unknown field"
    err = error(retry_doc(payload="x"))
    assert err.path == "payload" and "did you mean 'payload_b64'" in err.rule


def test_upsert_needs_a_job_object() -> None:
    assert str(error({"v": 1, "op": "upsert"})) == "job: required"
    err = error({"v": 1, "op": "upsert", "job": ["id", "x"]})
    assert (err.path, err.rule) == ("job", "must be a JSON object")


# --------------------------------------------------------------------------------------------
# Job id and record key


def test_id_limits_count_utf8_bytes() -> None:
    assert spec(id="x" * 256).id == "x" * 256
    assert spec(id="é" * 128).id == "é" * 128  # 256 bytes
    err = error(job(id="é" * 129))  # 129 characters, 258 bytes
    assert err.path == "job.id"
    assert err.rule == "must be at most 256 UTF-8 bytes (is 258)"
    err = error(job(id=""))
    assert (err.path, err.rule) == ("job.id", "must not be empty")
    err = error(job(id=42))
    assert (err.path, err.rule, err.value) == ("job.id", "must be a string", 42)
    assert str(error({"v": 1, "op": "upsert", "job": {"at": NOW}})) == "job.id: required"


def test_id_limit_follows_the_policy() -> None:
    small = ValidationPolicy(max_id_bytes=4)
    assert parse({"v": 1, "op": "cancel", "id": "abcd"}, policy=small) == Cancel("abcd")
    err = error({"v": 1, "op": "cancel", "id": "abcde"}, policy=small)
    assert err.path == "id" and "at most 4" in err.rule


def test_key_must_equal_the_utf8_id_for_every_op() -> None:
    assert spec_of(job(id="ü-1"), key="ü-1".encode()).id == "ü-1"
    assert spec_of(job(id="ü-1"), key=None).id == "ü-1"
    for doc in (job(id="a"), {"v": 1, "op": "cancel", "id": "a"}, retry_doc(id="a")):
        err = error(doc, key=b"b")
        assert (err.path, err.value) == ("key", b"b")
        assert "'a'" in err.rule
    err = error(job(id="a"), key=b"\xff")
    assert err.path == "key"


# --------------------------------------------------------------------------------------------
# Schedules


def test_exactly_one_of_at_cron_every() -> None:
    doc = {"v": 1, "op": "upsert", "job": {"id": "x"}}
    assert str(error(doc)) == "job: exactly one of at, cron, every"
    err = error(job(at=NOW, cron="* * * * *", every="1m"))
    assert (err.path, err.value) == ("job", ["at", "cron", "every"])
    err = error(job(cron="* * * * *", every="1m"))
    assert err.value == ["cron", "every"]


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("2026-12-01T09:00:00Z", 1_796_115_600_000),
        ("2026-12-01t09:00:00z", 1_796_115_600_000),
        ("2026-12-01T10:00:00+01:00", 1_796_115_600_000),
        ("2026-12-01T04:30:00-04:30", 1_796_115_600_000),
        ("2026-12-01T09:00:00-00:00", 1_796_115_600_000),
        ("2026-12-01T09:00:00.5Z", 1_796_115_600_500),
        ("2026-12-01T09:00:00.123Z", 1_796_115_600_123),
        ("2026-12-01T09:00:00.123000000Z", 1_796_115_600_123),
        # Below a millisecond rounds up: never early.
        ("2026-12-01T09:00:00.1231Z", 1_796_115_600_124),
        ("2026-12-01T09:00:00.9999Z", 1_796_115_601_000),
        ("2026-12-01T09:00:00.000000001Z", 1_796_115_600_001),
        ("1970-01-01T00:00:00Z", 0),
        ("2024-02-29T00:00:00Z", 1_709_164_800_000),
    ],
)
def test_at_accepts_rfc3339_with_offset(text: str, expected_ms: int) -> None:
    assert spec(at=text).at_ms == expected_ms


def test_at_accepts_epoch_ms_and_the_past() -> None:
    assert spec(at=1_796_115_600_000).at_ms == 1_796_115_600_000
    assert spec(at=0).at_ms == 0  # long past: fires at once
    assert spec(at=NOW + HORIZON).at_ms == NOW + HORIZON


@pytest.mark.parametrize(
    ("value", "rule_part"),
    [
        ("2026-12-01T09:00:00", "needs a UTC offset"),
        ("2026-12-01T09:00:00.5", "needs a UTC offset"),
        ("2026-12-01 09:00:00Z", "must be an RFC 3339 time"),
        ("2026-12-01", "must be an RFC 3339 time"),
        ("2026-12-01T09:00Z", "must be an RFC 3339 time"),
        ("2026-12-01T09:00:00+0100", "must be an RFC 3339 time"),
        ("2026-12-01T09:00:00+01", "must be an RFC 3339 time"),
        ("2026-12-01T09:00:00.Z", "must be an RFC 3339 time"),
        ("2026-12-01T09:00:00Z ", "must be an RFC 3339 time"),
        ("tomorrow", "must be an RFC 3339 time"),
        ("", "must be an RFC 3339 time"),
        ("2026-02-30T09:00:00Z", "not a valid date and time"),
        ("2026-13-01T09:00:00Z", "not a valid date and time"),
        ("2026-12-01T24:00:00Z", "not a valid date and time"),
        ("2026-12-01T09:60:00Z", "not a valid date and time"),
        ("2026-12-01T09:00:00+24:00", "not a valid date and time"),
        ("2026-12-01T09:00:00+01:60", "not a valid date and time"),
        ("0000-01-01T00:00:00Z", "not a valid date and time"),
        ("2016-12-31T23:59:60Z", "leap seconds"),
        ("1969-12-31T23:59:59Z", "before 1970"),
        ("1970-01-01T00:30:00+01:00", "before 1970"),
        ("9999-12-31T23:59:59-01:00", "after 9999"),
        (-1, "between 0 and"),
        (model.MAX_EPOCH_MS + 1, "between 0 and"),
        (1.7e12, "integer epoch milliseconds"),
        (True, "integer epoch milliseconds"),
        (None, "integer epoch milliseconds"),
        ({"ms": 1}, "integer epoch milliseconds"),
    ],
)
def test_at_rejects(value: Any, rule_part: str) -> None:
    err = error(job(at=value))
    assert err.path == "job.at"
    assert rule_part in err.rule
    assert err.value == value


def test_at_horizon() -> None:
    err = error(job(at=NOW + HORIZON + 1))
    assert err.path == "job.at"
    assert err.rule == "must be at most 3653d ahead of now"
    assert err.value == NOW + HORIZON + 1
    near = ValidationPolicy(max_horizon_ms=DAY)
    assert spec_of(job(at="2026-01-02T00:00:00Z"), policy=near).at_ms == NOW + DAY
    err = error(job(at="2026-01-02T00:00:00.001Z"), policy=near)
    assert err.rule == "must be at most 1d ahead of now"
    assert err.value == "2026-01-02T00:00:00.001Z"


def test_one_shot_rejects_recurring_only_fields() -> None:
    for name, value in [("start", NOW), ("end", NOW), ("catch_up", "all"), ("max_catch_up", 5)]:
        err = error(job(at=NOW, **{name: value}))
        assert err.path == f"job.{name}"
        assert err.rule == "only allowed for recurring jobs (cron or every)"
    for name, value in [("tz", "UTC"), ("dst", "skip")]:
        err = error(job(at=NOW, **{name: value}))
        assert (err.path, err.rule) == (f"job.{name}", "only allowed with cron")
        err = error(job(every="1m", **{name: value}))
        assert (err.path, err.rule) == (f"job.{name}", "only allowed with cron")


def test_cron_job_defaults_and_fields() -> None:
    s = spec(cron="0 9 * * 1-5")
    assert (s.cron, s.tz, s.dst, s.catch_up, s.max_catch_up) == (
        "0 9 * * 1-5",
        "UTC",
        "skip",
        "coalesce",
        100,
    )
    assert s.recurring and s.at_ms is None and s.every_ms is None
    s = spec(cron="@daily", tz="Europe/London", dst="cron", catch_up="all", max_catch_up=10_000)
    assert (s.tz, s.dst, s.catch_up, s.max_catch_up) == ("Europe/London", "cron", "all", 10_000)


def test_cron_expression_is_validated_by_the_recurrence_compiler() -> None:
    for bad in ("61 * * * *", "* * *", "0 9 * * Funday", "nonsense"):
        err = error(job(cron=bad))
        assert err.path == "job.cron"
        assert err.value == bad
    err = error(job(cron=""))
    assert (err.path, err.rule) == ("job.cron", "must be 1..256 characters long")
    err = error(job(cron=5))
    assert (err.path, err.rule) == ("job.cron", "must be a string")


@pytest.mark.parametrize(
    "tz", ["Europe/Lundon", "Mars/Olympus", "", "../../etc/passwd", "/etc/localtime", "localtime"]
)
def test_unknown_time_zones_are_rejected(tz: str) -> None:
    err = error(job(cron="0 9 * * *", tz=tz))
    assert err.path == "job.tz"
    assert err.value == tz


def test_unknown_time_zone_message() -> None:
    err = error(job(cron="0 9 * * *", tz="Europe/Lundon"))
    assert str(err) == "job.tz: unknown time zone (got 'Europe/Lundon')"


def test_every() -> None:
    s = spec(every="15m")
    assert (s.every_ms, s.cron, s.at_ms, s.tz) == (900_000, None, None, "UTC")
    assert spec(every="1s").every_ms == 1000  # the default minimum period
    assert spec_of(job(every="1ms"), policy=ValidationPolicy(min_period_ms=1)).every_ms == 1
    for zero in ("0s", "0d0h", "0ms"):
        err = error(job(every=zero))
        assert (err.path, err.rule, err.value) == ("job.every", "must be greater than 0s", zero)
    err = error(job(every=900_000))
    assert err.path == "job.every" and "duration string" in err.rule
    err = error(job(every="15 minutes"))
    assert err.path == "job.every" and err.value == "15 minutes"
    err = error(job(every="3654d"))
    assert (err.path, err.rule) == ("job.every", "must be at most 3653d")


def test_start_and_end() -> None:
    s = spec(every="1h", start="2026-02-01T00:00:00Z", end=1_800_000_000_000)
    assert (s.start_ms, s.end_ms) == (1_769_904_000_000, 1_800_000_000_000)
    err = error(job(every="1h", start=NOW + DAY, end=NOW + DAY))
    assert (err.path, err.rule, err.value) == ("job.end", "must be after start", NOW + DAY)
    err = error(job(cron="* * * * *", start="2026-01-02T00:00:00Z", end="2026-01-01T00:00:00Z"))
    assert err.path == "job.end"
    err = error(job(every="1h", start=NOW + HORIZON + 1))
    assert err.path == "job.start" and "ahead of now" in err.rule
    err = error(job(every="1h", start="2026-01-01T00:00:00"))
    assert err.path == "job.start" and "needs a UTC offset" in err.rule
    # end alone, and far ahead, is fine: it only bounds the series.
    assert spec(every="1h", end="9000-01-01T00:00:00Z").end_ms is not None


# --------------------------------------------------------------------------------------------
# Target topic


def test_topic_default_and_allowlist() -> None:
    assert spec().topic == "chronowheel.fired"
    assert spec(topic="chronowheel.fired").topic == "chronowheel.fired"
    assert spec(topic="emails.send").topic == "emails.send"
    assert spec(topic="emails." + "x" * 242).topic == "emails." + "x" * 242  # 249 characters
    for bad in ("emails.", "xemails.send", "billing.charge", "chronowheel.fired2"):
        err = error(job(topic=bad))
        assert err.path == "job.topic" and err.value == bad
        assert err.rule.startswith("not allowed: must be 'chronowheel.fired'")
    other = ValidationPolicy(namespace="prod")
    assert spec_of(job(topic="prod.fired"), policy=other).topic == "prod.fired"
    assert error(job(topic="chronowheel.fired"), policy=other).path == "job.topic"


def test_internal_topics_are_never_allowed_even_if_the_pattern_matches() -> None:
    everything = ValidationPolicy(allowed_topic_pattern=".*")
    assert spec_of(job(topic="anything.at-all"), policy=everything).topic == "anything.at-all"
    for suffix in ("submit", "state", "rejected", "dead"):
        err = error(job(topic=f"chronowheel.{suffix}"), policy=everything)
        assert err.path == "job.topic"
        assert err.rule == "is an internal topic of namespace 'chronowheel'"
        err = error(retry_doc(topic=f"chronowheel.{suffix}"), policy=everything)
        assert err.path == "topic" and "internal topic" in err.rule
    for kafka_internal in ("__consumer_offsets", "__transaction_state"):
        err = error(job(topic=kafka_internal), policy=everything)
        assert "reserved for Kafka" in err.rule


@pytest.mark.parametrize("topic", ["", ".", "..", "a b", "émails", "a/b", "x" * 250, 7, None])
def test_topic_must_be_a_kafka_topic_name(topic: Any) -> None:
    err = error(job(topic=topic), policy=ValidationPolicy(allowed_topic_pattern=".*"))
    assert err.path == "job.topic" and err.value == topic


# --------------------------------------------------------------------------------------------
# Payload and headers


def test_payload_forms() -> None:
    assert spec().payload == b""
    assert spec(payload={"b": 1, "a": [1, 2.5, None]}).payload == b'{"b":1,"a":[1,2.5,null]}'
    assert spec(payload="text").payload == b'"text"'
    assert spec(payload=None).payload == b"null"
    assert spec(payload=0).payload == b"0"
    assert spec(payload_b64="AAEC/w==").payload == b"\x00\x01\x02\xff"
    assert spec(payload_b64="").payload == b""
    err = error(job(payload=1, payload_b64="AA=="))
    assert (err.path, err.rule) == ("job", "at most one of payload, payload_b64")


def test_json_payload_is_compact_regardless_of_input_whitespace() -> None:
    raw = b'{"v":1,"op":"upsert","job":{"id":"j","at":0,"payload":  { "k" :  [ 1 , 2 ] } }}'
    command = parse(raw)
    assert isinstance(command, Upsert)
    assert command.job.payload == b'{"k":[1,2]}'


@pytest.mark.parametrize(
    "text", ["AAE", "AA=A", "A===", "QQ==QQ==", "AA==\n", " AA==", "-_8=", "AAE=\x00", 5]
)
def test_payload_b64_must_be_standard_padded_base64(text: Any) -> None:
    err = error(job(payload_b64=text))
    assert err.path == "job.payload_b64" and err.value == text


def test_payload_size_limits() -> None:
    small = ValidationPolicy(max_payload_bytes=10)
    assert spec_of(job(payload="12345678"), policy=small).payload == b'"12345678"'
    err = error(job(payload="123456789"), policy=small)
    assert err.path == "job.payload"
    assert err.rule == "must be at most 10 bytes once serialised"
    assert err.value == "11 bytes"
    ten = base64.b64encode(b"x" * 10).decode()
    assert spec_of(job(payload_b64=ten), policy=small).payload == b"x" * 10
    err = error(job(payload_b64=base64.b64encode(b"x" * 11).decode()), policy=small)
    assert (err.path, err.value) == ("job.payload_b64", "11 bytes")
    big = "x" * (POLICY.max_payload_bytes - 2)
    # Stored twice, the largest payload needs a batch limit raised to match (store size).
    roomy = ValidationPolicy(max_stored_bytes=4 * POLICY.max_payload_bytes)
    assert len(spec_of(job(payload=big), policy=roomy).payload) == POLICY.max_payload_bytes
    assert error(job(payload=big + "x")).path == "job.payload"


def test_headers() -> None:
    s = spec(headers={"z": "1", "a": "", "X-Trace": "é"})
    assert s.headers == (("X-Trace", "é"), ("a", ""), ("z", "1"))
    assert spec(headers={}).headers == ()
    for name in ("cw-attempt", "CW-Job-Id", "Cw-anything"):
        err = error(job(headers={"ok": "1", name: "x"}))
        assert err.path == f"job.headers.{name}"
        assert err.rule == "names starting with 'cw-' are reserved"
        assert err.value == name
    assert spec(headers={"cwx": "1", "x-cw-y": "2"}).headers == (("cwx", "1"), ("x-cw-y", "2"))
    err = error(job(headers={"n": 1}))
    assert (err.path, err.rule, err.value) == ("job.headers.n", "header values must be strings", 1)
    err = error(job(headers={"": "x"}))
    assert err.path == "job.headers."
    err = error(job(headers=[["a", "b"]]))
    assert err.path == "job.headers" and "object of string to string" in err.rule


def test_headers_total_size_limit() -> None:
    small = ValidationPolicy(max_headers_bytes=8)
    assert spec_of(job(headers={"abcd": "éé"}), policy=small).headers == (("abcd", "éé"),)
    err = error(job(headers={"abcd": "éé", "x": ""}), policy=small)
    assert (err.path, err.value) == ("job.headers", "9 bytes")


# --------------------------------------------------------------------------------------------
# The other job fields


def test_defaults_of_a_one_shot_job() -> None:
    s = spec(at=NOW)
    assert s == JobSpec(id="j-1", topic="chronowheel.fired", payload=b"", at_ms=NOW)
    assert not s.recurring
    assert (s.window_ms, s.max_attempts, s.backoff_ms, s.tenant) == (0, 5, 10_000, None)


@pytest.mark.parametrize(
    ("name", "value", "path_rule"),
    [
        ("catch_up", "none", "must be one of coalesce, all, skip"),
        ("catch_up", "ALL", "must be one of coalesce, all, skip"),
        ("catch_up", None, "must be one of coalesce, all, skip"),
        ("dst", "fold", "must be one of skip, cron"),
        ("max_catch_up", 0, "must be between 1 and 10000"),
        ("max_catch_up", 10_001, "must be between 1 and 10000"),
        ("max_catch_up", 5.0, "must be an integer"),
        ("max_catch_up", True, "must be an integer"),
        ("max_catch_up", "5", "must be an integer"),
    ],
)
def test_recurring_options_rejected(name: str, value: Any, path_rule: str) -> None:
    err = error(job(cron="0 9 * * *", **{name: value}))
    assert (err.path, err.rule, err.value) == (f"job.{name}", path_rule, value)


def test_max_catch_up_follows_the_policy() -> None:
    tight = ValidationPolicy(max_max_catch_up=50)
    assert spec_of(job(every="1s", max_catch_up=50), policy=tight).max_catch_up == 50
    err = error(job(every="1s", max_catch_up=51), policy=tight)
    assert err.rule == "must be between 1 and 50"


def test_window() -> None:
    assert spec(window="0s").window_ms == 0
    assert spec(window="1d").window_ms == DAY
    assert spec(every="1m", window="59s999ms").window_ms == 59_999
    assert spec(cron="* * * * *", window="1d").window_ms == DAY
    err = error(job(window="1d1ms"))
    assert (err.path, err.rule, err.value) == ("job.window", "must be at most 1d", "1d1ms")
    err = error(job(every="1m", window="1m"))
    assert (err.path, err.rule) == ("job.window", "must be shorter than every")
    err = error(job(window="-1s"))
    assert (err.path, err.rule) == ("job.window", "must not be negative")


def test_retry_policy_fields() -> None:
    s = spec(max_attempts=1, backoff="0s")
    assert (s.max_attempts, s.backoff_ms) == (1, 0)
    assert spec(max_attempts=100, backoff="1d").backoff_ms == DAY
    for bad in (0, 101, -1, 2.5, "3", False):
        err = error(job(max_attempts=bad))
        assert (err.path, err.value) == ("job.max_attempts", bad)
    err = error(job(backoff="25h"))
    assert (err.path, err.rule) == ("job.backoff", "must be at most 1d")
    err = error(job(backoff=10))
    assert err.path == "job.backoff"


def test_tenant() -> None:
    assert spec(tenant="acme").tenant == "acme"
    assert spec(tenant="é" * 128).tenant == "é" * 128
    for bad in ("", "x" * 129, 7, None):
        err = error(job(tenant=bad))
        assert (err.path, err.value) == ("job.tenant", bad)


# --------------------------------------------------------------------------------------------
# Canonical form: what makes an identical re-submit a no-op


def test_canonical_ignores_key_order_and_whitespace() -> None:
    a = b'{"v":1,"op":"upsert","job":{"id":"j","every":"1h","payload":{"x":1,"y":[2,3]}}}'
    b = (
        b'{ "job" : { "payload" : { "y" : [ 2 , 3 ] , "x" : 1 } , "every" : "1h" , "id" : "j" } ,'
        b' "op" : "upsert" , "v" : 1 }'
    )
    ja, jb = spec_of(a), spec_of(b)
    assert ja.canonical == jb.canonical
    assert ja.canonical == b'{"every":"1h","id":"j","payload":{"x":1,"y":[2,3]}}'
    # The fired payload keeps the submitter's key order (JSON objects are unordered, so the
    # two specs mean the same); everything else is equal.
    assert (ja.payload, jb.payload) == (b'{"x":1,"y":[2,3]}', b'{"y":[2,3],"x":1}')
    assert dataclasses.replace(jb, payload=ja.payload) == ja


def test_canonical_differs_when_the_spec_differs() -> None:
    assert spec(every="1h").canonical != spec(every="60m").canonical
    assert spec(every="1h", tenant="a").canonical != spec(every="1h").canonical
    # Same meaning, different spelling: a changed spec, hence a new version. Harmless.
    assert spec(at="2026-12-01T09:00:00Z").at_ms == spec(at=1_796_115_600_000).at_ms


# --------------------------------------------------------------------------------------------
# Cancel and retry


def test_cancel() -> None:
    assert parse({"v": 1, "op": "cancel", "id": "reminder-42"}, key=b"reminder-42") == Cancel(
        "reminder-42"
    )
    assert str(error({"v": 1, "op": "cancel"})) == "id: required"
    err = error({"v": 1, "op": "cancel", "id": ""})
    assert (err.path, err.rule) == ("id", "must not be empty")


def test_retry_parses_every_field() -> None:
    doc = retry_doc(
        at="2026-01-01T00:00:10Z", headers={"t": "1"}, max_attempts=5, backoff="30s", attempt=5
    )
    assert parse(doc, key=b"j-1") == Retry(
        id="j-1",
        scheduled_ms=NOW - 5000,
        attempt=5,
        at_ms=NOW + 10_000,
        topic="emails.send",
        payload=b"hi",
        headers=(("t", "1"),),
        max_attempts=5,
        backoff_ms=30_000,
    )
    minimal = parse(retry_doc(payload_b64=""))
    assert isinstance(minimal, Retry)
    assert (minimal.payload, minimal.headers, minimal.max_attempts, minimal.backoff_ms) == (
        b"",
        (),
        None,
        None,
    )


@pytest.mark.parametrize("name", ["id", "scheduled_at", "attempt", "at", "topic", "payload_b64"])
def test_retry_required_fields(name: str) -> None:
    assert str(error(retry_doc(**{name: _DROP}))) == f"{name}: required"


@pytest.mark.parametrize(
    ("fields", "path", "rule_part"),
    [
        ({"attempt": 1}, "attempt", "between 2 and 100"),
        ({"attempt": 101}, "attempt", "between 2 and 100"),
        ({"attempt": 4, "max_attempts": 3}, "attempt", "must not exceed max_attempts (3)"),
        ({"max_attempts": 0}, "max_attempts", "between 1 and 100"),
        ({"scheduled_at": "2026-01-01T00:00:00Z"}, "scheduled_at", "integer epoch"),
        ({"scheduled_at": -1}, "scheduled_at", "between 0 and"),
        ({"at": NOW + HORIZON + 1}, "at", "ahead of now"),
        ({"at": "2026-01-01T00:00:00"}, "at", "needs a UTC offset"),
        ({"topic": "billing.charge"}, "topic", "not allowed"),
        ({"payload_b64": "***"}, "payload_b64", "base64"),
        ({"headers": {"cw-attempt": "2"}}, "headers.cw-attempt", "reserved"),
        ({"backoff": "2d"}, "backoff", "at most 1d"),
        ({"concurrency": "sometimes"}, "concurrency", "must be one of allow, forbid, replace"),
        ({"concurrency": None}, "concurrency", "must be one of"),
        ({"redrive_id": "redrive:0@5"}, "redrive_id", "must be 1..128 of A-Z a-z 0-9 . _ : -"),
        ({"redrive_id": ""}, "redrive_id", "must be 1..128 characters long"),
        ({"redrive_id": "r" * 129}, "redrive_id", "must be 1..128 characters long"),
        ({"redrive_id": 5}, "redrive_id", "must be a string"),
    ],
)
def test_retry_rules(fields: dict[str, Any], path: str, rule_part: str) -> None:
    err = error(retry_doc(**fields))
    assert err.path == path
    assert rule_part in err.rule


# --------------------------------------------------------------------------------------------
# Error messages


def test_errors_name_path_rule_and_truncated_value() -> None:
    long_topic = "emails." + "é" * 300
    err = error(job(topic=long_topic))
    text = str(err)
    assert text.startswith("job.topic: must be 1..249 characters")
    assert "(got 'emails.ééé" in text
    assert text.endswith("...)")
    assert len(text) < 200
    err = error(b'{"v":1,' + b"x" * 10_000)
    assert str(err).startswith("$: not valid JSON")
    assert len(str(err)) < 300


# --------------------------------------------------------------------------------------------
# Policy


def test_policy_topics_and_config_errors() -> None:
    assert POLICY.internal_topics == {
        "chronowheel.submit",
        "chronowheel.state",
        "chronowheel.rejected",
        "chronowheel.dead",
    }
    assert internal_topics("x") == Settings(namespace="x").internal_topics
    assert POLICY.fired_topic == "chronowheel.fired"
    with pytest.raises(ConfigError, match="not a regex"):
        ValidationPolicy(allowed_topic_pattern="emails.(")
    with pytest.raises(ConfigError, match="namespace"):
        ValidationPolicy(namespace="bad ns")
    with pytest.raises(ConfigError, match="max_id_bytes"):
        ValidationPolicy(max_id_bytes=0)


def test_policy_from_settings() -> None:
    s = Settings(
        namespace="prod",
        allowed_topics=r"jobs\..+",
        max_id_bytes=64,
        max_payload_bytes=1024,
        max_horizon_ms=DAY,
    )
    p = ValidationPolicy.from_settings(s)
    assert (p.namespace, p.max_id_bytes, p.max_payload_bytes, p.max_horizon_ms) == (
        "prod",
        64,
        1024,
        DAY,
    )
    assert p.topic_problem("jobs.x") is None
    assert p.topic_problem("prod.fired") is None
    assert p.topic_problem("prod.state") is not None
    assert ValidationPolicy.from_settings(Settings()).max_horizon_ms == HORIZON


# --------------------------------------------------------------------------------------------
# Encode helpers round-trip with the parser


def test_encode_upsert_round_trips_with_conversions() -> None:
    raw = encode_upsert(
        {
            "id": "r-1",
            "cron": "0 9 * * 1-5",
            "tz": "Europe/London",
            "start": datetime(2026, 3, 1, 9, 0, tzinfo=timezone(timedelta(hours=1))),
            "end": datetime(2027, 1, 1, tzinfo=UTC),
            "window": timedelta(seconds=90),
            "backoff": 250,
            "payload": b"\x00bin",
            "headers": {"k": "v"},
            "topic": "emails.send",
        }
    )
    doc = orjson.loads(raw)
    assert doc["job"]["start"] == "2026-03-01T08:00:00Z"
    assert doc["job"]["window"] == "90s"
    assert doc["job"]["backoff"] == "250ms"
    assert doc["job"]["payload_b64"] == base64.b64encode(b"\x00bin").decode()
    assert schema_valid(doc)
    s = spec_of(raw, key=b"r-1")
    assert s.start_ms == 1_772_352_000_000
    assert s.end_ms == 1_798_761_600_000
    assert (s.window_ms, s.backoff_ms, s.payload, s.headers) == (
        90_000,
        250,
        b"\x00bin",
        (("k", "v"),),
    )


def test_encode_upsert_keeps_sub_millisecond_datetimes_never_early() -> None:
    raw = encode_upsert({"id": "x", "at": datetime(2026, 5, 1, 0, 0, 0, 1, tzinfo=UTC)})
    assert spec_of(raw).at_ms == 1_777_593_600_001


def test_encode_upsert_refuses_ambiguous_values() -> None:
    with pytest.raises(ValueError, match="naive"):
        encode_upsert({"id": "x", "at": datetime(2026, 5, 1)})
    with pytest.raises(ValueError, match="whole"):
        encode_upsert({"id": "x", "every": timedelta(microseconds=1500)})
    with pytest.raises(ValueError, match="negative"):
        encode_upsert({"id": "x", "every": -5})


def test_encode_cancel_round_trips() -> None:
    assert parse(encode_cancel("é-1"), key="é-1".encode()) == Cancel("é-1")
    assert schema_valid(orjson.loads(encode_cancel("x")))


@given(
    payload=st.binary(max_size=64),
    attempt=st.integers(2, 100),
    headers=st.dictionaries(
        safe_text(min_size=1, max_size=8).filter(lambda n: not n.lower().startswith("cw-")),
        st.text(max_size=8),
        max_size=3,
    ),
    backoff=st.none() | st.integers(0, DAY),
    delay=st.integers(-DAY, HORIZON),
)
@settings(max_examples=examples(100), deadline=None)
def test_encode_retry_round_trips(
    payload: bytes, attempt: int, headers: dict[str, str], backoff: int | None, delay: int
) -> None:
    at_ms = max(0, NOW + delay)
    raw = encode_retry(
        id="j",
        scheduled_ms=NOW,
        attempt=attempt,
        at_ms=at_ms,
        topic="chronowheel.fired",
        payload=payload,
        headers=headers,
        max_attempts=100,
        backoff_ms=backoff,
    )
    assert schema_valid(orjson.loads(raw))
    assert parse(raw, key=b"j") == Retry(
        id="j",
        scheduled_ms=NOW,
        attempt=attempt,
        at_ms=at_ms,
        topic="chronowheel.fired",
        payload=payload,
        headers=tuple(sorted(headers.items())),
        max_attempts=100,
        backoff_ms=backoff,
    )


# --------------------------------------------------------------------------------------------
# Generated commands: the schema and the parser agree
#
# Deliberate differences (the parser is stricter; the schema cannot express these):
#   time-zone existence and cron semantics; the horizon of at/start; end after start;
#   calendar validity, pre-1970 and leap seconds; id length in bytes (schema: characters);
#   payload size after serialising; total header size; the topic allowlist; window and backoff
#   at most 1d, window shorter than every; max_lateness at most 3653d and longer than window;
#   retry attempt <= max_attempts; integer-valued
#   floats (5.0), which JSON Schema counts as integers; a trailing newline, which Python's `$`
#   (used by the jsonschema library) lets through a pattern.
# So the property is one-way: whatever the schema rejects, the parser rejects.

ZONES = ["UTC", "Europe/London", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
CRONS = ["0 9 * * 1-5", "*/5 * * * *", "0 0 1 * *", "@daily", "@hourly", "30 2 * * 0"]
CRONS += ["* * * * * *", "0 30 9 * * 1", "15 10 L * ?"]
SAFE_MAX_MS = NOW + 9 * 365 * DAY  # inside the horizon and before the recurrence's 9999 cap

json_int = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what orjson can write
json_scalar = (
    st.none()
    | st.booleans()
    | json_int
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_value = st.recursive(
    json_scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
offsets = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
rfc3339 = st.builds(
    lambda moment, zone, spec: moment.replace(tzinfo=UTC).astimezone(zone).isoformat(timespec=spec),
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2034, 12, 1)),
    offsets,
    st.sampled_from(["seconds", "milliseconds", "microseconds"]),
)
epoch_ms = st.integers(0, SAFE_MAX_MS)
instant = epoch_ms | rfc3339
durations = st.integers(0, 3 * DAY).map(format_duration)
header_maps = st.dictionaries(
    safe_text(min_size=1, max_size=8).filter(lambda n: not n.lower().startswith("cw-")),
    st.text(max_size=8),
    max_size=3,
)


def _to_ms(value: int | str) -> int:
    if isinstance(value, int):
        return value
    return model._rfc3339_ms(value, "test")


@st.composite
def valid_job(draw: st.DrawFn) -> dict[str, Any]:
    job: dict[str, Any] = {"id": draw(safe_text(min_size=1, max_size=40))}
    kind = draw(st.sampled_from(["at", "cron", "every"]))
    every_ms = None
    if kind == "at":
        job["at"] = draw(instant)
    elif kind == "cron":
        job["cron"] = draw(st.sampled_from(CRONS))
        if draw(st.booleans()):
            job["tz"] = draw(st.sampled_from(ZONES))
        if draw(st.booleans()):
            job["dst"] = draw(st.sampled_from(["skip", "cron"]))
    else:
        every_ms = draw(st.integers(POLICY.min_period_ms, 30 * DAY))
        job["every"] = format_duration(every_ms)
    if kind != "at":
        if draw(st.booleans()):
            job["start"] = draw(instant)
        if draw(st.booleans()):
            low = _to_ms(job["start"]) + 1 if "start" in job else 0
            job["end"] = draw(st.integers(low, SAFE_MAX_MS + DAY))
        if draw(st.booleans()):
            job["catch_up"] = draw(st.sampled_from(["coalesce", "all", "skip"]))
        if draw(st.booleans()):
            job["max_catch_up"] = draw(st.integers(1, 10_000))
    if draw(st.booleans()):
        job["topic"] = draw(st.sampled_from(["chronowheel.fired", "emails.send", "emails.a_b-1"]))
    which = draw(st.sampled_from(["none", "json", "b64"]))
    if which == "json":
        job["payload"] = draw(json_value)
    elif which == "b64":
        job["payload_b64"] = base64.b64encode(draw(st.binary(max_size=30))).decode()
    if draw(st.booleans()):
        job["headers"] = draw(header_maps)
    if draw(st.booleans()):
        high = DAY if every_ms is None else min(DAY, every_ms - 1)
        job["window"] = format_duration(draw(st.integers(0, high)))
    if draw(st.booleans()):
        job["max_attempts"] = draw(st.integers(1, 100))
    if draw(st.booleans()):
        job["backoff"] = format_duration(draw(st.integers(0, DAY)))
    if draw(st.booleans()):
        job["tenant"] = draw(st.text(min_size=1, max_size=128))
    return job


@st.composite
def valid_command(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(["upsert", "cancel", "retry"]))
    if op == "upsert":
        return {"v": 1, "op": "upsert", "job": draw(valid_job())}
    job_id = draw(safe_text(min_size=1, max_size=40))
    if op == "cancel":
        return {"v": 1, "op": "cancel", "id": job_id}
    attempt = draw(st.integers(2, 100))
    doc: dict[str, Any] = {
        "v": 1,
        "op": "retry",
        "id": job_id,
        "scheduled_at": draw(epoch_ms),
        "attempt": attempt,
        "at": draw(instant),
        "topic": draw(st.sampled_from(["chronowheel.fired", "emails.send"])),
        "payload_b64": base64.b64encode(draw(st.binary(max_size=30))).decode(),
    }
    if draw(st.booleans()):
        doc["headers"] = draw(header_maps)
    if draw(st.booleans()):
        doc["max_attempts"] = draw(st.integers(attempt, 100))
    if draw(st.booleans()):
        doc["backoff"] = format_duration(draw(st.integers(0, DAY)))
    if draw(st.booleans()):
        doc["concurrency"] = draw(st.sampled_from(["allow", "forbid", "replace"]))
    if draw(st.booleans()):
        doc["redrive_id"] = draw(st.from_regex(r"[A-Za-z0-9._:-]{1,128}", fullmatch=True))
    return doc


# Values per field name, valid and invalid mixed, for mutating valid commands.
near_miss_text = st.sampled_from(
    ["", " ", "0", "-1s", "1.5h", "15M", "1h1h", "2026-12-01T09:00:00", "2026-02-30T00:00:00Z",
     "Europe/Lundon", "chronowheel.state", "__x", ".", "emails.", "cw-x", "ALL", "fold",
     "AAE", "QQ==QQ==", "15m\n", "* * *", "61 * * * *", "0s", "0d0s"]
)  # fmt: skip
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "v": st.sampled_from([1, 1, 2, 0, "1", True, 1.0, None]),
    "op": st.sampled_from(["upsert", "cancel", "retry", "delete", "", 3]),
    "id": st.text(max_size=300) | json_int | near_miss_text,
    "job": json_value,
    "at": instant | json_value | near_miss_text | st.integers(-(2**40), 2**50),
    "cron": st.sampled_from(CRONS) | st.text(max_size=20) | near_miss_text,
    "tz": st.sampled_from(ZONES) | st.text(max_size=10) | near_miss_text,
    "every": durations | near_miss_text | json_int,
    "start": instant | near_miss_text | st.integers(-5, 2**50),
    "end": instant | near_miss_text | st.integers(-5, 2**50),
    "topic": st.sampled_from(["chronowheel.fired", "emails.x", "chronowheel.submit"])
    | near_miss_text
    | st.text(alphabet="abc._-", max_size=8),
    "payload": json_value,
    "payload_b64": st.binary(max_size=10).map(lambda b: base64.b64encode(b).decode())
    | near_miss_text
    | st.text(alphabet="AB+/=", max_size=9),
    "headers": header_maps
    | st.dictionaries(st.text(max_size=5), json_value, max_size=2)
    | json_value,
    "catch_up": st.sampled_from(["coalesce", "all", "skip"]) | near_miss_text | json_scalar,
    "max_catch_up": st.integers(-3, 10_003) | json_scalar,
    "dst": st.sampled_from(["skip", "cron"]) | near_miss_text | json_scalar,
    "window": durations | near_miss_text | json_scalar,
    "max_attempts": st.integers(-1, 102) | json_scalar,
    "backoff": durations | near_miss_text | json_scalar,
    "tenant": st.text(max_size=130) | json_scalar,
    "scheduled_at": instant | json_scalar,
    "attempt": st.integers(0, 102) | json_scalar,
    "concurrency": st.sampled_from(["allow", "forbid", "replace"]) | near_miss_text
    | json_scalar,
    "redrive_id": st.sampled_from(["redrive:0:1", "redrive:0@1", "r" * 129])
    | near_miss_text | json_scalar,
    "bogus": json_value,
}


@st.composite
def mutated_command(draw: st.DrawFn) -> dict[str, Any]:
    doc = draw(valid_command())
    for _ in range(draw(st.integers(0, 3))):
        inner = doc.get("job") if doc.get("op") == "upsert" else None
        target = inner if isinstance(inner, dict) and draw(st.booleans()) else doc
        if draw(st.integers(0, 3)) == 0 and target:
            del target[draw(st.sampled_from(sorted(target)))]
        else:
            name = draw(st.sampled_from(sorted(FIELD_VALUES)))
            target[name] = draw(FIELD_VALUES[name])
    return doc


def _parser_verdict(raw: bytes) -> Command | ValidationError:
    """The parser's answer; any exception other than ValidationError fails the test."""
    try:
        return parse_command(raw, key=None, policy=POLICY, now_ms=NOW)
    except ValidationError as err:
        return err


@given(mutated_command())
@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_whatever_the_schema_rejects_the_parser_rejects(doc: dict[str, Any]) -> None:
    raw = orjson.dumps(doc)
    wire = orjson.loads(raw)  # what the parser sees: judge the schema on the same value
    verdict = _parser_verdict(raw)
    if not schema_valid(wire):
        assert isinstance(verdict, ValidationError), f"schema rejects, parser accepted {verdict}"


@given(valid_command())
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_generated_valid_commands_pass_both(doc: dict[str, Any]) -> None:
    assert schema_valid(doc), list(VALIDATOR.iter_errors(doc))
    raw = orjson.dumps(doc)
    command = parse_command(raw, key=None, policy=POLICY, now_ms=NOW)
    assert command.op == doc["op"]
    if isinstance(command, Upsert):
        assert command.job.id == doc["job"]["id"]
        assert command.job.canonical == orjson.dumps(doc["job"], option=orjson.OPT_SORT_KEYS)
        # The canonical bytes are themselves a valid job: re-submitting them is the same spec
        # (the payload's own key order aside).
        again = spec_of({"v": 1, "op": "upsert", "job": orjson.loads(command.job.canonical)})
        assert again.canonical == command.job.canonical
        assert dataclasses.replace(again, payload=command.job.payload) == command.job


def test_the_mutation_generator_reaches_both_sides_of_the_schema() -> None:
    # Guards the property above against a generator that only ever produces one kind.
    find(mutated_command(), lambda d: schema_valid(orjson.loads(orjson.dumps(d))))
    find(mutated_command(), lambda d: not schema_valid(orjson.loads(orjson.dumps(d))))
    find(
        mutated_command(),
        lambda d: (
            schema_valid(orjson.loads(orjson.dumps(d)))
            and isinstance(_parser_verdict(orjson.dumps(d)), ValidationError)
        ),
    )


@given(st.binary(max_size=200) | json_value.map(orjson.dumps))
@settings(max_examples=examples(300), deadline=None)
def test_arbitrary_bytes_get_a_verdict_never_a_crash(raw: bytes) -> None:
    verdict = _parser_verdict(raw)
    if isinstance(verdict, ValidationError):
        assert verdict.path and verdict.rule


def test_a_stored_spec_decodes_straight_back_to_the_job() -> None:
    from chronowheel.core.model import decode_stored_job

    policy = ValidationPolicy()
    now = 1_767_225_600_000
    raw = encode_upsert({"id": "r1", "cron": "0 9 * * MON-FRI", "tz": "Europe/London",
                         "payload": {"a": 1}, "headers": {"team": "x"}, "max_attempts": 3})
    cmd = parse_command(raw, key=b"r1", policy=policy, now_ms=now)
    assert isinstance(cmd, Upsert)
    again = decode_stored_job(cmd.job.canonical, policy=policy, now_ms=now)
    assert again == cmd.job and again.canonical == cmd.job.canonical
    with pytest.raises(ValidationError):
        decode_stored_job(b'{"id": "r1"}', policy=policy, now_ms=now)


# --------------------------------------------------------------------------------------------
# Schedule controls: pause, resume, trigger, backfill


def test_pause_and_resume_parse_and_round_trip() -> None:
    assert parse({"v": 1, "op": "pause", "id": "j"}) == model.Pause("j")
    assert parse({"v": 1, "op": "resume", "id": "j"}) == model.Resume("j")
    assert parse_command(model.encode_control("pause", "j"), key=b"j", policy=POLICY,
                         now_ms=NOW) == model.Pause("j")
    assert parse_command(model.encode_control("resume", "j"), key=b"j", policy=POLICY,
                         now_ms=NOW) == model.Resume("j")
    with pytest.raises(ValueError, match="pause or resume"):
        model.encode_control("cancel", "j")


def test_trigger_needs_a_well_formed_request_id() -> None:
    assert parse(orjson.loads(model.encode_trigger("j", "r-1:a.b_c"))) == \
        model.Trigger("j", "r-1:a.b_c")
    assert str(error({"v": 1, "op": "trigger", "id": "j"})) == "request_id: required"
    err = error({"v": 1, "op": "trigger", "id": "j", "request_id": "a/b"})
    assert (err.path, err.rule) == ("request_id", "must be 1..128 of A-Z a-z 0-9 . _ : -")
    err = error({"v": 1, "op": "trigger", "id": "j", "request_id": "x" * 129})
    assert (err.path, err.rule) == ("request_id", "must be 1..128 characters long")
    err = error({"v": 1, "op": "trigger", "id": "j", "request_id": 7})
    assert (err.path, err.rule) == ("request_id", "must be a string")


def test_backfill_range_rules() -> None:
    start = datetime(2025, 12, 1, tzinfo=UTC)
    cmd = parse(orjson.loads(model.encode_backfill("j", "r", start, NOW)))
    assert cmd == model.Backfill("j", "r", int(start.timestamp() * 1000), NOW)
    doc = {"v": 1, "op": "backfill", "id": "j", "request_id": "r"}
    assert str(error({**doc, "to": NOW})) == "from: required"
    assert str(error({**doc, "from": NOW - 1})) == "to: required"
    err = error({**doc, "from": NOW, "to": NOW})
    assert (err.path, err.rule) == ("to", "must be after from (the range is [from, to))")
    err = error({**doc, "from": NOW - 10, "to": NOW + 1})
    assert (err.path, err.rule) == (
        "to", "must not be in the future: occurrences are never published early")
    err = error({**doc, "from": "2025-12-01", "to": NOW})
    assert err.path == "from"
    with pytest.raises(ValueError, match="naive"):
        model.encode_backfill("j", "r", datetime(2025, 12, 1), NOW)


def test_every_new_op_checks_its_key_and_unknown_fields() -> None:
    for doc in ({"v": 1, "op": "pause", "id": "a"}, {"v": 1, "op": "resume", "id": "a"},
                {"v": 1, "op": "trigger", "id": "a", "request_id": "r"},
                {"v": 1, "op": "backfill", "id": "a", "request_id": "r", "from": 0, "to": 1}):
        err = error(doc, key=b"b")
        assert (err.path, err.value) == ("key", b"b")
        err = error({**doc, "force": True})
        assert (err.path, err.rule) == ("force", "unknown field")
    err = error({"v": 1, "op": "suspend", "id": "a"})
    assert err.rule == ("must be one of upsert, cancel, retry, pause, resume, trigger, "
                        "backfill, put_calendar, delete_calendar")


def test_a_retry_carries_the_origin_of_a_requested_occurrence() -> None:
    raw = encode_retry(id="j-1", scheduled_ms=NOW - 5000, attempt=2, at_ms=NOW + 10, topic=
                       "emails.send", payload=b"hi", origin="backfill", request_id="b-1")
    cmd = parse_command(raw, key=b"j-1", policy=POLICY, now_ms=NOW)
    assert isinstance(cmd, Retry) and (cmd.origin, cmd.request_id) == ("backfill", "b-1")
    assert str(error(retry_doc(request_id="b-1"))) == "origin: required"


@pytest.mark.parametrize("policy", ["forbid", "replace"])
def test_a_retry_carries_a_redrive_id_and_the_overlap_policy_and_round_trips(
        policy: str) -> None:
    raw = encode_retry(id="j-1", scheduled_ms=NOW - 5000, attempt=3, at_ms=NOW, topic=
                       "emails.send", payload=b"hi", origin="trigger", request_id="t-1",
                       pause_after_failures=2, concurrency=policy, redrive_id="redrive:2:41")
    doc = orjson.loads(raw)
    assert (doc["concurrency"], doc["redrive_id"]) == (policy, "redrive:2:41")
    assert schema_valid(doc)
    assert parse(raw, key=b"j-1") == Retry(
        id="j-1", scheduled_ms=NOW - 5000, attempt=3, at_ms=NOW, topic="emails.send",
        payload=b"hi", origin="trigger", request_id="t-1", pause_after_failures=2,
        concurrency=policy, redrive_id="redrive:2:41")
    # The defaults stay off the wire (a node without these fields takes such a retry), and
    # an explicit "allow" reads as the default.
    plain = encode_retry(id="j-1", scheduled_ms=NOW - 5000, attempt=3, at_ms=NOW,
                         topic="emails.send", payload=b"hi")
    assert not {"concurrency", "redrive_id"} & orjson.loads(plain).keys()
    cmd = parse(plain)
    assert isinstance(cmd, Retry) and (cmd.concurrency, cmd.redrive_id) == ("allow", "")
    cmd = parse(retry_doc(concurrency="allow"))
    assert isinstance(cmd, Retry) and cmd.concurrency == "allow"
    assert schema_valid(retry_doc(concurrency="allow"))
    assert not schema_valid(retry_doc(redrive_id="redrive:2@41"))
    assert not schema_valid(retry_doc(concurrency="sometimes"))


# --------------------------------------------------------------------------------------------
# max_lateness (issue 28, item 3)


@pytest.mark.parametrize("schedule", [{"at": NOW + 1000}, {"cron": "0 9 * * *"},
                                      {"every": "1m"}])
def test_max_lateness_is_a_duration_on_any_job_carried_in_its_fired_headers(
        schedule: dict[str, Any]) -> None:
    spec = spec_of(job(**schedule, max_lateness="1h30m"))
    assert spec.max_lateness_ms == 5_400_000
    assert (wire.MAX_LATENESS_MS, "5400000") in spec.fired_headers
    assert spec_of(job(**schedule)).max_lateness_ms is None
    plain = spec_of(job(**schedule)).fired_headers
    assert all(name != wire.MAX_LATENESS_MS for name, _ in plain)


@pytest.mark.parametrize(("value", "rule"), [
    ("999ms", "must be between 1s and 3653d (limits.MIN_MAX_LATENESS_MS, "
              "limits.MAX_MAX_LATENESS_MS)"),
    ("3654d", "must be between 1s and 3653d"),
    ("90", "every number needs a unit"),
    (90, "must be a duration string"),
])
def test_max_lateness_out_of_its_limits_is_refused_with_the_field_and_the_limit(
        value: Any, rule: str) -> None:
    err = error(job(max_lateness=value))
    assert err.path == "job.max_lateness"
    assert rule in str(err)


def test_max_lateness_must_be_longer_than_the_window() -> None:
    err = error(job(every="1h", window="5m", max_lateness="5m"))
    assert (err.path, err.rule) == ("job.max_lateness", "must be longer than window (5m)")
    assert spec_of(job(every="1h", window="5m", max_lateness="5m1s")).max_lateness_ms == 301_000


def test_max_lateness_encodes_from_milliseconds_and_timedelta() -> None:
    raw = encode_upsert({"id": "x", "at": NOW + 1000, "max_lateness": timedelta(minutes=2)})
    assert orjson.loads(raw)["job"]["max_lateness"] == "2m"
    assert orjson.loads(encode_upsert({"id": "x", "at": NOW + 1000,
                                       "max_lateness": 1500}))["job"]["max_lateness"] == "1500ms"
