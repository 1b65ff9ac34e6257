"""Exclusion dates and named calendars: parsing, and what a node does with them.

Node tests run a whole node on the in-memory store and bus with a manual clock (node_rig), so
days pass without waiting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import date
from typing import Any

import orjson
import pytest
from chronowheel.core import wire
from chronowheel.core.model import (
    DeleteCalendar,
    PutCalendar,
    Upsert,
    ValidationPolicy,
    encode_delete_calendar,
    encode_put_calendar,
    parse_command,
)
from chronowheel.core.shard import shard_of
from chronowheel.errors import ValidationError

from tests.unit.node_rig import NodeRig, scheduled_at

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
POLICY = ValidationPolicy()
DAY_MS = 86_400_000
HOUR_MS = 3_600_000


def parse(doc: Any, key: bytes | None = None) -> Any:
    return parse_command(orjson.dumps(doc), key=key, policy=POLICY, now_ms=NOW)


def rejection(doc: Any, key: bytes | None = None) -> ValidationError:
    with pytest.raises(ValidationError) as err:
        parse(doc, key)
    return err.value


def cron_job(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "op": "upsert", "job": {"id": "j", "cron": "0 9 * * *", **fields}}


# --------------------------------------------------------------------------------------------
# Parsing


def test_exclude_dates_and_calendar_parse_onto_the_job() -> None:
    cmd = parse(cron_job(exclude_dates=["2026-12-25", "2026-12-26", "2026-12-25"],
                         calendar="us-holidays", tz="America/New_York"))
    assert isinstance(cmd, Upsert)
    assert cmd.job.exclude_dates == {date(2026, 12, 25), date(2026, 12, 26)}
    assert cmd.job.calendar == "us-holidays"


@pytest.mark.parametrize(
    ("fields", "path", "rule"),
    [
        ({"exclude_dates": "2026-12-25"}, "job.exclude_dates", "must be an array of dates"),
        ({"exclude_dates": ["2026-12-25", "25/12/2026"]}, "job.exclude_dates[1]",
         'must be a date like "2026-12-25" (YYYY-MM-DD)'),
        ({"exclude_dates": ["2026-02-30"]}, "job.exclude_dates[0]",
         "not a valid date (day is out of range for month)"),
        ({"exclude_dates": ["2026-13-01"]}, "job.exclude_dates[0]", "not a valid date"),
        ({"exclude_dates": ["2026-12-25T00:00:00Z"]}, "job.exclude_dates[0]",
         "must be a date like"),
        ({"exclude_dates": [20261225]}, "job.exclude_dates[0]", "must be a date like"),
        ({"exclude_dates": ["1969-12-31"]}, "job.exclude_dates[0]", "must not be before 1970"),
        ({"exclude_dates": ["2026-01-01"] * (wire.MAX_EXCLUDE_DATES + 1)}, "job.exclude_dates",
         f"must list at most {wire.MAX_EXCLUDE_DATES} dates"),
        ({"calendar": ""}, "job.calendar", "must be a calendar name"),
        ({"calendar": "us holidays"}, "job.calendar", "must be a calendar name"),
        ({"calendar": 7}, "job.calendar", "must be a calendar name"),
    ],
)
def test_malformed_exclusions_are_rejected_with_a_precise_reason(
    fields: dict[str, Any], path: str, rule: str
) -> None:
    err = rejection(cron_job(**fields))
    assert err.path == path
    assert rule in err.rule


@pytest.mark.parametrize("name", ["exclude_dates", "calendar"])
def test_exclusions_are_for_cron_jobs_only(name: str) -> None:
    value: Any = ["2026-12-25"] if name == "exclude_dates" else "us-holidays"
    err = rejection({"v": 1, "op": "upsert", "job": {"id": "j", "every": "1h", name: value}})
    assert (err.path, err.rule) == (f"job.{name}", "only allowed with cron")


def test_calendar_commands_parse_and_encode() -> None:
    raw = encode_put_calendar("us-holidays", [date(2026, 12, 25), "2027-01-01"])
    put = parse(orjson.loads(raw), key=b"us-holidays")
    assert put == PutCalendar("us-holidays", frozenset({date(2026, 12, 25), date(2027, 1, 1)}))
    assert parse({"v": 1, "op": "put_calendar", "name": "none", "dates": []}) == PutCalendar(
        "none", frozenset())
    assert parse(orjson.loads(encode_delete_calendar("us-holidays"))) == DeleteCalendar(
        "us-holidays")


@pytest.mark.parametrize(
    ("doc", "key", "path", "rule"),
    [
        ({"v": 1, "op": "put_calendar", "name": "c"}, None, "dates", "required"),
        ({"v": 1, "op": "put_calendar", "dates": []}, None, "name", "required"),
        ({"v": 1, "op": "put_calendar", "name": "c", "dates": ["2026-12-32"]}, None,
         "dates[0]", "not a valid date"),
        ({"v": 1, "op": "put_calendar", "name": "c",
          "dates": ["2026-01-01"] * (wire.MAX_CALENDAR_DATES + 1)}, None, "dates",
         f"must list at most {wire.MAX_CALENDAR_DATES} dates"),
        ({"v": 1, "op": "put_calendar", "name": "a/b", "dates": []}, None, "name",
         "must be a calendar name"),
        ({"v": 1, "op": "put_calendar", "name": "c", "dates": [], "tz": "UTC"}, None, "tz",
         "unknown field"),
        ({"v": 1, "op": "delete_calendar", "name": "c"}, b"other", "key",
         "record key must equal the calendar name 'c'"),
        ({"v": 1, "op": "delete_calendar", "name": "c", "dates": []}, None, "dates",
         "unknown field"),
    ],
)
def test_malformed_calendar_commands_are_rejected(
    doc: dict[str, Any], key: bytes | None, path: str, rule: str
) -> None:
    err = rejection(doc, key)
    assert err.path == path
    assert rule in err.rule


# --------------------------------------------------------------------------------------------
# A node (in memory, manual clock)


@pytest.fixture
async def rig() -> AsyncIterator[NodeRig]:
    async with NodeRig(calendar_refresh_ms=HOUR_MS) as rig:
        yield rig


def put_calendar(rig: NodeRig, name: str, dates: list[str]) -> None:
    rig.submit(name, encode_put_calendar(name, dates))


def fired_days(rig: NodeRig, job_id: str) -> list[str]:
    from datetime import UTC, datetime

    return [datetime.fromtimestamp(scheduled_at(m) / 1000, UTC).strftime("%m-%d %H:%M")
            for m in rig.fired(job_id)]


# T0 is 2026-12-01T09:00:00Z. 10:00 in New York is 15:00Z in December.


async def test_a_job_skips_its_own_excluded_dates_in_its_zone(rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("standup", cron="0 10 * * *", tz="America/New_York",
               exclude_dates=["2026-12-02", "2026-12-03"])
    await rig.advance(4 * DAY_MS, step_ms=10 * 60_000)
    assert fired_days(rig, "standup") == ["12-01 15:00", "12-04 15:00"]


async def test_a_job_skips_the_dates_of_its_named_calendar(rig: NodeRig) -> None:
    await rig.start()
    put_calendar(rig, "holidays", ["2026-12-02"])
    await rig.settle()
    rig.upsert("report", cron="0 10 * * *", tz="America/New_York", calendar="holidays",
               exclude_dates=["2026-12-04"])
    await rig.advance(4 * DAY_MS, step_ms=10 * 60_000)
    # The calendar's date and the job's own are both skipped.
    assert fired_days(rig, "report") == ["12-01 15:00", "12-03 15:00"]
    assert await rig.store.get_calendar("holidays") == {date(2026, 12, 2)}


async def test_an_unknown_calendar_excludes_nothing(rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("report", cron="0 10 * * *", tz="America/New_York", calendar="missing")
    await rig.advance(2 * DAY_MS, step_ms=10 * 60_000)
    assert fired_days(rig, "report") == ["12-01 15:00", "12-02 15:00"]


async def test_a_date_added_after_the_next_occurrence_was_computed_is_still_skipped(
        rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("report", cron="0 10 * * *", tz="America/New_York", calendar="holidays")
    await rig.settle()
    # The pending occurrence (Dec 1 15:00Z) is computed and stored; then the calendar gains
    # Dec 1 and Dec 2. The shard owning the job reads the calendar again before firing only
    # once its cached copy is older than calendar_refresh_ms (an hour here), so the change is
    # made two hours ahead of the occurrence.
    put_calendar(rig, "holidays", ["2026-12-01", "2026-12-02"])
    await rig.advance(3 * DAY_MS, step_ms=10 * 60_000)
    assert fired_days(rig, "report") == ["12-03 15:00"]
    assert rig.nodes[0].metrics.excluded._value.get() == 1  # Dec 1, dropped when due


async def test_a_removed_date_counts_again_from_the_next_computation(rig: NodeRig) -> None:
    await rig.start()
    put_calendar(rig, "holidays", ["2026-12-02"])
    await rig.settle()
    rig.upsert("report", cron="0 10 * * *", tz="America/New_York", calendar="holidays")
    await rig.advance(8 * HOUR_MS, step_ms=10 * 60_000)
    assert fired_days(rig, "report") == ["12-01 15:00"]
    # Deleting the calendar does not move the occurrence already computed: the job fired
    # Dec 1, its next was computed then as Dec 3 (Dec 2 excluded), and stays so.
    rig.submit("holidays", encode_delete_calendar("holidays"))
    await rig.advance(4 * DAY_MS, step_ms=10 * 60_000)
    assert fired_days(rig, "report") == ["12-01 15:00", "12-03 15:00", "12-04 15:00",
                                         "12-05 15:00"]
    assert await rig.store.get_calendar("holidays") is None


async def test_a_change_through_another_shard_is_seen_within_the_refresh_period() -> None:
    rig = NodeRig(shards=4, calendar_refresh_ms=30 * 60_000)
    try:
        await rig.start()
        job_id = next(f"job-{i}" for i in range(100)
                      if shard_of(f"job-{i}", 4) != shard_of("cal", 4))
        # Hourly; the job's shard reads the (missing) calendar when the job is applied.
        rig.upsert(job_id, cron="0 * * * *", calendar="cal")
        await rig.settle()
        put_calendar(rig, "cal", ["2026-12-02"])  # applied by another shard
        await rig.advance(2 * DAY_MS, step_ms=5 * 60_000)
        days = {d[:5] for d in fired_days(rig, job_id)}
        assert days == {"12-01", "12-03"}
    finally:
        await rig.stop_all()
