"""Fencing with one producer per node (in-memory bus, manual clock): the recorded owner of a
shard is fenced by its next owner, a claim is committed before anything is published for a
shard, a paused node's open transaction never becomes visible, a fenced node that is still a
group member takes its shards again, and records from per-shard producers (no `owner`) are
fenced through the shard's own transactional id."""

from __future__ import annotations

import asyncio
from collections import Counter

import orjson
import pytest
from chronowheel.bus.memory import Message
from chronowheel.bus.ports import BusError, Fenced
from chronowheel.core.shard import shard_of
from chronowheel.core.wire import StateRecord
from chronowheel.node.transactions import FAILING_FOR_MS, MAX_FAILED_IN_ROW, renew_backoff_ms

from tests.unit.node_rig import T0, NodeRig, scheduled_at
from tests.unit.test_node_urgent import hold_writes_of


def node_id(name: str) -> str:
    return f"unit-node-{name}"


def state_records(rig: NodeRig, shard: int) -> list[dict[str, object]]:
    return [orjson.loads(m.value or b"{}") for m in rig.bus.messages(rig.settings.state_topic)
            if m.partition == shard and m.key == StateRecord.key(shard)]


def assert_claim_before_publish(rig: NodeRig) -> None:
    """In the order messages became visible: each fired message of shard k follows a claim of
    k by the transactional id whose transaction published it (the last claim before it)."""
    s = rig.settings
    owner: dict[int, str | None] = {}
    visible: list[Message] = sorted(
        (*rig.bus.messages(s.state_topic), *rig.bus.messages(s.fired_topic)),
        key=lambda m: m.seq)
    for m in visible:
        if m.topic == s.state_topic:
            record = orjson.loads(m.value or b"{}")
            if record.get("claim"):
                owner[m.partition] = record["owner"]
            elif "owner" in record:
                # A dispatch record is only ever written by the shard's last claimer (or it
                # releases the shard: owner null).
                assert record["owner"] in (owner.get(m.partition), None), (m, owner)
        else:
            shard = shard_of((m.key or b"").decode(), s.shards)
            assert owner.get(shard) is not None, f"{m.key!r} published before any claim"


async def test_a_takeover_fences_the_recorded_owner_then_claims(rig: NodeRig) -> None:
    # Shard 0 was last written by another node's producer, which may have an open transaction.
    rig.bus.produce(rig.settings.state_topic, 0, StateRecord.key(0), orjson.dumps(
        {"shard": 0, "watermark": T0, "owner": node_id("gone")}))
    zombie = rig.bus.producer(node_id("gone"), "unit-nodes")
    await zombie.start()
    txn = await zombie.begin()
    await txn.publish(rig.settings.fired_topic, 0, b"ghost", b"never", [])
    await rig.start("me")
    assert node_id("gone") in rig.bus.starts  # fenced
    assert node_id("gone") not in rig.bus.open_txns  # its open transaction was aborted
    with pytest.raises(Fenced):
        await txn.commit({})
    assert rig.fired() == []
    claims = [r for r in state_records(rig, 0) if r.get("claim")]
    assert claims[-1]["owner"] == node_id("me") and claims[-1]["watermark"] == T0
    # Shard 1's record has no owner (written before node transactions): the shard's own id is
    # the only one fenced for it, by the claim's producer.
    assert f"{rig.settings.namespace}-shard-1" in rig.bus.starts
    assert sorted(set(rig.bus.starts)) == sorted(
        {node_id("gone"), node_id("me"), "unit-shard-0", "unit-shard-1"})


