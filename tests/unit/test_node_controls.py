"""Schedule controls on a node without servers (in-memory store and bus, manual clock): pause,
resume and its catch-up, trigger, backfill (pacing, exactly once across a takeover), and the
rejections that depend on a job's state."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from chronowheel.core import wire
from chronowheel.core.model import encode_backfill, encode_control, encode_trigger
from chronowheel.core.shard import shard_of

from tests.unit.node_rig import T0, NodeRig, scheduled_at


@pytest.fixture
async def rig() -> AsyncIterator[NodeRig]:
    # A short grace, so that a pause of a few seconds counts as missed occurrences.
    async with NodeRig(catch_up_grace_ms=500, backfill_rows_per_cycle=7,
                       backfill_cycle_ms=100) as rig:
        yield rig


def reasons(rig: NodeRig) -> list[str]:
    return [(m.header(wire.REASON) or b"").decode()
            for m in rig.bus.messages(rig.settings.rejected_topic)]


async def status(rig: NodeRig, job_id: str) -> str:
    row = await rig.store.get_job(job_id)
    assert row is not None
    return row.status


async def test_a_paused_recurring_job_publishes_nothing_until_resumed(rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("tick", every="1s", start=T0 + 1_000, catch_up="skip")
    await rig.advance_to(T0 + 2_500)
    assert [scheduled_at(m) for m in rig.fired("tick")] == [T0 + 1_000, T0 + 2_000]
    rig.submit("tick", encode_control("pause", "tick"))
    await rig.advance(200)
    assert await status(rig, "tick") == "paused"
    assert (await rig.store.get_job("tick")).scheduled_ms == T0 + 3_000  # type: ignore[union-attr]
    await rig.advance_to(T0 + 10_000)
    assert len(rig.fired("tick")) == 2  # nothing while paused
    rig.submit("tick", encode_control("pause", "tick"))  # again: no change, no rejection
    rig.submit("tick", encode_control("resume", "tick"))
    await rig.advance_to(T0 + 12_500)
    # skip: the pause's misses are dropped; the series goes on from the next occurrence.
    assert [scheduled_at(m) for m in rig.fired("tick")][2:] == [T0 + 11_000, T0 + 12_000]
    assert await status(rig, "tick") == "scheduled"
    assert reasons(rig) == []


@pytest.mark.parametrize(("policy", "missed"), [
    ("coalesce", [T0 + 9_000]), ("all", [T0 + k * 1_000 for k in range(3, 10)]), ("skip", []),
])
async def test_resume_applies_the_catch_up_policy_to_what_the_pause_missed(
        rig: NodeRig, policy: str, missed: list[int]) -> None:
    await rig.start()
    rig.upsert("report", every="1s", start=T0 + 1_000, catch_up=policy)
    await rig.advance_to(T0 + 2_500)
    rig.submit("report", encode_control("pause", "report"))
    await rig.advance_to(T0 + 9_500)
    assert len(rig.fired("report")) == 2
    rig.submit("report", encode_control("resume", "report"))
    await rig.advance(300)
    assert sorted(scheduled_at(m) for m in rig.fired("report")[2:]) == missed
    await rig.advance_to(T0 + 11_500)
    after = [scheduled_at(m) for m in rig.fired("report") if scheduled_at(m) > T0 + 9_000]
    assert after == [T0 + 10_000, T0 + 11_000]
    occurrences = Counter(m.header(wire.OCCURRENCE) for m in rig.fired("report"))
    assert set(occurrences.values()) == {1}


async def test_a_short_pause_fires_the_withheld_occurrence_late_but_once(rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("nudge", every="10s", start=T0 + 10_000, catch_up="skip")
    await rig.advance_to(T0 + 9_000)
    rig.submit("nudge", encode_control("pause", "nudge"))
    await rig.advance_to(T0 + 10_300)
    rig.submit("nudge", encode_control("resume", "nudge"))  # 300 ms late: within the grace
    await rig.advance(500)
    [msg] = rig.fired("nudge")
    assert scheduled_at(msg) == T0 + 10_000
    assert int(msg.header(wire.FIRED_AT) or 0) >= T0 + 10_300


async def test_a_paused_one_shot_fires_on_resume_at_once_when_past_due(rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("mail", at=T0 + 5_000)
    rig.upsert("later", at=T0 + 60_000)
    await rig.advance(200)
    rig.submit("mail", encode_control("pause", "mail"))
    rig.submit("later", encode_control("pause", "later"))
    await rig.advance_to(T0 + 20_000)
    assert rig.fired() == []
    rig.submit("mail", encode_control("resume", "mail"))
    rig.submit("later", encode_control("resume", "later"))
    await rig.advance(200)
    [msg] = rig.fired("mail")
    assert scheduled_at(msg) == T0 + 5_000
    assert rig.fired("later") == []  # not due yet: fires at its own instant, not early
    await rig.advance_to(T0 + 59_900)
    assert rig.fired("later") == []
    await rig.advance_to(T0 + 60_100, step_ms=10)
    assert [scheduled_at(m) for m in rig.fired("later")] == [T0 + 60_000]


async def test_an_edit_of_a_paused_job_keeps_it_paused_and_a_cancel_cancels_it(
        rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("job", every="1s", start=T0 + 1_000)
    await rig.advance(100)
    rig.submit("job", encode_control("pause", "job"))
    await rig.advance(100)
    rig.upsert("job", every="2s", start=T0 + 2_000)
    await rig.advance_to(T0 + 6_000)
    assert await status(rig, "job") == "paused" and rig.fired() == []
    rig.cancel("job")
    await rig.advance(100)
    assert await status(rig, "job") == "cancelled"
    rig.submit("job", encode_control("resume", "job"))
    await rig.advance(3_000)
    assert rig.fired() == []
    assert reasons(rig) == ["id: job 'job' is cancelled; there is nothing to resume"]


async def test_trigger_publishes_one_marked_occurrence_once_per_request(rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("nightly", cron="0 3 * * *", payload={"r": 1}, headers={"team": "ops"})
    await rig.advance(200)
    rig.submit("nightly", encode_trigger("nightly", "run-1"))
    rig.submit("nightly", encode_trigger("nightly", "run-1"))  # the same request, re-sent
    await rig.advance(300)
    rig.submit("nightly", encode_trigger("nightly", "run-1"))  # and later again
    rig.submit("nightly", encode_trigger("nightly", "run-2"))
    await rig.advance(300)
    fired = rig.fired("nightly")
    assert [m.header(wire.TRIGGERED) for m in fired] == [b"run-1", b"run-2"]
    first = fired[0]
    at = scheduled_at(first)
    assert T0 + 200 <= at <= int(first.header(wire.FIRED_AT) or 0)  # never early
    assert first.header(wire.OCCURRENCE) == f"nightly@{at}/trigger/run-1".encode()
    assert first.value == b'{"r":1}' and first.header("team") == b"ops"
    assert first.header(wire.BACKFILL) is None
    # The schedule is untouched: its next occurrence is still 03:00 tomorrow.
    row = await rig.store.get_job("nightly")
    assert row is not None and row.status == "scheduled"
    assert row.scheduled_ms == T0 + 18 * 3_600_000


async def test_backfill_publishes_the_range_once_each_paced_per_cycle(rig: NodeRig) -> None:
    await rig.start()
    rig.clock.set(T0 + 3_600_000)
    rig.upsert("hourly", every="1s")
    await rig.advance(100)
    rig.submit("hourly", encode_backfill("hourly", "fix-1", T0, T0 + 30_000))
    await rig.settle()
    await rig.advance(100, step_ms=100)
    # At most one cycle's worth (7) handed over per 100 ms.
    assert 0 < len([m for m in rig.fired("hourly") if m.header(wire.BACKFILL)]) <= 2 * 7
    rig.submit("hourly", encode_backfill("hourly", "fix-1", T0, T0 + 30_000))  # re-sent
    await rig.advance(2_000)
    backfilled = [m for m in rig.fired("hourly") if m.header(wire.BACKFILL) == b"fix-1"]
    assert sorted(scheduled_at(m) for m in backfilled) == [T0 + k * 1_000 for k in range(30)]
    assert all(m.header(wire.OCCURRENCE) == f"hourly@{scheduled_at(m)}/backfill/fix-1".encode()
               for m in backfilled)
    request = await rig.store.get_request(_shard(rig, "hourly"), "hourly", "fix-1")
    assert request is not None and request.next_ms is None and request.handed == 30
    # On-time occurrences were not held up by it: each fired within a step of its instant.
    on_time = [m for m in rig.fired("hourly") if m.header(wire.BACKFILL) is None]
    assert on_time and all(int(m.header(wire.FIRED_AT) or 0) - scheduled_at(m) <= 100
                           for m in on_time)


def _shard(rig: NodeRig, job_id: str) -> int:
    from chronowheel.core.shard import shard_of

    return shard_of(job_id, rig.settings.shards)


async def test_a_backfill_resumes_after_a_takeover_without_loss_or_repeat(
        rig: NodeRig) -> None:
    await rig.start("first")
    rig.clock.set(T0 + 3_600_000)
    rig.upsert("sweep", every="10s")
    await rig.advance(100)
    rig.submit("sweep", encode_backfill("sweep", "b-1", T0, T0 + 3_600_000))  # 360
    await rig.advance(300, step_ms=100)
    handed = len([m for m in rig.fired("sweep") if m.header(wire.BACKFILL)])
    assert 0 < handed < 360
    await rig.start("second")  # takes every shard over mid-backfill
    await rig.advance(10_000)
    backfilled = Counter(scheduled_at(m) for m in rig.fired("sweep") if m.header(wire.BACKFILL))
    assert backfilled == Counter(T0 + k * 10_000 for k in range(360))


async def test_backfill_rejects_more_than_the_limit_and_an_empty_range(rig: NodeRig) -> None:
    await rig.start()
    rig.clock.set(T0 + 86_400_000)
    rig.upsert("often", every="1s")
    await rig.advance(100)
    rig.submit("often", encode_backfill("often", "too-many", T0, T0 + 10_001_000))
    rig.submit("often", encode_backfill("often", "just-right", T0, T0 + 10_000_000))
    rig.upsert("bounded", every="1s", start=T0 + 86_400_000 + 60_000)
    rig.submit("bounded", encode_backfill("bounded", "before", T0, T0 + 1_000))
    await rig.advance(100)
    assert reasons(rig) == [
        "to: the range holds more than 10000 occurrences (at least 10001 in "
        f"[{T0}, {T0 + 10_001_000}))",
        f"from: job 'bounded' has no occurrence in [{T0}, {T0 + 1_000})",
    ]


async def test_controls_refused_for_the_state_of_the_job_reach_rejected(rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("once", at=T0 + 1_000)
    rig.upsert("rec", every="1m")
    await rig.advance(100)
    rig.submit("rec", encode_control("pause", "rec"))
    await rig.advance(100)
    rig.submit("nope", encode_trigger("nope", "r"))
    rig.submit("nope", encode_control("pause", "nope"))
    rig.submit("once", encode_backfill("once", "r", T0 - 1_000, T0))
    rig.submit("once", encode_trigger("once", "r"))
    rig.submit("rec", encode_trigger("rec", "r"))
    await rig.advance(100)
    assert sorted(reasons(rig)) == sorted([
        "id: no job 'nope' to trigger",
        "id: no job 'nope' to pause",
        "id: job 'once' is a one-shot; only a recurring job can be backfilled",
        "id: job 'once' is a one-shot; only a recurring job can be triggered",
        "id: job 'rec' is paused; resume it before it can be triggered",
    ])
    await rig.advance_to(T0 + 2_000)
    rig.submit("once", encode_control("pause", "once"))  # fired already
    await rig.advance(100)
    assert reasons(rig)[-1] == ("id: job 'once' has no occurrence left to pause (a one-shot "
                                "that has fired)")
    rejected = rig.bus.messages(rig.settings.rejected_topic)[-1]
    assert rejected.header(wire.SOURCE_TOPIC) == rig.settings.submit_topic.encode()


async def test_a_retry_of_a_backfilled_occurrence_keeps_its_key_and_marker(
        rig: NodeRig) -> None:
    from chronowheel.core.model import encode_retry

    await rig.start()
    rig.submit("sweep", encode_retry(id="sweep", scheduled_ms=T0 - 60_000, attempt=2,
                                     at_ms=T0 + 1_000, topic=rig.settings.fired_topic,
                                     payload=b"x", origin="backfill", request_id="b-9"))
    rig.submit("sweep", encode_retry(id="sweep", scheduled_ms=T0 - 60_000, attempt=2,
                                     at_ms=T0 + 1_000, topic=rig.settings.fired_topic,
                                     payload=b"y"))
    await rig.advance(2_000)
    by_key = {m.header(wire.OCCURRENCE): m for m in rig.fired("sweep")}
    assert set(by_key) == {f"sweep@{T0 - 60_000}/backfill/b-9".encode(),
                           f"sweep@{T0 - 60_000}".encode()}
    kept = by_key[f"sweep@{T0 - 60_000}/backfill/b-9".encode()]
    assert kept.header(wire.BACKFILL) == b"b-9" and kept.header(wire.ATTEMPT) == b"2"


@pytest.mark.parametrize("step_ms", [10, 100])
async def test_a_pause_that_arrives_as_its_occurrence_comes_due_withholds_it_or_lets_it_go(
        rig: NodeRig, step_ms: int) -> None:
    # The pause reads the job's row, finds its occurrence not published yet, and then waits
    # for its store writes (held here) while the occurrence comes due. Dispatch must not
    # publish it meanwhile: the paused row says it is withheld, and the resume fires it; had it
    # gone out, the resume would fire it a second time.
    await rig.start()
    rig.upsert("mail", at=T0 + 2_000)
    await rig.advance_to(T0 + 1_900)
    release = rig.hold_due_retires()
    rig.submit("mail", encode_control("pause", "mail"))
    await rig.advance_to(T0 + 3_000, step_ms=step_ms)
    assert rig.fired("mail") == []
    release.set()
    await rig.advance(500)
    assert await status(rig, "mail") == "paused"
    assert rig.fired("mail") == []
    rig.submit("mail", encode_control("resume", "mail"))
    await rig.advance(2_000)
    assert [scheduled_at(m) for m in rig.fired("mail")] == [T0 + 2_000]


async def test_a_pause_after_an_edit_in_the_same_batch_withholds_the_edited_occurrence(
        rig: NodeRig) -> None:
    # The edit writes the job's new occurrence (due at once) and the pause, the job's next
    # command in the same ingest step, reads that row again: its slot must be held as well
    # while the pause's writes are held, or dispatch publishes it and the resume again.
    await rig.start()
    rig.upsert("mail", at=T0 + 60_000)
    await rig.advance_to(T0 + 1_900)
    release = rig.hold_due_retires()
    rig.upsert("mail", at=T0 + 2_000)
    rig.submit("mail", encode_control("pause", "mail"))
    await rig.advance_to(T0 + 3_000, step_ms=10)
    assert rig.fired("mail") == []
    release.set()
    await rig.advance(500)
    assert await status(rig, "mail") == "paused"
    rig.submit("mail", encode_control("resume", "mail"))
    await rig.advance(2_000)
    assert len(rig.fired("mail")) == 1


async def test_dispatch_sleeps_while_a_command_holds_its_due_occurrence(rig: NodeRig) -> None:
    node = await rig.start()
    rig.upsert("mail", at=T0 + 2_000)
    await rig.advance_to(T0 + 1_900)
    release = rig.hold_due_retires()
    rig.submit("mail", encode_control("pause", "mail"))
    await rig.advance_to(T0 + 2_500, step_ms=100)
    dispatcher = node.owned[shard_of("mail", rig.settings.shards)].actor.dispatcher
    steps = 0
    step = dispatcher.step

    async def counted_step(*args: Any, **kwargs: Any) -> None:
        nonlocal steps
        steps += 1
        await step(*args, **kwargs)

    dispatcher.step = counted_step  # type: ignore[method-assign]
    for _ in range(3):
        await rig.settle()
    # Held: it waits for the release (or the idle commit), it does not turn on every loop turn.
    assert steps <= 3
    release.set()
    await rig.advance(500)
    assert await status(rig, "mail") == "paused" and rig.fired("mail") == []
