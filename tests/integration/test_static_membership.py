"""Static group membership (`node_instance_id`) with the node's group member on its own thread,
against the real broker: a member restarted within its session timeout gets its own shards
back, and the other member keeps its shards all along (no rebalance reaches it)."""

from __future__ import annotations

import asyncio
import time

from chronowheel.bus.kafka_node import KafkaSubmitGroup
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
        members.events.clear()

        down = time.monotonic()
        await a.stop()  # a static member does not leave its group: its shards wait for it
        restarted = members.member("node-a")
        await restarted.start()
        await until(lambda: restarted is not None and restarted.assigned() == held_a,
                    SESSION_MS / 1000, "the restarted member holds its shards again",
                    poll_s=0.05)
        took = time.monotonic() - down
        # Nothing moved meanwhile, or since: the other member heard of no rebalance.
        await asyncio.sleep(2 * settings.node_heartbeat_interval_ms / 1000)
        assert b.assigned() == held_b
        assert [e for e in members.events if e[0] == "node-b"] == [], members.events
        assert ("node-a", "assigned", sorted(held_a)) in members.events
        print(f"\nstatic member stopped and back with shards {sorted(held_a)} in {took:.2f} s")
    finally:
        for member in (restarted, b, a):
            if member is not None:
                await member.stop()
