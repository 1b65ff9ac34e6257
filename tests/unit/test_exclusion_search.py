"""Exclusion dates are searched, not walked: a schedule skips a run of consecutive excluded
dates in one step, so a 10,000-date calendar costs a bisect, not 10,000 local days.

Steps are counted (calls of the one-occurrence search), never timed.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import Any

import pytest
from chronowheel.core import recurrence
from chronowheel.core.recurrence import (
    Schedule,
    catch_up,
    compile_schedule,
    excluding,
    latest_at_or_before,
    next_after,
)
from chronowheel.errors import ValidationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.property_budget import examples


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


class _Calls:
    """Counts the calls of the one-occurrence searches, the unit a skip is paid in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.next = 0
        self.prev = 0
        real_next, real_prev = recurrence._cron_next, recurrence._cron_prev

        def counted_next(*args: Any) -> int | None:
            self.next += 1
            return real_next(*args)

        def counted_prev(*args: Any) -> int | None:
            self.prev += 1
            return real_prev(*args)

        monkeypatch.setattr(recurrence, "_cron_next", counted_next)
        monkeypatch.setattr(recurrence, "_cron_prev", counted_prev)


def _days(first: date, count: int) -> list[date]:
    return [first + timedelta(days=k) for k in range(count)]


def test_ten_thousand_consecutive_excluded_dates_are_one_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 2026-01-01 .. 2053-05-18 excluded (10,000 days): the next 09:00 is the day after.
    excluded = _days(date(2026, 1, 1), 10_000)
    after = excluded[-1] + timedelta(days=1)
    s = compile_schedule(cron="0 9 * * *", tz="Europe/Berlin", exclude_dates=excluded)
    calls = _Calls(monkeypatch)
    nxt = next_after(s, ms("2025-12-31T12:00:00Z"))
    assert nxt is not None
    assert datetime.fromtimestamp(nxt / 1000, s.zone).date() == after
    assert calls.next <= 3
    prev = latest_at_or_before(s, ms(f"{after.isoformat()}T00:00:00Z"))
    assert prev == ms("2025-12-31T08:00:00Z")  # 09:00 Berlin in winter
    assert calls.prev <= 3


def test_a_calendar_of_many_runs_costs_one_step_per_run_met(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every weekday of 38 years excluded (about 10,000 dates in runs of five): a weekend cron
    # meets no excluded date, a daily one passes one run per week.
    weekdays = [d for d in _days(date(2026, 1, 1), 14_000) if d.weekday() < 5][:10_000]
    base = compile_schedule(cron="0 12 * * *")
    s = excluding(base, weekdays)
    calls = _Calls(monkeypatch)
    start = ms("2026-01-05T00:00:00Z")  # a Monday
    got = next_after(s, start)
    assert got == ms("2026-01-10T12:00:00Z")  # Saturday
    assert calls.next <= 3
    got = catch_up(s, policy="all", max_catch_up=10, first_missed_ms=ms("2026-01-03T12:00:00Z"),
                   now_ms=ms("2026-02-01T00:00:00Z"))
    assert len(got.fire) == 9  # four weekends' Saturdays and Sundays, and Jan 3
    assert calls.next <= 40


def _old_next_allowed(s: Schedule, a: int) -> int | None:
    """The search before runs: one local day at a time (the reference behaviour)."""
    while True:
        sec = recurrence._cron_next(s, a)
        if sec is None or not s.exclude_dates or sec > recurrence._MAX_SEC:
            return sec
        day = datetime.fromtimestamp(sec, s.zone).date()
        if day not in s.exclude_dates:
            return sec
        if day >= date(9999, 12, 31):
            return None
        a = max(sec, recurrence._day_start(s.zone, day + timedelta(days=1)) - 1)


def _old_prev_allowed(s: Schedule, b: int) -> int | None:
    while True:
        sec = recurrence._cron_prev(s, b)
        if sec is None or not s.exclude_dates:
            return sec
        day = datetime.fromtimestamp(sec, s.zone).date()
        if day not in s.exclude_dates:
            return sec
        if day <= date(1970, 1, 1):
            return None
        b = min(sec - 1, recurrence._day_start(s.zone, day) - 1)


ZONES = ["UTC", "America/New_York", "Europe/London", "Pacific/Apia", "Australia/Lord_Howe",
         "America/Santiago", "Asia/Tehran"]
CRONS = ["0 9 * * *", "30 23 * * *", "* * * * * *", "0 */5 * * * *", "0 0 * * *",
         "30 1 * * 0", "0 2 * * 1-5", "15 0 L * *", "0 30 2 * * *", "0 0 29 2 *"]


@st.composite
def exclusion_runs(draw: Callable[..., Any], centre: date) -> set[date]:
    out: set[date] = set()
    for _ in range(draw(st.integers(0, 6))):
        first = centre + timedelta(days=draw(st.integers(-40, 40)))
        out.update(_days(first, draw(st.integers(1, 30))))
    return out


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    zone=st.sampled_from(ZONES),
    expr=st.sampled_from(CRONS),
    dst=st.sampled_from(["skip", "cron"]),
    centre=st.dates(min_value=date(1971, 1, 1), max_value=date(2040, 12, 31)),
    data=st.data(),
)
def test_runs_give_what_the_day_by_day_walk_gave(
    zone: str, expr: str, dst: str, centre: date, data: st.DataObject
) -> None:
    excluded = data.draw(exclusion_runs(centre))
    s = compile_schedule(cron=expr, tz=zone, dst=dst, exclude_dates=excluded)  # type: ignore[arg-type]
    at = int(datetime(centre.year, centre.month, centre.day).timestamp())
    for delta in (-45 * 86_400, -3600, 0, 7 * 86_400 + 1, 44 * 86_400):
        a = at + delta + data.draw(st.integers(0, 86_399))
        assert recurrence._cron_next_allowed(s, a) == _old_next_allowed(s, a)
        assert recurrence._cron_prev_allowed(s, a) == _old_prev_allowed(s, a)


def test_exclusions_at_the_ends_of_time() -> None:
    ends = [date(9998, 1, 1), date(9999, 1, 1), date(1970, 1, 1)]
    s = compile_schedule(cron="0 0 1 1 *", exclude_dates=ends)
    assert next_after(s, ms("9997-06-01T00:00:00Z")) is None
    assert latest_at_or_before(s, ms("1970-06-01T00:00:00Z")) is None
    assert next_after(s, ms("1969-12-31T00:00:00Z")) == ms("1971-01-01T00:00:00Z")


def test_a_search_over_its_step_budget_is_rejected_not_continued() -> None:
    # Mondays at 09:00 with the next 20 Mondays excluded, one run each: 21 candidates.
    mondays = [date(2026, 1, 5) + timedelta(weeks=k) for k in range(20)]
    s = compile_schedule(cron="0 9 * * MON", exclude_dates=mondays)
    after = ms("2026-01-01T00:00:00Z")
    want = ms("2026-05-25T09:00:00Z")
    assert next_after(s, after) == want
    assert next_after(s, after, max_steps=100) == want
    with pytest.raises(ValidationError) as err:
        next_after(s, after, max_steps=10)
    assert err.value.path == "job.exclude_dates"
    assert "not found within 10 candidate instants" in err.value.rule
    # Intervals answer in one step whatever the budget.
    assert next_after(compile_schedule(every_ms=60_000), 0, max_steps=1) == 60_000
