"""The fault suite's tools that need no server: sizes, the bad-input generator, the verdict
and the recovery measure."""

from __future__ import annotations

import pytest
from chronowheel.core import wire
from chronowheel.core.model import ValidationPolicy, parse_command
from chronowheel.errors import ValidationError
from chronowheel.settings import Settings
from chronowheel.testing import Fired
from chronowheel.testing.chaos import Checker, Load, ScenarioResult, bad_commands, chaos_scale


def test_the_scale_defaults_to_a_twentieth_and_rejects_nonsense() -> None:
    assert chaos_scale({}) == 0.05
    assert chaos_scale({"CHRONOWHEEL_CHAOS_SCALE": "1"}) == 1.0
    for bad in ("0", "-1", "lots", "11"):
        with pytest.raises(ValueError, match="CHRONOWHEEL_CHAOS_SCALE"):
            chaos_scale({"CHRONOWHEEL_CHAOS_SCALE": bad})
    assert Load.at_scale(1.0).herd == 20_000 and Load.at_scale(1.0).rate == 400
    small = Load.at_scale(0.01)
    assert (small.rate, small.herd) == (40, 1_000)  # floors keep a scenario meaningful


def test_every_generated_bad_command_is_refused_and_they_vary() -> None:
    policy = ValidationPolicy(namespace="acme")
    made = list(bad_commands(2_000, policy, prefix="f-", at_ms=1_800_000_000_000))
    assert len(made) == 2_000
    assert made == list(bad_commands(2_000, policy, prefix="f-", at_ms=1_800_000_000_000))
    reasons = set()
    for key, value in made:
        with pytest.raises(ValidationError) as caught:
            parse_command(value, key=key, policy=policy, now_ms=1_799_999_000_000)
        reasons.add(caught.value.path)
    # Broken bytes, missing and mistyped fields, bad keys, unknown fields, limits, ...
    assert {"$", "v", "op", "key", "job.at", "job.id"} <= reasons
    assert len(reasons) >= 10


def fired(job_id: str, scheduled: int, received: float) -> Fired:
    return Fired("acme.fired", 0, 0, job_id.encode(), b"{}", {
        wire.JOB_ID: job_id, wire.SCHEDULED_AT: str(scheduled), wire.FIRED_AT: str(scheduled),
        wire.ATTEMPT: "1", wire.OCCURRENCE: wire.occurrence_id(job_id, scheduled)}, received)


def test_recovery_is_the_last_steady_arrival_over_the_late_bar_after_the_fault() -> None:
    checker = Checker(Settings(namespace="acme"), herd_prefix="x-h")
    for i in range(100):  # before the fault at 10,000: 100 ms late
        checker.observe(fired(f"x-s{i}", 1_000 + i, 1_100 + i))
    checker.observe(fired("x-s-slow", 10_500, 14_500))  # 4 s late, arrived at 14,500
    checker.observe(fired("x-s-ok", 11_000, 11_300))  # under the 1 s bar
    checker.observe(fired("x-h1", 10_200, 30_000))  # the herd does not count for recovery
    checker.observe(fired("x-s-ok", 11_000, 11_400))  # a duplicate
    before, after, bar, recovery = checker.recovery(fault_ms=10_000, late_ms=1_000)
    assert before == 100 and bar == 1_000
    assert after == 4_000
    assert recovery == pytest.approx(4.5)
    assert checker.tally.duplicates == 1 and checker.tally.early == 0
    # A slow machine's usual lateness raises the bar: 2 x the p99 before the fault.
    assert checker.recovery(fault_ms=10_000, late_ms=50)[2] == 200


def test_the_verdict_names_every_problem() -> None:
    clean = ScenarioResult("s", "load", accepted=10)
    assert clean.problems() == []
    assert "| s | load | 10 | 0 | 0 | 0 |" in clean.row()
    bad = ScenarioResult("s", "load", accepted=10, lost=2, early=1, duplicates=3,
                         lost_examples=["a@1", "b@2"])
    problems = " ".join(bad.problems())
    assert "2 accepted occurrences never arrived" in problems and "a@1" in problems
    assert "1 deliveries before" in problems and "3 duplicate" in problems
    assert ScenarioResult("s", "load").problems() == [
        "no job was accepted: the scenario measured nothing"]
