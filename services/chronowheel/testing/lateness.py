"""Lateness of occurrences observed somewhere in the pipeline (a read_committed receive, a
handler start): percentiles, early, duplicate and missing occurrences.

Lateness is the observation time minus the occurrence's scheduled instant (`cw-scheduled-at`),
both on this machine's wall clock, in milliseconds. A duplicate is counted but not measured a
second time; an early observation is counted on every delivery.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Summary = dict[str, float | int | None]


def percentile(ascending: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of an ascending sequence; None when empty."""
    if not ascending:
        return None
    rank = max(1, math.ceil(q / 100 * len(ascending)))
    return float(ascending[min(rank, len(ascending)) - 1])


def summarize(values: Iterable[float]) -> Summary:
    """n, p50, p95, p99 and max of some values."""
    v = sorted(values)
    return {"n": len(v), "p50": percentile(v, 50), "p95": percentile(v, 95),
            "p99": percentile(v, 99), "max": v[-1] if v else None}


@dataclass
class GroupTally:
    """The first observation of each occurrence of one group (a phase, the herd, ...)."""

    lateness_ms: list[float] = field(default_factory=list)
    """observation time - scheduled instant"""
    fired_lateness_ms: list[float] = field(default_factory=list)
    """cw-fired-at - scheduled instant, for observations that carry it"""
    last_observed_ms: float | None = None
    last_fired_ms: int | None = None

    @property
    def count(self) -> int:
        return len(self.lateness_ms)

    def percentile(self, q: float) -> float | None:
        return percentile(sorted(self.lateness_ms), q)


@dataclass
class LatenessTally:
    """Observations of occurrences (by `cw-occurrence`), grouped as the caller says."""

    seen: Counter[str] = field(default_factory=Counter)
    groups: dict[str, GroupTally] = field(default_factory=dict)
    deliveries: int = 0
    early_observed: int = 0
    """deliveries observed before their scheduled instant"""
    early_fired: int = 0
    """deliveries whose cw-fired-at is before their scheduled instant"""
    early: int = 0
    """deliveries early by either"""

    def observe(self, occurrence: str, scheduled_ms: int, observed_ms: float, *,
                fired_ms: int | None = None, group: str = "") -> bool:
        """Count one delivery; return whether it is the occurrence's first."""
        self.deliveries += 1
        early_observed = observed_ms < scheduled_ms
        early_fired = fired_ms is not None and fired_ms < scheduled_ms
        self.early_observed += early_observed
        self.early_fired += early_fired
        self.early += early_observed or early_fired
        self.seen[occurrence] += 1
        if self.seen[occurrence] > 1:
            return False
        g = self.groups.get(group)
        if g is None:
            g = self.groups[group] = GroupTally()
        g.lateness_ms.append(observed_ms - scheduled_ms)
        if g.last_observed_ms is None or observed_ms > g.last_observed_ms:
            g.last_observed_ms = observed_ms
        if fired_ms is not None:
            g.fired_lateness_ms.append(float(fired_ms - scheduled_ms))
            if g.last_fired_ms is None or fired_ms > g.last_fired_ms:
                g.last_fired_ms = fired_ms
        return True

    @property
    def distinct(self) -> int:
        return len(self.seen)

    @property
    def duplicates(self) -> int:
        """Deliveries beyond the first of each occurrence."""
        return self.deliveries - len(self.seen)

    def group(self, name: str = "") -> GroupTally:
        return self.groups.get(name) or GroupTally()

    def count(self, group: str) -> int:
        g = self.groups.get(group)
        return 0 if g is None else g.count

    def lateness_ms(self, *groups: str) -> list[float]:
        """First-delivery lateness of the named groups (all groups when none is named)."""
        names = groups or tuple(self.groups)
        return [x for name in names for x in self.group(name).lateness_ms]

    def percentile(self, q: float, *groups: str) -> float | None:
        return percentile(sorted(self.lateness_ms(*groups)), q)

    def summary(self, *groups: str) -> Summary:
        return summarize(self.lateness_ms(*groups))

    def missing(self, expected: Iterable[str]) -> list[str]:
        """The expected occurrences never observed, in the order given."""
        return [o for o in expected if o not in self.seen]
