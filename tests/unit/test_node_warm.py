"""Warm shards (in-memory bus, manual clock): a rebalance that gives a node back the shards it
held resumes them with their wheels kept, without reading Cassandra's buckets again, once the
shard's state record, its committed submit offset and the kept claimer prove that nobody took
the shard meanwhile; anything else (another node claimed it, began claiming it, or its offset
moved) takes it over in full. Nothing fires early, twice or not at all either way."""

from __future__ import annotations

from collections import Counter
from typing import Any

from chronowheel.bus.memory import MemorySubmitGroup
from chronowheel.core.shard import shard_of
from chronowheel.node.registry import ShardRegistry
from chronowheel.node.service import Node

from tests.unit.node_rig import T0, NodeRig, scheduled_at
from tests.unit.test_node_fencing import assert_claim_before_publish, state_records


def count_loads(rig: NodeRig) -> Counter[int]:
    """Bucket reads per shard from here on (a takeover's reload reads every minute from the
    watermark)."""
    loads: Counter[int] = Counter()
    real = rig.store.read_bucket

    def counting(minute: int, shard: int, **kw: Any) -> Any:
        loads[shard] += 1
        return real(minute, shard, **kw)

    rig.store.read_bucket = counting  # type: ignore[method-assign]
    return loads


def group(node: Node) -> MemorySubmitGroup:
    g = node._group
    assert isinstance(g, MemorySubmitGroup)
    return g


def takeovers(node: Node) -> dict[str, float]:
    return {kind: node.metrics.takeovers.labels(kind)._value.get() for kind in ("warm", "full")}


def registry(node: Node) -> ShardRegistry:
    return node.registry


def job_on(shard: int, prefix: str, shards: int = 2) -> str:
    """A job id of `shard`."""
    return next(f"{prefix}-{i}" for i in range(1000) if shard_of(f"{prefix}-{i}", shards) == shard)


def assert_each_once_never_early(rig: NodeRig, expected: Counter[str]) -> None:
    got = Counter((m.key or b"").decode() for m in rig.fired())
    assert got == expected
    for m in rig.fired():
        fired_at = m.header("cw-fired-at")
        assert fired_at is not None and int(fired_at) >= scheduled_at(m), m
        assert m.committed_ms >= scheduled_at(m), m


async def test_a_rebalance_that_gives_the_shards_back_keeps_their_wheels(rig: NodeRig) -> None:
    node = await rig.start("me")
    for k in (0, 1):
        rig.upsert(job_on(k, "soon"), at=T0 + 2_000)
        rig.upsert(job_on(k, "later"), at=T0 + 30_000)
    rig.upsert(job_on(0, "tick"), every="1s", start=T0 + 1_000)
    await rig.advance(1_500)
    wheels = {k: len(o.actor.state.wheel) for k, o in node.owned.items()}
    actors = {k: o.actor for k, o in node.owned.items()}
    assert all(wheels.values()), wheels
    loads = count_loads(rig)

    await group(node).revoke([0, 1])  # the eager protocol: every shard, every node
    await rig.settle()
    assert node.owned == {} and sorted(registry(node).warm) == [0, 1]
    for k in (0, 1):
        assert state_records(rig, k)[-1]["owner"] is None  # released: a mover fences nobody
    rig.upsert(job_on(1, "meanwhile"), at=T0 + 4_000)  # applied once the shard is back
    await group(node).assign([0, 1])
    await rig.settle()

    assert loads == Counter(), "a shard given back was read again from Cassandra"
    assert {k: o.actor for k, o in node.owned.items()} == actors  # the same actors, wheels
    assert all(o.actor.resumed_warm and o.actor.ready for o in node.owned.values())
    assert takeovers(node) == {"warm": 2, "full": 2}
    assert registry(node).warm == {}
    for k in (0, 1):  # claimed again (by us) right after the release
        records = state_records(rig, k)
        last_release = max(i for i, r in enumerate(records) if r.get("owner") is None)
        claim = records[last_release + 1]
        assert claim.get("claim") is True and claim["owner"] == "unit-node-me", records
    await rig.advance(29_000)
    expected = Counter({job_on(0, "soon"): 1, job_on(1, "soon"): 1, job_on(0, "later"): 1,
                        job_on(1, "later"): 1, job_on(1, "meanwhile"): 1,
                        job_on(0, "tick"): 30})
    assert_each_once_never_early(rig, expected)
    ticks = sorted(scheduled_at(m) for m in rig.fired(job_on(0, "tick")))
    assert ticks == list(range(T0 + 1_000, T0 + 31_000, 1_000))
    assert_claim_before_publish(rig)


