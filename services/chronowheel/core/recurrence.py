"""Recurrence: when does a recurring job fire next?

A job recurs either by a cron expression evaluated in an IANA zone or by a fixed interval. All
instants are UTC epoch milliseconds; only the next occurrence is ever materialised, so every
function here answers "what comes after t" (or "what was the last one at or before t") directly,
without walking the occurrences in between.

Cron syntax: 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first;
macros @yearly @annually @monthly @weekly @daily @midnight @hourly; month names JAN-DEC and
weekday names SUN-SAT (any case); `*`, `?` (day fields only, same as `*`), ranges `a-b`, steps
`*/n` `a-b/n` `a/n`, lists `a,b`; 0 and 7 are both Sunday.
- A range whose start is after its end wraps around: `22-2` (hours 22, 23, 0, 1, 2), `FRI-MON`,
  `NOV-FEB`, `28-3` in day-of-month (28th to 31st, whichever exist, then 1st to 3rd); a step
  counts along the wrapped run (`22-2/2` is 22, 0, 2).
- Day-of-month: `L` (last day), `L-n` (n days before the last, n 1-30), `nW` (the weekday
  nearest the n-th, never leaving the month), `LW` and `L-nW` (the weekday nearest those). A
  day the month lacks matches nothing that month (`31W` in April, `L-29` in February).
- Day-of-week: `5L` / `FRIL` (last Friday), `MON#2` (second Monday).
- Day-of-month and day-of-week combine as in Vixie cron and cronie: if either field's first
  character is `*` (or `?`) a day must match both fields, otherwise it matches when either
  field matches. The test is on the first character, so `*/10` counts as a star although it
  restricts: `0 0 */10 * MON` is a Monday that is the 1st, 11th, 21st or 31st, while
  `0 0 1-31/10 * MON` is any of those days or any Monday.
Other dialects' syntax is rejected with a reason naming it: `H` (Jenkins), a seventh (year)
field (Quartz), `@reboot`, `@every`, and `L`, `W`, `#` outside the fields that define them.

Daylight saving time (docs/design.md, section "Recurrence and DST") is handled here explicitly
rather than by a library: wall times are searched in local time and then mapped to instants, and
the mapping applies the job's policy:

- ``skip``: a wall time that does not exist (spring-forward gap) does not fire; one that occurs
  twice (fall back) fires once, at its first instant.
- ``cron``: for a fixed-time expression (neither the minute nor the hour field starts with `*`;
  the seconds field is not considered, so `0 30 2 * * *` behaves like `30 2 * * *`) a wall time
  in a gap fires once, at the first instant after the gap, and a repeated one fires once, at
  its first instant. Any other expression
  follows elapsed time: gap times do not fire, repeated times fire in both passes.
  Unlike Vixie cron, which stops doing this for clock jumps of 3 hours or more, the rule
  applies to every gap, including a whole skipped day (Pacific/Apia, 2011-12-30).

An interval (`every`) is anchored at `start` if given, else at the Unix epoch, so that "every
15m" lands on UTC quarter hours whenever it is submitted (which keeps re-submits identical); it
ignores zones and DST.

Bounds: occurrences lie in [start, end], both ends inclusive, and never before
1970-01-01T00:00:00Z or after 9999-01-01T00:00:00Z.

Exclusion dates (cron only): a schedule may carry local dates of its zone on which nothing
fires (holidays, from the job's `exclude_dates` and its named calendar). They are part of the
search, so "the next occurrence" is the next one on a date not excluded, and the catch-up
policies count only occurrences on dates not excluded.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from calendar import monthrange
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from functools import lru_cache
from itertools import pairwise
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from chronowheel.errors import ValidationError

# Defined here rather than imported from core.model: the model's parser imports this module.
DstPolicy = Literal["skip", "cron"]
CatchUpPolicy = Literal["coalesce", "all", "skip"]

MIN_MS = 0
# Occurrences stop here, a year below datetime's ceiling, so zone offsets and searches near
# the end never overflow. start/end may still be given up to MAX_INSTANT_MS.
MAX_MS = 253_370_764_800_000  # 9999-01-01T00:00:00Z
MAX_INSTANT_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last RFC 3339 instant
_MAX_SEC = MAX_MS // 1000
_MIN_YEAR = 1969  # wall times west of UTC at the epoch fall in 1969
_MAX_YEAR = 9999
_MAX_EXPR_CHARS = 1024

_EPOCH = datetime(1970, 1, 1)
_FIRST_DAY = date(_MIN_YEAR + 1, 1, 1)
_SEC = timedelta(seconds=1)

# How a schedule maps wall times to instants (see the module docstring).
_SKIP, _FIXED, _ELAPSED = 0, 1, 2


# --------------------------------------------------------------------------------------------
# Cron expression parsing


_MACROS = {
    "@YEARLY": "0 0 1 1 *",
    "@ANNUALLY": "0 0 1 1 *",
    "@MONTHLY": "0 0 1 * *",
    "@WEEKLY": "0 0 * * 0",
    "@DAILY": "0 0 * * *",
    "@MIDNIGHT": "0 0 * * *",
    "@HOURLY": "0 * * * *",
}
_MONTHS = {
    name: i + 1
    for i, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
    )
}
_WEEKDAYS = {name: i for i, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}

_ITEM = re.compile(
    r"(?:(?P<star>[*?])|(?P<lo>[0-9A-Z]+)(?:-(?P<hi>[0-9A-Z]+))?)(?:/(?P<step>[0-9]+))?"
)
_L_FORM = re.compile(r"[0-9]*L(?:-[0-9]*)?W?")
# Day-of-month items beyond plain numbers: `L`, `L-n`, `LW`, `L-nW`, `nW`.
_DOM_SPECIAL = re.compile(r"(?:L(?:-(?P<back>[0-9]+))?|(?P<day>[0-9]+)(?=W))(?P<w>W)?")
_NTH = re.compile(r"(?P<wd>[0-9A-Z]+)#(?P<n>[0-9]+)")
_LAST_WD = re.compile(r"(?P<wd>[0-9A-Z]+)L")


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    lo: int
    hi: int
    names: dict[str, int] | None = None


_SECOND = _Spec("second", 0, 59)
_MINUTE = _Spec("minute", 0, 59)
_HOUR = _Spec("hour", 0, 23)
_DOM = _Spec("day-of-month", 1, 31)
_MONTH = _Spec("month", 1, 12, _MONTHS)
_DOW = _Spec("day-of-week", 0, 7, _WEEKDAYS)  # 7 is Sunday too


def _bad(rule: str, expr: str) -> ValidationError:
    return ValidationError("job.cron", rule, expr)


def _value(spec: _Spec, token: str, expr: str) -> int:
    if token.isdigit() and len(token) <= 4:
        v = int(token)
    elif spec.names is not None and token in spec.names:
        v = spec.names[token]
    else:
        raise _bad(f"{spec.name} field: {token!r} is not a valid value", expr)
    if not spec.lo <= v <= spec.hi:
        raise _bad(f"{spec.name} field: {v} is out of range {spec.lo}-{spec.hi}", expr)
    return v


def _expand(spec: _Spec, item: str, expr: str) -> set[int]:
    """One list item (`*`, `a`, `a-b`, each optionally `/step`) to its set of values.

    A range whose start is after its end wraps around the field: `22-2` in the hour field is
    22, 23, 0, 1, 2 and `FRI-MON` is Friday to Monday; a step counts along the wrapped run, so
    `22-2/2` is 22, 0, 2.
    """
    _reject_unsupported(spec, item, expr)
    m = _ITEM.fullmatch(item)
    if m is None:
        raise _bad(f"{spec.name} field: cannot parse {item!r}", expr)
    if m["star"] == "?" and spec not in (_DOM, _DOW):
        raise _bad(f"{spec.name} field: '?' is only allowed in the day fields", expr)
    step = 1
    if m["step"] is not None:
        step = int(m["step"][:6])
        if step == 0:
            raise _bad(f"{spec.name} field: step must be at least 1", expr)
    if m["star"]:
        # `*` in day-of-week is 0-6: 7 would only repeat Sunday.
        lo, hi = spec.lo, (6 if spec is _DOW else spec.hi)
    else:
        lo = _value(spec, m["lo"], expr)
        if m["hi"] is not None:
            hi = _value(spec, m["hi"], expr)
            if hi < lo:
                return _wrapped(spec, lo, hi, step)
        else:
            # `a/n` means a, a+n, ... up to the field's maximum (as in Quartz and croniter).
            hi = spec.hi if m["step"] is not None else lo
    return set(range(lo, hi + 1, step))


def _wrapped(spec: _Spec, lo: int, hi: int, step: int) -> set[int]:
    """The values of a range that runs past the field's end and on from its start."""
    if spec is _DOW:
        # Weekdays form a cycle of 7 (7 is Sunday again), so `SAT-SUN` and `7-1` both work.
        first, cycle, base = lo % 7, 7, 0
        length = (hi % 7 - first) % 7 + 1
    else:
        first, cycle, base = lo, spec.hi - spec.lo + 1, spec.lo
        length = (hi - lo) % cycle + 1
    return {base + (first - base + i) % cycle for i in range(0, length, step)}


