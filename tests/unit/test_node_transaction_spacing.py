"""Spacing between node transactions (`node_transaction_spacing_ms`): a transaction begins no
sooner than the spacing after the last one began, unless an urgent part (a shard's first after
its takeover, a release) is waiting; with no spacing, transactions go back to back."""

from __future__ import annotations

import asyncio

import pytest
from chronowheel.bus.memory import MemoryBus, MemorySubmitGroup
from chronowheel.bus.ports import Transaction
from chronowheel.cli import build_parser
from chronowheel.core.clock import ManualClock
from chronowheel.errors import ConfigError
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.transactions import NodeTransactions
from chronowheel.settings import Settings, settings_from_args

from tests.unit.node_rig import T0, NodeRig
from tests.unit.rig_settle import settle
from tests.unit.test_node_fencing import state_records
from tests.unit.test_node_warm import job_on

SETTINGS = Settings(namespace="unit", shards=2, http_port=0)


class Rig:
    """A node's transaction loop over the in-memory bus; each part notes when its
    transaction took it."""

    def __init__(self, spacing_ms: int, spacing_max_ms: int = 0,
                 max_messages: int | None = None) -> None:
        self.clock = ManualClock(T0)
        self.bus = MemoryBus(SETTINGS, self.clock)
        self.bus.create_namespace(2)
        self.transactions = NodeTransactions(
            producer=lambda: self.bus.producer("unit-node-a", "unit-nodes"), clock=self.clock,
            metrics=NodeMetrics(), on_fenced=lambda session: None, spacing_ms=spacing_ms,
            spacing_max_ms=spacing_max_ms, max_messages=max_messages)
        self.taken: dict[str, int] = {}
        self.committed: dict[str, int] = {}

    async def __aenter__(self) -> Rig:
        await self.transactions.start()
        self.loop = asyncio.create_task(self.transactions.run())
        await self.settle()
        return self

    async def settle(self) -> None:
        await settle(lambda: (len(self.taken), len(self.committed), self.bus.commits,
                              self.clock.now_ms()), "the transaction loop")

    async def __aexit__(self, *exc: object) -> None:
        self.loop.cancel()
        await asyncio.gather(self.loop, return_exceptions=True)
        await self.transactions.stop()

    def part(self, name: str, shard: int = 0, *, urgent: bool = False) -> asyncio.Task[None]:
        async def fill(txn: Transaction) -> int:
            self.taken[name] = self.clock.now_ms()
            await txn.publish(SETTINGS.fired_topic, shard, name.encode(), b"", [])
            return 1

        async def commit() -> None:
            await self.transactions.commit(shard, self.transactions.session, fill, None,
                                           urgent=urgent)
            self.committed[name] = self.clock.now_ms()

        return asyncio.create_task(commit())


async def test_the_next_transaction_waits_for_the_spacing_after_the_last_began() -> None:
    async with Rig(spacing_ms=200) as rig:
        assert rig.transactions.metrics.txn_spacing_seconds._value.get() == 0.2
        first = rig.part("a")
        await rig.settle()
        assert rig.taken == {"a": T0} and first.done()  # nothing in flight: at once
        rig.clock.advance(50)
        second, third = rig.part("b"), rig.part("c", shard=1)
        await rig.settle()
        rig.clock.advance(149)  # T0 + 199
        await rig.settle()
        assert "b" not in rig.taken and "c" not in rig.taken
        rig.clock.advance(1)  # T0 + 200: both go in one transaction
        await rig.settle()
        assert rig.taken["b"] == rig.taken["c"] == T0 + 200
        assert second.done() and third.done()
        rig.clock.advance(500)  # long after the last: a part goes at once
        rig.part("d")
        await rig.settle()
        assert rig.taken["d"] == T0 + 700


async def test_an_urgent_part_ends_the_spacing_and_takes_the_waiting_parts_along() -> None:
    async with Rig(spacing_ms=200) as rig:
        rig.part("a")
        await rig.settle()
        rig.clock.advance(10)
        rig.part("b")
        await rig.settle()
        assert "b" not in rig.taken
        rig.clock.advance(10)
        rig.part("first after a takeover", shard=1, urgent=True)
        await rig.settle()
        assert rig.taken["b"] == rig.taken["first after a takeover"] == T0 + 20
        # The spacing counts from that transaction on.
        rig.clock.advance(10)
        rig.part("c")
        await rig.settle()
        rig.clock.advance(189)
        await rig.settle()
        assert "c" not in rig.taken
        rig.clock.advance(1)
        await rig.settle()
        assert rig.taken["c"] == T0 + 220


async def test_a_full_transaction_does_not_wait_for_the_spacing() -> None:
    async with Rig(spacing_ms=200, max_messages=2) as rig:
        rig.part("a")
        await rig.settle()
        rig.clock.advance(10)
        rig.part("b")
        await rig.settle()
        assert "b" not in rig.taken  # one message of two: it waits
        rig.part("c", shard=1)
        await rig.settle()
        assert rig.taken["b"] == rig.taken["c"] == T0 + 10  # two of two: full, at once
        rig.clock.advance(10)
        for name in ("d", "e", "f"):
            rig.part(name)
        await rig.settle()
        # Full at once; what did not fit (f) goes next, without the spacing either: at
        # max_messages a spacing, a herd would fall behind.
        assert rig.taken["d"] == rig.taken["e"] == rig.taken["f"] == T0 + 20
        rig.part("g")
        await rig.settle()
        assert "g" not in rig.taken
        rig.clock.advance(200)
        await rig.settle()
        assert rig.taken["g"] == T0 + 220


