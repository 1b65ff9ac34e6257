"""Text formatting shared by the CLI and the console: instants, durations, counts, aligned
tables."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000))


def rfc3339(epoch_ms: int) -> str:
    """UTC RFC 3339 with milliseconds: 2026-12-01T09:00:00.000Z (always the same width)."""
    moment = datetime.fromtimestamp(epoch_ms // 1000, UTC).replace(
        microsecond=epoch_ms % 1000 * 1000)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def human_ms(ms: int) -> str:
    """A short duration for people: 850ms, 4.2s, 3m05s, 2h10m, 3d4h (sign kept)."""
    if ms < 0:
        return "-" + human_ms(-ms)
    if ms < 1_000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    # Two units are enough to read at a glance; the rest is truncated, not rounded up.
    for i, (unit, size) in enumerate(_UNITS):
        if ms >= size:
            major, rest = divmod(ms, size)
            if i + 1 < len(_UNITS):
                minor_unit, minor_size = _UNITS[i + 1]
                width = 2 if minor_unit in ("m", "s") else 1
                return f"{major}{unit}{rest // minor_size:0{width}d}{minor_unit}"
            return f"{major}{unit}"
    raise AssertionError("unreachable")  # ms >= 60_000 always matches a unit


def relative(target_ms: int, now_ms: int) -> str:
    """'in 5m03s', '2.0s ago' or 'now' (within a millisecond)."""
    delta = target_ms - now_ms
    if delta == 0:
        return "now"
    return f"in {human_ms(delta)}" if delta > 0 else f"{human_ms(-delta)} ago"


def count(n: int) -> str:
    return f"{n:,}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]],
          right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell, two spaces apart; columns in `right` are
    right-aligned (numbers). No trailing spaces."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in (headers, *rows):
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                 for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
