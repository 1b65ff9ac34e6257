"""The node's parts on their own: the due-row factories, the rejections of an ingest batch, the
clock guard's clock-step check and the no-op test of an upsert."""

from __future__ import annotations

from dataclasses import dataclass, replace

import orjson
import pytest
from chronowheel.core import limits, wire
from chronowheel.core.buckets import minute_of
from chronowheel.core.clock import ManualClock
from chronowheel.core.model import (
    JobSpec,
    Retry,
    Upsert,
    ValidationPolicy,
    encode_retry,
    encode_upsert,
    parse_command,
)
from chronowheel.errors import ConfigError, StoreRefused
from chronowheel.node.clock_guard import ClockGuard
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.rejections import Rejections
from chronowheel.node.state import Outgoing
from chronowheel.node.transitions import unchanged
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobRow
from chronowheel.store.memory import MemoryStore

from tests.unit.node_rig import T0

SETTINGS = Settings(namespace="unit", shards=2, http_port=0)
POLICY = ValidationPolicy.from_settings(SETTINGS)


def job(**fields: object) -> JobSpec:
    cmd = parse_command(encode_upsert({"id": "j", "payload": "p", **fields}),
                        key=None, policy=POLICY, now_ms=T0)
    assert isinstance(cmd, Upsert)
    return cmd.job


def test_a_one_shots_due_row_carries_the_fired_headers_and_no_spec() -> None:
    spec = job(at=T0 + 5_000, headers={"team": "a"})
    row = DueRow.for_job(spec, shard=1, slot_ms=T0 + 5_007, scheduled_ms=T0 + 5_000, version=3)
    assert row == DueRow(minute_of(T0 + 5_007), 1, T0 + 5_007, "j", 1, T0 + 5_000, 3, "unit.fired",
                         spec.payload, spec.fired_headers, None, spec.max_attempts, spec.backoff_ms)
    assert row.headers == (("team", "a"),) and not row.origin


def test_a_recurring_jobs_due_row_carries_its_spec_or_the_stored_bytes() -> None:
    spec = job(every="1m", concurrency="forbid")
    row = DueRow.for_job(spec, shard=0, slot_ms=T0, scheduled_ms=T0, version=1)
    assert row.spec == spec.canonical and (wire.CONCURRENCY, "forbid") in row.headers
    stored = DueRow.for_job(spec, shard=0, slot_ms=T0, scheduled_ms=T0, version=1,
                            spec=b"as stored")
    assert stored.spec == b"as stored"


def test_a_requested_occurrence_has_the_jobs_own_headers_and_its_request() -> None:
    spec = job(every="1m", headers={"team": "a"}, concurrency="forbid")
    row = DueRow.for_request(spec, shard=0, slot_ms=T0 + 1, scheduled_ms=T0, version=0,
                             origin=wire.BACKFILL_ORIGIN, request_id="r1")
    assert row.headers == spec.headers and row.spec is None
    assert (row.origin, row.request_id) == (wire.BACKFILL_ORIGIN, "r1")
    assert row.entry == wire.requested_occurrence_id("j", T0, wire.BACKFILL_ORIGIN, "r1")


def test_a_retrys_due_row_defaults_its_delivery_policy() -> None:
    cmd = parse_command(encode_retry(id="j", scheduled_ms=T0, attempt=2, at_ms=T0 + 9,
                                     topic="unit.fired", payload=b"p"),
                        key=None, policy=POLICY, now_ms=T0)
    assert isinstance(cmd, Retry)
    row = DueRow.for_retry(cmd, shard=1, slot_ms=T0 + 10)
    assert (row.slot_ms, row.attempt, row.scheduled_ms, row.version) == (T0 + 10, 2, T0, 0)
    assert (row.max_attempts, row.backoff_ms) == (wire.DEFAULT_MAX_ATTEMPTS,
                                                  wire.DEFAULT_BACKOFF_MS)
    row = DueRow.for_retry(replace(cmd, max_attempts=7, backoff_ms=11), shard=1, slot_ms=T0)
    assert (row.max_attempts, row.backoff_ms) == (7, 11)


@dataclass
class Record:
    value: bytes | None
    key: bytes | None = b"k"
    topic: str = "unit.submit"
    partition: int = 1
    offset: int = 42
    headers: list[tuple[str, bytes]] | None = None


def test_a_rejection_names_its_source_and_stands_in_for_an_original_too_large() -> None:
    rejections = Rejections(shard=1, rejected_topic="unit.rejected", metrics=NodeMetrics())
    outbox: list[Outgoing] = []
    rejections.rejection(Record(b"{}"), "id: bad", outbox)  # type: ignore[arg-type]
    big = b"x" * limits.KAFKA_MAX_MESSAGE_BYTES
    rejections.rejection(Record(big), "too big", outbox)  # type: ignore[arg-type]
    small, large = outbox
    assert small.topic == "unit.rejected" and small.value == b"{}"
    assert dict(small.headers)[wire.SOURCE_OFFSET] == b"42"
    assert dict(large.headers)[wire.ORIGINAL_BYTES] == str(len(big)).encode()
    assert orjson.loads(large.value)["original_bytes"] == len(big)


def test_a_quarantine_rejects_the_command_alone_unless_the_error_is_the_nodes() -> None:
    metrics = NodeMetrics()
    rejections = Rejections(shard=1, rejected_topic="unit.rejected", metrics=metrics)
    cmd = Upsert(job(at=T0 + 1))
    rejections.sources[id(cmd)] = Record(b"{}")  # type: ignore[assignment]
    rejections.quarantine(cmd, StoreRefused("the store refused it"))
    assert len(rejections.late) == 1
    assert metrics.quarantined.labels("ingest", "store_refused")._value.get() == 1
    with pytest.raises(ConfigError):
        rejections.quarantine(cmd, ConfigError("no MODIFY permission on table due"))
    assert len(rejections.late) == 1


class SteppingClock(ManualClock):
    """Wall time that a test can step; elapsed time that never steps."""

    def __init__(self, start_ms: int) -> None:
        super().__init__(start_ms)
        self.step_ms = 0

    def now_ms(self) -> int:
        return super().now_ms() + self.step_ms


async def test_the_clock_guard_stops_dispatch_at_once_when_the_clock_steps() -> None:
    clock = SteppingClock(T0)
    store = MemoryStore(clock=clock)
    woken: list[bool] = []
    guard = ClockGuard(settings=replace(SETTINGS, max_clock_skew_ms=500), clock=clock,
                       metrics=NodeMetrics(), node_id="n", store=lambda: store,
                       on_clear=lambda: woken.append(True))
    assert guard.dispatch_blocked(), "blocked until a first skew check passes"
    guard.blocked = False
    clock.advance(10_000)  # time passing is no step
    assert not guard.dispatch_blocked()
    clock.step_ms = 1_000  # the wall clock alone jumps: a step
    assert guard.dispatch_blocked() and guard.blocked and guard.recheck.is_set()
    assert not woken


def test_an_upsert_is_a_no_op_only_over_the_same_spec_not_cancelled() -> None:
    spec = job(at=T0 + 1)
    row = JobRow("j", 0, spec.canonical, 1, "scheduled", T0 + 1, T0 + 1)
    assert unchanged(row, spec)
    assert not unchanged(replace(row, status="cancelled"), spec)
    assert not unchanged(replace(row, spec=b"{}"), spec)
    assert not unchanged(None, spec)
