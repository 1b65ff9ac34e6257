"""Catch-up at the interval where it matters (issue 28, item 7): a job every 1 s or 2 s,
withheld for 24 s by a pause or by an outage (its shard owned by no node), with the default
`catch_up_grace_ms` (60 s). The grace applies once, to the first withheld occurrence: it fires,
late; the others due by then were missed and the job's policy decides them (coalesce folds
them into the one fired, skip drops them, all fires each); the schedule then continues with
its next occurrence after now, each once and never early.

Before, every withheld occurrence was within the grace on its own, so each fired in turn within
a fraction of a second: every policy acted like `all` for any gap shorter than a minute.

On the in-memory store and bus with a manual clock (tests/unit/node_rig.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest
from chronowheel.core import wire
from chronowheel.core.model import encode_control
from chronowheel.core.recurrence import CatchUp, catch_up, compile_schedule

from tests.unit.node_rig import T0, NodeRig, scheduled_at

GAP_MS = 24_000
POLICIES = ("coalesce", "skip", "all")


@pytest.fixture
async def rig() -> AsyncIterator[NodeRig]:
    async with NodeRig() as rig:
        assert rig.settings.catch_up_grace_ms == 60_000  # the default: the gap is within it
        yield rig


def expected_burst(policy: str, withheld: list[int]) -> list[int]:
    """What fires at once when the gap ends: the first withheld occurrence, on time by the
    grace, and for `all` every other one the gap held back."""
    return withheld if policy == "all" else withheld[:1]


def check_series(rig: NodeRig, every_ms: int, burst_at: int, burst: list[int],
                 until: int) -> None:
    """The burst fired when the gap ended, then one occurrence per interval after it, each at
    or after its instant and within a tick of it, none twice."""
    fired = rig.fired("tick")
    keys = Counter(m.header(wire.OCCURRENCE) for m in fired)
    assert set(keys.values()) == {1}, keys
    caught_up = [m for m in fired if burst_at <= m.committed_ms and scheduled_at(m) <= burst_at]
    assert sorted(scheduled_at(m) for m in caught_up) == burst
    assert all(m.committed_ms < burst_at + 300 for m in caught_up)  # at once
    after = [m for m in fired if scheduled_at(m) > burst_at]
    first_next = T0 + ((burst_at - T0) // every_ms + 1) * every_ms  # the first after the gap
    assert [scheduled_at(m) for m in after] == list(range(first_next, until + 1, every_ms))
    for m in after:
        assert scheduled_at(m) <= m.committed_ms < scheduled_at(m) + 200, "on time, never early"


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("every_s", [1, 2])
async def test_a_24_s_pause_fires_the_first_withheld_and_the_policy_decides_the_rest(
        rig: NodeRig, every_s: int, policy: str) -> None:
    every_ms = every_s * 1_000
    await rig.start()
    rig.upsert("tick", every=f"{every_s}s", start=T0 + every_ms, catch_up=policy)
    await rig.advance_to(T0 + 2 * every_ms + 500, step_ms=50)
    assert [scheduled_at(m) for m in rig.fired("tick")] == [T0 + every_ms, T0 + 2 * every_ms]
    rig.submit("tick", encode_control("pause", "tick"))
    await rig.advance(100, step_ms=50)
    paused_at = rig.clock.now_ms()
    await rig.advance_to(paused_at + GAP_MS, step_ms=500)
    assert len(rig.fired("tick")) == 2  # nothing while paused
    resumed_at = rig.clock.now_ms()
    withheld = list(range(T0 + 3 * every_ms, resumed_at + 1, every_ms))
    assert len(withheld) == 24 // every_s  # 24 or 12 (the report counted 13 over ~24 s)
    rig.submit("tick", encode_control("resume", "tick"))
    await rig.advance(300, step_ms=50)
    burst = sorted(scheduled_at(m) for m in rig.fired("tick")[2:])
    assert burst == expected_burst(policy, withheld)
    coalesced = rig.nodes[0].metrics.coalesced._value.get()
    assert coalesced == (1 if policy == "coalesce" else 0)
    until = resumed_at + 5 * every_ms
    await rig.advance_to(until + 100, step_ms=50)
    check_series(rig, every_ms, resumed_at, burst, until)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("every_s", [1, 2])
async def test_a_24_s_outage_fires_the_first_missed_and_the_policy_decides_the_rest(
        rig: NodeRig, every_s: int, policy: str) -> None:
    every_ms = every_s * 1_000
    await rig.start()
    rig.upsert("tick", every=f"{every_s}s", start=T0 + every_ms, catch_up=policy)
    await rig.advance_to(T0 + 2 * every_ms + 500, step_ms=50)
    assert len(rig.fired("tick")) == 2
    await rig.stop_all()  # the only node goes: nobody owns the shard for 24 s
    back_at = rig.clock.now_ms() + GAP_MS
    rig.clock.set(back_at)
    missed = list(range(T0 + 3 * every_ms, back_at + 1, every_ms))
    assert len(missed) == 24 // every_s
    await rig.start("second-node")  # takes the shards over at `back_at`
    await rig.advance(300, step_ms=50)
    burst = sorted(scheduled_at(m) for m in rig.fired("tick")[2:])
    assert burst == expected_burst(policy, missed)
    until = back_at + 5 * every_ms
    await rig.advance_to(until + 100, step_ms=50)
    check_series(rig, every_ms, back_at, burst, until)


async def test_a_job_on_schedule_is_not_caught_up(rig: NodeRig) -> None:
    # Every occurrence dispatched within a tick of its instant: nothing is missed, nothing
    # folded, whatever the policy.
    await rig.start()
    for policy in POLICIES:
        rig.upsert(f"steady-{policy}", every="1s", start=T0 + 1_000, catch_up=policy)
    await rig.advance_to(T0 + 10_050, step_ms=50)
    for policy in POLICIES:
        assert [scheduled_at(m) for m in rig.fired(f"steady-{policy}")] == [
            T0 + k * 1_000 for k in range(1, 11)]
    assert rig.nodes[0].metrics.coalesced._value.get() == 0


# --- the decision itself (core/recurrence.py) ------------------------------------------------

EVERY_2S = compile_schedule(every_ms=2_000, start_ms=T0)


def on_time(policy: str, first: int, now: int, *, window_ms: int = 0,
            schedule: object = EVERY_2S, max_catch_up: int = 100) -> CatchUp:
    return catch_up(schedule, policy=policy, max_catch_up=max_catch_up,  # type: ignore[arg-type]
                    first_missed_ms=first, now_ms=now, first_on_time=True, window_ms=window_ms)


def test_on_time_with_nothing_else_due_fires_it_and_continues_with_the_next() -> None:
    for policy in POLICIES:
        assert on_time(policy, T0 + 4_000, T0 + 4_030) == CatchUp(
            (T0 + 4_000,), T0 + 6_000, coalesced=False, missed=False)


def test_on_time_the_grace_covers_the_first_only() -> None:
    first, now = T0 + 4_000, T0 + 4_000 + 24_100  # 13 due: 4 s ... 28 s
    due = list(range(first, now + 1, 2_000))
    assert len(due) == 13
    assert on_time("coalesce", first, now) == CatchUp((first,), T0 + 30_000, True)
    assert on_time("skip", first, now) == CatchUp((first,), T0 + 30_000, False)
    assert on_time("all", first, now) == CatchUp(tuple(due), T0 + 30_000, False)
    assert on_time("all", first, now, max_catch_up=5) == CatchUp(
        (*due[:4], due[-1]), T0 + 30_000, True)


def test_on_time_counts_as_due_only_what_a_window_cannot_still_hold_back() -> None:
    # A cron every minute with a 5-minute window: the next occurrences' slots may still be
    # ahead, so at the first one's slot only those scheduled 5 minutes before now are due.
    cron = compile_schedule(cron="* * * * *")
    first = T0
    slot = first + 4 * 60_000  # its slot, 4 minutes into its window
    got = on_time("coalesce", first, slot, window_ms=5 * 60_000, schedule=cron)
    assert got == CatchUp((first,), first + 60_000, False, False)
    late = on_time("coalesce", first, slot + 3 * 60_000, window_ms=5 * 60_000, schedule=cron)
    assert late == CatchUp((first,), first + 3 * 60_000, True)  # 1 and 2 min were due


@pytest.mark.parametrize("policy", POLICIES)
async def test_a_node_running_behind_fires_every_occurrence_in_turn(
        rig: NodeRig, policy: str) -> None:
    # Dispatch 1.5 s behind a job every 1 s (a herd, a loaded machine) is not a gap: nothing
    # was withheld, so no occurrence counts as missed and none is folded or dropped.
    await rig.start()
    rig.upsert("tick", every="1s", start=T0 + 1_000, catch_up=policy)
    await rig.advance_to(T0 + 1_050, step_ms=50)
    assert [scheduled_at(m) for m in rig.fired("tick")] == [T0 + 1_000]
    rig.clock.set(T0 + 3_500)  # the node wakes 1.5 s after the next occurrence's instant
    await rig.advance(300, step_ms=50)
    assert [scheduled_at(m) for m in rig.fired("tick")] == [T0 + 1_000, T0 + 2_000, T0 + 3_000]
    await rig.advance_to(T0 + 6_100, step_ms=50)
    assert [scheduled_at(m) for m in rig.fired("tick")] == [
        T0 + k * 1_000 for k in range(1, 7)]
    assert all(m.committed_ms >= scheduled_at(m) for m in rig.fired("tick"))
    assert rig.nodes[0].metrics.coalesced._value.get() == 0
