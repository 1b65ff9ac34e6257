"""Durations on the wire: `90s`, `15m`, `1h30m`, `2d`, `500ms`, `0s`.

Grammar: one or more `<digits><unit>` parts, units from `d h m s ms`, each at most once and in
descending order, no signs, no spaces, no fractions. Values are milliseconds internally.
"""

from __future__ import annotations

import re
from functools import lru_cache

from chronowheel.errors import ValidationError

UNITS: tuple[tuple[str, int], ...] = (
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
)
_RANK = {unit: rank for rank, (unit, _) in enumerate(UNITS)}
_MS = dict(UNITS)

# Largest accepted duration: fits a signed 64-bit integer (Cassandra bigint, Kafka headers).
MAX_DURATION_MS = 2**63 - 1

# ASCII digits only: `\d` and int() would also accept other scripts' digits.
_PART = re.compile(r"([0-9]+)([A-Za-z]+)")
# The same grammar as one regular expression, as the JSON Schema spells it (plus minLength 1).
DURATION_PATTERN = r"^(?:[0-9]+d)?(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?(?:[0-9]+ms)?$"


def parse_duration(text: str, *, path: str = "duration") -> int:
    """Milliseconds of `text`; raises ValidationError naming `path` on anything off-grammar."""
    if not isinstance(text, str):
        raise ValidationError(path, "must be a duration string like '90s' or '1h30m'", text)
    if text == "":
        raise ValidationError(path, "must not be empty (use '0s' for zero)", text)
    if text.startswith("-"):
        raise ValidationError(path, "must not be negative", text)
    total = 0
    pos = 0
    last_rank = -1
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        digits, unit = match.groups()
        if unit not in _RANK:
            raise ValidationError(path, f"unknown unit {unit!r} (units: d, h, m, s, ms)", text)
        rank = _RANK[unit]
        if rank == last_rank:
            raise ValidationError(path, f"unit {unit!r} appears more than once", text)
        if rank < last_rank:
            raise ValidationError(path, "units must go from largest to smallest (d h m s ms)", text)
        last_rank = rank
        if len(digits) > 20:  # beyond any 64-bit value; also keeps int() off huge strings
            raise ValidationError(path, "too large", text)
        total += int(digits) * _MS[unit]
        pos = match.end()
    if pos != len(text):
        rest = text[pos:]
        if not rest.isascii():
            rule = "only ASCII digits 0-9 and the units d, h, m, s, ms are allowed"
        elif rest.isdigit():
            rule = "every number needs a unit (d, h, m, s, ms)"
        else:
            rule = "expected parts like '90s', '15m', '1h30m', '2d' or '500ms'"
        raise ValidationError(path, rule, text)
    if total > MAX_DURATION_MS:
        raise ValidationError(path, "too large", text)
    return total


def format_duration(ms: int) -> str:
    """The shortest string that parses back to `ms` (ties go to larger units): 90_000 -> '90s'."""
    if isinstance(ms, bool) or not isinstance(ms, int):
        raise TypeError(f"duration must be an int of milliseconds, got {type(ms).__name__}")
    if ms < 0:
        raise ValueError(f"duration must not be negative, got {ms}")
    if ms == 0:
        return "0s"
    return _shortest(0, ms)[1]


@lru_cache(maxsize=4096)
def _shortest(index: int, rest: int) -> tuple[int, str]:
    """(length, text) of the shortest spelling of `rest` using UNITS[index:].

    Only a few amounts per unit need trying. Among amounts with the same number of digits the
    largest is best: it leaves the least for the smaller units, and a larger remainder (larger
    by a multiple of this unit) never spells shorter, since any spelling of it can be turned into
    one of the smaller remainder by only lowering amounts. So: none, the greedy amount, and
    9, 99, 999, ... below it.
    """
    unit, size = UNITS[index]
    if index == len(UNITS) - 1:
        text = f"{rest}{unit}" if rest else ""
        return len(text), text
    most = rest // size
    candidates = {0, most}
    nines = 9
    while nines < most:
        candidates.add(nines)
        nines = nines * 10 + 9
    best: tuple[int, str] | None = None
    # Larger amounts first, so that on equal length the larger unit wins.
    for amount in sorted(candidates, reverse=True):
        tail_len, tail = _shortest(index + 1, rest - amount * size)
        head = f"{amount}{unit}" if amount else ""
        length = len(head) + tail_len
        if best is None or length < best[0]:
            best = (length, head + tail)
    assert best is not None  # the candidate set is never empty
    return best
