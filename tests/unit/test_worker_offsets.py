"""Offset tracking of the worker: commit only a contiguous prefix of handled records."""

from __future__ import annotations

import random

from chronowheel.worker.offsets import OffsetTracker


def test_nothing_received_nothing_to_commit() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    assert t.commit_point("p") is None
    assert t.commit_points() == {}


def test_out_of_order_finishes_commit_only_the_contiguous_prefix() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    tickets = {o: t.begin("p", o) for o in (10, 11, 12, 13)}
    assert t.commit_point("p") == 10  # nothing done yet: still "read from 10"
    t.finish(tickets[12])
    t.finish(tickets[13])
    assert t.commit_point("p") == 10  # 10 and 11 still run
    t.finish(tickets[10])
    assert t.commit_point("p") == 11
    t.finish(tickets[11])
    assert t.commit_point("p") == 14


def test_gaps_in_offsets_are_fine() -> None:
    # Transaction markers and compaction leave holes between record offsets.
    t: OffsetTracker[str] = OffsetTracker()
    a, b = t.begin("p", 3), t.begin("p", 7)
    t.finish(b)
    assert t.commit_point("p") == 3
    t.finish(a)
    assert t.commit_point("p") == 8


def test_partitions_are_independent() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    slow = t.begin("a", 0)
    fast = t.begin("b", 0)
    t.finish(fast)
    assert t.commit_points() == {"a": 0, "b": 1}
    t.committed({"a": 0, "b": 1})
    assert t.commit_points() == {}
    t.finish(slow)
    assert t.commit_points() == {"a": 1}


def test_committed_points_are_not_offered_again_and_never_go_back() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    x = t.begin("p", 5)
    t.finish(x)
    t.committed({"p": 6})
    assert t.commit_point("p") is None
    t.committed({"p": 4})  # a late, older commit result must not move it back
    assert t.last_committed("p") == 6
    y = t.begin("p", 6)
    assert t.commit_point("p") is None  # 6 in flight: the point is still 6
    t.finish(y)
    assert t.commit_point("p") == 7


def test_a_record_never_finished_holds_its_partition_back() -> None:
    # A handling cancelled at shutdown is never finished: it and what follows are redelivered.
    t: OffsetTracker[str] = OffsetTracker()
    t.begin("p", 0)
    later = [t.begin("p", o) for o in range(1, 50)]
    for tk in later:
        t.finish(tk)
    assert t.commit_point("p") == 0


def test_tickets_of_a_dropped_partition_do_not_count_after_reassignment() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    old = t.begin("p", 5)
    t.drop(["p"])
    assert t.commit_point("p") is None
    new = t.begin("p", 5)  # redelivered to us after re-assignment, still running
    assert t.finish(old) is False
    assert t.commit_point("p") == 5
    assert t.in_flight("p") == 1
    assert t.finish(new) is True
    assert t.commit_point("p") == 6


def test_random_finish_orders_match_a_model() -> None:
    rng = random.Random(7)
    for _ in range(200):
        t: OffsetTracker[int] = OffsetTracker()
        offsets = sorted(rng.sample(range(1000), rng.randint(1, 30)))
        tickets = [t.begin(0, o) for o in offsets]
        done: set[int] = set()
        for tk in rng.sample(tickets, len(tickets)):
            t.finish(tk)
            done.add(tk.offset)
            first_open = next((o for o in offsets if o not in done), None)
            want = first_open if first_open is not None else offsets[-1] + 1
            assert t.commit_point(0) == want
