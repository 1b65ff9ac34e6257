"""Static group membership (`node_instance_id`) with the node's group member on its own thread,
against the real broker: a member restarted within its session timeout gets its own shards
back, and the other member keeps its shards all along (no rebalance reaches it)."""

from __future__ import annotations

import time

from chronowheel.bus.kafka import open_admin
from chronowheel.bus.kafka_node import KafkaSubmitGroup
from chronowheel.ops.cluster import Group, describe_group
from chronowheel.settings import Settings

from testkit.fleet import until
from tests.conftest import Stack
from tests.integration.harness import make_namespace

SESSION_MS = 10_000
SHARDS = 4


class _Members:
    def __init__(self, settings: Settings, group_id: str) -> None:
        self.settings = settings
        self.group_id = group_id
        self.events: list[tuple[str, str, list[int]]] = []

    def member(self, name: str) -> KafkaSubmitGroup:
        async def assigned(shards: list[int]) -> None:
            self.events.append((name, "assigned", sorted(shards)))

        async def revoked(shards: list[int]) -> None:
            self.events.append((name, "revoked", sorted(shards)))

        return KafkaSubmitGroup(self.settings.replace(node_instance_id=name),
                                group_id=self.group_id, client_id=name,
                                session_timeout_ms=SESSION_MS, on_assigned=assigned,
                                on_revoked=revoked)

    async def settled(self, held: dict[str, set[int]], timeout_s: float) -> Group:
        """Wait until the broker has the group stable with these members, each holding these
        shards; the group as described then."""
        seen: list[Group] = []

        async def stable() -> bool:
            admin = await open_admin(self.settings)
            try:
                group = await describe_group(admin, self.group_id, self.settings.submit_topic)
            finally:
                await admin.close()
            seen[:] = [group]
            return (group.state == "Stable"
                    and sorted(m.client_id for m in group.members) == sorted(held)
                    and all(held_by(group, name) == shards for name, shards in held.items()))

        await until(stable, timeout_s, f"the broker to show the group stable with {held}")
        return seen[0]


def held_by(group: Group, client_id: str) -> set[int]:
    return {k for k, member in group.owners.items() if member.client_id == client_id}


def member_ids(group: Group, client_id: str) -> list[str]:
    return [m.member_id for m in group.members if m.client_id == client_id]


async def test_a_static_member_restarted_within_its_session_gets_its_shards_back_alone(
        stack: Stack, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=SHARDS,
                                    node_session_timeout_ms=SESSION_MS)
    members = _Members(settings, f"{namespace}.static-membership")
    a, b = members.member("node-a"), members.member("node-b")
    await a.start()
    await b.start()
    restarted: KafkaSubmitGroup | None = None
    try:
        await until(lambda: bool(
            a.assigned() and b.assigned() and len(a.assigned() | b.assigned()) == SHARDS
            and not a.assigned() & b.assigned()), 60,
            "both members hold shards, every shard held once")
        held_a, held_b = a.assigned(), b.assigned()
        held = {"node-a": held_a, "node-b": held_b}
        before = await members.settled(held, SESSION_MS / 1000)
        members.events.clear()

        down = time.monotonic()
        await a.stop()  # a static member does not leave its group: its shards wait for it
        restarted = members.member("node-a")
        await restarted.start()
        await until(lambda: restarted is not None and restarted.assigned() == held_a,
                    SESSION_MS / 1000, "the restarted member holds its shards again",
                    poll_s=0.05)
        took = time.monotonic() - down
        # Nothing moved meanwhile, or since: the broker has the group stable with both members
        # holding what they held before, the other one still under its old member id. A
        # rebalance the restart began is not over before every member joins it again, and a
        # member runs its revocation before it does: had one begun, the group would not be
        # stable yet, or node-b's revocation would be among the events below.
        after = await members.settled(held, 3 * SESSION_MS / 1000)
        assert member_ids(after, "node-b") == member_ids(before, "node-b")
        assert b.assigned() == held_b
        assert [e for e in members.events if e[0] == "node-b"] == [], members.events
        assert ("node-a", "assigned", sorted(held_a)) in members.events
        print(f"\nstatic member stopped and back with shards {sorted(held_a)} in {took:.2f} s")
    finally:
        for member in (restarted, b, a):
            if member is not None:
                await member.stop()
