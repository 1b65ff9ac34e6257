"""Recurrence: cron syntax, DST policies, intervals, bounds and catch-up.

The DST cases list their expected UTC instants literally; each was worked out by hand from the
zone's rules (written next to it), so these tests check the policy, not the code against itself.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from functools import cache
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from chronowheel.core import recurrence
from chronowheel.core.recurrence import (
    CatchUp,
    Schedule,
    catch_up,
    compile_schedule,
    excluding,
    is_excluded,
    latest_at_or_before,
    next_after,
    occurrences,
)
from chronowheel.errors import ValidationError
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.property_budget import examples


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def rfc(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def run(expr: str, after: str, n: int, tz: str = "UTC", dst: str = "skip") -> list[str]:
    s = compile_schedule(cron=expr, tz=tz, dst=dst)  # type: ignore[arg-type]
    return [rfc(u) for u in occurrences(s, ms(after), n)]


# --------------------------------------------------------------------------------------------
# DST: hand-computed instants


# (zone, expression, after, {dst policy: expected instants}); one policy key "both" when equal.
DST_CASES: list[tuple[str, str, str, dict[str, list[str]]]] = [
    # America/New_York, 2026-03-08: 02:00 EST (-05) jumps to 03:00 EDT (-04) at 07:00Z, so
    # 02:30 does not exist that day. Mar 7 02:30 EST = 07:30Z; Mar 9 02:30 EDT = 06:30Z.
    # cron policy: "30 2" is fixed-time, so it fires at the first instant after the gap,
    # 03:00 EDT = 07:00Z.
    (
        "America/New_York",
        "30 2 * * *",
        "2026-03-07T00:00:00Z",
        {
            "skip": ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z"],
            "cron": ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"],
        },
    ),
    # Same gap, three fixed times (02:00, 02:20, 02:40) all inside it: cron fires ONCE at
    # 07:00Z, then Mar 9 02:00 EDT = 06:00Z. skip fires none of them on Mar 8.
    (
        "America/New_York",
        "0,20,40 2 * * *",
        "2026-03-08T00:00:00Z",
        {
            "skip": ["2026-03-09T06:00:00Z", "2026-03-09T06:20:00Z"],
            "cron": ["2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z", "2026-03-09T06:20:00Z"],
        },
    ),
    # The minute field starts with `*`: not fixed-time, so cron follows elapsed time and the
    # gap's 02:00/02:20/02:40 do not fire, same as skip.
    (
        "America/New_York",
        "*/20 2 * * *",
        "2026-03-08T00:00:00Z",
        {"both": ["2026-03-09T06:00:00Z", "2026-03-09T06:20:00Z"]},
    ),
    # Every 30 minutes across the gap: 01:30 EST = 06:30Z, then 02:00 and 02:30 do not
    # exist, then 03:00 EDT = 07:00Z, 03:30 EDT = 07:30Z.
    (
        "America/New_York",
        "*/30 * * * *",
        "2026-03-08T06:00:00Z",
        {"both": ["2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"]},
    ),
    # America/New_York, 2026-11-01: 02:00 EDT (-04) falls back to 01:00 EST (-05) at 06:00Z,
    # so 01:30 happens at 05:30Z (EDT) and again at 06:30Z (EST). Fixed-time: once, the first.
    # Nov 2 01:30 EST = 06:30Z.
    (
        "America/New_York",
        "30 1 * * *",
        "2026-10-31T12:00:00Z",
        {"both": ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]},
    ),
    # Every 30 minutes across the repeat: 01:00 EDT 05:00Z, 01:30 EDT 05:30Z, then cron
    # (elapsed) repeats 01:00 EST 06:00Z and 01:30 EST 06:30Z; 02:00 EST = 07:00Z. skip keeps
    # only the first pass and goes on to 02:00 EST = 07:00Z, 02:30 = 07:30Z, 03:00 = 08:00Z.
    (
        "America/New_York",
        "*/30 * * * *",
        "2026-11-01T04:45:00Z",
        {
            "skip": [
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T07:00:00Z",
                "2026-11-01T07:30:00Z",
                "2026-11-01T08:00:00Z",
            ],
            "cron": [
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:30:00Z",
                "2026-11-01T07:00:00Z",
            ],
        },
    ),
    # Europe/London, 2026-03-29: 01:00 GMT jumps to 02:00 BST (+01) at 01:00Z; 01:30 does not
    # exist. Mar 28 01:30 GMT = 01:30Z; Mar 30 01:30 BST = 00:30Z; cron: 02:00 BST = 01:00Z.
    (
        "Europe/London",
        "30 1 * * *",
        "2026-03-28T00:00:00Z",
        {
            "skip": ["2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"],
            "cron": ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
        },
    ),
    # Europe/London, 2026-10-25: 02:00 BST falls back to 01:00 GMT at 01:00Z; 01:30 happens at
    # 00:30Z (BST) and 01:30Z (GMT); fixed-time fires the first. Oct 26 01:30 GMT = 01:30Z.
    (
        "Europe/London",
        "30 1 * * *",
        "2026-10-24T12:00:00Z",
        {"both": ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]},
    ),
    # Hourly across the same repeat: 01:00 BST = 00:00Z; cron repeats 01:00 GMT = 01:00Z;
    # 02:00 GMT = 02:00Z, 03:00 GMT = 03:00Z.
    (
        "Europe/London",
        "0 * * * *",
        "2026-10-24T23:30:00Z",
        {
            "skip": ["2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z", "2026-10-25T03:00:00Z"],
            "cron": ["2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z"],
        },
    ),
    # Australia/Lord_Howe shifts by 30 minutes. 2026-10-04 (first Sunday of October): 02:00
    # +10:30 jumps to 02:30 +11:00 at 2026-10-03T15:30Z, so 02:15 does not exist.
    # Oct 3 02:15 +10:30 = Oct 2 15:45Z; Oct 5 02:15 +11 = Oct 4 15:15Z; cron: 02:30 +11 =
    # Oct 3 15:30Z.
    (
        "Australia/Lord_Howe",
        "15 2 * * *",
        "2026-10-02T00:00:00Z",
        {
            "skip": ["2026-10-02T15:45:00Z", "2026-10-04T15:15:00Z"],
            "cron": ["2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"],
        },
    ),
    # Quarter hours across that gap: 01:45 +10:30 = 15:15Z; 02:00 and 02:15 do not exist;
    # 02:30 +11 = 15:30Z; 02:45 +11 = 15:45Z.
    (
        "Australia/Lord_Howe",
        "*/15 * * * *",
        "2026-10-03T15:00:00Z",
        {"both": ["2026-10-03T15:15:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z"]},
    ),
    # Lord Howe 2026-04-05 (first Sunday of April): 02:00 +11 falls back to 01:30 +10:30 at
    # 2026-04-04T15:00Z, so 01:45 happens at 14:45Z (+11) and 15:15Z (+10:30). Fixed-time fires
    # the first; Apr 6 01:45 +10:30 = Apr 5 15:15Z.
    (
        "Australia/Lord_Howe",
        "45 1 * * *",
        "2026-04-03T16:00:00Z",
        {"both": ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]},
    ),
    # Quarter hours across the 30-minute repeat: 01:30 +11 = 14:30Z, 01:45 +11 = 14:45Z; cron
    # repeats 01:30 +10:30 = 15:00Z and 01:45 +10:30 = 15:15Z; then 02:00 +10:30 = 15:30Z.
    (
        "Australia/Lord_Howe",
        "*/15 * * * *",
        "2026-04-04T14:20:00Z",
        {
            "skip": [
                "2026-04-04T14:30:00Z",
                "2026-04-04T14:45:00Z",
                "2026-04-04T15:30:00Z",
                "2026-04-04T15:45:00Z",
                "2026-04-04T16:00:00Z",
            ],
            "cron": [
                "2026-04-04T14:30:00Z",
                "2026-04-04T14:45:00Z",
                "2026-04-04T15:00:00Z",
                "2026-04-04T15:15:00Z",
                "2026-04-04T15:30:00Z",
            ],
        },
    ),
    # Australia/Sydney (southern hemisphere: DST starts in October). 2026-10-04: 02:00 AEST
    # (+10) jumps to 03:00 AEDT (+11) at 2026-10-03T16:00Z. Oct 3 02:30 +10 = Oct 2 16:30Z;
    # Oct 5 02:30 +11 = Oct 4 15:30Z; cron: 03:00 +11 = Oct 3 16:00Z.
    (
        "Australia/Sydney",
        "30 2 * * *",
        "2026-10-02T00:00:00Z",
        {
            "skip": ["2026-10-02T16:30:00Z", "2026-10-04T15:30:00Z"],
            "cron": ["2026-10-02T16:30:00Z", "2026-10-03T16:00:00Z", "2026-10-04T15:30:00Z"],
        },
    ),
    # Sydney 2026-04-05: 03:00 AEDT falls back to 02:00 AEST at 2026-04-04T16:00Z. 02:30 on
    # Apr 4 = +11 = Apr 3 15:30Z; Apr 5 first pass +11 = Apr 4 15:30Z (not the +10 one,
    # 16:30Z); Apr 6 02:30 +10 = Apr 5 16:30Z.
    (
        "Australia/Sydney",
        "30 2 * * *",
        "2026-04-03T12:00:00Z",
        {"both": ["2026-04-03T15:30:00Z", "2026-04-04T15:30:00Z", "2026-04-05T16:30:00Z"]},
    ),
    # Hourly at :30 across that repeat: 01:30 +11 14:30Z, 02:30 +11 15:30Z, cron repeats 02:30
    # +10 16:30Z, then 03:30 +10 17:30Z.
    (
        "Australia/Sydney",
        "30 * * * *",
        "2026-04-04T14:00:00Z",
        {
            "skip": ["2026-04-04T14:30:00Z", "2026-04-04T15:30:00Z", "2026-04-04T17:30:00Z"],
            "cron": [
                "2026-04-04T14:30:00Z",
                "2026-04-04T15:30:00Z",
                "2026-04-04T16:30:00Z",
                "2026-04-04T17:30:00Z",
            ],
        },
    ),
    # America/Santiago changes at midnight. 2026-09-06 (Sunday): 00:00 -04 jumps to 01:00 -03
    # at 04:00Z, so midnight itself does not exist. Sep 5 00:00 -04 = 04:00Z; Sep 7 00:00 -03
    # = 03:00Z; cron: 01:00 -03 = Sep 6 04:00Z.
    (
        "America/Santiago",
        "0 0 * * *",
        "2026-09-05T00:00:00Z",
        {
            "skip": ["2026-09-05T04:00:00Z", "2026-09-07T03:00:00Z"],
            "cron": ["2026-09-05T04:00:00Z", "2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z"],
        },
    ),
    # Sundays at midnight: Sep 6 has none, so skip waits for Sep 13 00:00 -03 = 03:00Z.
    (
        "America/Santiago",
        "0 0 * * SUN",
        "2026-09-01T00:00:00Z",
        {
            "skip": ["2026-09-13T03:00:00Z"],
            "cron": ["2026-09-06T04:00:00Z", "2026-09-13T03:00:00Z"],
        },
    ),
    # Santiago 2026-04-05: Sunday 00:00 -03 falls back to Saturday 23:00 -04 at 03:00Z, so
    # Saturday 23:30 happens at 02:30Z (-03) and 03:30Z (-04). Fixed-time fires the first;
    # Sunday Apr 5 23:30 -04 = Apr 6 03:30Z.
    (
        "America/Santiago",
        "30 23 * * *",
        "2026-04-04T12:00:00Z",
        {"both": ["2026-04-05T02:30:00Z", "2026-04-06T03:30:00Z"]},
    ),
    # Hourly at :30 there: 22:30 -03 01:30Z, 23:30 -03 02:30Z, cron repeats 23:30 -04 03:30Z,
    # then Sunday 00:30 -04 04:30Z.
    (
        "America/Santiago",
        "30 * * * *",
        "2026-04-05T01:00:00Z",
        {
            "skip": ["2026-04-05T01:30:00Z", "2026-04-05T02:30:00Z", "2026-04-05T04:30:00Z"],
            "cron": [
                "2026-04-05T01:30:00Z",
                "2026-04-05T02:30:00Z",
                "2026-04-05T03:30:00Z",
                "2026-04-05T04:30:00Z",
            ],
        },
    ),
    # Pacific/Apia skipped Friday 2011-12-30 entirely: Thursday 23:59:59 -10 was followed by
    # Saturday 00:00 +14, at 2011-12-30T10:00Z. Dec 29 09:00 -10 = 19:00Z; Dec 31 09:00 +14 =
    # Dec 30 19:00Z. cron (fixed-time) fires Dec 30's 09:00 once at the first instant after
    # the gap, Saturday 00:00 +14 = Dec 30 10:00Z, only nine hours before Saturday's own.
    (
        "Pacific/Apia",
        "0 9 * * *",
        "2011-12-29T00:00:00Z",
        {
            "skip": ["2011-12-29T19:00:00Z", "2011-12-30T19:00:00Z"],
            "cron": ["2011-12-29T19:00:00Z", "2011-12-30T10:00:00Z", "2011-12-30T19:00:00Z"],
        },
    ),
    # Fridays at noon: Dec 23 12:00 -10 = 22:00Z; there was no Friday Dec 30; Jan 6 2012 12:00
    # +14 = Jan 5 22:00Z.
    (
        "Pacific/Apia",
        "0 12 * * FRI",
        "2011-12-20T00:00:00Z",
        {
            "skip": ["2011-12-23T22:00:00Z", "2012-01-05T22:00:00Z"],
            "cron": ["2011-12-23T22:00:00Z", "2011-12-30T10:00:00Z", "2012-01-05T22:00:00Z"],
        },
    ),
    # Every 6 hours (elapsed time in both policies): Dec 29 18:00 -10 = Dec 30 04:00Z, then
    # the whole of Dec 30 is missing, then Dec 31 00:00 +14 = Dec 30 10:00Z, 06:00 +14 = 16:00Z.
    (
        "Pacific/Apia",
        "0 */6 * * *",
        "2011-12-29T22:00:00Z",
        {"both": ["2011-12-30T04:00:00Z", "2011-12-30T10:00:00Z", "2011-12-30T16:00:00Z"]},
    ),
    # A date that only existed in other years: 2011-12-30 is skipped, 2012-12-30 12:00 is in
    # Samoa's summer time (+14) = 2012-12-29T22:00Z.
    (
        "Pacific/Apia",
        "0 12 30 12 *",
        "2011-12-01T00:00:00Z",
        {
            "skip": ["2012-12-29T22:00:00Z"],
            "cron": ["2011-12-30T10:00:00Z", "2012-12-29T22:00:00Z"],
        },
    ),
]


def _dst_params() -> Iterator[Any]:
    for zone, expr, after, expected in DST_CASES:
        for policy in ("skip", "cron"):
            want = expected.get(policy, expected.get("both"))
            assert want is not None
            yield pytest.param(zone, expr, after, policy, want, id=f"{zone}|{expr}|{policy}")


@pytest.mark.parametrize(("zone", "expr", "after", "dst", "want"), list(_dst_params()))
def test_dst_hand_computed(zone: str, expr: str, after: str, dst: str, want: list[str]) -> None:
    assert run(expr, after, len(want), tz=zone, dst=dst) == want


@pytest.mark.parametrize(("zone", "expr", "after", "dst", "want"), list(_dst_params()))
def test_dst_backwards_agrees(zone: str, expr: str, after: str, dst: str, want: list[str]) -> None:
    """latest_at_or_before walks the same instants backwards, overlaps and gaps included."""
    s = compile_schedule(cron=expr, tz=zone, dst=dst)  # type: ignore[arg-type]
    instants = [ms(w) for w in want]
    for prev, cur in pairwise(instants):
        assert latest_at_or_before(s, cur) == cur
        assert latest_at_or_before(s, cur - 1) == prev


def test_dst_inclusive_at_the_shifted_instant() -> None:
    # The gap shift is itself an occurrence, so asking "at or after it" must return it.
    s = compile_schedule(cron="30 2 * * *", tz="America/New_York", dst="cron")
    assert next_after(s, ms("2026-03-08T07:00:00Z"), inclusive=True) == ms("2026-03-08T07:00:00Z")
    assert next_after(s, ms("2026-03-08T07:00:00Z")) == ms("2026-03-09T06:30:00Z")


def test_dst_from_inside_the_repeat() -> None:
    # Asked from the second pass of New York's repeated 01:xx (06:10Z = 01:10 EST).
    elapsed = compile_schedule(cron="*/30 * * * *", tz="America/New_York", dst="cron")
    skip = compile_schedule(cron="*/30 * * * *", tz="America/New_York", dst="skip")
    assert rfc(next_after(elapsed, ms("2026-11-01T06:10:00Z")) or 0) == "2026-11-01T06:30:00Z"
    assert rfc(next_after(skip, ms("2026-11-01T06:10:00Z")) or 0) == "2026-11-01T07:00:00Z"
    # From the first pass after its last match (01:45 EDT = 05:45Z): elapsed goes back to
    # wall 01:00 of the second pass (06:00Z); skip goes on to 02:00 EST (07:00Z).
    assert rfc(next_after(elapsed, ms("2026-11-01T05:45:00Z")) or 0) == "2026-11-01T06:00:00Z"
    assert rfc(next_after(skip, ms("2026-11-01T05:45:00Z")) or 0) == "2026-11-01T07:00:00Z"
    # Backwards from the second pass: elapsed finds 01:00 EST (06:00Z); skip the first pass's
    # last one, 01:30 EDT (05:30Z), even though its wall time is later than 01:10.
    assert rfc(latest_at_or_before(elapsed, ms("2026-11-01T06:10:00Z")) or 0) == (
        "2026-11-01T06:00:00Z"
    )
    assert rfc(latest_at_or_before(skip, ms("2026-11-01T06:10:00Z")) or 0) == (
        "2026-11-01T05:30:00Z"
    )


def test_fixed_time_rule_ignores_the_seconds_field() -> None:
    # Seconds `*/20` with fixed minute and hour is still fixed-time: the three 02:30:xx
    # instants of the gap day collapse into one fire at 03:00 EDT (07:00Z).
    s = compile_schedule(cron="*/20 30 2 * * *", tz="America/New_York", dst="cron")
    assert [rfc(u) for u in occurrences(s, ms("2026-03-08T00:00:00Z"), 2)] == [
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:30:00Z",
    ]


# --------------------------------------------------------------------------------------------
# Syntax


def test_last_day_of_month() -> None:
    assert run("0 0 L * *", "2024-01-15T00:00:00Z", 4) == [
        "2024-01-31T00:00:00Z",
        "2024-02-29T00:00:00Z",  # leap year
        "2024-03-31T00:00:00Z",
        "2024-04-30T00:00:00Z",
    ]


def test_last_weekday_of_month() -> None:
    assert run("0 0 LW * *", "2026-01-01T00:00:00Z", 5) == [
        "2026-01-30T00:00:00Z",  # Jan 31 is a Saturday
        "2026-02-27T00:00:00Z",  # Feb 28 is a Saturday
        "2026-03-31T00:00:00Z",  # Tuesday
        "2026-04-30T00:00:00Z",  # Thursday
        "2026-05-29T00:00:00Z",  # May 31 is a Sunday
    ]


def test_last_friday_and_nth_weekday() -> None:
    last_friday = ["2026-01-30T00:00:00Z", "2026-02-27T00:00:00Z", "2026-03-27T00:00:00Z"]
    assert run("0 0 * * 5L", "2026-01-01T00:00:00Z", 3) == last_friday
    assert run("0 0 * * FRIL", "2026-01-01T00:00:00Z", 3) == last_friday
    second_monday = ["2026-01-12T00:00:00Z", "2026-02-09T00:00:00Z", "2026-03-09T00:00:00Z"]
    assert run("0 0 * * MON#2", "2026-01-01T00:00:00Z", 3) == second_monday
    assert run("0 0 * * 1#2", "2026-01-01T00:00:00Z", 3) == second_monday
    # A fifth Monday exists only in some months: 2026 has them in Mar, Jun, Aug, Nov.
    assert run("0 0 * * mon#5", "2026-01-01T00:00:00Z", 2) == [
        "2026-03-30T00:00:00Z",
        "2026-06-29T00:00:00Z",
    ]


def test_names_are_case_insensitive() -> None:
    numeric = run("0 12 * 1,7 1-5", "2026-01-01T00:00:00Z", 30)
    assert run("0 12 * JAN,JUL MON-FRI", "2026-01-01T00:00:00Z", 30) == numeric
    assert run("0 12 * jan,Jul mon-FRI", "2026-01-01T00:00:00Z", 30) == numeric


def test_question_mark_is_a_star_in_day_fields() -> None:
    assert run("0 0 ? * MON", "2026-01-01T00:00:00Z", 5) == run(
        "0 0 * * 1", "2026-01-01T00:00:00Z", 5
    )
    assert run("0 0 15 * ?", "2026-01-01T00:00:00Z", 5) == run(
        "0 0 15 * *", "2026-01-01T00:00:00Z", 5
    )


def test_six_fields_have_seconds_first() -> None:
    assert run("*/15 30 9 * * *", "2026-01-01T00:00:00Z", 5) == [
        "2026-01-01T09:30:00Z",
        "2026-01-01T09:30:15Z",
        "2026-01-01T09:30:30Z",
        "2026-01-01T09:30:45Z",
        "2026-01-02T09:30:00Z",
    ]
    assert run("0 30 9 * * 1-5", "2026-01-01T00:00:00Z", 10) == run(
        "30 9 * * 1-5", "2026-01-01T00:00:00Z", 10
    )


@pytest.mark.parametrize(
    ("macro", "expansion"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_macros(macro: str, expansion: str) -> None:
    assert run(macro, "2026-02-03T04:05:06Z", 3) == run(expansion, "2026-02-03T04:05:06Z", 3)


def test_macro_expansions_explicitly() -> None:
    assert run("@weekly", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-04T00:00:00Z",  # Sunday
        "2026-01-11T00:00:00Z",
    ]
    assert run("@hourly", "2026-01-01T00:00:00Z", 2) == [
        "2026-01-01T01:00:00Z",
        "2026-01-01T02:00:00Z",
    ]
    assert run("@yearly", "2026-01-01T00:00:00Z", 1) == ["2027-01-01T00:00:00Z"]


def test_day_of_month_or_day_of_week_rule() -> None:
    # Both restricted: the 13th OR any Friday (Jan 2026: Fri 2, 9, Tue 13, Fri 16).
    assert run("0 0 13 * 5", "2026-01-01T00:00:00Z", 4) == [
        "2026-01-02T00:00:00Z",
        "2026-01-09T00:00:00Z",
        "2026-01-13T00:00:00Z",
        "2026-01-16T00:00:00Z",
    ]
    # Day-of-month starts with `*`: both fields must match, so odd-numbered Mondays.
    assert run("0 0 */2 * 1", "2026-01-01T00:00:00Z", 3) == [
        "2026-01-05T00:00:00Z",
        "2026-01-19T00:00:00Z",
        "2026-02-09T00:00:00Z",
    ]
    # `1-31` does not start with `*`: OR applies and it matches every day.
    assert len(run("0 0 1-31 * 1", "2026-01-01T00:00:00Z", 31)) == 31
    assert run("0 0 1-31 * 1", "2026-01-01T00:00:00Z", 31)[-1] == "2026-02-01T00:00:00Z"
    # Day-of-week starts with `*`: the 1st, whatever the weekday.
    assert run("0 0 1 * */1", "2026-01-01T00:00:00Z", 2) == [
        "2026-02-01T00:00:00Z",
        "2026-03-01T00:00:00Z",
    ]
    # L OR the 2nd Monday.
    assert run("0 0 L * MON#2", "2026-01-01T00:00:00Z", 3) == [
        "2026-01-12T00:00:00Z",
        "2026-01-31T00:00:00Z",
        "2026-02-09T00:00:00Z",
    ]


def test_sunday_is_0_and_7_and_ranges_steps_lists() -> None:
    sundays = run("0 0 * * 0", "2026-01-01T00:00:00Z", 4)
    assert run("0 0 * * 7", "2026-01-01T00:00:00Z", 4) == sundays
    assert run("0 0 * * SUN", "2026-01-01T00:00:00Z", 4) == sundays
    assert run("0 0 * * 5-7", "2026-01-01T00:00:00Z", 3) == [
        "2026-01-02T00:00:00Z",  # Fri
        "2026-01-03T00:00:00Z",  # Sat
        "2026-01-04T00:00:00Z",  # Sun
    ]
    assert run("5/20 * * * *", "2026-01-01T00:00:00Z", 4) == [
        "2026-01-01T00:05:00Z",
        "2026-01-01T00:25:00Z",
        "2026-01-01T00:45:00Z",
        "2026-01-01T01:05:00Z",
    ]
    assert run("10-20/5,59 8 * * *", "2026-01-01T00:00:00Z", 5) == [
        "2026-01-01T08:10:00Z",
        "2026-01-01T08:15:00Z",
        "2026-01-01T08:20:00Z",
        "2026-01-01T08:59:00Z",
        "2026-01-02T08:10:00Z",
    ]
    # Feb 29 only: the search hops over years, not days.
    assert run("0 0 29 2 *", "2026-01-01T00:00:00Z", 2) == [
        "2028-02-29T00:00:00Z",
        "2032-02-29T00:00:00Z",
    ]


def test_star_prefix_rule_follows_vixie() -> None:
    # Vixie cron and cronie decide AND versus OR from the first character of each day field.
    # `*/10` restricts days but starts with `*`: Mondays that are the 1st, 11th, 21st or 31st.
    # In 2026 those are Jun 1, May 11, Aug 31, Sep 21 ... (Mondays: Jun 1, May 11).
    assert run("0 0 */10 * MON", "2026-01-01T00:00:00Z", 3) == [
        "2026-05-11T00:00:00Z",
        "2026-06-01T00:00:00Z",
        "2026-08-31T00:00:00Z",
    ]
    # The same days spelt without a leading `*` OR with every Monday: Jan 1 (Thu) is day 1,
    # Jan 5 a Monday, Jan 11 day 11, Jan 12 a Monday.
    assert run("0 0 1-31/10 * MON", "2025-12-31T00:00:00Z", 4) == [
        "2026-01-01T00:00:00Z",
        "2026-01-05T00:00:00Z",
        "2026-01-11T00:00:00Z",
        "2026-01-12T00:00:00Z",
    ]
    # Day-of-week `*/2` (Sun, Tue, Thu, Sat) with day-of-month 1: AND, so a 1st that falls on
    # one of those days. 2026: Jan 1 Thu, Feb 1 Sun, Mar 1 Sun, Apr 1 Wed (no), May 1 Fri (no).
    assert run("0 0 1 * */2", "2025-12-31T00:00:00Z", 4) == [
        "2026-01-01T00:00:00Z",
        "2026-02-01T00:00:00Z",
        "2026-03-01T00:00:00Z",
        "2026-08-01T00:00:00Z",  # Jun 1 Mon, Jul 1 Wed, Aug 1 Sat
    ]


def test_wrap_around_ranges() -> None:
    # Hours 22-2: 22, 23, 0, 1, 2.
    assert run("0 22-2 * * *", "2026-01-01T12:00:00Z", 6) == [
        "2026-01-01T22:00:00Z",
        "2026-01-01T23:00:00Z",
        "2026-01-02T00:00:00Z",
        "2026-01-02T01:00:00Z",
        "2026-01-02T02:00:00Z",
        "2026-01-02T22:00:00Z",
    ]
    # A step counts along the wrapped run: 22, 0, 2.
    assert run("0 22-2/2 * * *", "2026-01-01T12:00:00Z", 4) == [
        "2026-01-01T22:00:00Z",
        "2026-01-02T00:00:00Z",
        "2026-01-02T02:00:00Z",
        "2026-01-02T22:00:00Z",
    ]
    # FRI-MON from Wednesday 2026-01-07: Fri 9, Sat 10, Sun 11, Mon 12, then Fri 16.
    fri_mon = run("0 0 * * FRI-MON", "2026-01-07T00:00:00Z", 5)
    assert fri_mon == [
        "2026-01-09T00:00:00Z",
        "2026-01-10T00:00:00Z",
        "2026-01-11T00:00:00Z",
        "2026-01-12T00:00:00Z",
        "2026-01-16T00:00:00Z",
    ]
    assert run("0 0 * * 5-1", "2026-01-07T00:00:00Z", 5) == fri_mon
    assert run("0 0 * * SAT-SUN", "2026-01-07T00:00:00Z", 2) == [
        "2026-01-10T00:00:00Z",
        "2026-01-11T00:00:00Z",
    ]
    assert run("0 0 * * 7-1", "2026-01-07T00:00:00Z", 2) == [  # Sunday (7) to Monday
        "2026-01-11T00:00:00Z",
        "2026-01-12T00:00:00Z",
    ]
    # Months NOV-FEB, first of each.
    assert run("0 0 1 NOV-FEB *", "2026-03-01T00:00:00Z", 4) == [
        "2026-11-01T00:00:00Z",
        "2026-12-01T00:00:00Z",
        "2027-01-01T00:00:00Z",
        "2027-02-01T00:00:00Z",
    ]
    # Day-of-month 29-2 in February 2026 (28 days): 29-31 do not exist, so Feb 1, 2, Mar 1.
    assert run("0 0 29-2 * *", "2026-01-31T12:00:00Z", 4) == [
        "2026-02-01T00:00:00Z",
        "2026-02-02T00:00:00Z",
        "2026-03-01T00:00:00Z",
        "2026-03-02T00:00:00Z",
    ]
    # `5-1` in minutes used to be rejected as running backwards; it now wraps: 5 to 59, 0, 1.
    assert len(run("5-1 * * * *", "2026-01-01T00:00:00Z", 57)) == 57
    assert run("5-1 * * * *", "2026-01-01T00:59:30Z", 3) == [
        "2026-01-01T01:00:00Z",
        "2026-01-01T01:01:00Z",
        "2026-01-01T01:05:00Z",
    ]
    # Minutes 58-1.
    assert run("58-1 * * * *", "2026-01-01T00:30:00Z", 4) == [
        "2026-01-01T00:58:00Z",
        "2026-01-01T00:59:00Z",
        "2026-01-01T01:00:00Z",
        "2026-01-01T01:01:00Z",
    ]


def test_nearest_weekday() -> None:
    # 2026-08-15 is a Saturday -> Friday 14; 2026-11-15 a Sunday -> Monday 16; 2026-09-15 a
    # Tuesday -> itself.
    assert run("0 9 15W * *", "2026-08-01T00:00:00Z", 4) == [
        "2026-08-14T09:00:00Z",
        "2026-09-15T09:00:00Z",
        "2026-10-15T09:00:00Z",  # Thursday
        "2026-11-16T09:00:00Z",
    ]
    # 1W never goes back into the previous month: 2026-08-01 is a Saturday -> Monday 3rd;
    # 2026-02-01 a Sunday -> Monday 2nd.
    assert run("0 0 1W 8 *", "2026-01-01T00:00:00Z", 1) == ["2026-08-03T00:00:00Z"]
    assert run("0 0 1W 2 *", "2026-01-01T00:00:00Z", 1) == ["2026-02-02T00:00:00Z"]
    # 31W never goes forward into the next month: 2026-05-31 is a Sunday -> Friday 29th.
    # Months without a 31st have no match (2026: Jan, Mar, May, Jul ...): Jan 31 is a Saturday
    # -> Friday 30; Mar 31 Tuesday.
    assert run("0 0 31W * *", "2026-01-01T00:00:00Z", 3) == [
        "2026-01-30T00:00:00Z",
        "2026-03-31T00:00:00Z",
        "2026-05-29T00:00:00Z",
    ]
    # A list mixing W and plain days.
    assert run("0 0 1W,20 6 *", "2026-01-01T00:00:00Z", 2) == [
        "2026-06-01T00:00:00Z",  # Monday
        "2026-06-20T00:00:00Z",
    ]


def test_days_before_the_last() -> None:
    # L-2: Jan 29, Feb 26 (28 days), Feb 27 in a leap year.
    assert run("0 0 L-2 * *", "2026-01-01T00:00:00Z", 3) == [
        "2026-01-29T00:00:00Z",
        "2026-02-26T00:00:00Z",
        "2026-03-29T00:00:00Z",
    ]
    assert run("0 0 L-2 2 *", "2028-01-01T00:00:00Z", 1) == ["2028-02-27T00:00:00Z"]
    # L-30 is the 1st of a 31-day month and nothing in shorter ones.
    assert run("0 0 L-30 * *", "2026-01-02T00:00:00Z", 2) == [
        "2026-03-01T00:00:00Z",
        "2026-05-01T00:00:00Z",
    ]
    # L-1W: the weekday nearest the day before the last. 2026-01-30 Friday; 2026-02-27 Friday;
    # 2026-05-30 Saturday -> Friday 29; 2026-08-30 Sunday -> Monday 31.
    assert run("0 0 L-1W 1,2,5,8 *", "2026-01-01T00:00:00Z", 4) == [
        "2026-01-30T00:00:00Z",
        "2026-02-27T00:00:00Z",
        "2026-05-29T00:00:00Z",
        "2026-08-31T00:00:00Z",
    ]


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("60 * * * *", "minute field: 60 is out of range 0-59"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * * *", "expected 5 fields"),
        ("0 0 30 2 *", "never matches"),
        ("0 0 31 4,6 *", "never matches"),
        ("0 0 * * 8", "day-of-week field: 8 is out of range"),
        ("0 0 * * MON#6", "occurrence must be 1-5"),
        ("*/0 * * * *", "step must be at least 1"),
        ("@every", "unknown macro"),
        ("? * * * *", "'?' is only allowed in the day fields"),
        ("0 0 * * L", "day-of-week field"),
        ("0 0 1,,2 * *", "empty list item"),
        ("0 0 * FOO *", "month field: 'FOO' is not a valid value"),
        ("0 0 * * MON-FOO", "day-of-week field"),
        ("0 24 * * *", "hour field: 24 is out of range 0-23"),
        ("0 0 0 * *", "day-of-month field: 0 is out of range 1-31"),
        ("", "expected 5 fields"),
        ("x" * 2000, "longer than"),
        ("H * * * *", "minute field: 'H': 'H' (hashed values, a Jenkins extension)"),
        ("H(0-29) * * * *", "'H' (hashed values"),
        ("0 0 * * * * 2027", "seventh (year) field is not supported"),
        ("@reboot", "@reboot is not supported"),
        ("@every 5m", "@every is not supported"),
        ("L * * * *", "minute field: 'L': 'L' is only allowed in the day fields"),
        ("0 0 * L *", "month field: 'L': 'L' is only allowed"),
        ("0 1#2 * * *", "hour field: '1#2': '#' is only allowed in day-of-week"),
        ("0 0 1#2 * *", "day-of-month field: '1#2': '#' is only allowed in day-of-week"),
        ("0 0 * * 1W", "day-of-week field: '1W': 'W' is only allowed in day-of-month"),
        ("0 5W * * *", "hour field: '5W': 'W' is only allowed in day-of-month"),
        ("0 0 1-5W * *", "day-of-month field: '1-5W': 'L' and 'W' take the forms"),
        ("0 0 L-31 * *", "n in L-n must be 1-30"),
        ("0 0 L-0 * *", "n in L-n must be 1-30"),
        ("0 0 32W * *", "day-of-month field: 32 is out of range 1-31"),
        ("0 0 L-3/2 * *", "'L' and 'W' take the forms"),
        ("0 0 30W 2 *", "never matches"),
    ],
)
def test_bad_expressions(expr: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        compile_schedule(cron=expr)
    assert err.value.path == "job.cron"
    assert fragment in err.value.rule


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        ({"cron": "* * * * *", "tz": "Mars/Olympus_Mons"}, "job.tz"),
        ({"cron": "* * * * *", "tz": ""}, "job.tz"),
        ({"cron": "* * * * *", "tz": "localtime"}, "job.tz"),
        ({"cron": "* * * * *", "tz": "../etc/passwd"}, "job.tz"),
        ({"cron": "* * * * *", "tz": "America"}, "job.tz"),
        ({"cron": "* * * * *", "dst": "later"}, "job.dst"),
        ({"every_ms": 0}, "job.every"),
        ({"every_ms": -5}, "job.every"),
        ({"every_ms": True}, "job.every"),
        ({}, "job"),
        ({"cron": "* * * * *", "every_ms": 1000}, "job"),
        ({"cron": 5}, "job.cron"),
        ({"every_ms": 1000, "start_ms": -1}, "job.start"),
        ({"every_ms": 1000, "end_ms": 10**15}, "job.end"),
        ({"every_ms": 1000, "start_ms": 2000, "end_ms": 1000}, "job.end"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], path: str) -> None:
    with pytest.raises(ValidationError) as err:
        compile_schedule(**kwargs)
    assert err.value.path == path


@settings(max_examples=examples(300), deadline=None)
@given(
    expr=st.one_of(
        st.text(max_size=40),
        st.lists(
            st.text(alphabet="0123456789*?/-,#LW@JANMOFRISU ", max_size=8), min_size=5, max_size=6
        ).map(" ".join),
    )
)
def test_garbage_is_a_validation_error_or_a_schedule(expr: str) -> None:
    # The parser turns ValidationError into a rejection; anything else would stop ingest.
    try:
        s = compile_schedule(cron=expr, tz="Europe/London")
    except ValidationError as exc:
        assert exc.path == "job.cron"
        return
    got = occurrences(s, ms("2026-01-01T00:00:00Z"), 3)
    assert got == sorted(set(got))


def test_start_and_end_accept_the_whole_rfc3339_range() -> None:
    last = ms("9999-12-31T23:59:59.999+00:00")
    s = compile_schedule(cron="0 0 * * *", start_ms=last, end_ms=last)
    assert next_after(s, 0) is None  # beyond the last instant occurrences are computed for
    assert compile_schedule(every_ms=1000, end_ms=last).end_ms == last


def test_compiled_schedules_are_shared_and_comparable() -> None:
    a = compile_schedule(cron="0 9 * * 1-5", tz="Europe/London")
    b = compile_schedule(cron="0 9 * * 1-5", tz="Europe/London")
    assert a == b and hash(a) == hash(b)
    assert a.fields is b.fields  # one compiled expression for every job that uses it
    assert a != compile_schedule(cron="0 9 * * 1-5", tz="Europe/Paris")


# --------------------------------------------------------------------------------------------
# every, start, end


def test_every_is_anchored_at_the_epoch() -> None:
    s = compile_schedule(every_ms=15 * 60_000, tz="America/New_York")
    # UTC quarter hours, straight through New York's spring-forward (07:00Z).
    assert [rfc(u) for u in occurrences(s, ms("2026-03-08T06:50:00Z"), 3)] == [
        "2026-03-08T07:00:00Z",
        "2026-03-08T07:15:00Z",
        "2026-03-08T07:30:00Z",
    ]
    assert next_after(s, ms("2026-03-08T07:00:00Z"), inclusive=True) == ms("2026-03-08T07:00:00Z")
    assert latest_at_or_before(s, ms("2026-03-08T07:14:59.999Z")) == ms("2026-03-08T07:00:00Z")


def test_every_is_anchored_at_start_and_bounded_by_end() -> None:
    start, end = ms("2026-01-01T00:00:07Z"), ms("2026-01-01T00:00:37Z")
    s = compile_schedule(every_ms=10_000, start_ms=start, end_ms=end)
    assert next_after(s, 0) == start  # never before start, and start itself counts
    assert occurrences(s, 0, 10) == [start, start + 10_000, start + 20_000, start + 30_000]
    assert next_after(s, start + 30_000) is None  # start + 40 s is after end
    assert latest_at_or_before(s, start - 1) is None
    assert latest_at_or_before(s, 10**13) == start + 30_000


def test_end_is_inclusive() -> None:
    end = ms("2026-01-01T10:00:00Z")
    s = compile_schedule(cron="0 * * * *", end_ms=end)
    assert next_after(s, end - 1) == end
    assert next_after(s, end) is None
    assert occurrences(s, end - 3_600_000, 5) == [end]


def test_cron_respects_start() -> None:
    start = ms("2026-01-01T10:30:00Z")
    s = compile_schedule(cron="0 * * * *", start_ms=start)
    assert next_after(s, 0) == ms("2026-01-01T11:00:00Z")
    assert latest_at_or_before(s, ms("2026-01-01T10:59:59Z")) is None
    on_start = compile_schedule(cron="30 10 * * *", start_ms=start)
    assert next_after(on_start, 0) == start


def test_occurrences_stop_at_the_far_end() -> None:
    s = compile_schedule(cron="0 0 1 1 *")
    assert next_after(s, ms("9998-06-01T00:00:00Z")) == ms("9999-01-01T00:00:00Z")
    assert next_after(s, ms("9999-01-01T00:00:00Z")) is None
    assert next_after(compile_schedule(every_ms=1000), recurrence.MAX_MS) is None


# --------------------------------------------------------------------------------------------
# catch_up


HOURLY = compile_schedule(cron="0 * * * *", tz="Europe/London")


def test_catch_up_policies() -> None:
    first, now = ms("2026-06-01T10:00:00Z"), ms("2026-06-01T13:30:00Z")
    nxt = ms("2026-06-01T14:00:00Z")
    h = [ms(f"2026-06-01T{hour}:00:00Z") for hour in (10, 11, 12, 13)]

    def cu(policy: str, max_catch_up: int = 100) -> CatchUp:
        return catch_up(
            HOURLY,
            policy=policy,  # type: ignore[arg-type]
            max_catch_up=max_catch_up,
            first_missed_ms=first,
            now_ms=now,
        )

    assert cu("coalesce") == CatchUp((h[3],), nxt, True)
    assert cu("skip") == CatchUp((), nxt, False)
    assert cu("all") == CatchUp(tuple(h), nxt, False)
    assert cu("all", 4) == CatchUp(tuple(h), nxt, False)  # exactly max: nothing folded
    assert cu("all", 3) == CatchUp((h[0], h[1], h[3]), nxt, True)
    assert cu("all", 1) == CatchUp((h[3],), nxt, True)


def test_catch_up_with_a_single_missed_occurrence() -> None:
    first = ms("2026-06-01T10:00:00Z")
    now = first + 5_000
    for policy in ("coalesce", "all"):
        got = catch_up(HOURLY, policy=policy, max_catch_up=10, first_missed_ms=first, now_ms=now)
        assert got == CatchUp((first,), ms("2026-06-01T11:00:00Z"), False)


def test_catch_up_keeps_an_off_schedule_pending_occurrence() -> None:
    # The pending occurrence came from an older spec (10:17 is not on the hour): it was
    # materialised, so it is still the one that fires.
    first = ms("2026-06-01T10:17:00Z")
    now = ms("2026-06-01T10:30:00Z")
    for policy in ("coalesce", "all"):
        got = catch_up(HOURLY, policy=policy, max_catch_up=10, first_missed_ms=first, now_ms=now)
        assert got.fire == (first,)


def test_catch_up_stops_at_end() -> None:
    end = ms("2026-06-01T12:00:00Z")
    s = compile_schedule(cron="0 * * * *", end_ms=end)
    got = catch_up(
        s,
        policy="all",
        max_catch_up=100,
        first_missed_ms=ms("2026-06-01T10:00:00Z"),
        now_ms=ms("2026-06-01T15:00:00Z"),
    )
    assert got == CatchUp(
        (ms("2026-06-01T10:00:00Z"), ms("2026-06-01T11:00:00Z"), end), None, False
    )
    coalesced = catch_up(
        s,
        policy="coalesce",
        max_catch_up=100,
        first_missed_ms=ms("2026-06-01T10:00:00Z"),
        now_ms=ms("2026-06-01T15:00:00Z"),
    )
    assert coalesced == CatchUp((end,), None, True)


def test_catch_up_rejects_impossible_input() -> None:
    with pytest.raises(ValueError):
        catch_up(HOURLY, policy="all", max_catch_up=10, first_missed_ms=2, now_ms=1)
    with pytest.raises(ValueError):
        catch_up(HOURLY, policy="all", max_catch_up=0, first_missed_ms=1, now_ms=2)
    with pytest.raises(ValueError):
        catch_up(HOURLY, policy="most", max_catch_up=1, first_missed_ms=1, now_ms=2)  # type: ignore[arg-type]


class _Counter:
    """Counts the search's units of work: calendar months visited and zone transitions probed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.months = 0
        self.probes = 0
        days = recurrence._CronFields.days
        offset_at = recurrence._offset_at

        def counted_days(fields: Any, year: int, month: int) -> tuple[int, ...]:
            self.months += 1
            return days(fields, year, month)

        def counted_offset(zone: ZoneInfo, u: int) -> int:
            self.probes += 1
            return offset_at(zone, u)

        monkeypatch.setattr(recurrence._CronFields, "days", counted_days)
        monkeypatch.setattr(recurrence, "_offset_at", counted_offset)