async def test_a_shard_claimed_elsewhere_in_between_is_taken_over_in_full(
        rig: NodeRig) -> None:
    first = await rig.start("first")
    for k in (0, 1):
        rig.upsert(job_on(k, "a"), at=T0 + 1_000)
        rig.upsert(job_on(k, "b"), at=T0 + 6_000)
        rig.upsert(job_on(k, "c"), at=T0 + 20_000)
    await rig.advance(1_500)
    await group(first).revoke([0, 1])
    await rig.settle()
    assert sorted(registry(first).warm) == [0, 1]

    # Another node holds both shards for a while (it claims them: its claimer fences the
    # first node's kept claimers), fires what comes due, and gives them up.
    second = rig.new_node("second")
    await second.start()
    await rig.settle()
    assert sorted(second.owned) == [0, 1]
    await rig.advance(6_000)
    await group(second).revoke([0, 1])
    await rig.settle()

    loads = count_loads(rig)
    await group(first).assign([0, 1])
    await rig.settle()
    assert all(not o.actor.resumed_warm for o in first.owned.values())
    assert takeovers(first) == {"warm": 0, "full": 4}
    assert loads[0] and loads[1], "a shard another node held was not reloaded"
    await rig.advance(15_000)
    assert_each_once_never_early(rig, Counter(
        {job_on(k, p): 1 for k in (0, 1) for p in ("a", "b", "c")}))
    assert_claim_before_publish(rig)


async def test_a_claim_begun_elsewhere_or_a_moved_offset_forces_a_full_takeover(
        rig: NodeRig) -> None:
    node = await rig.start("me")
    for k in (0, 1):
        rig.upsert(job_on(k, "a"), at=T0 + 5_000)
    await rig.advance(1_000)
    await group(node).revoke([0, 1])
    await rig.settle()
    # Shard 0: a node started claiming it (its claimer initialised: ours is fenced) and was
    # stopped before it committed anything, so the record still is our release.
    claimer = rig.bus.producer(f"{rig.settings.namespace}-shard-0", "unit-nodes")
    await claimer.start()
    # Shard 1: its committed submit offset moved (nothing may apply its commands but a claimed
    # owner: the warm shard would miss them).
    offsets = rig.bus.group_offsets
    key = ("unit-nodes", rig.settings.submit_topic, 1)
    offsets[key] = offsets.get(key, 0) + 1
    loads = count_loads(rig)
    await group(node).assign([0, 1])
    await rig.settle()
    assert not node.owned[0].actor.resumed_warm and not node.owned[1].actor.resumed_warm
    assert loads[0] and loads[1]
    assert takeovers(node) == {"warm": 0, "full": 4}
    await rig.advance(5_000)
    assert_each_once_never_early(rig, Counter({job_on(0, "a"): 1, job_on(1, "a"): 1}))
    assert_claim_before_publish(rig)


