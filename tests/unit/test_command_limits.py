"""Limits that keep one submit command from stalling or crashing a node: JSON depth, the
recurrence search's step budget, the minimum period, the stored size and the TTL reach.

Each rejection is a ValidationError naming the field, the rule and the limit, never an
internal error.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import orjson
import pytest
from chronowheel.core import limits
from chronowheel.core.model import (
    DAY_MS,
    Upsert,
    ValidationPolicy,
    decode_stored_job,
    parse_command,
)
from chronowheel.errors import ValidationError
from chronowheel.node.dispatch import stored_policy
from chronowheel.node.writes import RowWriter
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobRow
from chronowheel.store.memory import MemoryStore

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
POLICY = ValidationPolicy()


def parse(doc: Any, policy: ValidationPolicy = POLICY) -> Any:
    raw = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return parse_command(raw, key=None, policy=policy, now_ms=NOW)


def upsert(**fields: Any) -> dict[str, Any]:
    if not {"at", "cron", "every"} & fields.keys():
        fields["at"] = NOW + 1000
    return {"v": 1, "op": "upsert", "job": {"id": "j", **fields}}


def rejection(doc: Any, policy: ValidationPolicy = POLICY) -> ValidationError:
    with pytest.raises(ValidationError) as err:
        parse(doc, policy)
    return err.value


def nested(levels: int) -> Any:
    """A JSON value that is `levels` arrays deep (0: a plain number)."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


# --------------------------------------------------------------------------------------------
# JSON depth


def test_depth_up_to_the_limit_is_accepted() -> None:
    # The command is one level and the job another: the payload may add 62.
    cmd = parse(upsert(payload=nested(limits.MAX_JSON_DEPTH - 2)))
    assert isinstance(cmd, Upsert)


@pytest.mark.parametrize("levels", [limits.MAX_JSON_DEPTH - 1, 300, 1100])
def test_a_deeper_payload_is_rejected_by_name(levels: int) -> None:
    # 300 levels: orjson reads them but cannot write them back (its limit is about 254);
    # 1100: orjson cannot even read them (about 1024). Neither may reach orjson's own error.
    # The test writes the bytes itself: orjson.dumps refuses them too.
    raw = (b'{"v":1,"op":"upsert","job":{"id":"j","at":1767225601000,"payload":'
           + b"[" * levels + b"]" * levels + b"}}")
    err = rejection(raw)
    assert err.path == "$"
    assert err.rule == f"nested deeper than {limits.MAX_JSON_DEPTH} levels"


def test_depth_counts_every_kind_of_command_and_ignores_brackets_in_strings() -> None:
    err = rejection({"v": 1, "op": "cancel", "id": "j", "extra": nested(70)})
    assert err.rule == f"nested deeper than {limits.MAX_JSON_DEPTH} levels"
    text = "[{" * 500
    cmd = parse(upsert(payload={"text": text, "quote": '\\"[[[', "deep": nested(60)}))
    assert isinstance(cmd, Upsert)


def test_unbalanced_or_broken_json_is_still_a_validation_error() -> None:
    for raw in (b"[" * 5000, b"{" * 70, b'{"v":1,"op":"cancel","id":"j"' + b"]" * 100,
                b'"' + b"[" * 100, b"\xff" + b"[" * 100):
        with pytest.raises(ValidationError) as err:
            parse(raw)
        assert err.value.path == "$"


# --------------------------------------------------------------------------------------------
# The recurrence search's step budget


def test_a_schedule_whose_next_occurrence_takes_too_many_steps_is_rejected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mondays = [(date(2026, 1, 5) + timedelta(weeks=k)).isoformat() for k in range(20)]
    doc = upsert(cron="0 9 * * MON", exclude_dates=mondays)
    assert isinstance(parse(doc), Upsert)
    monkeypatch.setattr(limits, "MAX_RECURRENCE_STEPS", 10)
    err = rejection(doc)
    assert err.path == "job.exclude_dates"
    assert "not found within 10 candidate instants" in err.rule


# --------------------------------------------------------------------------------------------
# Minimum period


def test_every_below_the_minimum_period_is_rejected() -> None:
    err = rejection(upsert(every="500ms"))
    assert (err.path, err.value) == ("job.every", "500ms")
    assert err.rule.startswith("must be at least 1s")
    assert "min_period_ms" in err.rule
    assert parse(upsert(every="1s")).job.every_ms == 1000
    strict = ValidationPolicy(min_period_ms=60_000)
    assert rejection(upsert(every="59s"), strict).rule.startswith("must be at least 1m")
    assert parse(upsert(every="1m"), strict).job.every_ms == 60_000