@pytest.mark.parametrize("tz", ["UTC", "America/New_York"])
def test_catch_up_cost_is_bounded_not_proportional_to_the_outage(
    monkeypatch: pytest.MonkeyPatch, tz: str
) -> None:
    # A per-second cron after a 30-day outage (which crosses nothing but is 2.6 million
    # occurrences long) and after a 300-day one crossing both New York DST changes.
    s = compile_schedule(cron="* * * * * *", tz=tz, dst="cron")
    first = ms("2026-01-10T00:00:00Z")
    for days in (30, 300):
        now = first + days * 86_400_000 + 500
        latest = now - 500
        counter = _Counter(monkeypatch)
        got = catch_up(s, policy="coalesce", max_catch_up=100, first_missed_ms=first, now_ms=now)
        assert got == CatchUp((latest,), latest + 1000, True)
        assert counter.months <= 4 and counter.probes <= 64

        counter = _Counter(monkeypatch)
        got = catch_up(s, policy="all", max_catch_up=100, first_missed_ms=first, now_ms=now)
        assert got.fire == (*range(first, first + 99_000, 1000), latest)
        assert got.coalesced and got.next_ms == latest + 1000
        # One month visit per occurrence fired, plus a constant: O(max_catch_up).
        assert counter.months <= 100 + 4 and counter.probes <= 64

        counter = _Counter(monkeypatch)
        got = catch_up(s, policy="skip", max_catch_up=100, first_missed_ms=first, now_ms=now)
        assert got == CatchUp((), latest + 1000, False)
        assert counter.months <= 2


