"""The urgent lane's bookkeeping (`node/urgent.py`), without a node: which records go out of
turn, the order kept per job, and where the shard's partition is read."""

from __future__ import annotations

from dataclasses import dataclass

from chronowheel.core.model import ValidationPolicy, encode_cancel, encode_upsert
from chronowheel.core.shard import shard_of
from chronowheel.node.state import Outgoing
from chronowheel.node.urgent import UrgentLane

NOW = 1_796_115_600_000
SHARDS = 4


@dataclass
class Rec:
    offset: int
    key: bytes | None
    value: bytes | None
    topic: str = "unit.submit"
    partition: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()


def job_in(shard: int, n: int) -> str:
    found = [j for j in (f"job-{i}" for i in range(1_000)) if shard_of(j, SHARDS) == shard]
    return found[n]


def lane(**kw: int) -> UrgentLane:
    args = {"urgent_ms": 30_000, "lookahead": 100, "queue_rows": 10, "resume_rows": 5, **kw}
    return UrgentLane(shard=0, shards=SHARDS, policy=ValidationPolicy(), **args)


def upsert(offset: int, job_id: str, at_ms: int, **fields: object) -> Rec:
    return Rec(offset, job_id.encode(), encode_upsert({"id": job_id, "at": at_ms, **fields}))


SOON, FAR = NOW + 2_000, NOW + 86_400_000


def test_only_a_new_one_shot_of_its_shard_due_soon_is_urgent() -> None:
    ln = lane()
    a, b, c, d, e = (job_in(0, i) for i in range(5))
    records = [
        upsert(0, a, SOON),  # urgent
        upsert(1, b, FAR),  # not due soon
        Rec(2, c.encode(), encode_upsert({"id": c, "cron": "* * * * *"})),  # recurring
        upsert(3, d, SOON, calendar="holidays"),  # uses a calendar: in order
        upsert(4, job_in(1, 0), SOON),  # another shard's: forwarded in order
        Rec(5, e.encode(), b"{not json"),  # refused in order, with its reason
        Rec(6, e.encode(), encode_cancel(e)),
        upsert(7, e, NOW + 30_001),  # just beyond urgent_ms
    ]
    for i, rec in enumerate(records):
        assert ln.arrived(rec, queued=i, now_ms=NOW)
    assert list(ln.ready) == [0]
    assert sum(ln.waiting.values()) == 7


def test_a_job_with_an_earlier_unapplied_command_keeps_its_turn() -> None:
    ln = lane()
    a, b = job_in(0, 0), job_in(0, 1)
    ln.arrived(upsert(0, a, FAR), 0, NOW)
    ln.arrived(upsert(1, a, SOON), 1, NOW)  # a's earlier command waits: so does this one
    ln.arrived(upsert(2, b, SOON), 2, NOW)
    assert list(ln.ready) == [2]
    # A record without a key could be any job's: nothing after it jumps.
    ln.arrived(Rec(3, None, encode_upsert({"id": job_in(0, 2), "at": FAR})), 3, NOW)
    ln.arrived(upsert(4, job_in(0, 3), SOON), 4, NOW)
    assert list(ln.ready) == [2]


def test_the_lane_leaves_a_job_the_in_order_step_is_applying() -> None:
    ln = lane()
    a, b = job_in(0, 0), job_in(0, 1)
    first, second, other = upsert(0, a, SOON), upsert(1, a, SOON), upsert(2, b, SOON)
    for i, rec in enumerate((first, second, other)):
        ln.arrived(rec, i, NOW)
    assert list(ln.ready) == [0, 1, 2]
    # The in-order step reaches `first` before the lane took it: it applies it itself...
    assert ln.in_order(first)
    # ...so the lane must not apply a's later command meanwhile, only b's.
    batch = ln.take(10)
    assert batch is not None and [r.offset for r, _ in batch.records] == [2]
    assert ln.take(10) is None
    assert ln.stepped([first], through=0) == []
    batch = ln.take(10)
    assert batch is not None and [r.offset for r, _ in batch.records] == [1]


