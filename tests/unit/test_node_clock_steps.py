"""A node whose clock is stepped (an NTP step, a VM resumed, an operator's `date -s`) between two
skew checks: dispatch stops at once, not at the next check, so nothing fires early; it resumes
when a skew check finds the clocks agreeing again."""

from __future__ import annotations

from chronowheel.core.clock import ManualClock, anchor, stepped_ms
from chronowheel.node.service import Node

from tests.unit.node_rig import T0, NodeRig, scheduled_at


class SteppedClock:
    """The node's clock: the rig's time (which the store's "server" reads) plus a step that a
    test changes; its monotonic time is the rig's, which never steps."""

    def __init__(self, base: ManualClock) -> None:
        self.base = base
        self.offset_ms = 0

    def now_ms(self) -> int:
        return self.base.now_ms() + self.offset_ms

    def elapsed_ms(self) -> int:
        return self.base.now_ms()

    async def sleep_until(self, deadline_ms: int) -> None:
        await self.base.sleep_until(deadline_ms - self.offset_ms)

    def step(self, delta_ms: int) -> None:
        self.offset_ms += delta_ms


async def start_node(rig: NodeRig, clock: SteppedClock) -> Node:
    node = Node(rig.settings, clock=clock, store=rig.store, bus=rig.bus,
                shards=rig.settings.shards, node_id="stepped")
    rig.nodes.append(node)
    await node.start()
    await rig.settle()
    assert not node.blocked
    return node


def test_stepped_ms_is_the_wall_time_moved_beyond_the_elapsed_time() -> None:
    base = ManualClock(T0)
    clock = SteppedClock(base)
    mark = anchor(clock)
    base.advance(1_000)
    assert stepped_ms(clock, mark) == 0
    clock.step(-7_000)
    assert stepped_ms(clock, mark) == -7_000


async def test_a_clock_stepped_forward_between_skew_checks_fires_nothing_early() -> None:
    rig = NodeRig(shards=1)
    clock = SteppedClock(rig.clock)
    node = await start_node(rig, clock)
    rig.upsert("soon", at=T0 + 10_000)
    rig.upsert("later", at=T0 + 40_000)
    await rig.advance(1_000)
    assert not rig.fired()

    clock.step(20_000)  # the node now believes it is 20 s later than it is
    await rig.advance(1_000)  # dispatch looks again (its idle commit is due)
    for o in node.owned.values():
        o.actor.wake.set()
    await rig.settle()
    assert node.blocked, "a 20 s step did not stop dispatch"
    assert not rig.fired(), "a job fired early after the clock stepped forward"

    # The real due time of "soon" passes while the clock is still wrong: nothing goes.
    await rig.advance_to(T0 + 12_000)
    assert not rig.fired()

    clock.step(-20_000)  # corrected: the next skew check agrees again
    node.clock_guard.recheck.set()
    await rig.settle()
    await rig.advance(500)
    assert not node.blocked
    fired = rig.fired()
    assert [m.key for m in fired] == [b"soon"]
    assert all(rig.clock.now_ms() >= scheduled_at(m) for m in fired)
    await rig.stop_all()


async def test_a_clock_stepped_back_stops_dispatch_until_it_agrees_again() -> None:
    rig = NodeRig(shards=1)
    clock = SteppedClock(rig.clock)
    node = await start_node(rig, clock)
    rig.upsert("job", at=T0 + 5_000)
    await rig.advance(1_000)
    clock.step(-30_000)
    await rig.advance(200)
    for o in node.owned.values():
        o.actor.wake.set()
    await rig.settle()
    assert node.blocked
    clock.step(30_000)
    node.clock_guard.recheck.set()
    await rig.settle()
    await rig.advance_to(T0 + 5_500)
    assert not node.blocked
    assert [m.key for m in rig.fired()] == [b"job"]
    await rig.stop_all()


async def test_small_steps_within_the_skew_limit_do_not_stop_dispatch() -> None:
    rig = NodeRig(shards=1, max_clock_skew_ms=500)
    clock = SteppedClock(rig.clock)
    node = await start_node(rig, clock)
    clock.step(300)
    rig.upsert("job", at=T0 + 2_000)
    await rig.advance_to(T0 + 2_000)
    assert not node.blocked
    assert [m.key for m in rig.fired()] == [b"job"]
    await rig.stop_all()