def test_next_after_cost_does_not_depend_on_the_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    # A yearly job asked from 50 years before: the search visits months, at most 12 a year of
    # distance, and for an expression restricted to one month only one per year.
    s = compile_schedule(cron="0 0 1 6 *")
    counter = _Counter(monkeypatch)
    assert next_after(s, ms("1990-07-01T00:00:00Z")) == ms("1991-06-01T00:00:00Z")
    assert counter.months <= 2


# --------------------------------------------------------------------------------------------
# Property tests


@st.composite
def _numeric_field(draw: st.DrawFn, lo: int, hi: int, allow_star: bool = True) -> str:
    """A field in the syntax croniter and this module read the same way."""
    a = draw(st.integers(lo, hi - 1))
    # croniter reads a one-value range "a-a" as something else, so ranges have two values.
    b = draw(st.integers(a + 1, hi))
    k = draw(st.integers(1, max(1, hi - lo)))
    choices = [str(a), f"{a}-{b}", f"{a}-{b}/{k}", f"{a},{b}"]
    if allow_star:
        choices += ["*", f"*/{k}"]
    return draw(st.sampled_from(choices))


@st.composite
def utc_expressions(draw: st.DrawFn) -> str:
    minute = draw(_numeric_field(0, 59))
    hour = draw(_numeric_field(0, 23))
    # Day fields: exactly "*" or not starting with "*", where croniter's day_or matches Vixie
    # (croniter treats "*/2" as restricted; Vixie and this module do not).
    dom = draw(st.one_of(st.just("*"), _numeric_field(1, 28, allow_star=False), st.just("L")))
    month = draw(st.one_of(st.just("*"), _numeric_field(1, 12), st.sampled_from(["JAN", "FEB"])))
    dow = draw(
        st.one_of(
            st.just("*"),
            _numeric_field(0, 6, allow_star=False),
            st.sampled_from(["MON", "SAT", "MON-FRI"]),
            st.builds(lambda d, n: f"{d}#{n}", st.integers(0, 6), st.integers(1, 4)),
        )
    )
    if "#" in dow:
        # croniter ANDs `#` with a restricted day-of-month; Vixie's OR rule would apply.
        dom = "*"
    fields = [minute, hour, dom, month, dow]
    if draw(st.booleans()):
        fields.insert(0, draw(_numeric_field(0, 59)))
    return " ".join(fields)