@pytest.mark.parametrize(
    ("cron", "period_s"),
    [
        ("* * * * * *", 1),
        ("*/30 * * * * *", 30),
        ("0,1 * * * * *", 1),
        ("58 * * * * *", 60),
        ("* * * * *", 60),
        ("0,30 * * * *", 1800),
        ("0,59 0,23 * * *", 60),  # 23:59, then 00:00 the next day
        ("0 */2 * * *", 7200),
        ("0 9 * * 1-5", 86_400),
        ("@monthly", 86_400),  # counted within a day: daily or rarer meets any minimum
    ],
)
def test_a_cron_faster_than_the_minimum_period_is_rejected(cron: str, period_s: int) -> None:
    for minimum_s in (1, 60, 3600):
        policy = ValidationPolicy(min_period_ms=minimum_s * 1000)
        if period_s >= minimum_s:
            assert isinstance(parse(upsert(cron=cron), policy), Upsert)
        else:
            err = rejection(upsert(cron=cron), policy)
            assert (err.path, err.value) == ("job.cron", cron)
            assert "min_period_ms" in err.rule
    # A minimum above a day still lets a daily cron through (the period is counted in a day).
    assert isinstance(parse(upsert(cron="0 9 * * *"), ValidationPolicy(min_period_ms=7 * DAY_MS)),
                      Upsert)


def test_the_cron_rule_names_both_periods() -> None:
    err = rejection(upsert(cron="*/10 * * * * *"), ValidationPolicy(min_period_ms=60_000))
    assert err.rule.startswith("fires as often as every 10s; must be at least 1m apart")


# --------------------------------------------------------------------------------------------
# Stored size


def _job_bytes(spec_payload_bytes: int, recurring: bool = False) -> dict[str, Any]:
    schedule = {"every": "1h"} if recurring else {}
    return upsert(payload="x" * spec_payload_bytes, **schedule)


def test_a_job_whose_rows_exceed_the_batch_limit_is_rejected() -> None:
    # The payload is stored twice (due row and spec): 20 KiB fits in 50 KiB, 30 KiB does not.
    assert isinstance(parse(_job_bytes(20_000)), Upsert)
    err = rejection(_job_bytes(30_000))
    assert err.path == "job"
    size = int(str(err.value).split()[0])
    assert size > limits.CASSANDRA_BATCH_FAIL_BYTES
    assert f"{size} bytes" in err.rule and str(limits.CASSANDRA_BATCH_FAIL_BYTES) in err.rule
    assert "twice" in err.rule and "store_batch_fail_bytes" in err.rule
    # A recurring job's due row carries the spec too: 20 KiB is over.
    assert rejection(_job_bytes(20_000, recurring=True)).path == "job"
    roomy = ValidationPolicy(max_stored_bytes=1 << 20)
    assert isinstance(parse(_job_bytes(100_000, recurring=True), roomy), Upsert)


def test_an_edit_counts_the_retirement_of_its_old_row_in_its_batch() -> None:
    # An edit's logged batch also carries the retirement of the old due row: a job whose two
    # rows fit the limit exactly is refused as an edit that moves it, before anything is
    # written, and accepted as a first submit or an edit that keeps its key.
    cmd = parse(upsert(payload="x" * 2_000))
    assert isinstance(cmd, Upsert)
    job = cmd.job
    row = DueRow(0, 0, job.at_ms or 0, job.id, 1, job.at_ms or 0, 2, job.topic, job.payload,
                 tuple(job.fired_headers), None)
    jobs_row = JobRow(job.id, 0, job.canonical, 2, "scheduled", row.scheduled_ms, row.slot_ms)
    exact = limits.job_rows_bytes(job_id=job.id, topic=job.topic, payload_len=len(job.payload),
                                  spec_len=len(job.canonical), recurring=False,
                                  headers=row.headers)
    writer = RowWriter(MemoryStore(), 0, 86_400_000, batch_fail_bytes=exact)
    now = row.slot_ms - 60_000
    writer.check(row, now, jobs_row)
    with pytest.raises(ValidationError) as err:
        writer.check(row, now, jobs_row, retiring=True)
    assert f"{exact + limits.retired_row_bytes(job.id)} bytes" in str(err.value.rule)


def test_the_measured_size_is_the_limits_module_count() -> None:
    cmd = parse(upsert(payload="x" * 100, headers={"a": "b"}, every="1h",
                       concurrency="forbid"))
    job = cmd.job
    size = limits.job_rows_bytes(
        job_id=job.id, topic=job.topic, payload_len=len(job.payload),
        spec_len=len(job.canonical), recurring=True,
        headers=[(n, v.encode()) for n, v in job.fired_headers])
    tight = ValidationPolicy(max_stored_bytes=size)
    assert isinstance(parse(upsert(payload="x" * 100, headers={"a": "b"}, every="1h",
                                   concurrency="forbid"), tight), Upsert)
    tighter = ValidationPolicy(max_stored_bytes=size - 1)
    assert rejection(upsert(payload="x" * 100, headers={"a": "b"}, every="1h",
                            concurrency="forbid"), tighter).value == f"{size} bytes"


