"""Exclusion dates and named calendars end to end: a real node, Cassandra, Kafka, and a
read_committed reader. The node's clock is shifted (OffsetClock) to ten seconds before a
local midnight, so a per-second cron job crosses into an excluded day within the test."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest
from chronowheel.core.clock import OffsetClock
from chronowheel.core.model import encode_put_calendar
from chronowheel.store.cassandra import CassandraStore

from testkit.fleet import until
from tests.integration.harness import (
    collecting,
    make_namespace,
    now_ms,
    produce,
    running_node,
    settled,
    upsert,
)

pytestmark = pytest.mark.integration

ZONE = ZoneInfo("Asia/Tokyo")  # no DST: the test is about dates, not offsets


def local_date(epoch_ms: int) -> date:
    return datetime.fromtimestamp(epoch_ms / 1000, ZONE).date()


async def test_jobs_skip_an_excluded_date_in_their_zone(stack: Any, namespace: str) -> None:
    # Two days ahead, at Tokyo midnight: the day before (D) fires, D+1 is excluded.
    d_plus_1 = datetime.now(ZONE).date() + timedelta(days=2)
    midnight = int(datetime(d_plus_1.year, d_plus_1.month, d_plus_1.day, tzinfo=ZONE)
                   .timestamp() * 1000)
    clock = OffsetClock(midnight - 30_000 - now_ms())
    settings = await make_namespace(stack, namespace, max_clock_skew_ms=10**12,
                                    calendar_refresh_ms=1_000)
    calendar = "holidays"
    bad = [
        (b"bad-cal", orjson.dumps({"v": 1, "op": "put_calendar", "name": "bad-cal",
                                   "dates": ["2026-02-30"]}), "dates[0]: not a valid date"),
        (b"bad-job", orjson.dumps({"v": 1, "op": "upsert", "job": {
            "id": "bad-job", "cron": "* * * * * *", "exclude_dates": ["12/25/2026"]}}),
         "job.exclude_dates[0]: must be a date like"),
    ]
    store = CassandraStore.open(settings)
    try:
        async with collecting(settings, settings.fired_topic, settings.rejected_topic) as seen, \
                running_node(settings, clock=clock):
            await produce(settings, [(calendar.encode(),
                                      encode_put_calendar(calendar, [d_plus_1]))])
            async def put() -> bool:
                return await store.get_calendar(calendar) is not None

            await until(put, 10, f"the node to apply the put of calendar {calendar}")
            assert await store.get_calendar(calendar) == {d_plus_1}
            # Node time 10 s before midnight, however long setting up took: enough for the
            # jobs to fire in the last seconds of D, no longer to wait.
            lead_ms = (midnight - 10_000) - clock.now_ms()
            if lead_ms > 0:
                clock.jump(lead_ms)
            produced_at = clock.now_ms()
            await produce(settings, [
                upsert("by-calendar", cron="* * * * * *", tz="Asia/Tokyo", calendar=calendar),
                upsert("by-list", cron="* * * * * *", tz="Asia/Tokyo",
                       exclude_dates=[d_plus_1.isoformat()]),
                upsert("control", cron="* * * * * *", tz="Asia/Tokyo"),
                *((key, value) for key, value, _ in bad),
            ])

            def control_past_midnight(ms: list[Any]) -> bool:
                return sum(1 for m in ms if m.key == b"control"
                           and m.scheduled_ms >= midnight + 3_000) >= 1

            await seen.wait_for(control_past_midnight, 90, "the control job past midnight")
            # anything an excluded job would (wrongly) fire up to now is in `seen`
            await settled(settings, seen, clock=clock, upto_ms=clock.now_ms())
        rows = {job: await store.get_job(job) for job in ("by-calendar", "by-list")}
    finally:
        store.close()

    fired = seen.on(settings.fired_topic)
    control = [m.scheduled_ms for m in fired if m.key == b"control"]
    assert any(local_date(u) == d_plus_1 for u in control)
    for job in ("by-calendar", "by-list"):
        instants = [m.scheduled_ms for m in fired if m.key == job.encode()]
        assert all(local_date(u) != d_plus_1 for u in instants), job
        if produced_at < midnight - 5_000:  # submitted in time for the last seconds of D
            assert instants and local_date(max(instants)) == d_plus_1 - timedelta(days=1)
        row = rows[job]
        assert row is not None and row.status == "scheduled"
        assert row.scheduled_ms == midnight + 86_400_000, job  # the first second of D+2
    rejected = {m.key: m.headers["cw-reason"] for m in seen.on(settings.rejected_topic)}
    for key, _value, needle in bad:
        assert needle in rejected[key], rejected.get(key)