async def test_the_recorded_owner_is_fenced_only_after_the_claimer_started(
        rig: NodeRig) -> None:
    """Not beside the claimer's start, although that would save a crash's takeover the time of
    the shorter of the two: an owner fenced first could initialise again and commit a claim of
    its own before our claimer starts, and go on publishing (docs/design.md, takeover step 2)."""
    s = rig.settings
    rig.bus.produce(s.state_topic, 0, StateRecord.key(0), orjson.dumps(
        {"shard": 0, "watermark": T0, "owner": node_id("gone")}))
    zombie = rig.bus.producer(node_id("gone"), "unit-nodes")
    await zombie.start()
    txn = await zombie.begin()
    await txn.publish(s.fired_topic, 0, b"ghost", b"never", [])
    claimer_started = rig.bus.hold_starts(f"{s.namespace}-shard-0")
    node = rig.new_node("me")
    await node.start()
    await rig.settle()
    assert rig.bus.starts.count(node_id("gone")) == 1  # its own start only: not fenced yet
    assert node_id("gone") in rig.bus.open_txns
    assert not node.owned[0].actor.ready
    claimer_started.set()
    await rig.advance(1_000)
    gone = [i for i, started in enumerate(rig.bus.starts) if started == node_id("gone")]
    assert len(gone) == 2 and rig.bus.starts.index(f"{s.namespace}-shard-0") < gone[1]
    assert node_id("gone") not in rig.bus.open_txns  # the fence aborted it
    with pytest.raises(Fenced):
        await txn.commit({})
    assert node.owned[0].actor.ready and node.failure is None
    claims = [r for r in state_records(rig, 0) if r.get("claim")]
    assert [(c["owner"], c["watermark"]) for c in claims] == [(node_id("me"), T0)]
    assert rig.fired() == []


async def test_records_without_owner_are_fenced_through_the_shard_id_and_upgraded(
        rig: NodeRig) -> None:
    # A per-shard producer of the old scheme, with an open transaction for shard 1.
    legacy = rig.bus.producer("unit-shard-1", "unit-nodes")
    await legacy.start()
    txn = await legacy.begin()
    await txn.publish(rig.settings.fired_topic, 1, b"old", b"late", [])
    await txn.publish(rig.settings.state_topic, 1, StateRecord.key(1),
                      orjson.dumps({"shard": 1, "watermark": T0 + 5_000}), [])
    node = await rig.start("me")
    with pytest.raises(Fenced):
        await txn.commit({})
    assert rig.fired() == []
    rig.upsert("after", at=T0 + 1_000)
    await rig.advance(2_000)
    assert [m.key for m in rig.fired()] == [b"after"]
    # From here on the records name the node's producer.
    for k in (0, 1):
        assert state_records(rig, k)[-1]["owner"] == node_id("me")
    assert node.transactions is not None and node.transactions.session == 0
    assert_claim_before_publish(rig)


async def test_a_paused_node_with_an_open_transaction_publishes_nothing_after_a_takeover(
        rig: NodeRig) -> None:
    first = await rig.start("first")
    jobs = {f"j-{i}": T0 + 1_000 + 100 * i for i in range(20)}
    for job_id, at in jobs.items():
        rig.upsert(job_id, at=at)
    await rig.advance(500)
    # The first node stops mid-commit: its open transaction holds fired messages of a shard.
    hold = rig.bus.hold_commits(node_id("first"))
    await rig.advance_to(T0 + 1_200)
    open_txn = rig.bus.open_txns[node_id("first")]
    held_shards = {k for k in range(rig.settings.shards)
                   if open_txn.writes_to(rig.settings.fired_topic, k)}
    assert held_shards, "the paused node's transaction holds no fired message"
    assert rig.fired() == []
    # Its session expires; a second node joins and is given every shard.
    second = await rig.start("second")
    assert node_id("first") not in rig.bus.open_txns  # aborted by the fence
    await rig.advance_to(T0 + 4_000)
    # The first node wakes up: its commit fails, and it finds it is no longer a member.
    hold.set()
    await rig.settle()
    await rig.advance_to(T0 + 6_000)
    assert first.owned == {} and first.failure is None
    assert sorted(second.owned) == [0, 1]
    fired = rig.fired()
    assert Counter(m.key for m in fired) == Counter(j.encode() for j in jobs)  # once each
    for m in fired:
        assert scheduled_at(m) <= m.committed_ms  # never early
        assert m.committed_ms >= T0 + 1_200  # all of it published after the takeover
    for k in (0, 1):
        assert state_records(rig, k)[-1]["owner"] == node_id("second")
    assert_claim_before_publish(rig)


