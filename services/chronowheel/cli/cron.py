"""`chronowheel cron next`: list when a cron expression fires, as the node would compute it."""

from __future__ import annotations

import argparse
import re
import time
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

from chronowheel.core.recurrence import compile_schedule, occurrences
from chronowheel.errors import ValidationError

MAX_COUNT = 10_000

_RFC3339 = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt](?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d+))?"
    r"(?P<offset>[Zz]|[+-]\d{2}:\d{2})"
)


def parse_instant(text: str) -> tuple[int, bool]:
    """RFC 3339 (offset required, any fraction) to (epoch ms rounded down, had a sub-ms part).

    The flag matters for --inclusive: an instant between two milliseconds cannot itself be an
    occurrence, so "at or after" it means "after" its rounded-down millisecond.
    """
    m = _RFC3339.fullmatch(text.strip())
    if m is None:
        raise ValidationError(
            "--after", "must be an RFC 3339 time with offset, like 2026-03-29T01:30:00Z", text
        )
    offset = m["offset"].upper()
    try:
        base = datetime.fromisoformat(f"{m['date']}T{m['time']}")
        if offset == "Z":
            tz = UTC
        else:
            hours, minutes = int(offset[1:3]), int(offset[4:6])
            if minutes > 59:
                raise ValueError("offset minutes out of range")
            delta = timedelta(hours=hours, minutes=minutes)
            tz = timezone(-delta if offset[0] == "-" else delta)
    except ValueError as exc:
        raise ValidationError("--after", f"not a valid date and time ({exc})", text) from None
    frac = m["frac"] or ""
    whole_ms = int(base.replace(tzinfo=tz).timestamp()) * 1000
    return whole_ms + int(frac[:3].ljust(3, "0")), bool(frac[3:].strip("0"))


def format_instant(epoch_ms: int, zone: ZoneInfo) -> str:
    """RFC 3339 with the zone's offset at that instant; milliseconds only when non-zero."""
    local = datetime.fromtimestamp(epoch_ms // 1000, zone)
    local = local.replace(microsecond=epoch_ms % 1000 * 1000)
    offset = local.utcoffset()
    if offset is None or offset % timedelta(minutes=1):
        # Local mean time (before ~1900) has offsets with seconds, which RFC 3339 cannot show.
        local = local.astimezone(UTC)
    return local.isoformat(timespec="milliseconds" if epoch_ms % 1000 else "seconds")


def cmd_next(args: argparse.Namespace) -> int:
    schedule = compile_schedule(cron=args.expr, tz=args.tz, dst=args.dst,
                                exclude_dates=args.exclude_date or ())
    if args.after is None:
        after, sub_ms = time.time_ns() // 1_000_000, False
    else:
        after, sub_ms = parse_instant(args.after)
    inclusive = args.inclusive and not sub_ms
    for u in occurrences(schedule, after, args.count, inclusive=inclusive):
        print(format_instant(u, schedule.zone))
    return 0


def _date(text: str) -> date:
    try:
        if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text):
            raise ValueError("not YYYY-MM-DD")
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date like 2026-12-25: {text!r}") from None


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= n <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_COUNT}")
    return n


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "cron",
        help="evaluate cron expressions the way the scheduler does",
        description="Evaluate cron expressions in an IANA zone with the scheduler's DST rules.",
    )
    actions = parser.add_subparsers(dest="cron_command", metavar="ACTION", required=True)
    nxt = actions.add_parser(
        "next",
        help="print the next occurrences of an expression",
        description=(
            "Print the next occurrences of EXPR strictly after --after (default: now), one "
            "RFC 3339 instant per line with the zone's UTC offset at that instant."
        ),
    )
    nxt.add_argument("expr", metavar="EXPR", help='cron expression, e.g. "0 9 * * 1-5"')
    nxt.add_argument("--tz", default="UTC", help="IANA zone the expression is read in (UTC)")
    nxt.add_argument(
        "--after",
        metavar="INSTANT",
        help="RFC 3339 time with offset, fractions allowed (default: now)",
    )
    nxt.add_argument("--count", type=_count, default=5, metavar="N", help="how many (5)")
    nxt.add_argument(
        "--dst",
        choices=("skip", "cron"),
        default="skip",
        help="daylight-saving policy, as the job's `dst` field (skip)",
    )
    nxt.add_argument(
        "--exclude-date", action="append", type=_date, metavar="YYYY-MM-DD",
        help="a local date (in --tz) to skip, as a job's exclude_dates (repeatable)")
    nxt.add_argument(
        "--inclusive", action="store_true", help="INSTANT itself counts if it is an occurrence"
    )
    nxt.set_defaults(func=cmd_next)