@settings(max_examples=examples(300), deadline=None)
@given(
    expr=utc_expressions(),
    start=st.integers(ms("2000-01-01T00:00:00Z"), ms("2040-01-01T00:00:00Z")),
)
def test_matches_croniter_in_utc(expr: str, start: int) -> None:
    """In UTC there is no DST to disagree about, so croniter is an independent oracle."""
    s = compile_schedule(cron=expr)
    six = len(expr.split()) == 6
    it = croniter(
        expr,
        datetime.fromtimestamp(start / 1000, UTC),
        second_at_beginning=six,
        max_years_between_matches=50,
    )
    want = [int(it.get_next(float) * 1000) for _ in range(5)]
    assert occurrences(s, start, 5) == want


ZONES = [
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Australia/Sydney",
    "America/Santiago",
    "Pacific/Apia",
    "Asia/Tehran",
    "Europe/Moscow",
]


@cache
def transitions(zone_name: str) -> tuple[tuple[int, int, int], ...]:
    """(instant s, offset before, offset after) for every change of offset 2005-2030."""
    zone = ZoneInfo(zone_name)

    def offset(u: int) -> int:
        off = datetime.fromtimestamp(u, zone).utcoffset()
        assert off is not None
        return int(off.total_seconds())

    out = []
    u = int(datetime(2005, 1, 1, tzinfo=UTC).timestamp())
    end = int(datetime(2030, 1, 1, tzinfo=UTC).timestamp())
    step = 6 * 3600
    while u < end:
        if offset(u) != offset(u + step):
            lo, hi = u, u + step
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(mid) == offset(u) else (lo, mid)
            out.append((hi, offset(u), offset(hi)))
        u += step
    return tuple(out)


