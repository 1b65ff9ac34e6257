"""Bytes a loaded occurrence costs the node, measured with tracemalloc.

Deterministic (it counts allocations, not RSS or time), so it is stable on a busy machine and
can bound the cost in a unit test. It builds due rows the way a Cassandra page delivers them
(a fresh object for every column value of every row), feeds them to a shard's loader, drops the
pages and counts what stays allocated: the wheel's structures and everything its entries hold.
"""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import dataclass

from chronowheel.core import wire
from chronowheel.core.buckets import minute_of
from chronowheel.core.clock import ManualClock
from chronowheel.node.loader import Loader
from chronowheel.node.state import ShardState
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow
from chronowheel.store.memory import MemoryStore

PAGE_ROWS = 1000


@dataclass(frozen=True)
class EntryCost:
    entries: int
    payload_bytes: int
    bytes_per_entry: float

    @property
    def overhead_per_entry(self) -> float:
        """What an entry costs beyond its payload's bytes."""
        return self.bytes_per_entry - self.payload_bytes


def _fresh_str(text: str) -> str:
    # A new string object, as the driver decodes one per row and column.
    return (text + ".")[:-1]


def _fresh_bytes(data: bytes) -> bytes:
    return bytes(bytearray(data))


def _fresh_int(value: int) -> int:
    # Ints above 256 are separate objects per row in a decoded page; small ones are shared.
    return int(str(value))


def _page(first: int, count: int, *, start_ms: int, spread_ms: int, payload: bytes,
          topic: str, job_prefix: str) -> list[DueRow]:
    rows = []
    for i in range(first, first + count):
        due = start_ms + 1 + (i * 7919) % spread_ms if spread_ms else start_ms + 1
        rows.append(DueRow(
            minute_of(due), 0, _fresh_int(due), _fresh_str(f"{job_prefix}{i:07d}"), 1,
            _fresh_int(due), _fresh_int(1), _fresh_str(topic), _fresh_bytes(payload), (),
            None, _fresh_int(wire.DEFAULT_MAX_ATTEMPTS), _fresh_int(wire.DEFAULT_BACKOFF_MS)))
    return rows


def loaded_entry_cost(entries: int, *, payload_bytes: int = 90, spread_ms: int = 60_000,
                      job_prefix: str = "bench-run.herd.") -> EntryCost:
    """Load `entries` one-shot occurrences due within `spread_ms` (0: all at one instant, a
    herd) into a fresh shard's wheel through its loader; tracemalloc bytes per entry."""
    start_ms = 1_700_000_000_000
    state = ShardState(shard=0, start_ms=start_ms, tick_ms=1, ingest_slack_ms=0)
    loader = Loader(state=state, settings=Settings(), store=MemoryStore(),
                    clock=ManualClock(start_ms))
    payload = b"p" * payload_bytes
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for first in range(0, entries, PAGE_ROWS):
            page = _page(first, min(PAGE_ROWS, entries - first), start_ms=start_ms,
                         spread_ms=spread_ms, payload=payload, topic="orders.due",
                         job_prefix=job_prefix)
            loader.apply_rows(page, state.touch_seq + 1)
            del page
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(state.wheel) == entries
    return EntryCost(entries, payload_bytes, (after - before) / entries)