async def test_a_fenced_node_that_is_still_a_member_takes_its_shards_again(
        rig: NodeRig) -> None:
    node = await rig.start("me")
    rig.upsert("before", at=T0 + 1_000)
    await rig.advance(1_500)
    # Another node's takeover of a shard whose record still named us fences our producer
    # (here without moving any shard: the group still gives us both).
    fencer = rig.bus.producer(node_id("me"), "unit-nodes")
    await fencer.start()
    rig.upsert("after", at=T0 + 3_000)
    await rig.advance(3_000)
    assert node.transactions is not None and node.transactions.session == 1
    assert sorted(node.owned) == [0, 1] and node.failure is None
    assert all(o.actor.session == 1 for o in node.owned.values())
    assert Counter(m.key for m in rig.fired()) == Counter([b"before", b"after"])
    assert_claim_before_publish(rig)


async def test_a_graceful_stop_releases_the_shards_and_the_next_owner_fences_nobody(
        rig: NodeRig) -> None:
    first = await rig.start("first")
    rig.upsert("a", at=T0 + 1_000)
    await rig.advance(1_500)
    await first.shutdown()
    rig.nodes.remove(first)
    for k in (0, 1):
        assert state_records(rig, k)[-1]["owner"] is None
    starts = len(rig.bus.starts)
    await rig.start("second")
    assert node_id("first") not in rig.bus.starts[starts:]
    rig.upsert("b", at=T0 + 3_000)
    await rig.advance(3_000)
    assert Counter(m.key for m in rig.fired()) == Counter([b"a", b"b"])
    assert_claim_before_publish(rig)


async def test_one_transaction_carries_every_shards_part(rig: NodeRig) -> None:
    node = await rig.start("me")
    # Jobs on both shards due at the same instant.
    ids = [f"same-{i}" for i in range(40)]
    assert {shard_of(j, 2) for j in ids} == {0, 1}
    for job_id in ids:
        rig.upsert(job_id, at=T0 + 2_000)
    await rig.advance(1_900)
    commits = rig.bus.commits
    await rig.advance(200, step_ms=200)
    assert len(rig.fired()) == len(ids)
    assert rig.bus.commits - commits <= 2  # not one per shard and step
    shards = node.metrics.registry.get_sample_value("chronowheel_transaction_shard_parts_total")
    txns = node.metrics.registry.get_sample_value("chronowheel_transaction_seconds_count")
    assert shards is not None and txns is not None and shards > txns


async def test_a_herd_goes_one_shard_part_per_transaction_past_max_batch() -> None:
    # Each shard's step of a herd on one millisecond holds ~100 messages, over max_batch (50):
    # a transaction then takes one part, so readers see the herd part by part instead of all
    # of it only when the whole herd is written.
    rig = NodeRig(shards=4, max_batch=50)
    try:
        node = await rig.start("me")
        ids = [f"herd-{i}" for i in range(400)]
        assert {shard_of(j, 4) for j in ids} == {0, 1, 2, 3}
        for job_id in ids:
            rig.upsert(job_id, at=T0 + 2_000)
        await rig.advance(1_900)
        registry = node.metrics.registry

        def sample(name: str) -> float:
            value = registry.get_sample_value(name)
            assert value is not None, name
            return value

        txns = sample("chronowheel_transaction_seconds_count")
        parts = sample("chronowheel_transaction_shard_parts_total")
        await rig.advance(200, step_ms=200)
        fired = rig.fired()
        assert Counter(m.key for m in fired) == Counter(j.encode() for j in ids)
        assert all(scheduled_at(m) == T0 + 2_000 <= m.committed_ms for m in fired)
        herd_txns = sample("chronowheel_transaction_seconds_count") - txns
        herd_parts = sample("chronowheel_transaction_shard_parts_total") - parts
        assert herd_txns >= 4
        assert herd_parts == herd_txns
    finally:
        await rig.stop_all()