@st.composite
def dst_windows(draw: st.DrawFn) -> tuple[str, int, int, int]:
    zone = draw(st.sampled_from(ZONES))
    trans = transitions(zone)
    assume(trans)
    t, before, after = draw(st.sampled_from(trans))
    return zone, t, before, after


@st.composite
def local_expressions(draw: st.DrawFn) -> str:
    minute = draw(_numeric_field(0, 59))
    # Transitions happen around local midnight to 03:00, so bias the hour towards them.
    hour = draw(
        st.one_of(
            _numeric_field(0, 23),
            st.sampled_from(["0", "1", "2", "3", "23", "0-3", "1,2", "22-23", "*"]),
        )
    )
    return f"{minute} {hour} * * *"


def _oracle(expr: str, zone_name: str, lo: int, hi: int, dst: str) -> list[int]:
    """Occurrences in (lo, hi] seconds by brute force over every UTC minute, from the policy's
    definition: a minute fires when its local wall time matches; skip and fixed-time cron drop
    second passes; fixed-time cron adds the transition instant for a gap holding a match."""
    zone = ZoneInfo(zone_name)
    minute_field, hour_field = expr.split()[:2]
    expanded = croniter(expr).expanded
    minutes = set(range(60)) if expanded[0] == ["*"] else set(expanded[0])
    hours = set(range(24)) if expanded[1] == ["*"] else set(expanded[1])
    fixed = not (minute_field.startswith("*") or hour_field.startswith("*"))
    elapsed = dst == "cron" and not fixed
    out: set[int] = set()
    for u in range(lo - lo % 60 + 60, hi + 1, 60):
        local = datetime.fromtimestamp(u, zone)
        if local.second == 0 and local.minute in minutes and local.hour in hours:
            if local.fold == 1 and not elapsed:
                continue
            out.add(u)
    if dst == "cron" and fixed:
        for t, before, after in transitions(zone_name):
            if lo < t <= hi and after > before:
                gap_start = datetime.fromtimestamp(t + before, UTC).replace(tzinfo=None)
                w = gap_start
                while w < gap_start + timedelta(seconds=after - before):
                    if w.minute in minutes and w.hour in hours:
                        out.add(t)
                    w += timedelta(minutes=1)
    return sorted(out)


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(window=dst_windows(), expr=local_expressions(), dst=st.sampled_from(["skip", "cron"]))
def test_dst_matches_brute_force(window: tuple[str, int, int, int], expr: str, dst: str) -> None:
    zone, t, _before, _after = window
    lo, hi = t - 5 * 3600, t + 5 * 3600
    s = compile_schedule(cron=expr, tz=zone, dst=dst)  # type: ignore[arg-type]
    got = []
    u = next_after(s, lo * 1000)
    while u is not None and u <= hi * 1000:
        got.append(u // 1000)
        u = next_after(s, u)
    assert got == _oracle(expr, zone, lo, hi, dst)
    # Backwards gives the same instants.
    for prev, cur in zip([None, *got], got, strict=False):
        assert latest_at_or_before(s, cur * 1000) == cur * 1000
        if prev is not None:
            assert latest_at_or_before(s, cur * 1000 - 1) == prev * 1000


def _schedules() -> st.SearchStrategy[Schedule]:
    crons = st.builds(
        lambda expr, zone, dst, start, span: compile_schedule(
            cron=expr,
            tz=zone,
            dst=dst,
            start_ms=start,
            end_ms=None if span is None else start + span,
        ),
        st.one_of(local_expressions(), utc_expressions()),
        st.sampled_from([*ZONES, "UTC"]),
        st.sampled_from(["skip", "cron"]),
        st.integers(ms("2005-01-01T00:00:00Z"), ms("2029-01-01T00:00:00Z")),
        st.none() | st.integers(0, 400 * 86_400_000),
    )
    everies = st.builds(
        lambda every, start, span: compile_schedule(
            every_ms=every, start_ms=start, end_ms=None if span is None else (start or 0) + span
        ),
        st.integers(1, 10 * 86_400_000),
        st.none() | st.integers(0, 10**12),
        st.none() | st.integers(0, 10**10),
    )
    return st.one_of(crons, everies)


def _checked(fn: Callable[..., Any]) -> Callable[..., Any]:
    return settings(max_examples=examples(200), deadline=None)(fn)


@_checked
@given(s=_schedules(), after=st.integers(ms("2004-01-01T00:00:00Z"), ms("2030-01-01T00:00:00Z")))
def test_occurrences_increase_and_stay_in_bounds(s: Schedule, after: int) -> None:
    got = occurrences(s, after, 30)
    assert all(a < b for a, b in pairwise(got))
    assert all(u > after for u in got)
    if s.start_ms is not None:
        assert all(u >= s.start_ms for u in got)
    if s.end_ms is not None:
        assert all(u <= s.end_ms for u in got)
    if s.every_ms is not None:
        anchor = s.start_ms or 0
        assert all((u - anchor) % s.every_ms == 0 for u in got)
    # inclusive: asking at an occurrence returns it.
    for u in got[:3]:
        assert next_after(s, u, inclusive=True) == u
        assert latest_at_or_before(s, u) == u


@_checked
@given(s=_schedules(), after=st.integers(ms("2004-01-01T00:00:00Z"), ms("2030-01-01T00:00:00Z")))
def test_results_are_real_matching_local_times(s: Schedule, after: int) -> None:
    """Every result's local wall time matches, except cron's fixed-time gap shift; skip never
    yields a second pass or a shifted time."""
    assume(s.cron is not None)
    assert s.cron is not None and s.fields is not None
    six = len(s.cron.split()) == 6
    for u in occurrences(s, after, 20):
        local = datetime.fromtimestamp(u / 1000, s.zone)
        wall = local.replace(tzinfo=None)
        matches = croniter.match(s.cron, wall, second_at_beginning=six) and wall.second in (
            s.fields.seconds
        )
        if s.dst == "skip":
            assert matches and local.fold == 0
        elif not matches:
            # Only a fixed-time expression may fire off its wall time: at a gap's end.
            assert s.fields.fixed_time
            before = datetime.fromtimestamp(u / 1000 - 1, s.zone).utcoffset()
            assert before is not None and local.utcoffset() != before


# --------------------------------------------------------------------------------------------
# Brute-force reference for the extended syntax (wrap-around ranges, W, L-n, #, nL, the
# Vixie star rule). It reads each field from its definition and tests candidate minutes or
# days one by one, sharing no code with the module under test.

_REF_WEEKDAYS = {n: i for i, n in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
_REF_MONTHS = {
    n: i + 1
    for i, n in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
    )
}


def _ref_number(token: str, names: dict[str, int]) -> int:
    return names[token] if token in names else int(token)


def _ref_values(text: str, lo: int, hi: int, names: dict[str, int], weekday: bool) -> set[int]:
    """Values of a plain field (no L/W/#), walking ranges one step at a time."""
    out: set[int] = set()
    for item in text.split(","):
        body, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if body in ("*", "?"):
            run_ = list(range(lo, (6 if weekday else hi) + 1))
        elif "-" in body:
            a, b = (_ref_number(t, names) for t in body.split("-"))
            if weekday and a > b:
                a, b = a % 7, b % 7  # a wrapping run of weekdays: 7 is just Sunday (`7-0`)
            run_ = [a]
            while run_[-1] != b:
                nxt = run_[-1] + 1
                if weekday:
                    nxt %= 7
                    if b == 7 and nxt == 0:
                        nxt = 7
                elif nxt > hi:
                    nxt = lo
                run_.append(nxt)
        else:
            a = _ref_number(body, names)
            run_ = list(range(a, hi + 1)) if step_text else [a]
        out |= set(run_[::step])
    return {v % 7 for v in out} if weekday else out


def _ref_day_matches(dom_text: str, dow_text: str, day: datetime) -> bool:
    last = (day.replace(day=28) + timedelta(days=4)).replace(day=1) - timedelta(days=1)
    ndays = last.day

    def nearest_weekday(n: int) -> int | None:
        if n < 1 or n > ndays:
            return None
        for distance in (0, 1, 2):
            for candidate in (n - distance, n + distance):
                if 1 <= candidate <= ndays and day.replace(day=candidate).weekday() < 5:
                    return candidate
        raise AssertionError("a month always has a weekday within two days")

    dom_hit = False
    for item in dom_text.split(","):
        if item == "L":
            dom_hit |= day.day == ndays
        elif item == "LW":
            dom_hit |= day.day == nearest_weekday(ndays)
        elif item.startswith("L-") and item.endswith("W"):
            dom_hit |= day.day == nearest_weekday(ndays - int(item[2:-1]))
        elif item.startswith("L-"):
            dom_hit |= day.day == ndays - int(item[2:])
        elif item.endswith("W"):
            dom_hit |= day.day == nearest_weekday(int(item[:-1]))
        else:
            dom_hit |= day.day in _ref_values(item, 1, 31, {}, weekday=False)
    cron_weekday = (day.weekday() + 1) % 7
    dow_hit = False
    for item in dow_text.split(","):
        if "#" in item:
            wd, n = item.split("#")
            dow_hit |= cron_weekday == _ref_number(wd, _REF_WEEKDAYS) % 7 and (
                (day.day - 1) // 7 + 1 == int(n)
            )
        elif item.endswith("L"):
            dow_hit |= cron_weekday == _ref_number(item[:-1], _REF_WEEKDAYS) % 7 and (
                day.day + 7 > ndays
            )
        else:
            dow_hit |= cron_weekday in _ref_values(item, 0, 7, _REF_WEEKDAYS, weekday=True)
    if dom_text[0] in "*?" or dow_text[0] in "*?":
        return dom_hit and dow_hit
    return dom_hit or dow_hit


@st.composite
def _wrapping_field(draw: st.DrawFn, lo: int, hi: int) -> str:
    a, b = draw(st.integers(lo, hi)), draw(st.integers(lo, hi))
    k = draw(st.integers(1, 5))
    return draw(st.sampled_from([f"{a}-{b}", f"{a}-{b}/{k}", f"*/{k}", f"{a}", f"{a},{b}", "*"]))


@st.composite
def _day_of_month_field(draw: st.DrawFn) -> str:
    item = st.one_of(
        _wrapping_field(1, 31),
        st.sampled_from(["L", "LW", "?"]),
        st.integers(1, 30).map(lambda n: f"L-{n}"),
        st.integers(1, 30).map(lambda n: f"L-{n}W"),
        st.integers(1, 31).map(lambda n: f"{n}W"),
    )
    return ",".join(draw(st.lists(item, min_size=1, max_size=3)))


@st.composite
def _day_of_week_field(draw: st.DrawFn) -> str:
    names = list(_REF_WEEKDAYS)
    item = st.one_of(
        _wrapping_field(0, 7),
        st.builds(lambda a, b: f"{a}-{b}", st.sampled_from(names), st.sampled_from(names)),
        st.builds(lambda d, n: f"{d}#{n}", st.integers(0, 7), st.integers(1, 5)),
        st.integers(0, 7).map(lambda d: f"{d}L"),
    )
    return ",".join(draw(st.lists(item, min_size=1, max_size=3)))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dom=_day_of_month_field(),
    month=_wrapping_field(1, 12),
    dow=_day_of_week_field(),
    start_day=st.integers(0, 365 * 30),
)
def test_day_fields_match_brute_force(dom: str, month: str, dow: str, start_day: int) -> None:
    expr = f"0 0 {dom} {month} {dow}"
    try:
        s = compile_schedule(cron=expr)
    except ValidationError as exc:
        # The only expressions refused here are those no date can ever satisfy.
        assert "never matches" in exc.rule
        return
    start = datetime(2000, 1, 1) + timedelta(days=start_day)
    months = _ref_values(month, 1, 12, _REF_MONTHS, weekday=False)
    want = []
    day = start + timedelta(days=1)
    horizon = start + timedelta(days=2 * 366)
    while day < horizon:
        if day.month in months and _ref_day_matches(dom, dow, day):
            want.append(rfc(int(day.replace(tzinfo=UTC).timestamp()) * 1000))
        day += timedelta(days=1)
    after = int(start.replace(tzinfo=UTC).timestamp()) * 1000
    horizon_ms = int(horizon.replace(tzinfo=UTC).timestamp()) * 1000
    got = [rfc(u) for u in occurrences(s, after, len(want) + 1) if u < horizon_ms]
    assert got == want