# Syntax some cron dialects have and this one does not: named in the error rather than
# reported as a parse failure, so the submitter learns it is a dialect difference.
_UNSUPPORTED = (
    (re.compile(r"H(\(|$|/)"), "'H' (hashed values, a Jenkins extension) is not supported"),
)


def _reject_unsupported(spec: _Spec, item: str, expr: str) -> None:
    for pattern, rule in _UNSUPPORTED:
        if pattern.match(item):
            raise _bad(f"{spec.name} field: {item!r}: {rule}", expr)
    if spec not in (_DOM, _DOW):
        # Month names contain an L (APR, JUL), so look for L where a number would be.
        if _L_FORM.fullmatch(item):
            raise _bad(
                f"{spec.name} field: {item!r}: 'L' is only allowed in the day fields", expr
            )
        if "#" in item:
            raise _bad(f"{spec.name} field: {item!r}: '#' is only allowed in day-of-week", expr)
        if item.endswith("W"):
            raise _bad(f"{spec.name} field: {item!r}: 'W' is only allowed in day-of-month", expr)
    if spec is _DOM and "#" in item:
        raise _bad(f"{spec.name} field: {item!r}: '#' is only allowed in day-of-week", expr)


def _split(spec: _Spec, text: str, expr: str) -> list[str]:
    items = text.split(",")
    if any(not it for it in items):
        raise _bad(f"{spec.name} field: empty list item in {text!r}", expr)
    return items


def _simple_field(spec: _Spec, text: str, expr: str) -> tuple[int, ...]:
    values: set[int] = set()
    for item in _split(spec, text, expr):
        values |= _expand(spec, item, expr)
    return tuple(sorted(values))


def _nearest_weekday(day: int, ndays: int, wd1: int) -> int:
    """The weekday (Mon-Fri) nearest to `day`, staying inside the month (Quartz's `W`).

    Saturday moves back to Friday and Sunday on to Monday, except that the 1st on a Saturday
    moves on to Monday the 3rd and the last day on a Sunday back to Friday.
    """
    weekday = (wd1 + day - 1) % 7
    if weekday == 6:
        return day - 1 if day > 1 else day + 2
    if weekday == 0:
        return day + 1 if day < ndays else day - 2
    return day


