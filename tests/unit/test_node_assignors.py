"""The node group's assignors (bus/assignors.py): a rebalance moves only the shards it must.

The group's protocol is played out here without a broker: each member's assignor class makes
its JoinGroup metadata, the leader's assigns, and each member's learns its share (what aiokafka's
coordinator does with them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from chronowheel.bus.assignors import node_assignors

TOPIC = "ns.submit"


@dataclass
class Cluster:
    """The one method of aiokafka's ClusterMetadata the assignors read, and topics()."""

    partitions: int

    def topics(self) -> set[str]:
        return {TOPIC}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(self.partitions)) if topic == TOPIC else None


@dataclass
class Group:
    cluster: Cluster
    assignors: dict[str, type[AbstractPartitionAssignor]] = field(default_factory=dict)
    owned: dict[str, set[int]] = field(default_factory=dict)

    def join(self, member: str, assignor: type[AbstractPartitionAssignor] | None = None) -> None:
        self.assignors[member] = assignor or node_assignors()[0]

    def leave(self, member: str) -> None:
        del self.assignors[member]
        self.owned.pop(member, None)

    def rebalance(self) -> dict[str, set[int]]:
        """One generation: metadata from every member, the leader (the first) assigns."""
        metadata = {m: a.metadata({TOPIC}) for m, a in self.assignors.items()}
        leader = next(iter(self.assignors.values()))
        assignments = leader.assign(self.cluster, metadata)  # type: ignore[arg-type]
        self.owned = {}
        for member, assignment in assignments.items():
            self.assignors[member].on_assignment(assignment)
            self.owned[member] = {p for t, ps in assignment.assignment for p in ps if t == TOPIC}
        return self.owned


def moved(before: dict[str, set[int]], after: dict[str, set[int]]) -> dict[int, tuple[str, str]]:
    """partition -> (old owner, new owner) for each partition whose owner changed."""
    old = {p: m for m, ps in before.items() for p in ps}
    new = {p: m for m, ps in after.items() for p in ps}
    return {p: (old[p], new[p]) for p in new if p in old and old[p] != new[p]}


def assert_balanced(owned: dict[str, set[int]], partitions: int) -> None:
    everyone = [p for ps in owned.values() for p in ps]
    assert sorted(everyone) == list(range(partitions))  # each partition has one owner
    sizes = [len(ps) for ps in owned.values()]
    assert max(sizes) - min(sizes) <= 1, owned


def test_sticky_is_preferred_and_round_robin_remains_for_a_group_of_mixed_versions() -> None:
    sticky, fallback = node_assignors()
    assert sticky.name == "sticky" and fallback is RoundRobinPartitionAssignor


def test_a_join_moves_only_the_shards_the_new_node_takes() -> None:
    group = Group(Cluster(8))
    group.join("a")
    group.join("b")
    before = {m: set(ps) for m, ps in group.rebalance().items()}
    assert_balanced(before, 8)
    group.join("c")
    after = group.rebalance()
    assert_balanced(after, 8)
    moves = moved(before, after)
    assert all(new == "c" for _, new in moves.values()), moves
    assert len(moves) == len(after["c"]) == 2  # 8 over three: 3, 3, 2
    assert after["a"] <= before["a"] and after["b"] <= before["b"]


def test_round_robin_moves_shards_between_the_old_nodes_too() -> None:
    # What the sticky assignor avoids (aiokafka's default, used before it).
    group = Group(Cluster(8))
    for member in ("a", "b"):
        group.join(member, RoundRobinPartitionAssignor)
    before = {m: set(ps) for m, ps in group.rebalance().items()}
    group.join("c", RoundRobinPartitionAssignor)
    moves = moved(before, group.rebalance())
    assert any(new != "c" for _, new in moves.values()), moves


def test_a_leave_moves_only_the_shards_of_the_node_that_left() -> None:
    group = Group(Cluster(16))
    for member in ("a", "b", "c", "d"):
        group.join(member)
    before = {m: set(ps) for m, ps in group.rebalance().items()}
    assert_balanced(before, 16)
    group.leave("b")
    after = group.rebalance()
    assert_balanced(after, 16)
    moves = moved({m: ps for m, ps in before.items() if m != "b"}, after)
    assert moves == {}, moves  # no shard of a surviving node moved
    assert set().union(*after.values()) == set(range(16))
    for member in ("a", "c", "d"):
        assert before[member] <= after[member]


def test_a_rolling_restart_with_new_member_ids_keeps_the_rest_in_place() -> None:
    # A restarted node rejoins as a new member (no static membership) and has no assignment
    # to report: only its former shards move, to it or to others, and the others keep theirs.
    group = Group(Cluster(16))
    for member in ("a", "b", "c"):
        group.join(member)
    owned = {m: set(ps) for m, ps in group.rebalance().items()}
    for restarted, again in (("a", "a2"), ("b", "b2"), ("c", "c2")):
        group.leave(restarted)
        group.join(again)
        after = group.rebalance()
        assert_balanced(after, 16)
        survivors = {m: ps for m, ps in owned.items() if m != restarted}
        assert moved(survivors, after) == {}, (restarted, owned, after)
        owned = {m: set(ps) for m, ps in after.items()}


def test_each_consumer_gets_an_assignor_class_of_its_own() -> None:
    # aiokafka's sticky assignor keeps the member's assignment in class attributes: two
    # members in one process must not report each other's partitions.
    group = Group(Cluster(4))
    group.join("a")
    group.join("b")
    owned = group.rebalance()
    a, b = group.assignors["a"], group.assignors["b"]
    assert a is not b
    reported = {m: group.assignors[m].metadata({TOPIC}) for m in ("a", "b")}
    decoded = {m: a.parse_member_metadata(md).partitions  # type: ignore[attr-defined]
               for m, md in reported.items()}
    assert {m: {tp.partition for tp in tps} for m, tps in decoded.items()} == owned