@settings(max_examples=examples(200), deadline=None)
@given(
    minute=_wrapping_field(0, 59),
    hour=_wrapping_field(0, 23),
    start_minute=st.integers(0, 60 * 24 * 365 * 20),
)
def test_time_fields_match_brute_force(minute: str, hour: str, start_minute: int) -> None:
    """Every minute of a 26-hour window, checked against the fields' definitions."""
    s = compile_schedule(cron=f"{minute} {hour} * * *")
    minutes = _ref_values(minute, 0, 59, {}, weekday=False)
    hours = _ref_values(hour, 0, 23, {}, weekday=False)
    start = datetime(2000, 1, 1, tzinfo=UTC) + timedelta(minutes=start_minute)
    window = 26 * 60
    want = [
        int((start + timedelta(minutes=i)).timestamp()) * 1000
        for i in range(1, window + 1)
        if (start + timedelta(minutes=i)).minute in minutes
        and (start + timedelta(minutes=i)).hour in hours
    ]
    end_ms = int((start + timedelta(minutes=window)).timestamp()) * 1000
    got = [u for u in occurrences(s, int(start.timestamp()) * 1000, len(want) + 1) if u <= end_ms]
    assert got == want


# --------------------------------------------------------------------------------------------
# Exclusion dates (holidays)


