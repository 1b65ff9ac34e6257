"""The capacity test's steps, judgement and knee, kept apart from locust (like
locust_support.py) so that they can be tested alone; `locust_capacity.py` drives them.

- the command line: the SLO (`parse_slo`: "p99<250ms"), the mix of commands (`parse_mix`:
  "steady=80,herd=10,horizon=8,cancel=2") and the rates of the steps (`step_rates`);
- a step's figures (`StepStats`, filled while the step's occurrences arrive) and whether it
  held (`verdict`); the ladder (`Ladder`), which says when to stop loading, when the knee is
  known, and which step it is;
- the record of a knee (`knee_record`) with the cluster's size, the date, the code version
  and the command, appended to the knees file (`write_knee`) that `chronowheel capacity
  --cluster ...` reads.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chronowheel.testing.lateness import percentile

KINDS = ("steady", "herd", "horizon", "cancel")
FIRING = ("steady", "herd")
"""the kinds whose jobs fire during the run (horizon jobs are due 1 to 365 days ahead; a
cancel removes one of them)"""
SHORTFALL = 0.9
"""a step whose commands fell short of this share of its rate (and by more than SLACK) was not
the load asked for"""
WARMUP = -1
"""the warm-up's index: before step 0"""
SLACK = 25
"""commands a step may fall short by whatever its rate: the users' fractional credits and the
first users' spawn"""
KNEES_FILE = Path(__file__).resolve().parent / "results" / "knees.json"

