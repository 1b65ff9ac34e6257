"""`loadtest/rebalance.py`: the figures of one phase (a shard's pause at the reader, its gap in
the steady window before, the worst lateness of what was due in the phase, moved or stayed) and
the even spread of the jobs over time."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from chronowheel.core import wire
from chronowheel.core.shard import shard_of
from chronowheel.testing.collect import Fired

from tests.unit.loadtest_modules import load

SHARDS = 2


@pytest.fixture(scope="module")
def bench() -> Any:
    return load("rebalance")


def _job_of_shard(shard: int) -> str:
    return next(f"j{i}" for i in range(100) if shard_of(f"j{i}", SHARDS) == shard)


def _fired(shard: int, due: int, received: float) -> Fired:
    job = _job_of_shard(shard)
    headers = {wire.OCCURRENCE: f"{job}@{due}", wire.JOB_ID: job,
               wire.SCHEDULED_AT: str(due), wire.FIRED_AT: str(due + 1)}
    return Fired("ns.fired", shard, 0, job.encode(), b"", headers, received, due + 1)


def test_a_phase_reports_each_shards_pause_steady_gap_and_lateness(bench: Any) -> None:
    phase = bench.Phase("scale-out", start_ms=10_000, shared_ms=11_000, end_ms=20_000,
                        before={0: "n1", 1: "n2"}, after={0: "n1", 1: "n3"}, subject="n3")
    messages = [
        # shard 0 stays: every 100 ms before and after, one 300 ms gap across the change
        *(_fired(0, t, t + 20) for t in range(5_000, 9_901, 100)),
        *(_fired(0, t, t + 20) for t in range(10_200, 20_001, 100)),
        # shard 1 moves: a 4,590 ms steady gap, then nothing from 9,900 to 12,400; what arrives
        # then was due before the change, and counts for it
        *(_fired(1, t, t + 10) for t in (5_000, 5_200, 5_300, 9_890)),
        _fired(1, 9_950, 12_400.0),
        *(_fired(1, t, t + 10) for t in range(12_500, 20_001, 100)),
        # arrivals before the quiet window and after the phase: neither counts
        _fired(1, 1_000, 1_010.0), _fired(1, 25_000, 25_900.0),
    ]
    figures = bench.phase_figures(phase, messages, SHARDS, steady_ms=5_000)
    stayed, moved = figures.shards[0], figures.shards[1]
    assert figures.shared_after_s == 1.0
    assert (stayed.moved, stayed.pause_ms, stayed.steady_gap_ms) == (False, 300, 100)
    assert (stayed.worst_lateness_ms, stayed.steady_worst_lateness_ms) == (20, 20)
    assert (moved.moved, moved.pause_ms, moved.steady_gap_ms) == (True, 2_500, 4_590)
    assert (stayed.pause_began_ms, moved.pause_began_ms) == (-80, -100)  # the last arrival
    assert (moved.worst_lateness_ms, moved.steady_worst_lateness_ms) == (2_450, 10)
    assert figures.worst(moved=False) == (300, 20)
    assert figures.worst(moved=True) == (2_500, 2_450)
    # the joiner's shards and the others'
    assert (stayed.of_subject, moved.of_subject) == (False, True)
    assert figures.worst(subject=True) == (2_500, 2_450)
    assert figures.worst(subject=False) == (300, 20)


def test_a_restarted_nodes_shards_stay_with_it_but_count_as_its_own(bench: Any) -> None:
    # Its shard 0 stays with n1 and falls silent from 9,900 to the phase's end: that silence
    # is its pause, and the shard is the subject's although it did not move.
    phase = bench.Phase("restart n1", start_ms=10_000, shared_ms=11_000, end_ms=14_000,
                        before={0: "n1", 1: "n2"}, after={0: "n1", 1: "n2"}, subject="n1")
    messages = [*(_fired(0, t, t + 20) for t in range(9_000, 9_901, 100)),
                *(_fired(1, t, t + 20) for t in range(9_000, 14_001, 100))]
    figures = bench.phase_figures(phase, messages, SHARDS, steady_ms=1_000)
    own, other = figures.shards[0], figures.shards[1]
    assert (own.moved, own.of_subject, own.pause_ms) == (False, True, 4_000)
    assert own.pause_began_ms == 0  # a silence to the end counts from the phase's start
    assert (other.moved, other.of_subject, other.pause_ms) == (False, False, 100)
    assert figures.worst(subject=True)[0] == 4_000 and figures.worst(moved=True) == (None, None)


def test_jobs_are_due_evenly_at_the_rate(bench: Any) -> None:
    jobs = bench.even_jobs(1_000, 2.0, 500)
    dues = list(jobs.values())
    assert len(jobs) == 1_000 and len(set(jobs)) == 1_000
    assert dues[0] == 1_000 and dues[-1] == 1_000 + 1_998
    assert all(b - a == 2 for a, b in itertools.pairwise(dues))


def test_the_arguments_are_checked(bench: Any) -> None:
    with pytest.raises(SystemExit):
        bench.parse(["--nodes", "1"])
    with pytest.raises(SystemExit):
        bench.parse(["--node-env", "NOEQUALS"])
    assert bench.parse(["--rate", "100"]).rate == 100


def test_phases_run_in_their_fixed_order_and_a_rolling_restart_counts_once_per_node(
        bench: Any) -> None:
    assert bench.parse_phases("crash, out,in") == ("out", "in", "crash")
    assert bench.phase_count(bench.parse_phases("out,in,restart,crash"), nodes=3) == 6
    assert bench.phase_count(("out", "in"), nodes=3) == 2
    assert bench.phase_count(("restart",), nodes=5) == 5


@pytest.mark.parametrize(("text", "message"), [
    ("out,join", "unknown join"),
    (" , ", "name at least one phase"),
    ("in,crash", "'in' stops the node that 'out' starts"),
])
def test_phases_that_cannot_run_are_refused_with_the_reason(bench: Any, text: str,
                                                            message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bench.parse_phases(text)
    with pytest.raises(SystemExit):
        bench.parse(["--phases", text])


def test_idle_share_is_the_idle_part_of_the_cpu_time_between_two_readings(bench: Any) -> None:
    assert bench.idle_share((100, 1_000), (150, 1_200)) == 0.25
    assert bench.idle_share((100, 1_000), (100, 1_000)) is None  # no time passed
    idle, total = bench.cpu_times()
    assert 0 <= idle <= total