@dataclass(frozen=True, slots=True)
class _DaySpec:
    """Parsed day-of-month and day-of-week fields; `day_table` is what the search uses."""

    dom: frozenset[int]
    dom_weekday: frozenset[int]  # n from `nW`
    dom_from_end: frozenset[int]  # n from `L-n`; `L` is 0
    dom_from_end_weekday: frozenset[int]  # n from `L-nW`; `LW` is 0
    dow: frozenset[int]  # 0 = Sunday
    dow_nth: frozenset[tuple[int, int]]  # (weekday, n) from `wd#n`
    dow_last: frozenset[int]  # weekdays from `wdL`
    both_restrict: bool  # neither field starts with `*`/`?`: Vixie's OR rule applies

    def days(self, ndays: int, wd1: int) -> tuple[int, ...]:
        """Matching days of a month with `ndays` days whose 1st is weekday `wd1` (0 = Sunday)."""
        by_dom = {d for d in self.dom if d <= ndays}
        # A day the month does not have matches nothing, as a plain `31` does in April.
        by_dom |= {_nearest_weekday(d, ndays, wd1) for d in self.dom_weekday if d <= ndays}
        by_dom |= {ndays - n for n in self.dom_from_end if n < ndays}
        by_dom |= {
            _nearest_weekday(ndays - n, ndays, wd1)
            for n in self.dom_from_end_weekday
            if n < ndays
        }
        by_dow = {d for d in range(1, ndays + 1) if (wd1 + d - 1) % 7 in self.dow}
        for wd, n in self.dow_nth:
            d = 1 + (wd - wd1) % 7 + 7 * (n - 1)
            if d <= ndays:
                by_dow.add(d)
        for wd in self.dow_last:
            by_dow.add(ndays - ((wd1 + ndays - 1) - wd) % 7)
        days = (by_dom | by_dow) if self.both_restrict else (by_dom & by_dow)
        return tuple(sorted(days))


def _day_fields(dom_text: str, dow_text: str, expr: str) -> _DaySpec:
    dom: set[int] = set()
    dom_weekday: set[int] = set()
    from_end: set[int] = set()
    from_end_weekday: set[int] = set()
    for item in _split(_DOM, dom_text, expr):
        m = _DOM_SPECIAL.fullmatch(item)
        if m is None:
            if "W" in item or "L" in item:
                raise _bad(
                    f"day-of-month field: {item!r}: 'L' and 'W' take the forms L, L-n, LW, "
                    "L-nW and nW (no ranges or steps with them)",
                    expr,
                )
            dom |= _expand(_DOM, item, expr)
        elif m["day"] is not None:
            dom_weekday.add(_value(_DOM, m["day"], expr))
        else:
            back = 0
            if m["back"] is not None:
                back = int(m["back"][:4])
                if not 1 <= back <= 30:
                    raise _bad(f"day-of-month field: {item!r}: n in L-n must be 1-30", expr)
            (from_end_weekday if m["w"] else from_end).add(back)
    dow: set[int] = set()
    nth: set[tuple[int, int]] = set()
    last: set[int] = set()
    for item in _split(_DOW, dow_text, expr):
        if m := _NTH.fullmatch(item):
            n = int(m["n"][:4])
            if not 1 <= n <= 5:
                raise _bad(f"day-of-week field: {item!r}: occurrence must be 1-5", expr)
            nth.add((_value(_DOW, m["wd"], expr) % 7, n))
        elif m := _LAST_WD.fullmatch(item):
            # `5L` / `FRIL`; a bare `L` would be ambiguous (Quartz reads it as Saturday).
            last.add(_value(_DOW, m["wd"], expr) % 7)
        else:
            if item.endswith("W"):
                raise _bad(
                    f"day-of-week field: {item!r}: 'W' is only allowed in day-of-month", expr
                )
            dow |= {v % 7 for v in _expand(_DOW, item, expr)}
    return _DaySpec(
        dom=frozenset(dom),
        dom_weekday=frozenset(dom_weekday),
        dom_from_end=frozenset(from_end),
        dom_from_end_weekday=frozenset(from_end_weekday),
        dow=frozenset(dow),
        dow_nth=frozenset(nth),
        dow_last=frozenset(last),
        # Vixie cron sets its DOM_STAR / DOW_STAR flags from the field's first character, so
        # `*/10` counts as a star here too, though it restricts the days.
        both_restrict=not (dom_text[0] in "*?" or dow_text[0] in "*?"),
    )


def _month_lengths(month: int) -> tuple[int, ...]:
    return (28, 29) if month == 2 else (30,) if month in (4, 6, 9, 11) else (31,)