_SLO = re.compile(r"^\s*p(\d+(?:\.\d+)?)\s*<=?\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Slo:
    percentile: float
    bound_ms: float

    def __str__(self) -> str:
        return f"p{self.percentile:g} lateness <= {self.bound_ms:g} ms, none early, " \
               f"duplicate or missing"


def parse_slo(text: str) -> Slo:
    """`p99<250ms`, `p99<=0.25s`, `p99.9<1000` (milliseconds when no unit is given)."""
    m = _SLO.match(text)
    if m is None:
        raise ValueError(f"SLO {text!r}: expected pNN<BOUND, e.g. p99<250ms or p99<1s")
    q, bound, unit = float(m[1]), float(m[2]), (m[3] or "ms").lower()
    if not 0 < q <= 100:
        raise ValueError(f"SLO {text!r}: the percentile must be in (0, 100]")
    bound_ms = bound * 1000 if unit == "s" else bound
    if bound_ms <= 0:
        raise ValueError(f"SLO {text!r}: the bound must be positive")
    return Slo(q, bound_ms)


def parse_mix(text: str) -> dict[str, float]:
    """`steady=80,herd=10,horizon=8,cancel=2`: the share of each kind of command (weights,
    normalised to sum to 1; kinds left out get none)."""
    weights = dict.fromkeys(KINDS, 0.0)
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in weights:
            raise ValueError(f"mix {text!r}: expected KIND=WEIGHT with KIND one of "
                             f"{', '.join(KINDS)}")
        try:
            w = float(value)
        except ValueError:
            raise ValueError(f"mix {text!r}: {value.strip()!r} is not a number") from None
        if w < 0 or not math.isfinite(w):
            raise ValueError(f"mix {text!r}: weights must be finite and not negative")
        weights[name] = w
    total = sum(weights.values())
    if sum(weights[k] for k in FIRING) <= 0:
        raise ValueError(f"mix {text!r}: steady or herd must have a share (nothing would fire)")
    if weights["cancel"] > 0 and weights["horizon"] <= 0:
        raise ValueError(f"mix {text!r}: cancels cancel long-horizon jobs; give horizon a share")
    return {k: w / total for k, w in weights.items()}


def step_rates(steps: str | None, start: float, factor: float, ceiling: float) -> list[float]:
    """The rates (commands per second) of the steps: the list given (`500,1000,2000`), else
    start, start × factor, ... up to the ceiling (included)."""
    if steps:
        try:
            rates = [float(s) for s in steps.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"steps {steps!r}: expected rates such as 500,1000,2000") from None
        if not rates or any(r <= 0 for r in rates) or rates != sorted(set(rates)):
            raise ValueError(f"steps {steps!r}: positive rates, rising")
        return rates
    if start <= 0 or factor <= 1 or ceiling < start:
        raise ValueError("steps: need start > 0, factor > 1 and a ceiling >= start")
    out = [float(start)]
    while out[-1] * factor <= ceiling + 1e-9:
        out.append(round(out[-1] * factor, 1))
    return out


def _figures(values: Sequence[float]) -> dict[str, Any]:
    v = sorted(values)
    return {"n": len(v), **{k: None if x is None else round(float(x), 1) for k, x in (
        ("p50", percentile(v, 50)), ("p99", percentile(v, 99)),
        ("max", v[-1] if v else None))}}


@dataclass
class StepStats:
    """What one step did: its commands (by the step in which they were sent) and their
    occurrences, whenever they arrive."""

    index: int
    rate: float
    """commands per second asked for"""
    fire_share: float
    """the share of commands that are steady or herd jobs"""
    warmup: bool = False
    """the warm-up before the first step (index -1): judged like a step, lateness excepted"""
    duration_s: float = 0.0
    sent: int = 0
    submit_failed: int = 0
    expected: set[str] = field(default_factory=set)
    """occurrences of this step's acknowledged jobs"""
    last_due_ms: float = 0.0
    received_ms: list[float] = field(default_factory=list)
    """receive time on Cassandra's clock - cw-scheduled-at, first delivery of each"""
    fired_ms: list[float] = field(default_factory=list)
    """cw-fired-at - cw-scheduled-at"""
    seen: set[str] = field(default_factory=set)
    duplicates: int = 0
    early: int = 0
    missing: int | None = None
    """set when judged: expected occurrences not received by then"""

    def observe(self, occurrence: str, received_late_ms: float, fired_late_ms: float,
                duplicate: bool, early: bool) -> None:
        if early:
            self.early += 1
        if duplicate or occurrence in self.seen:
            self.duplicates += 1
            return
        self.seen.add(occurrence)
        self.received_ms.append(received_late_ms)
        self.fired_ms.append(fired_late_ms)

    def close(self) -> None:
        """Judgement time: what has not arrived is missing."""
        self.missing = len(self.expected - self.seen)

    def figures(self, slo: Slo) -> dict[str, Any]:
        d = self.duration_s
        return {
            "step": self.index, "rate": self.rate, "fires_per_s": round(self.rate
                                                                       * self.fire_share, 1),
            "seconds": round(d, 1), "sent": self.sent,
            "sent_per_s": round(self.sent / d, 1) if d > 0 else None,
            "fires_sent_per_s": round(len(self.expected) / d, 1) if d > 0 else None,
            "submit_failed": self.submit_failed, "expected_fires": len(self.expected),
            "received": len(self.seen), "missing": self.missing,
            "duplicates": self.duplicates, "early": self.early,
            "slo_percentile_ms": None if not self.received_ms else round(
                float(percentile(sorted(self.received_ms), slo.percentile) or 0.0), 1),
            "lateness_ms": {"received": _figures(self.received_ms),
                            "cw_fired_at": _figures(self.fired_ms)},
        }


def verdict(step: StepStats, slo: Slo) -> list[str]:
    """Why the step broke the SLO (empty: it held). Judged once every occurrence of the step
    was due a grace period ago (`close()` first). The warm-up's lateness is not judged (a
    cluster's first seconds of load: connections, caches, compiled code); a lost, early or
    duplicate occurrence breaks it all the same."""
    why: list[str] = []
    if step.missing:
        why.append(f"{step.missing} occurrence(s) missing")
    if step.early:
        why.append(f"{step.early} early")
    if step.duplicates:
        why.append(f"{step.duplicates} duplicate(s)")
    if step.submit_failed:
        why.append(f"{step.submit_failed} submit(s) failed")
    if step.warmup:
        return why
    if step.received_ms:
        late = percentile(sorted(step.received_ms), slo.percentile)
        if late is not None and late > slo.bound_ms:
            why.append(f"p{slo.percentile:g} lateness {late:.1f} ms > {slo.bound_ms:g} ms")
    elif step.expected:
        why.append("nothing received")
    return why


def shortfall(step: StepStats) -> str | None:
    """Why the step was not the load asked for (the load generator, not the cluster), if so."""
    if step.duration_s <= 0:
        return None
    reached = step.sent / step.duration_s
    if reached < SHORTFALL * step.rate and step.rate * step.duration_s - step.sent > SLACK:
        return (f"the load generator sent {reached:,.0f} commands/s of the {step.rate:,.0f} "
                f"asked (add users or locust processes)")
    return None


@dataclass
class Ladder:
    """The steps in order; each is judged when its time comes (in any order: a herd step's
    occurrences fall due later than a steady one's)."""

    rates: list[float]
    slo: Slo
    fire_share: float
    steps: list[StepStats] = field(default_factory=list)
    verdicts: dict[int, list[str]] = field(default_factory=dict)
    """by step index; the warm-up's is WARMUP"""
    short: dict[int, str] = field(default_factory=dict)
    warmup: StepStats | None = None

    def start_warmup(self) -> StepStats:
        """The warm-up, at the first step's rate, before it."""
        self.warmup = StepStats(WARMUP, self.rates[0], self.fire_share, warmup=True)
        return self.warmup

    def start_step(self, index: int) -> StepStats:
        step = StepStats(index, self.rates[index], self.fire_share)
        self.steps.append(step)
        return step

    def started(self) -> list[StepStats]:
        """The warm-up (if any) and the steps begun, in order."""
        return ([self.warmup] if self.warmup is not None else []) + sorted(
            self.steps, key=lambda s: s.index)

    def judge(self, step: StepStats) -> None:
        step.close()
        self.verdicts[step.index] = verdict(step, self.slo)
        why = shortfall(step)
        if why is not None:
            self.short[step.index] = why

    def first_stop(self) -> int | None:
        """The first step that broke the SLO or fell short, among those judged."""
        stops = [i for i, why in self.verdicts.items() if why] + list(self.short)
        return min(stops) if stops else None

    def stop_loading(self) -> bool:
        return self.first_stop() is not None

    def decided(self) -> bool:
        """Every step before the first stop (or every step started) has been judged."""
        stop = self.first_stop()
        started = [s.index for s in self.started()]
        wanted = [i for i in started if stop is None or i <= stop]
        return all(i in self.verdicts for i in wanted)

    def warmup_unjudged(self) -> bool:
        """A warm-up ran and has no verdict (the run ended first): its lost, early and
        duplicate checks never ran, so no knee may be read from the steps after it."""
        return self.warmup is not None and WARMUP not in self.verdicts

    def knee(self) -> StepStats | None:
        """The last step that held before the first that did not (None: not even the first,
        or a warm-up that was not judged)."""
        if self.warmup_unjudged():
            return None
        stop = self.first_stop()
        held = None
        for s in sorted(self.steps, key=lambda s: s.index):
            if stop is not None and s.index >= stop:
                break
            if s.index not in self.verdicts:
                break
            held = s
        return held

    def outcome(self) -> tuple[str, str]:
        """(stopped_by, reason): `slo` (a step or the warm-up broke it: the knee, if there is
        one, is the cluster's),
        `generator` (the load asked for was not sent: the knee is a lower bound), `ceiling`
        (every step held: a lower bound too) or `interrupted` (the run ended before a step
        broke: a lower bound)."""
        stop = self.first_stop()
        if self.warmup_unjudged():
            return "interrupted", "the run ended before the warm-up was judged"
        judged = len([i for i in self.verdicts if i != WARMUP])
        if stop is None and judged < len(self.rates):
            return "interrupted", f"stopped after {judged} of {len(self.rates)} " \
                                  f"steps were judged, all held"
        if stop is None:
            return "ceiling", f"every step up to {self.rates[-1]:g} commands/s held"
        name = "the warm-up" if stop == WARMUP else f"step {stop}"
        if self.verdicts.get(stop):
            return "slo", f"{name} ({self.rates[max(stop, 0)]:g} commands/s): " \
                          + "; ".join(self.verdicts[stop])
        return "generator", f"{name}: {self.short[stop]}"


def knee_record(ladder: Ladder, *, cluster: Mapping[str, int], namespace: str,
                measured_on: str, code: str, command: str, mix: Mapping[str, float],
                step_s: float, lead_s: float, herd_every_s: float) -> dict[str, Any]:
    """What the knees file keeps of one capacity run."""
    stopped_by, reason = ladder.outcome()
    knee = ladder.knee()
    def judged(s: StepStats) -> dict[str, Any]:
        return s.figures(ladder.slo) | {
            "held": not ladder.verdicts.get(s.index) and s.index not in ladder.short,
            "why": ladder.verdicts.get(s.index, [])
            + ([ladder.short[s.index]] if s.index in ladder.short else [])}

    steps = [judged(s) for s in sorted(ladder.steps, key=lambda s: s.index)
             if s.index in ladder.verdicts]
    warm = ladder.warmup
    return {
        "cluster": dict(cluster), "namespace": namespace, "measured_on": measured_on,
        "code": code, "command": command,
        "slo": {"percentile": ladder.slo.percentile, "bound_ms": ladder.slo.bound_ms},
        "mix": {k: round(v, 4) for k, v in mix.items()}, "step_s": step_s, "lead_s": lead_s,
        "herd_every_s": herd_every_s,
        "stopped_by": stopped_by, "reason": reason, "lower_bound": stopped_by != "slo",
        "knee": None if knee is None else knee.figures(ladder.slo),
        "warmup": None if warm is None else judged(warm) if warm.index in ladder.verdicts
        else warm.figures(ladder.slo) | {"held": False, "why": ["not judged"]},
        "steps": steps,
    }


def write_knee(path: Path, record: Mapping[str, Any]) -> None:
    """Append the record to the knees file ({"knees": [...]}, created if missing)."""
    doc: dict[str, Any] = {"knees": []}
    if path.exists():
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("knees"), list):
            raise ValueError(f"{path}: expected {{\"knees\": [...]}}")
    doc["knees"].append(dict(record))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