async def test_without_spacing_transactions_go_back_to_back() -> None:
    async with Rig(spacing_ms=0) as rig:
        for name in ("a", "b", "c"):
            rig.part(name)
            await rig.settle()
        assert rig.taken == {"a": T0, "b": T0, "c": T0}


async def test_brokers_slow_to_end_transactions_get_them_spaced_until_they_recover() -> None:
    async with Rig(spacing_ms=0, spacing_max_ms=200) as rig:
        gauge = rig.transactions.metrics.txn_spacing_seconds

        async def one(name: str) -> int:
            """Queue a part and move the clock a millisecond at a time until its transaction
            took it; how long it waited."""
            queued = rig.clock.now_ms()
            rig.part(name)
            await rig.settle()
            while name not in rig.taken:
                rig.clock.advance(1)
                await rig.settle()
            return rig.taken[name] - queued

        async def series(prefix: str, end_ms: float, count: int) -> list[int]:
            """`count` parts one after the other, the brokers ending each in `end_ms`."""
            rig.bus.end_txn_ms = end_ms
            return [await one(f"{prefix} {i}") for i in range(count)]

        await series("quick", 4.0, 20)
        assert gauge._value.get() == 0
        assert await one("back to back") == 0
        waits = await series("slow", 80.0, 30)  # the brokers are short of CPU
        assert waits[0] == 0
        assert max(waits) > 150  # spaced, up to 200 ms after the last began
        assert gauge._value.get() == 0.2
        await series("again", 4.0, 60)  # recovered
        assert gauge._value.get() == 0
        assert await one("back to back again") == 0


def test_the_spacing_is_a_node_flag_and_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().node_transaction_spacing_ms == 0  # back to back unless asked
    assert Settings().node_transaction_spacing_max_ms == 0  # and not adapting
    monkeypatch.setenv("CHRONOWHEEL_NODE_TRANSACTION_SPACING_MS", "150")
    assert settings_from_args(build_parser().parse_args(["node"])).node_transaction_spacing_ms \
        == 150
    args = build_parser().parse_args(["node", "--node-transaction-spacing-ms", "40"])
    assert settings_from_args(args).node_transaction_spacing_ms == 40
    monkeypatch.setenv("CHRONOWHEEL_NODE_TRANSACTION_SPACING_MAX_MS", "250")
    assert settings_from_args(build_parser().parse_args(["node"])) \
        .node_transaction_spacing_max_ms == 250
    args = build_parser().parse_args(["node", "--node-transaction-spacing-max-ms", "90"])
    assert settings_from_args(args).node_transaction_spacing_max_ms == 90


@pytest.mark.parametrize("spacing_ms", [-1, 1001])
def test_a_spacing_out_of_range_is_refused_with_its_bounds(spacing_ms: int) -> None:
    with pytest.raises(ConfigError, match="node_transaction_spacing_ms: must be 0 to 1000"):
        Settings(node_transaction_spacing_ms=spacing_ms)
    with pytest.raises(ConfigError, match="node_transaction_spacing_max_ms: must be 0 to 1000"):
        Settings(node_transaction_spacing_max_ms=spacing_ms)


async def test_a_node_with_spacing_publishes_a_later_occurrence_once_the_spacing_is_over(
) -> None:
    async with NodeRig(shards=1, node_transaction_spacing_ms=300) as rig:
        await rig.start()
        rig.upsert("early", at=T0 + 5_000)
        rig.upsert("soon-after", at=T0 + 5_040)
        await rig.settle()
        await rig.advance_to(T0 + 5_000, step_ms=10)
        [early] = rig.fired("early")
        began = early.committed_ms
        await rig.advance_to(T0 + 5_040, step_ms=1)
        await rig.advance_to(began + 299, step_ms=1)
        assert rig.fired("soon-after") == []  # due, and waiting for the spacing
        await rig.advance(1, step_ms=1)
        [later] = rig.fired("soon-after")
        assert later.committed_ms == began + 300


async def test_a_released_shards_last_part_and_its_first_after_a_takeover_do_not_wait(
) -> None:
    async with NodeRig(shards=2, node_transaction_spacing_ms=300) as rig:
        node = await rig.start("me")
        rig.upsert(job_on(0, "tick"), at=T0 + 5_000)
        rig.upsert(job_on(1, "moved"), at=T0 + 5_005)
        await rig.settle()
        await rig.advance_to(T0 + 5_000, step_ms=10)
        [tick] = rig.fired(job_on(0, "tick"))
        began = tick.committed_ms
        commits = rig.bus.commits
        group = node._group
        assert isinstance(group, MemorySubmitGroup)
        await group.revoke([1])
        await rig.settle()
        released = state_records(rig, 1)[-1]
        assert released["owner"] is None and rig.bus.commits > commits  # within the spacing
        assert rig.clock.now_ms() < began + 300
        await group.assign([1])
        await rig.advance_to(T0 + 5_005, step_ms=1)
        [moved] = rig.fired(job_on(1, "moved"))
        assert moved.committed_ms == T0 + 5_005  # not at `began` + 300