# --------------------------------------------------------------------------------------------
# TTL reach


def test_a_recurring_job_first_firing_beyond_the_ttl_reach_is_rejected() -> None:
    # Feb 29 on a Sunday: 2032, then 2060. With 2032 excluded the first run is 34 years away,
    # beyond Cassandra's 20-year TTL.
    assert isinstance(parse(upsert(cron="0 0 29 2 */7")), Upsert)
    err = rejection(upsert(cron="0 0 29 2 */7", exclude_dates=["2032-02-29"]))
    assert (err.path, err.value) == ("job.cron", "0 0 29 2 */7")
    assert "2060-02-29T00:00:00Z" in err.rule
    assert "20 years" in err.rule and "TTL" in err.rule


def test_the_ttl_reach_leaves_room_for_the_retention() -> None:
    reach = limits.max_ttl_reach_ms(POLICY.retention_ms)
    assert POLICY.retention_ms == 604_800_000
    assert POLICY.max_horizon_ms <= reach
    # A start just inside and just beyond the reach (the horizon out of the way).
    far = ValidationPolicy(max_horizon_ms=reach)
    assert far.max_horizon_ms == reach
    assert isinstance(parse(upsert(every="1h", start=NOW + reach), far), Upsert)
    # A start within the horizon, and the first New Year after it beyond the reach.
    err = rejection(upsert(cron="0 0 1 1 *", start=NOW + reach - 1000), far)
    assert err.path == "job.cron" and "TTL" in err.rule
    # A horizon beyond the reach is clamped to it: a one-shot's row could not be stored.
    assert ValidationPolicy(max_horizon_ms=1 << 60).max_horizon_ms == reach
    long_kept = ValidationPolicy(retention_ms=5 * 365 * DAY_MS, max_horizon_ms=1 << 60)
    assert long_kept.max_horizon_ms == limits.max_ttl_reach_ms(5 * 365 * DAY_MS)


# --------------------------------------------------------------------------------------------
# Settings and stored specs


def test_the_limits_come_from_the_settings() -> None:
    s = Settings(min_period_ms=5000, store_batch_fail_bytes=100_000, retention_ms=DAY_MS)
    p = ValidationPolicy.from_settings(s)
    assert (p.min_period_ms, p.max_stored_bytes, p.retention_ms) == (5000, 100_000, DAY_MS)
    d = ValidationPolicy.from_settings(Settings())
    assert (d.min_period_ms, d.max_stored_bytes) == (
        limits.DEFAULT_MIN_PERIOD_MS, limits.CASSANDRA_BATCH_FAIL_BYTES)


def test_specs_already_stored_still_decode() -> None:
    # Accepted under looser limits before: a fast interval, a large recurring payload, a
    # schedule whose next run is beyond the reach, a deep payload.
    lax = ValidationPolicy(min_period_ms=1, max_stored_bytes=1 << 30, max_reach_ms=1 << 60)
    stored = stored_policy(POLICY)
    for doc in (upsert(every="10ms"), _job_bytes(40_000, recurring=True),
                upsert(cron="0 0 29 2 */7", exclude_dates=["2032-02-29"]),
                upsert(payload=nested(100))):
        raw = orjson.dumps(doc)
        job = doc["job"]
        if "payload" in job and isinstance(job["payload"], list):
            spec = orjson.dumps(job, option=orjson.OPT_SORT_KEYS)
        else:
            spec = parse(raw, lax).job.canonical
        assert decode_stored_job(spec, policy=stored, now_ms=NOW).id == "j"


def test_depth_built_of_short_runs_is_caught_and_width_is_not_depth() -> None:
    # No run of opening brackets longer than 40, yet 3 x 39 levels deep.
    comb = (b"[" * 40 + b"1],") * 3 + b"1" + b"]" * (3 * 39)
    raw = (b'{"v":1,"op":"upsert","job":{"id":"j","at":1767225601000,"payload":' + comb
           + b"}}")
    assert rejection(raw).rule == f"nested deeper than {limits.MAX_JSON_DEPTH} levels"
    wide = upsert(payload=[[[i]] for i in range(3000)])
    assert isinstance(parse(wide, ValidationPolicy(max_stored_bytes=1 << 20)), Upsert)