def test_excluded_dates_are_skipped_in_the_jobs_zone() -> None:
    # 09:00 New York is 14:00Z in winter. Dec 25 and 26 excluded: Dec 24, then Dec 27.
    holidays = [date(2026, 12, 25), date(2026, 12, 26)]
    s = compile_schedule(cron="0 9 * * *", tz="America/New_York", exclude_dates=holidays)
    assert [rfc(u) for u in occurrences(s, ms("2026-12-24T00:00:00Z"), 3)] == [
        "2026-12-24T14:00:00Z",
        "2026-12-27T14:00:00Z",
        "2026-12-28T14:00:00Z",
    ]
    assert latest_at_or_before(s, ms("2026-12-27T13:00:00Z")) == ms("2026-12-24T14:00:00Z")
    assert is_excluded(s, ms("2026-12-25T14:00:00Z"))
    # 23:30 on Dec 24 in New York is 04:30Z on Dec 25: the local date decides, not UTC's.
    late = compile_schedule(cron="30 23 * * *", tz="America/New_York", exclude_dates=holidays)
    assert [rfc(u) for u in occurrences(late, ms("2026-12-24T12:00:00Z"), 2)] == [
        "2026-12-25T04:30:00Z",  # Dec 24 local
        "2026-12-28T04:30:00Z",  # Dec 27 local
    ]