def test_the_pass_skips_what_the_lane_applied_and_releases_its_messages_after_it() -> None:
    ln = lane()
    a, b = job_in(0, 0), job_in(0, 1)
    far, soon = upsert(0, a, FAR), upsert(1, b, SOON)
    ln.arrived(far, 0, NOW)
    ln.arrived(soon, 1, NOW)
    batch = ln.take(10)
    assert batch is not None
    assert ln.waits_for_lane([far, soon])  # an in-order step over both waits for the lane
    message = Outgoing("unit.rejected", 0, soon.key, b"quarantined", [])
    ln.finished(batch, [(1, message)])
    assert not ln.waits_for_lane([far, soon])
    # A step that ends before the lane's record keeps its message back...
    assert ln.in_order(far)
    assert ln.stepped([far], through=0) == []
    # ...the one that goes past it skips the record and lets the message out.
    assert not ln.in_order(soon)
    assert ln.stepped([], through=1) == [message]
    assert not ln.waiting and not ln.applied and not ln.ready


def test_a_backlog_is_looked_ahead_then_read_again_from_where_the_queue_ended() -> None:
    ln = lane(queue_rows=4, resume_rows=2, lookahead=8)
    ids = [job_in(0, i) for i in range(20)]
    queue: list[Rec] = []

    def hand(*offsets: int, urgent: set[int] | None = None) -> None:
        for o in offsets:
            rec = upsert(o, ids[o], SOON if o in (urgent or set()) else FAR)
            if ln.arrived(rec, len(queue), NOW):
                queue.append(rec)

    hand(0, 1, 2, 3)
    assert [r.offset for r in queue] == [0, 1, 2, 3] and ln.fetch_wanted(4, paused=False)
    # Full: what comes next is looked at and dropped, an urgent one kept for the lane.
    hand(4, 5, 6, 7, urgent={6})
    assert [r.offset for r in queue] == [0, 1, 2, 3] and ln.skip_from == 4
    assert list(ln.ready) == [6]
    assert ln.fetch_wanted(4, paused=False)
    hand(8, 9, 10, 11)
    assert not ln.fetch_wanted(4, paused=False)  # eight offsets ahead: enough
    assert ln.plan_seek(4) is None  # the queue has not drained yet
    # The queue drains: the partition is read again where it ended, nothing fetched meanwhile.
    queue[:3] = []
    assert ln.plan_seek(1) == 4
    assert not ln.fetch_wanted(1, paused=True)
    hand(12)  # fetched before the seek: read again later
    ln.sought()
    assert ln.fetch_wanted(1, paused=True)
    hand(4, 5, 6)  # read again: no second look, queued in order
    assert [r.offset for r in queue] == [3, 4, 5, 6] and list(ln.ready) == [6]
    # Full again, five offsets looked at beyond: not read again, and not read on either.
    hand(7)
    assert ln.skip_from == 7 and not ln.fetch_wanted(4, paused=False)
    assert ln.plan_seek(4) is None
    queue[:3] = []
    assert ln.plan_seek(1) == 7
    ln.sought()
    hand(7, 8, 9)
    # Full again, two offsets looked at beyond: the look-ahead goes on past them.
    hand(10)
    assert ln.skip_from == 10 and not ln.fetch_wanted(4, paused=False)
    assert ln.plan_seek(4) == 12
    ln.sought()
    assert ln.fetch_wanted(4, paused=True)
    hand(12, 13, urgent={13})
    assert [r.offset for r in queue] == [6, 7, 8, 9]
    assert list(ln.ready) == [6, 13] and ln.looked_to == 14


def test_with_the_lane_off_everything_is_queued() -> None:
    ln = lane(urgent_ms=0, queue_rows=2, resume_rows=1)
    assert not ln.enabled
    for o in range(5):
        assert ln.arrived(upsert(o, job_in(0, o), SOON), o, NOW)
    assert not ln.ready and ln.skip_from is None
    assert not ln.fetch_wanted(3, paused=False) and ln.fetch_wanted(0, paused=True)


def test_the_lane_holds_no_more_records_than_the_queue() -> None:
    # A whole herd due soon: the lane keeps queue_rows of them, the rest go in order.
    ln = lane(queue_rows=3, resume_rows=1, lookahead=100)
    queued = 0
    for o in range(10):
        if ln.arrived(upsert(o, job_in(0, o), SOON), queued, NOW):
            queued += 1
    assert list(ln.ready) == [0, 1, 2]
    assert sum(ln.waiting.values()) == 7