@dataclass(frozen=True, slots=True)
class _CronFields:
    """A compiled cron expression: sorted value tuples and a precomputed day table."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: tuple[int, ...]
    # Matching days depend only on the month's length and its first weekday: 4 x 7 entries,
    # indexed (ndays - 28) * 7 + weekday of the 1st (0 = Sunday).
    day_table: tuple[tuple[int, ...], ...]
    fixed_time: bool  # minute and hour fields do not start with `*` (the dst="cron" rule)

    def days(self, year: int, month: int) -> tuple[int, ...]:
        wd1_monday0, ndays = monthrange(year, month)
        return self.day_table[(ndays - 28) * 7 + (wd1_monday0 + 1) % 7]

    def _time_at_or_after(self, h: int, m: int, s: int) -> tuple[int, int, int] | None:
        hs, ms, ss = self.hours, self.minutes, self.seconds
        i = bisect_left(hs, h)
        if i == len(hs):
            return None
        if hs[i] != h:
            return hs[i], ms[0], ss[0]
        j = bisect_left(ms, m)
        if j < len(ms):
            if ms[j] != m:
                return h, ms[j], ss[0]
            k = bisect_left(ss, s)
            if k < len(ss):
                return h, m, ss[k]
            if j + 1 < len(ms):
                return h, ms[j + 1], ss[0]
        if i + 1 < len(hs):
            return hs[i + 1], ms[0], ss[0]
        return None

    def _time_at_or_before(self, h: int, m: int, s: int) -> tuple[int, int, int] | None:
        hs, ms, ss = self.hours, self.minutes, self.seconds
        i = bisect_right(hs, h) - 1
        if i < 0:
            return None
        if hs[i] != h:
            return hs[i], ms[-1], ss[-1]
        j = bisect_right(ms, m) - 1
        if j >= 0:
            if ms[j] != m:
                return h, ms[j], ss[-1]
            k = bisect_right(ss, s) - 1
            if k >= 0:
                return h, m, ss[k]
            if j >= 1:
                return h, ms[j - 1], ss[-1]
        if i >= 1:
            return hs[i - 1], ms[-1], ss[-1]
        return None

    def shortest_gap_s(self) -> int:
        """The shortest wall-clock time between two consecutive matching times of day, in
        seconds, the day's last time counted as followed by the next day's first (as if the
        next day matched too): 1 for `* * * * * *`, 60 for `0,59 0,23 * * *` (23:59, 00:00),
        86,400 for an expression that fires once a day or less often."""
        ss, ms, hs = self.seconds, self.minutes, self.hours
        first = hs[0] * 3600 + ms[0] * 60 + ss[0]
        last = hs[-1] * 3600 + ms[-1] * 60 + ss[-1]
        gaps = [86_400 - last + first]
        gaps += [b - a for a, b in pairwise(ss)]
        # From a minute's last second to the next matching minute's first second.
        gaps += [(b - a) * 60 - (ss[-1] - ss[0]) for a, b in pairwise(ms)]
        # From an hour's last time to the next matching hour's first.
        span = ms[-1] * 60 + ss[-1] - (ms[0] * 60 + ss[0])
        gaps += [(b - a) * 3600 - span for a, b in pairwise(hs)]
        return min(gaps)

    def next_match(self, w: datetime) -> datetime | None:
        """First matching wall time at or after `w` (whole seconds), or None before year 10000.

        Walks months, not seconds: each month costs one table lookup and a bisect, so even a
        rare expression (a leap-day Monday) takes a few hundred steps at most.
        """
        y, mo, d = w.year, w.month, w.day
        hms = (w.hour, w.minute, w.second)
        months = self.months
        while y <= _MAX_YEAR:
            i = bisect_left(months, mo)
            if i == len(months):
                y, mo, d, hms = y + 1, months[0], 1, (0, 0, 0)
                continue
            if months[i] != mo:
                mo, d, hms = months[i], 1, (0, 0, 0)
            days = self.days(y, mo)
            for k in range(bisect_left(days, d), len(days)):
                day = days[k]
                if day == d:
                    t = self._time_at_or_after(*hms)
                else:
                    t = (self.hours[0], self.minutes[0], self.seconds[0])
                if t is not None:
                    return datetime(y, mo, day, *t)
            y, mo = (y + 1, 1) if mo == 12 else (y, mo + 1)
            d, hms = 1, (0, 0, 0)
        return None

    def prev_match(self, w: datetime) -> datetime | None:
        """Last matching wall time at or before `w` (whole seconds), or None before 1969."""
        y, mo, d = w.year, w.month, w.day
        hms = (w.hour, w.minute, w.second)
        months = self.months
        while y >= _MIN_YEAR:
            i = bisect_right(months, mo) - 1
            if i < 0:
                y, mo, d, hms = y - 1, months[-1], 31, (23, 59, 59)
                continue
            if months[i] != mo:
                mo, d, hms = months[i], 31, (23, 59, 59)
            days = self.days(y, mo)
            for k in range(bisect_right(days, d) - 1, -1, -1):
                day = days[k]
                if day == d:
                    t = self._time_at_or_before(*hms)
                else:
                    t = (self.hours[-1], self.minutes[-1], self.seconds[-1])
                if t is not None:
                    return datetime(y, mo, day, *t)
            y, mo = (y - 1, 12) if mo == 1 else (y, mo - 1)
            d, hms = 31, (23, 59, 59)
        return None


@lru_cache(maxsize=4096)
def _parse_cron(expr: str) -> _CronFields:
    """Parse and compile; cached so that a million jobs on "0 9 * * 1-5" share one object."""
    if len(expr) > _MAX_EXPR_CHARS:
        raise _bad(f"longer than {_MAX_EXPR_CHARS} characters", expr[:100])
    text = expr.strip().upper()
    if text.startswith("@"):
        if text == "@REBOOT":
            raise _bad("@reboot is not supported: a scheduler has no boot to run at", expr)
        if text.startswith("@EVERY"):
            raise _bad("unknown macro: @every is not supported, use the job's `every` field", expr)
        if text not in _MACROS:
            raise _bad(f"unknown macro; use one of {', '.join(sorted(_MACROS)).lower()}", expr)
        text = _MACROS[text]
    parts = text.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    elif len(parts) != 6:
        # Quartz's optional year field is the usual source of a seventh field.
        year = "; a seventh (year) field is not supported, use the job's `end`"
        raise _bad(
            "expected 5 fields (minute hour day-of-month month day-of-week)"
            " or 6 with seconds first" + (year if len(parts) == 7 else ""),
            expr,
        )
    sec, minute, hour, dom, month, dow = parts
    days = _day_fields(dom, dow, expr)
    table = tuple(days.days(n, wd1) for n in (28, 29, 30, 31) for wd1 in range(7))
    months = _simple_field(_MONTH, month, expr)
    # Every month length occurs with every first weekday within the 400-year Gregorian cycle,
    # so this decides once and for all whether the expression can ever match.
    if not any(
        table[(n - 28) * 7 + wd1] for m in months for n in _month_lengths(m) for wd1 in range(7)
    ):
        raise _bad("never matches a real date", expr)
    return _CronFields(
        seconds=_simple_field(_SECOND, sec, expr),
        minutes=_simple_field(_MINUTE, minute, expr),
        hours=_simple_field(_HOUR, hour, expr),
        months=months,
        day_table=table,
        fixed_time=not (minute.startswith("*") or hour.startswith("*")),
    )


# --------------------------------------------------------------------------------------------
# Schedules


@dataclass(frozen=True, slots=True)
class Schedule:
    """A compiled, validated recurrence. Build it with `compile_schedule`."""

    cron: str | None
    every_ms: int | None
    tz: str
    start_ms: int | None
    end_ms: int | None
    dst: DstPolicy
    # Derived from the fields above, hence left out of equality and repr.
    fields: _CronFields | None = field(repr=False, compare=False)
    zone: ZoneInfo = field(repr=False, compare=False)
    mode: int = field(repr=False, compare=False)
    # Local dates (in `zone`) on which a cron schedule does not fire: the job's own
    # `exclude_dates` and the dates of its calendar (see `excluding`).
    exclude_dates: frozenset[date] = frozenset()
    # The same dates as sorted runs of consecutive days, (first, last) as proleptic ordinals in
    # two parallel tuples: the search passes a whole run in one step, found by bisection.
    _run_firsts: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    _run_lasts: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        firsts: list[int] = []
        lasts: list[int] = []
        for day in sorted(d.toordinal() for d in self.exclude_dates):
            if lasts and day == lasts[-1] + 1:
                lasts[-1] = day
            else:
                firsts.append(day)
                lasts.append(day)
        object.__setattr__(self, "_run_firsts", tuple(firsts))
        object.__setattr__(self, "_run_lasts", tuple(lasts))

    def excluded_run(self, day: date) -> tuple[date, date] | None:
        """The run of consecutive excluded dates that holds `day`, or None if it is allowed."""
        o = day.toordinal()
        i = bisect_right(self._run_firsts, o) - 1
        if i < 0 or o > self._run_lasts[i]:
            return None
        return date.fromordinal(self._run_firsts[i]), date.fromordinal(self._run_lasts[i])


@dataclass(frozen=True, slots=True)
class CatchUp:
    """What to do when a recurring occurrence is dispatched: fire these scheduled instants now,
    then re-arm at next_ms.

    `coalesced` is True when some missed occurrences are not in `fire` because they were folded
    into the one fired (policy "coalesce" with more than one due, or "all" beyond
    max_catch_up). The "skip" policy folds nothing and reports coalesced=False. `missed` is
    False only for an on-time dispatch after which nothing else was due (the usual case).
    """

    fire: tuple[int, ...]
    next_ms: int | None
    coalesced: bool
    missed: bool = True


def _instant(path: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(path, "must be an integer epoch-milliseconds instant", value)
    if not MIN_MS <= value <= MAX_INSTANT_MS:
        raise ValidationError(
            path, f"epoch milliseconds must be between 0 and {MAX_INSTANT_MS}", value
        )
    return value


def _zone(tz: str) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise ValidationError("job.tz", "must be an IANA time zone name", tz)
    # These two name host configuration, not a zone: nodes could disagree about them.
    if tz in ("localtime", "posixrules"):
        raise ValidationError("job.tz", "must be an IANA time zone name", tz)
    try:
        return _loaded_zone(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValidationError("job.tz", "unknown IANA time zone", tz) from None


@lru_cache(maxsize=1024)
def _loaded_zone(tz: str) -> ZoneInfo:
    # ZoneInfo keeps only 8 zones alive itself; a schedule is dropped once its rows are
    # written, so a mix of more zones read the zone's file again for every job (a tenth of
    # the node's ingest time with 20 % cron jobs in 20 zones). There are about 600 zones.
    return ZoneInfo(tz)


def compile_schedule(
    *,
    cron: str | None = None,
    every_ms: int | None = None,
    tz: str = "UTC",
    start_ms: int | None = None,
    end_ms: int | None = None,
    dst: DstPolicy = "skip",
    exclude_dates: Iterable[date] = (),
) -> Schedule:
    """Validate and compile a recurrence; raises ValidationError naming the offending field.

    `exclude_dates` (cron only) are local dates in `tz` on which nothing fires.

    Compiled schedules are immutable and kept in a bounded cache: many jobs share a recurrence
    (a daily report in each zone), and a job's is compiled when its command is validated and
    again when its rows are written. The cache is typed, so `True` never stands for `1`; input
    it cannot hash (only ever invalid) and schedules with more than `CACHED_EXCLUDE_DATES` of
    their own exclusion dates are compiled uncached.
    """
    dates = exclude_dates if isinstance(exclude_dates, frozenset) else frozenset(exclude_dates)
    if len(dates) > CACHED_EXCLUDE_DATES:
        return _compile(cron, every_ms, tz, start_ms, end_ms, dst, dates)
    try:
        return _compile_cached(cron, every_ms, tz, start_ms, end_ms, dst, dates)
    except TypeError:
        return _compile(cron, every_ms, tz, start_ms, end_ms, dst, dates)


CACHED_EXCLUDE_DATES = 64
"""Schedules with more of their own exclusion dates are not cached: a job may carry up to
1,000, and 4,096 such schedules would keep hundreds of MiB alive."""


@lru_cache(maxsize=4096, typed=True)
def _compile_cached(cron: str | None, every_ms: int | None, tz: str, start_ms: int | None,
                    end_ms: int | None, dst: DstPolicy, exclude_dates: frozenset[date],
                    ) -> Schedule:
    return _compile(cron, every_ms, tz, start_ms, end_ms, dst, exclude_dates)


def _compile(cron: str | None, every_ms: int | None, tz: str, start_ms: int | None,
             end_ms: int | None, dst: DstPolicy, exclude_dates: frozenset[date]) -> Schedule:
    if (cron is None) == (every_ms is None):
        raise ValidationError("job", "exactly one of cron and every is required")
    if every_ms is not None and exclude_dates:
        raise ValidationError("job.exclude_dates", "only allowed with cron")
    zone = _zone(tz)
    if dst not in ("skip", "cron"):
        raise ValidationError("job.dst", "must be 'skip' or 'cron'", dst)
    start = _instant("job.start", start_ms)
    end = _instant("job.end", end_ms)
    if start is not None and end is not None and end < start:
        raise ValidationError("job.end", "must not be before start", end_ms)
    if every_ms is not None:
        if isinstance(every_ms, bool) or not isinstance(every_ms, int) or every_ms <= 0:
            raise ValidationError("job.every", "must be a positive duration", every_ms)
        return Schedule(None, every_ms, tz, start, end, dst, None, zone, _SKIP)
    if not isinstance(cron, str):
        raise ValidationError("job.cron", "must be a string", cron)
    fields = _parse_cron(cron)
    mode = _SKIP if dst == "skip" else _FIXED if fields.fixed_time else _ELAPSED
    return Schedule(cron, None, tz, start, end, dst, fields, zone, mode, frozenset(exclude_dates))


def excluding(s: Schedule, dates: Iterable[date]) -> Schedule:
    """`s` with `dates` excluded too (a calendar's dates added to the job's own)."""
    extra = frozenset(dates) - s.exclude_dates
    if not extra:
        return s
    if s.fields is None:
        raise ValueError("exclusion dates apply to cron schedules only")
    return replace(s, exclude_dates=s.exclude_dates | extra)


def cron_period_ms(s: Schedule) -> int | None:
    """The shortest time a cron schedule allows between two occurrences, read from its
    seconds, minutes and hours fields in wall-clock time (`_CronFields.shortest_gap_s`); at
    most a day. None for an interval."""
    return None if s.fields is None else s.fields.shortest_gap_s() * 1000


def is_excluded(s: Schedule, at_ms: int) -> bool:
    """Whether the instant falls on an excluded date of the schedule's zone."""
    if not s.exclude_dates:
        return False
    return datetime.fromtimestamp(at_ms // 1000, s.zone).date() in s.exclude_dates


def _day_start(zone: ZoneInfo, day: date) -> int:
    """The first instant (epoch seconds) whose local date in `zone` is `day`, or after it.

    A midnight inside a spring-forward gap reads with the offset before the gap, which lands on
    the gap's end: the first instant of the day. Days a zone skipped entirely give the start of
    the next day that exists.
    """
    return int(datetime(day.year, day.month, day.day, tzinfo=zone).timestamp())


# --------------------------------------------------------------------------------------------
# Wall time <-> instant, in whole seconds


def _wall_seconds(w: datetime) -> int:
    """A naive wall time as seconds since 1970-01-01T00:00 on the same wall clock."""
    return (w - _EPOCH) // _SEC


def _wall_at(seconds: int) -> datetime:
    return _EPOCH + timedelta(seconds=seconds)


def _offsets(zone: ZoneInfo, w: datetime) -> tuple[int, int]:
    """UTC offsets (seconds) of wall time w read with fold=0 and fold=1 (PEP 495).

    Equal: w exists once. fold=0 larger: w is repeated (fall back), fold=0 being the first
    pass. fold=0 smaller: w falls in a gap; fold=0 is the offset before it, fold=1 after.
    """
    o0 = zone.utcoffset(w.replace(fold=0))
    o1 = zone.utcoffset(w.replace(fold=1))
    assert o0 is not None and o1 is not None
    return o0 // _SEC, o1 // _SEC


def _offset_at(zone: ZoneInfo, u: int) -> int:
    off = datetime.fromtimestamp(u, zone).utcoffset()
    assert off is not None
    return off // _SEC


def _transition(zone: ZoneInfo, lo: int, hi: int) -> int:
    """The first instant in (lo, hi] whose offset differs from lo's.

    Callers pass the two readings of one gap or repeated wall time, which bracket exactly one
    transition; tzdata transitions fall on whole seconds, so bisecting seconds is exact.
    """
    base = _offset_at(zone, lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset_at(zone, mid) == base:
            lo = mid
        else:
            hi = mid
    return hi


class _Budget:
    """Candidate instants a search may still examine (see `limits.MAX_RECURRENCE_STEPS`)."""

    __slots__ = ("left", "steps")

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.left = steps

    def take(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _Exhausted(self.steps)


class _Exhausted(Exception):
    """A search used up its budget (internal: next_after turns it into a ValidationError)."""


def _cron_next(s: Schedule, a: int, budget: _Budget | None = None) -> int | None:
    """Smallest occurrence (epoch seconds) strictly after a, ignoring start/end."""
    f, zone, mode = s.fields, s.zone, s.mode
    assert f is not None
    local = datetime.fromtimestamp(a, zone)
    w_a = local.replace(tzinfo=None)
    start = w_a + _SEC
    o0, o1 = _offsets(zone, w_a)
    if o0 > o1:
        # a lies inside a fall-back overlap [A, B) of wall time. In instant order the first
        # pass of the whole overlap comes before the second pass, so wall-time order alone
        # would go wrong here.
        ws = _wall_seconds(w_a)
        t = _transition(zone, ws - o0, ws - o1)
        first_a, end_b = _wall_at(t + o1), _wall_at(t + o0)
        if local.fold == 0:
            w = f.next_match(start)
            if w is not None and w < end_b:
                return _wall_seconds(w) - o0
            if mode == _ELAPSED:
                w = f.next_match(first_a)
                if w is not None and w < end_b:
                    return _wall_seconds(w) - o1
        elif mode == _ELAPSED:
            w = f.next_match(start)
            if w is not None and w < end_b:
                return _wall_seconds(w) - o1
        start = end_b
    while True:
        if budget is not None:
            budget.take()
        w = f.next_match(start)
        if w is None:
            return None
        ws = _wall_seconds(w)
        o0, o1 = _offsets(zone, w)
        if min(ws - o0, ws - o1) > _MAX_SEC:
            return None
        if o0 >= o1:
            # Unique, or a repeated time reached from before its overlap: its first pass.
            return ws - o0
        t = _transition(zone, ws - o1, ws - o0)
        if mode == _FIXED:
            return t  # the first instant after the gap
        start = _wall_at(t + o1)  # jump over the rest of the gap in one step


def _cron_prev(s: Schedule, b: int) -> int | None:
    """Largest occurrence (epoch seconds) at or before b, ignoring start/end."""
    f, zone, mode = s.fields, s.zone, s.mode
    assert f is not None
    local = datetime.fromtimestamp(b, zone)
    end = local.replace(tzinfo=None)
    o0, o1 = _offsets(zone, end)
    if o0 > o1 and local.fold == 1:
        # b is in the second pass of an overlap: its own pass first (elapsed mode only), then
        # the whole first pass, which may include wall times later than b's.
        ws = _wall_seconds(end)
        t = _transition(zone, ws - o0, ws - o1)
        first_a, end_b = _wall_at(t + o1), _wall_at(t + o0)
        if mode == _ELAPSED:
            w = f.prev_match(end)
            if w is not None and w >= first_a:
                return _wall_seconds(w) - o1
        end = end_b - _SEC
    while True:
        w = f.prev_match(end)
        if w is None:
            return None
        ws = _wall_seconds(w)
        o0, o1 = _offsets(zone, w)
        if o0 == o1:
            return ws - o0
        if o0 > o1:
            # Repeated: the second pass if it counts and is not after b, else the first.
            if mode == _ELAPSED and ws - o1 <= b:
                return ws - o1
            return ws - o0
        t = _transition(zone, ws - o1, ws - o0)
        if mode == _FIXED:
            return t
        end = _wall_at(t - 1 + o0)  # the last wall second before the gap


# --------------------------------------------------------------------------------------------
# Public queries


def next_after(
    s: Schedule, after_ms: int, *, inclusive: bool = False, max_steps: int | None = None
) -> int | None:
    """The next occurrence strictly after `after_ms` (at or after, if inclusive); None if none.

    O(1) for intervals; for cron, independent of how far `after_ms` is from the previous
    occurrence (the search walks calendar months, never individual occurrences) and of how
    many consecutive dates are excluded (a run of them is one step).

    With `max_steps`, a cron search that examines more candidate instants than that (an
    occurrence on an excluded date, a wall time in a DST gap) raises ValidationError instead
    of going on: what the parser uses to reject a schedule that would hold the event loop.
    """
    a = after_ms - 1 if inclusive else after_ms
    if s.start_ms is not None:
        a = max(a, s.start_ms - 1)
    a = max(a, MIN_MS - 1)
    if a >= MAX_MS:
        return None
    if s.every_ms is not None:
        anchor = s.start_ms if s.start_ms is not None else 0
        u: int | None = anchor + ((a - anchor) // s.every_ms + 1) * s.every_ms
    elif max_steps is None:
        sec = _cron_next_allowed(s, a // 1000)
        u = None if sec is None else sec * 1000
    else:
        try:
            sec = _cron_next_allowed(s, a // 1000, _Budget(max_steps))
        except _Exhausted:
            raise ValidationError(
                "job.exclude_dates" if s.exclude_dates else "job.cron",
                f"the next occurrence is not found within {max_steps} candidate instants "
                "(limits.MAX_RECURRENCE_STEPS): the schedule falls on excluded dates or "
                "skipped local times almost every time it matches",
                s.cron,
            ) from None
        u = None if sec is None else sec * 1000
    if u is None or u > MAX_MS or (s.end_ms is not None and u > s.end_ms):
        return None
    return u


def _cron_next_allowed(s: Schedule, a: int, budget: _Budget | None = None) -> int | None:
    """`_cron_next`, passing over occurrences on excluded dates a whole run of consecutive
    excluded local days at a time (found by bisection, see `Schedule.excluded_run`).

    Each round either leaves a run of excluded days or passes one occurrence (a day whose first
    instant comes before an occurrence dated the day before, as when a clock falls back across
    midnight), so the rounds are bounded by the runs met plus such repeats.
    """
    while True:
        sec = _cron_next(s, a, budget)
        if sec is None or not s.exclude_dates or sec > _MAX_SEC:
            return sec
        run = s.excluded_run(datetime.fromtimestamp(sec, s.zone).date())
        if run is None:
            return sec
        last = run[1]
        if last >= date(_MAX_YEAR, 12, 31):
            return None
        if budget is not None:
            budget.take()
        a = max(sec, _day_start(s.zone, last + timedelta(days=1)) - 1)


def _cron_prev_allowed(s: Schedule, b: int) -> int | None:
    """`_cron_prev`, passing over occurrences on excluded dates (see `_cron_next_allowed`)."""
    while True:
        sec = _cron_prev(s, b)
        if sec is None or not s.exclude_dates:
            return sec
        day = datetime.fromtimestamp(sec, s.zone).date()
        run = s.excluded_run(day)
        if run is None:
            return sec
        # Near the epoch step one day at a time: the dates before 1970 are never excluded, and
        # wall times of 1969 west of UTC are still instants of 1970.
        first = run[0] if run[0] > _FIRST_DAY else day
        if first <= _FIRST_DAY:
            return None
        b = min(sec - 1, _day_start(s.zone, first) - 1)


def latest_at_or_before(s: Schedule, at_ms: int) -> int | None:
    """The last occurrence at or before `at_ms` (within start/end), or None. O(1) like next_after.

    For cron this searches backwards from `at_ms`, so it never visits the occurrences between
    an old pending one and now.
    """
    b = min(at_ms, MAX_MS)
    if s.end_ms is not None:
        b = min(b, s.end_ms)
    lo = s.start_ms if s.start_ms is not None else MIN_MS
    if b < lo:
        return None
    if s.every_ms is not None:
        anchor = s.start_ms if s.start_ms is not None else 0
        return anchor + (b - anchor) // s.every_ms * s.every_ms
    sec = _cron_prev_allowed(s, b // 1000)
    if sec is None or sec * 1000 < lo:
        return None
    return sec * 1000


def occurrences(s: Schedule, after_ms: int, count: int, inclusive: bool = False) -> list[int]:
    """Up to `count` occurrences after `after_ms` (at or after it, if inclusive), in order."""
    out: list[int] = []
    nxt = next_after(s, after_ms, inclusive=inclusive)
    while nxt is not None and len(out) < count:
        out.append(nxt)
        nxt = next_after(s, nxt)
    return out


def catch_up(
    s: Schedule,
    *,
    policy: CatchUpPolicy,
    max_catch_up: int,
    first_missed_ms: int,
    now_ms: int,
    first_on_time: bool = False,
    window_ms: int = 0,
) -> CatchUp:
    """Decide what to fire when the pending occurrence `first_missed_ms` is dispatched at
    `now_ms`, and where the schedule continues.

    `first_missed_ms` is the pending occurrence (the first one an outage or a pause withheld);
    it counts even if the schedule would not produce it (it was materialised under an older
    spec, say).

    Without `first_on_time` (it is more than the grace late) every occurrence in
    [first_missed, now] was missed:
    - coalesce: fire only the latest occurrence at or before now.
    - all: fire every one; if there are more than max_catch_up, fire the first
      max_catch_up - 1 and the latest, and set coalesced.
    - skip: fire none.

    With `first_on_time` (within the grace) it fires, late, whatever the policy; the grace
    is for it alone. The occurrences after it that are already due (scheduled at or before
    `now_ms - window_ms`, so that their slot has passed whatever a flexible window made of
    it) were missed, and the policy decides them: coalesce folds them into the one fired,
    skip drops them, all fires each (max_catch_up in all, as above). With none due (the
    usual case: the job is on schedule) this costs one `next_after`, as the dispatch of an
    occurrence always did.

    next_ms is the first occurrence after what was considered. Costs O(1) for coalesce and
    skip and O(max_catch_up) for all, however long the outage.
    """
    if first_missed_ms > now_ms:
        raise ValueError(f"first_missed_ms {first_missed_ms} is after now_ms {now_ms}")
    if max_catch_up < 1:
        raise ValueError(f"max_catch_up must be at least 1, got {max_catch_up}")
    if policy not in ("coalesce", "all", "skip"):
        raise ValueError(f"unknown catch-up policy {policy!r}")
    if first_on_time:
        return _on_time(s, policy, max_catch_up, first_missed_ms, now_ms - window_ms)
    nxt = next_after(s, now_ms)
    if is_excluded(s, first_missed_ms):
        # Its date was excluded after it was materialised (a calendar gained the date): it
        # does not fire; the first occurrence after it on an allowed date takes its place.
        after = next_after(s, first_missed_ms)
        if after is None or after > now_ms:
            return CatchUp((), nxt, False)
        first_missed_ms = after
    if policy == "skip":
        return CatchUp((), nxt, False)
    if policy == "coalesce":
        prev = latest_at_or_before(s, now_ms)
        latest = first_missed_ms if prev is None else max(prev, first_missed_ms)
        return CatchUp((latest,), nxt, latest != first_missed_ms)
    return _all(s, max_catch_up, first_missed_ms, now_ms, nxt)


def _on_time(s: Schedule, policy: CatchUpPolicy, max_catch_up: int, first: int,
             due_ms: int) -> CatchUp:
    """`catch_up` of an occurrence within the grace; `due_ms`: occurrences scheduled at or
    before it are due (missed)."""
    if is_excluded(s, first):
        # A calendar gained its date after it was computed: it is dropped, and the next
        # allowed occurrence takes its place if due already, or is the next one.
        after = next_after(s, first)
        if after is None or after > due_ms:
            return CatchUp((), after, False, False)
        first = after
    following = next_after(s, first)
    if following is None or following > due_ms:
        return CatchUp((first,), following, False, False)
    if policy == "all":
        return _all(s, max_catch_up, first, due_ms, None)
    return CatchUp((first,), next_after(s, due_ms), policy == "coalesce")


def _all(s: Schedule, max_catch_up: int, first: int, due_ms: int,
         nxt: int | None) -> CatchUp:
    """Policy all: every occurrence from `first` to `due_ms`, at most `max_catch_up` (the
    first max_catch_up - 1 and the latest); `nxt`, if known, is next_after(due_ms)."""
    # Collect one more than allowed: that is how we learn there are too many.
    fire = [first]
    while len(fire) <= max_catch_up:
        u = next_after(s, fire[-1])
        if u is None or u > due_ms:
            return CatchUp(tuple(fire), u, False)
        fire.append(u)
    prev = latest_at_or_before(s, due_ms)
    latest = fire[-1] if prev is None else max(prev, fire[-1])
    return CatchUp((*fire[: max_catch_up - 1], latest),
                   next_after(s, due_ms) if nxt is None else nxt, True)