async def test_warm_shards_not_given_back_are_dropped(rig: NodeRig) -> None:
    node = await rig.start("me")
    rig.upsert(job_on(1, "a"), at=T0 + 5_000)
    await rig.advance(1_000)
    await group(node).revoke([0, 1])
    await rig.settle()
    kept = registry(node).warm[1]
    await group(node).assign([0])
    await rig.settle()
    assert registry(node).warm == {} and kept.claimer is None and not kept.clean
    assert node.owned[0].actor.resumed_warm
    # Given back later (a rebalance after the grace), it is taken over in full.
    await group(node).assign([1])
    await rig.settle()
    assert not node.owned[1].actor.resumed_warm
    await rig.advance(5_000)
    assert_each_once_never_early(rig, Counter({job_on(1, "a"): 1}))


async def revoked(rig: NodeRig, job_id: str, at_ms: int) -> Node:
    """A node that took both shards, `job_id` due at `at_ms`, and a revocation of both after a
    second."""
    node = await rig.start("me")
    rig.upsert(job_id, at=at_ms)
    await rig.advance(1_000)
    await group(node).revoke([0, 1])
    await rig.settle()
    return node


async def assert_given_back_in_full(rig: NodeRig, node: Node) -> None:
    """Both shards assigned again are taken over in full: reloaded, not resumed warm."""
    loads = count_loads(rig)
    await group(node).assign([0, 1])
    await rig.settle()
    assert not any(o.actor.resumed_warm for o in node.owned.values())
    assert loads[0] and loads[1]
    assert takeovers(node) == {"warm": 0, "full": 4}


async def test_warm_shards_are_dropped_when_the_grace_passes_on_the_node_s_clock() -> None:
    async with NodeRig(warm_grace_ms=5_000) as rig:
        node = await revoked(rig, job_on(1, "a"), T0 + 9_000)
        kept = dict(registry(node).warm)
        assert sorted(kept) == [0, 1]
        await rig.advance(4_900)  # the manual clock alone moves: short of the grace
        assert registry(node).warm == kept
        assert all(a.claimer is not None and a.clean for a in kept.values())
        await rig.advance(100)  # the grace is over
        assert registry(node).warm == {}
        assert all(a.claimer is None and not a.clean for a in kept.values())
        # Given back after the grace: nothing lost or early.
        await assert_given_back_in_full(rig, node)
        await rig.advance(4_000)
        assert_each_once_never_early(rig, Counter({job_on(1, "a"): 1}))


async def test_a_grace_of_0_keeps_no_shard_warm() -> None:
    async with NodeRig(warm_grace_ms=0) as rig:
        node = await revoked(rig, job_on(0, "a"), T0 + 3_000)
        assert registry(node).warm == {}
        await assert_given_back_in_full(rig, node)
        await rig.advance(3_000)
        assert_each_once_never_early(rig, Counter({job_on(0, "a"): 1}))


async def test_a_shard_resumed_warm_exports_its_series_again(rig: NodeRig) -> None:
    """The release drops a shard's per-shard series; the same actor run again (warm) exports
    them anew and keeps them current, not into series no longer registered."""
    node = await rig.start("me")
    rig.upsert(job_on(0, "a"), at=T0 + 3_000)
    rig.upsert(job_on(0, "b"), at=T0 + 30_000)
    await rig.advance(1_000)
    registry_ = node.metrics.registry

    def entries(shard: int) -> float | None:
        return registry_.get_sample_value("chronowheel_wheel_entries", {"shard": str(shard)})

    def watermark(shard: int) -> float | None:
        return registry_.get_sample_value("chronowheel_watermark_seconds", {"shard": str(shard)})

    assert entries(0) == 2
    await group(node).revoke([0, 1])
    await rig.settle()
    assert entries(0) is None and watermark(0) is None  # released: no frozen series
    await group(node).assign([0, 1])
    await rig.settle()
    assert node.owned[0].actor.resumed_warm
    await rig.advance(3_000)  # "a" fires: the wheel and the watermark move on
    assert entries(0) == 1
    first = watermark(0)
    assert first is not None and first >= (T0 + 3_000) / 1000
    await rig.advance(2_000)
    later = watermark(0)
    assert later is not None and later > first