def describe_knee(record: Mapping[str, Any]) -> str:
    """The report's lines about the knee."""
    k, c = record["knee"], record["cluster"]
    size = (f"{c['nodes']} node(s), {c['shards']} shards, {c['cassandra_nodes']} Cassandra, "
            f"{c['kafka_nodes']} Kafka")
    head = f"capacity: {size}; stopped by {record['stopped_by']}: {record['reason']}"
    warm = record.get("warmup")
    if k is None and warm is not None and not warm["held"]:
        return head + f"\ncapacity: the warm-up did not hold ({'; '.join(warm['why'])}): no knee"
    if k is None:
        return head + "\ncapacity: no step held: no knee"
    r, f = k["lateness_ms"]["received"], k["lateness_ms"]["cw_fired_at"]
    bound = " (a lower bound)" if record["lower_bound"] else ""
    return (f"{head}\ncapacity: knee{bound}: step {k['step']}, {k['rate']:g} commands/s "
            f"({k['sent_per_s']} sent/s), {k['fires_per_s']:g} fires/s; lateness received "
            f"p50 {r['p50']} p99 {r['p99']} max {r['max']} ms, cw-fired-at p50 {f['p50']} "
            f"p99 {f['p99']} max {f['max']} ms; {k['expected_fires']} fires, none missing, "
            f"early or twice")