def test_excluding_a_day_with_a_dst_gap_and_a_per_second_cron_is_cheap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every second, with New York's spring-forward day excluded: the search jumps to the next
    # local midnight instead of stepping through 82,800 excluded occurrences.
    s = compile_schedule(
        cron="* * * * * *", tz="America/New_York", dst="cron", exclude_dates=[date(2026, 3, 8)]
    )
    counter = _Counter(monkeypatch)
    # Mar 8 00:00 EST = 05:00Z; Mar 9 00:00 EDT = 04:00Z.
    assert next_after(s, ms("2026-03-08T04:59:59Z")) == ms("2026-03-09T04:00:00Z")
    assert latest_at_or_before(s, ms("2026-03-09T03:59:59Z")) == ms("2026-03-08T04:59:59Z")
    assert counter.months <= 8


def test_catch_up_passes_over_excluded_dates() -> None:
    s = compile_schedule(cron="0 12 * * *", exclude_dates=[date(2026, 6, 2)])
    got = catch_up(
        s,
        policy="all",
        max_catch_up=10,
        first_missed_ms=ms("2026-06-01T12:00:00Z"),
        now_ms=ms("2026-06-03T13:00:00Z"),
    )
    assert got == CatchUp(
        (ms("2026-06-01T12:00:00Z"), ms("2026-06-03T12:00:00Z")), ms("2026-06-04T12:00:00Z"), False
    )
    # The pending occurrence itself fell on a date excluded after it was computed: it is
    # replaced by the next allowed one, or by nothing if that is still ahead.
    assert catch_up(
        s,
        policy="coalesce",
        max_catch_up=10,
        first_missed_ms=ms("2026-06-02T12:00:00Z"),
        now_ms=ms("2026-06-02T12:05:00Z"),
    ) == CatchUp((), ms("2026-06-03T12:00:00Z"), False)


def test_exclusion_dates_are_for_cron_only() -> None:
    with pytest.raises(ValidationError) as err:
        compile_schedule(every_ms=1000, exclude_dates=[date(2026, 1, 1)])
    assert err.value.path == "job.exclude_dates"
    base = compile_schedule(cron="0 0 * * *")
    assert excluding(base, []) is base
    assert excluding(base, [date(2026, 1, 1)]).exclude_dates == {date(2026, 1, 1)}
    assert excluding(base, [date(2026, 1, 1)]) != base


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    window=dst_windows(),
    expr=local_expressions(),
    dst=st.sampled_from(["skip", "cron"]),
    offsets=st.sets(st.integers(-2, 2), max_size=3),
)
def test_exclusions_drop_exactly_the_excluded_local_dates(
    window: tuple[str, int, int, int], expr: str, dst: str, offsets: set[int]
) -> None:
    """Against the same schedule without exclusions, filtered by local date: around DST
    changes, where local days are 23 or 25 hours long."""
    zone, t, _before, _after = window
    lo, hi = (t - 2 * 86_400) * 1000, (t + 2 * 86_400) * 1000
    plain = compile_schedule(cron=expr, tz=zone, dst=dst)  # type: ignore[arg-type]
    centre = datetime.fromtimestamp(t, ZoneInfo(zone)).date()
    excluded = {centre + timedelta(days=k) for k in offsets}
    s = excluding(plain, excluded)

    def within(sched: Schedule) -> list[int]:
        out = []
        u = next_after(sched, lo)
        while u is not None and u <= hi:
            out.append(u)
            u = next_after(sched, u)
        return out

    want = [
        u
        for u in within(plain)
        if datetime.fromtimestamp(u // 1000, ZoneInfo(zone)).date() not in excluded
    ]
    assert within(s) == want
    for prev, cur in pairwise(want):
        assert latest_at_or_before(s, cur) == cur
        assert latest_at_or_before(s, cur - 1) == prev


# --- the compiled-schedule and zone caches ----------------------------------------------------

TWENTY_ZONES = ("UTC", "Europe/London", "Europe/Berlin", "Europe/Moscow", "Africa/Cairo",
                "Africa/Lagos", "Asia/Kolkata", "Asia/Shanghai", "Asia/Tokyo", "Asia/Dubai",
                "Asia/Singapore", "Australia/Sydney", "Pacific/Auckland", "America/New_York",
                "America/Chicago", "America/Denver", "America/Los_Angeles", "America/Sao_Paulo",
                "America/Mexico_City", "Pacific/Honolulu")


def test_a_recurrence_compiled_twice_is_the_same_schedule() -> None:
    days = [date(2027, 1, 1), date(2027, 12, 25)]
    first = compile_schedule(cron="0 9 * * 1-5", tz="Europe/Berlin", exclude_dates=days)
    again = compile_schedule(cron="0 9 * * 1-5", tz="Europe/Berlin",
                             exclude_dates=frozenset(days))
    assert again is first
    other = compile_schedule(cron="0 9 * * 1-5", tz="Europe/Paris", exclude_dates=days)
    assert other is not first and other.zone.key == "Europe/Paris"


def test_a_long_exclusion_list_is_compiled_but_not_kept() -> None:
    many = [date(2027, 1, 1) + timedelta(days=2 * i)
            for i in range(recurrence.CACHED_EXCLUDE_DATES + 1)]
    first = compile_schedule(cron="0 9 * * *", tz="UTC", exclude_dates=many)
    again = compile_schedule(cron="0 9 * * *", tz="UTC", exclude_dates=many)
    assert again == first and again is not first
    assert again.exclude_dates == frozenset(many)


def test_the_cache_never_lets_a_bool_or_float_stand_for_an_int() -> None:
    assert compile_schedule(every_ms=1).every_ms == 1  # cached first
    with pytest.raises(ValidationError) as err:
        compile_schedule(every_ms=True)  # type: ignore[arg-type]  # equal to 1, and hashes so
    assert err.value.path == "job.every"
    compile_schedule(every_ms=60_000, start_ms=0)
    with pytest.raises(ValidationError):
        compile_schedule(every_ms=60_000, start_ms=0.0)  # type: ignore[arg-type]


def test_input_the_cache_cannot_hash_gets_the_same_error() -> None:
    with pytest.raises(ValidationError) as err:
        compile_schedule(cron=["0", "9", "*", "*", "*"])  # type: ignore[arg-type]
    assert (err.value.path, err.value.rule) == ("job.cron", "must be a string")


def test_a_mix_of_more_zones_than_zoneinfo_keeps_loads_each_zone_once() -> None:
    loaded = [weakref.ref(compile_schedule(cron="0 0 * * *", tz=tz).zone)
              for tz in TWENTY_ZONES]
    gc.collect()  # ZoneInfo itself keeps only its last eight zones alive
    assert all(ref() is not None for ref in loaded)
    again = [compile_schedule(cron="30 0 * * *", tz=tz).zone for tz in TWENTY_ZONES]
    assert all(ref() is zone for ref, zone in zip(loaded, again, strict=True))