async def test_a_failed_transaction_renews_the_producer_and_takes_the_shards_again(
        rig: NodeRig) -> None:
    node = await rig.start("me")
    rig.upsert("before", at=T0 + 1_000)
    await rig.advance(1_500)
    # A transaction fails for a reason that is neither a fence nor refused records (a broker
    # error, or a producer its Kafka client gave up on): it concerns those shards, not the node.
    rig.bus.fail_commits = 1
    rig.upsert("during", at=T0 + 2_000)
    rig.upsert("after", at=T0 + 4_000)
    await rig.advance(3_500)
    assert node.failure is None
    assert node.transactions is not None and node.transactions.session == 1
    assert sorted(node.owned) == [0, 1]
    assert all(o.actor.session == 1 for o in node.owned.values())
    assert Counter(m.key for m in rig.fired()) == Counter([b"before", b"during", b"after"])
    for m in rig.fired():
        assert scheduled_at(m) <= m.committed_ms  # never early
    assert node.metrics.txn_failed._value.get() == 1
    assert_claim_before_publish(rig)


async def test_transactions_that_keep_failing_stop_the_node(rig: NodeRig) -> None:
    node = await rig.start("me")
    rig.bus.fail_commits = 1_000_000
    rig.bus.fail_commits_of = node_id("me")  # the node's transactions; the claims go through
    rig.upsert("never", at=T0 + 1_000)
    # Many renewals in a few seconds (a leader election) do not stop it...
    await rig.advance(10_000)
    assert node.failure is None
    assert node.transactions is not None and node.transactions.session > MAX_FAILED_IN_ROW
    # ...failures that go on past FAILING_FOR_MS do.
    await rig.advance(FAILING_FOR_MS)
    assert node.failure is not None
    assert "in a row" in str(node.failure)
    assert rig.fired() == []


def test_renewals_after_failures_in_a_row_back_off_up_to_a_cap() -> None:
    assert [renew_backoff_ms(n) for n in range(1, 8)] == [0, 200, 400, 800, 1_600, 3_200, 5_000]
    assert renew_backoff_ms(1_000) == 5_000


async def test_the_submit_partition_is_sought_while_the_claim_commits(rig: NodeRig) -> None:
    """A takeover reads the committed submit offset and seeks while its claim commits (the
    offset is settled with the state record); nothing reaches the shard before the claim."""
    first = await rig.start("first")
    rig.upsert("a", at=T0 + 1_000)
    await rig.advance(1_500)
    await first.shutdown()
    rig.nodes.remove(first)
    claim = rig.bus.hold_commits(f"{rig.settings.namespace}-shard-0")
    second = rig.new_node("second")
    await second.start()
    await rig.settle()
    member = rig.bus.members[second.group_id][-1]
    committed = rig.bus.group_offsets.get((second.group_id, rig.settings.submit_topic, 0))
    assert (0, committed) in member.seeks  # sought, while the claim waits
    assert not second.owned[0].actor.ready
    for k in (0, 1):  # shard 0's claim has not committed: its last record is the release
        assert state_records(rig, k)[-1]["owner"] == (None if k == 0 else node_id("second"))
    job = next(f"b-{i}" for i in range(100) if shard_of(f"b-{i}", 2) == 0)
    rig.upsert(job, at=T0 + 3_000)
    await rig.advance(1_000)
    assert not second.owned[0].actor.ready
    claim.set()
    await rig.advance(2_000)
    assert second.owned[0].actor.ready and second.failure is None
    assert Counter(m.key for m in rig.fired()) == Counter([b"a", job.encode()])
    assert_claim_before_publish(rig)


