"""The wheel's entry: which instant it fires at, and what it costs."""

from __future__ import annotations

import sys

import pytest
from chronowheel.core import wire
from chronowheel.core.buckets import minute_of
from chronowheel.node.pending import Pending, pending_from_row, with_schedule
from chronowheel.store.base import DueRow

T0 = 1_800_000_000_000


def row(*, scheduled_ms: int, slot_ms: int, spec: bytes | None = None,
        origin: str = "", request_id: str = "") -> DueRow:
    return DueRow(minute_of(slot_ms), 0, slot_ms, "job-1", 1, scheduled_ms, 1, "t", b"p", (),
                  spec, origin=origin, request_id=request_id)


@pytest.mark.parametrize(("spec", "origin", "request_id"), [
    (None, "", ""), (b"{}", "", ""), (None, wire.TRIGGER_ORIGIN, "r1")],
    ids=["one-shot", "recurring", "triggered"])
def test_an_entry_fires_at_its_slot_whether_or_not_it_was_moved(
        spec: bytes | None, origin: str, request_id: str) -> None:
    same = pending_from_row(row(scheduled_ms=T0, slot_ms=T0, spec=spec, origin=origin,
                                request_id=request_id))
    moved = pending_from_row(row(scheduled_ms=T0, slot_ms=T0 + 7, spec=spec, origin=origin,
                                 request_id=request_id))
    assert (same.scheduled_ms, same.slot_ms) == (T0, T0)
    assert (moved.scheduled_ms, moved.slot_ms) == (T0, T0 + 7)
    # The slot is where it fires, not what it is: both are the same occurrence.
    assert moved == same and hash(moved) == hash(same)


def test_a_catch_up_fire_keeps_the_slot_of_the_entry_it_came_from() -> None:
    p = pending_from_row(row(scheduled_ms=T0, slot_ms=T0 + 7, spec=b"{}"))
    caught_up = with_schedule(p, T0 - 60_000)
    assert (caught_up.scheduled_ms, caught_up.slot_ms) == (T0 - 60_000, T0 + 7)
    assert caught_up.recurring == p.recurring


def test_an_unmoved_one_shot_carries_no_slot_field() -> None:
    p = pending_from_row(row(scheduled_ms=T0, slot_ms=T0))
    assert type(p) is Pending
    # Four fields: 64 bytes with the GC header, a size class of pymalloc; a fifth field
    # would cost 16 bytes more per entry.
    assert sys.getsizeof(p) <= 64
