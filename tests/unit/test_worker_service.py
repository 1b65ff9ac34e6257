"""A real `Worker` on the in-memory bus and stores (tests/unit/worker_rig.py): handling,
offsets, marks, rebalances and shutdown, with time moved by hand."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from chronowheel.worker import Handler, Occurrence, WorkerSettings, WorkerStats

from tests.unit.worker_rig import T0, WorkerRig


@pytest.fixture
async def rig() -> AsyncIterator[WorkerRig]:
    async with WorkerRig() as r:
        yield r


async def test_the_handler_runs_once_per_occurrence_and_its_offset_is_committed_after_its_mark(
        rig: WorkerRig) -> None:
    seen: list[Occurrence] = []

    async def handler(occ: Occurrence) -> None:
        seen.append(occ)

    worker = await rig.start(handler)
    msg = rig.fire("hello", payload=b'{"to":"ada"}', headers=(("team", "billing"),),
                   max_attempts=3, backoff_ms=2000)
    await rig.until("the commit", lambda: bool(rig.committed(worker)))
    [occ] = seen
    assert occ.json() == {"to": "ada"}
    assert (occ.job_id, occ.scheduled_ms, occ.attempt, occ.occurrence) == (
        "hello", T0, 1, f"hello@{T0}")
    assert (occ.max_attempts, occ.backoff_ms) == (3, 2000)
    assert occ.job_headers == {"team": "billing"} and occ.topic == rig.topic
    assert (occ.partition, occ.offset) == (msg.partition, msg.offset)
    assert worker.stats == WorkerStats(succeeded=1)
    assert worker.group_id == f"unit-workers-{rig.topic}" == worker.idempotency_scope
    assert rig.committed(worker) == {msg.partition: msg.offset + 1}
    assert worker.committed_points() == {rig.tp(msg.partition): msg.offset + 1}
    marks = rig.marks_of(worker.group_id, msg.partition)
    assert [(m.offset, m.state, m.occurrence) for m in marks.values()] == [
        (msg.offset, "done", f"hello@{T0}")]
    # A first delivery leaves a mark, not a per-occurrence claim.
    assert rig.store.claims == {}


async def test_nothing_is_committed_before_the_handler_is_done(rig: WorkerRig) -> None:
    release = asyncio.Event()
    started: list[str] = []

    async def handler(occ: Occurrence) -> None:
        started.append(occ.job_id)
        if occ.job_id == "slow":
            await release.wait()

    worker = await rig.start(handler, commit_interval_s=0.5)
    slow = rig.fire("slow", partition=0)
    fast = rig.fire("fast", partition=0)
    await rig.until("both handlers", lambda: len(started) == 2)
    await rig.advance(5_000)  # ten commit rounds
    assert rig.committed(worker).get(0, 0) <= slow.offset  # the slow one holds it back
    assert worker.holding() == 1
    release.set()
    await rig.until("the commit past both", lambda: rig.committed(worker) == {
        0: fast.offset + 1})
    assert worker.stats == WorkerStats(succeeded=2)


async def test_keyword_options_and_a_settings_value_are_the_same() -> None:
    rig = WorkerRig()

    async def handler(occ: Occurrence) -> None: ...

    a = rig.worker(handler, concurrency=3, lease_s=9)
    b = rig.worker(handler, options=WorkerSettings(concurrency=3, lease_s=9))
    assert a.options == b.options
    assert a.options.prefetch == 1000 and a.options.concurrency == 3
    with pytest.raises(TypeError):
        rig.worker(handler, no_such_option=1)
    with pytest.raises(ValueError, match="concurrency"):
        WorkerSettings(concurrency=0)


# --- idempotency -------------------------------------------------------------------------------

async def test_duplicates_are_handled_once_per_idempotency_scope(rig: WorkerRig) -> None:
    calls: dict[str, list[Occurrence]] = {"first": [], "shared": [], "other": []}

    def recorder(name: str) -> Handler:
        async def handler(occ: Occurrence) -> None:
            calls[name].append(occ)
        return handler

    first = await rig.start(recorder("first"))
    original = rig.fire("once", payload=b'"p"', headers=(("h", "v"),))
    await rig.until("the first delivery", lambda: bool(calls["first"]))
    # The same fired message again on the same partition (a plain re-publish, or a worker
    # crash before its commit).
    copy = rig.fire_copy(original)
    await rig.until("the copy to be skipped", lambda: first.stats.skipped == 1)
    await rig.until("the commit", lambda: rig.committed(first) == {
        original.partition: copy.offset + 1})
    assert len(calls["first"]) == 1
    await rig.shutdown(first)

    # A new group reading from offset 0 but sharing the first group's ledger: nothing to do.
    shared = await rig.start(recorder("shared"), group_id="unit-g2",
                             idempotency_scope=first.group_id, worker_id="w2")
    await rig.until("both copies skipped", lambda: shared.stats.skipped == 2)
    assert calls["shared"] == []
    # A different consumer group with its own ledger processes it too, once.
    other = await rig.start(recorder("other"), group_id="unit-g3", worker_id="w3")
    await rig.until("its copy skipped", lambda: other.stats.skipped == 1)
    assert [c.occurrence for c in calls["other"]] == [f"once@{T0}"]
    assert other.stats == WorkerStats(succeeded=1, skipped=1)


async def test_concurrent_duplicates_in_two_groups_sharing_a_ledger_run_once(
        rig: WorkerRig) -> None:
    started: list[str] = []
    release = asyncio.Event()

    async def slow(occ: Occurrence) -> None:
        started.append(occ.occurrence)
        await release.wait()

    a = await rig.start(slow, group_id="unit-a", idempotency_scope="shared", worker_id="a")
    b = await rig.start(slow, group_id="unit-b", idempotency_scope="shared", worker_id="b")
    rig.fire("contended")
    # Both workers hold the delivery; one runs the handler, the other waits for its lease.
    await rig.until("both workers to hold it", lambda: a.holding() == 1 and b.holding() == 1)
    await rig.advance(2_000)
    assert len(started) == 1
    release.set()
    await rig.until("one success and one skip", lambda: (
        a.stats.succeeded + b.stats.succeeded == 1 and a.stats.skipped + b.stats.skipped == 1))
    assert len(started) == 1


async def test_a_duplicated_retry_is_handled_once(rig: WorkerRig) -> None:
    seen: list[tuple[str, int, int]] = []

    async def handler(occ: Occurrence) -> None:
        seen.append((occ.occurrence, occ.attempt, occ.offset))

    worker = await rig.start(handler)
    at = T0 - 5000
    # The same retry (attempt 2) twice, far apart on the partition: a crash between producing
    # a retry command and committing makes the node fire it twice.
    first = rig.fire("retried", attempt=2, scheduled_ms=at, partition=0)
    for i in range(200):
        rig.fire(f"filler-{i}", partition=0)
    second = rig.fire("retried", attempt=2, scheduled_ms=at, partition=0)
    await rig.until("the second copy to be skipped", lambda: worker.stats.skipped == 1)
    assert [s for s in seen if s[0] == f"retried@{at}"] == [
        (f"retried@{at}", 2, first.offset)]
    assert second.offset > first.offset
    claim, _, _ = rig.store.claims[(worker.group_id, f"retried@{at}")]
    assert (claim.state, claim.attempt) == ("done", 2)


# --- rebalancing and shutdown --------------------------------------------------------------------

async def test_a_rebalance_lets_in_flight_handlers_finish_and_commits_before_partitions_move(
        rig: WorkerRig) -> None:
    calls: list[str] = []

    async def handler(occ: Occurrence) -> None:
        calls.append(occ.job_id)
        if occ.job_id.startswith("slow"):
            await rig.clock.sleep_until(rig.clock.now_ms() + 5_000)  # still running at the join

    a = await rig.start(handler, group_id="unit-rebalance", idempotency=False, worker_id="a")
    first = [rig.fire(f"slow{p}", partition=p) for p in (0, 1)]
    await rig.until("A to start both", lambda: len(calls) == 2)
    b = await rig.start(handler, group_id="unit-rebalance", idempotency=False, worker_id="b")
    assert a.assignment() and b.assignment()
    # A's handlers finished within the revoke deadline and their offsets were committed
    # before the partitions moved: B does not run them again.
    assert a.stats == WorkerStats(succeeded=2)
    assert rig.committed(a) == {m.partition: m.offset + 1 for m in first}
    second = [rig.fire(f"next{p}", partition=p) for p in (0, 1)]
    await rig.until("the second round", lambda: len(calls) == 4)
    assert sorted(calls) == sorted(["slow0", "slow1", "next0", "next1"])
    assert b.stats.succeeded >= 1 and a.stats.cancelled == 0
    assert len(second) == 2


async def test_a_revoke_past_its_deadline_cancels_the_handler_and_the_next_owner_runs_it(
        rig: WorkerRig) -> None:
    calls: list[tuple[str, str]] = []

    def handler(name: str) -> Handler:
        async def handle(occ: Occurrence) -> None:
            calls.append((name, occ.job_id))
            if name == "a":
                await asyncio.Event().wait()  # never ends on its own
        return handle

    a = await rig.start(handler("a"), group_id="unit-g", worker_id="a",
                        shutdown_deadline_s=2.0, lease_s=30)
    msg = rig.fire("stuck", partition=1)  # the partition the group gives B
    await rig.until("A to start it", lambda: bool(calls))
    joined_at = rig.clock.now_ms()
    b = await rig.start(handler("b"), group_id="unit-g", worker_id="b")
    assert rig.tp(1) in b.assignment()
    assert a.stats.cancelled == 1
    assert rig.committed(a).get(1, 0) <= msg.offset
    await rig.until("the cancelled occurrence again", lambda: len(calls) == 2)
    assert calls == [("a", "stuck"), ("b", "stuck")]
    # Its lease was released at the revoke: B did not wait for the 30 s expiry.
    assert rig.clock.now_ms() - joined_at < 10_000


async def test_graceful_shutdown_commits_what_finished_and_redelivers_what_was_cancelled(
        rig: WorkerRig) -> None:
    first: list[Occurrence] = []

    async def handler(occ: Occurrence) -> None:
        first.append(occ)
        if occ.job_id == "slow":
            await asyncio.Event().wait()  # never finishes on its own

    worker = await rig.start(handler, lease_s=30)
    fast = rig.fire("fast", partition=0)
    slow = rig.fire("slow", partition=1)
    await rig.until("both handlers to start", lambda: len(first) == 2)
    await rig.shutdown(worker, deadline_s=1.0)
    assert worker.failure is None
    assert worker.stats == WorkerStats(succeeded=1, cancelled=1)
    assert rig.committed(worker).get(0) == fast.offset + 1
    assert rig.committed(worker).get(1, 0) <= slow.offset

    again: list[Occurrence] = []

    async def record(occ: Occurrence) -> None:
        again.append(occ)

    stopped_at = rig.clock.now_ms()
    second = await rig.start(record, lease_s=30, worker_id="w2")
    await rig.until("the cancelled occurrence again", lambda: bool(again))
    await rig.until("its commit", lambda: rig.committed(second).get(1) == slow.offset + 1)
    # The cancelled handler's lease was released: no waiting for its 30 s expiry.
    assert rig.clock.now_ms() - stopped_at < 5_000
    assert [o.job_id for o in again] == ["slow"]


def test_the_command_line_flags_become_the_workers_settings() -> None:
    from chronowheel import cli
    from chronowheel.cli.worker import worker_settings

    args = cli.build_parser().parse_args(
        ["worker", "--topic", "a", "--handler", "m:f", "--concurrency", "4", "--group", "g",
         "--no-idempotency", "--idempotency-scope", "s", "--lease-s", "9", "--prefetch", "50",
         "--shutdown-deadline-s", "3", "--session-timeout-ms", "7000"])
    assert worker_settings(args, 0) == WorkerSettings(
        group_id="g", concurrency=4, idempotency=False, idempotency_scope="s", lease_s=9,
        prefetch=50, shutdown_deadline_s=3.0, session_timeout_ms=7000, http_port=0)