async def test_an_actor_that_fails_after_its_claim_releases_the_shard(rig: NodeRig) -> None:
    """A shard actor that fails after its claim (here its loader, on a bug) releases the shard
    with its claimer: the next owner fences nobody, where it used to fence the node's producer
    (aborting what the node did for its other shards)."""
    read_bucket = rig.store.read_bucket

    def failing(minute: int, shard: int, **kw: object) -> object:
        if shard == 0:
            raise RuntimeError("a bug on shard 0's path")
        return read_bucket(minute, shard, **kw)  # type: ignore[arg-type]

    rig.store.read_bucket = failing  # type: ignore[method-assign,assignment]
    first = rig.new_node("first")
    await first.start()
    await rig.settle()
    assert first.failure is not None and "a bug on shard 0" in repr(first.failure)
    assert state_records(rig, 0)[-1]["owner"] is None  # released by the failed actor
    await first.shutdown()
    rig.nodes.remove(first)
    rig.store.read_bucket = read_bucket  # type: ignore[method-assign]
    starts = len(rig.bus.starts)
    await rig.start("second")
    assert node_id("first") not in rig.bus.starts[starts:]  # nobody fenced
    rig.upsert("after", at=T0 + 3_000)
    await rig.advance(3_000)
    assert Counter(m.key for m in rig.fired()) == Counter([b"after"])
    assert_claim_before_publish(rig)


async def test_a_shard_stopped_past_its_deadline_is_released() -> None:
    """An actor whose stop passes `stop_deadline_ms` (a row write that never returns) is
    cancelled; it then releases the shard, so its next owner fences nobody, and the command
    it was applying is applied by that owner (its offset was never committed)."""
    rig = NodeRig(shards=1, ingest_batch=1, stop_deadline_ms=50, stop_drain_ms=60_000)
    hold = hold_writes_of(rig, "stuck")
    try:
        first = await rig.start("first")
        rig.upsert("stuck", at=T0 + 10_000)
        await rig.settle()  # its row write is held: the stop's drain cannot finish
        await asyncio.wait_for(first.shutdown(), 30)
        rig.nodes.remove(first)
        assert state_records(rig, 0)[-1]["owner"] is None
        starts = len(rig.bus.starts)
        hold.set()
        await rig.start("second")
        assert node_id("first") not in rig.bus.starts[starts:]  # nobody fenced
        await rig.advance(11_000)
        assert [m.key for m in rig.fired()] == [b"stuck"]
        assert_claim_before_publish(rig)
    finally:
        hold.set()
        await rig.stop_all()


async def test_a_takeover_whose_seek_fails_after_the_claim_releases_the_shard(
        rig: NodeRig) -> None:
    """The seek runs beside the claim: when it fails and the claim committed, the takeover
    releases the shard before it fails, so the next owner fences nobody."""
    first = rig.new_node("first")
    group_of = rig.bus.submit_group

    def failing_group(**kw: object) -> object:
        group = group_of(**kw)  # type: ignore[arg-type]
        seek = group.seek

        async def refused(shard: int, offset: int | None) -> int:
            if shard == 0:
                raise BusError("seek refused")
            return await seek(shard, offset)

        group.seek = refused  # type: ignore[method-assign]
        return group

    rig.bus.submit_group = failing_group  # type: ignore[method-assign,assignment]
    await first.start()
    await rig.settle()
    assert first.failure is not None and "seek refused" in repr(first.failure)
    assert state_records(rig, 0)[-1]["owner"] is None
    await first.shutdown()
    rig.nodes.remove(first)
    rig.bus.submit_group = group_of  # type: ignore[method-assign]
    starts = len(rig.bus.starts)
    await rig.start("second")
    assert node_id("first") not in rig.bus.starts[starts:]
