"""One bad command or occurrence never stops a node (no servers: in-memory store and bus with
Cassandra's limits, manual clock).

Each test puts good one-shots on the same shard before and after the bad input and checks that
the node is still running, that the good ones fire once and on time, and that the bad one is in
`<ns>.rejected` with the limit or the store's refusal named (or, at dispatch, that its job is
paused with the reason counted)."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import orjson
import pytest
from chronowheel.core import limits
from chronowheel.errors import ConfigError, StoreRefused
from chronowheel.node.service import Node
from chronowheel.settings import Settings
from chronowheel.store.base import DueKey, DueRow, JobRow
from chronowheel.store.memory import MemoryStore

from tests.unit.node_rig import T0, NodeRig, scheduled_at

SHARDS = 1  # every job on the one shard: bad and good share it


@pytest.fixture
async def rig() -> AsyncIterator[NodeRig]:
    async with NodeRig(shards=SHARDS) as rig:
        yield rig


def running(node: Node) -> bool:
    return node.failure is None and bool(node.owned) and all(
        o.actor.ready and not o.task.done() for o in node.owned.values())


def rejected(rig: NodeRig) -> dict[str, bytes]:
    """job id (record key) -> cw-reason of each rejected command."""
    return {(m.key or b"").decode(): m.header("cw-reason") or b""
            for m in rig.bus.messages(rig.settings.rejected_topic)}


def fired_once_on_time(rig: NodeRig, ats: dict[str, int]) -> None:
    fired = rig.fired()
    assert Counter((m.key or b"").decode() for m in fired) == Counter(list(ats)), fired
    for m in fired:
        at = ats[(m.key or b"").decode()]
        assert scheduled_at(m) == at and at <= m.committed_ms, (m.key, at, m.committed_ms)


def good_jobs(rig: NodeRig, prefix: str, n: int, at: int) -> dict[str, int]:
    ats = {f"{prefix}-{i}": at + i for i in range(n)}
    for job_id, when in ats.items():
        rig.upsert(job_id, at=when)
    return ats


async def test_a_60_kb_payload_is_rejected_by_name_and_the_shard_goes_on(rig: NodeRig) -> None:
    node = await rig.start()
    ats = good_jobs(rig, "before", 5, T0 + 2_000)
    rig.upsert("big", at=T0 + 2_500, payload={"blob": "x" * 60_000})
    ats |= good_jobs(rig, "after", 5, T0 + 3_000)
    await rig.advance_to(T0 + 5_000)
    assert running(node)
    fired_once_on_time(rig, ats)
    reason = rejected(rig)["big"]
    assert b"51200" in reason and b"store_batch_fail_bytes" in reason, reason


async def test_a_cron_beyond_cassandras_ttl_is_rejected_by_name(rig: NodeRig) -> None:
    node = await rig.start()
    ats = good_jobs(rig, "before", 3, T0 + 2_000)
    # 29 February on a day-of-week list that, with 2032 excluded, first comes 20+ years on.
    rig.upsert("far", cron="0 0 29 2 */7", exclude_dates=["2032-02-29"])
    ats |= good_jobs(rig, "after", 3, T0 + 3_000)
    await rig.advance_to(T0 + 5_000)
    assert running(node)
    fired_once_on_time(rig, ats)
    reason = rejected(rig)["far"]
    assert re.search(rb"20[ -]year", reason), reason


class RefusingStore(MemoryStore):
    """Refuses every write that carries one chosen job, as Cassandra refuses a batch for one
    oversized member; counts the grouped writes it is asked for."""

    def __init__(self, poison: str, error: Exception, *, grouped: bool = True,
                 **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.poison = poison
        self.error = error
        self.grouped = grouped
        """Whether grouped writes (new jobs) are refused too, or only single ones (edits)."""
        self.group_writes = 0

    async def put_dues_and_jobs(self, rows: Sequence[tuple[DueRow, int, JobRow]]) -> None:
        self.group_writes += 1
        if self.grouped and any(due.job_id == self.poison for due, _ttl, _job in rows):
            raise self.error
        await super().put_dues_and_jobs(rows)

    async def put_due_and_job(self, row: DueRow, ttl_s: int, job: JobRow,
                              replaces: DueKey | None = None) -> None:
        if row.job_id == self.poison:
            raise self.error
        await super().put_due_and_job(row, ttl_s, job, replaces)


def refusing_rig(error: Exception, *, grouped: bool = True, **settings: object) -> NodeRig:
    rig = NodeRig(shards=SHARDS, **settings)
    rig.store = RefusingStore("poison", error, grouped=grouped, clock=rig.clock)
    return rig


async def test_a_store_refusal_in_a_group_finds_the_culprit_by_halving() -> None:
    # 64 new jobs, written 16 per logged batch; the store refuses any batch holding "poison".
    rig = refusing_rig(StoreRefused("Batch too large"), ingest_group_bytes=1 << 20)
    store = rig.store
    assert isinstance(store, RefusingStore)
    try:
        node = await rig.start()
        ats = good_jobs(rig, "a", 40, T0 + 2_000)
        rig.upsert("poison", at=T0 + 2_100)
        ats |= good_jobs(rig, "b", 23, T0 + 2_200)
        await rig.advance_to(T0 + 4_000)
        assert running(node)
        fired_once_on_time(rig, ats)
        assert rejected(rig)["poison"].startswith(b"Batch too large")
        # 4 groups of 16; the refused one is halved 4 times down to the culprit (2 writes a
        # halving): 4 + 8 = 12, against 4 + 16 for a write per job of that group.
        assert store.group_writes == 4 + 2 * 4, store.group_writes
        quarantined = node.metrics.quarantined.labels("ingest", "store_refused")._value.get()
        assert quarantined == 1
    finally:
        await rig.stop_all()


async def test_a_bug_on_one_commands_path_quarantines_that_command_alone() -> None:
    rig = refusing_rig(KeyError("a bug"), grouped=False)
    try:
        node = await rig.start()
        # An edit of a scheduled job goes one command at a time (put_due_and_job). Its first
        # version is due beyond the loaded horizon: only its due row stands for it.
        first = T0 + rig.settings.lookahead_ms + 600_000
        rig.upsert("poison", at=first)
        await rig.settle()
        ats = good_jobs(rig, "before", 3, T0 + 2_000)
        rig.upsert("poison", at=first + 1_000)
        ats |= good_jobs(rig, "after", 3, T0 + 3_000)
        await rig.advance_to(T0 + 4_000)
        assert running(node)
        fired_once_on_time(rig, ats)
        assert b"internal error while applying: KeyError" in rejected(rig)["poison"]
        assert node.metrics.quarantined.labels("ingest", "internal")._value.get() == 1
        # The refused edit changed nothing (its delete of the old row went in the batch the
        # store refused): the first version still fires, loaded from its due row.
        await rig.advance_to(first + 1_000, step_ms=2_000)
        assert [scheduled_at(m) for m in rig.fired("poison")] == [first]
    finally:
        await rig.stop_all()


async def test_an_error_about_all_the_work_still_stops_the_shard() -> None:
    rig = refusing_rig(ConfigError("no MODIFY permission on table due"))
    try:
        node = await rig.start()
        rig.upsert("poison", at=T0 + 2_000)
        await rig.advance(1_000)
        assert not running(node)
        assert rejected(rig) == {}  # nothing quarantined: the operator must act
    finally:
        await rig.stop_all()


async def test_a_next_occurrence_beyond_the_ttl_pauses_its_job_at_dispatch() -> None:
    # A retention period of 20 years less 40 days leaves a due row 40 days of reach.
    rig = NodeRig(shards=SHARDS, retention_ms=limits.CASSANDRA_MAX_TTL_S * 1000 - 40 * 86_400_000,
                  max_horizon_ms=30 * 86_400_000)
    try:
        node = await rig.start()
        # T0 is 09:00 on 1 December 2026: fires at 10:00 and 10:01, then a year later.
        rig.upsert("yearly", cron="0-1 10 1 12 *")
        ats = good_jobs(rig, "good", 3, T0 + 3_600_000 + 90_000)
        await rig.advance_to(T0 + 3_600_000 + 120_000, step_ms=1_000)
        assert running(node)
        assert [scheduled_at(m) for m in rig.fired("yearly")] == [T0 + 3_600_000,
                                                                   T0 + 3_660_000]
        job = await rig.store.get_job("yearly")
        assert job is not None and job.status == "paused"
        assert job.scheduled_ms == T0 + 3_600_000 + 365 * 86_400_000
        assert node.metrics.quarantined.labels("dispatch", "limit")._value.get() == 1
        good = [m for m in rig.fired() if (m.key or b"").startswith(b"good")]
        assert sorted(scheduled_at(m) for m in good) == sorted(ats.values())
    finally:
        await rig.stop_all()


async def test_a_rejection_too_large_to_republish_carries_the_size_and_digest(
        rig: NodeRig) -> None:
    node = await rig.start()
    value = b"{" + b" " * (limits.KAFKA_MAX_MESSAGE_BYTES - 100) + b"}"  # no op: invalid
    rig.submit("huge", value)
    ats = good_jobs(rig, "after", 2, T0 + 2_000)
    await rig.advance_to(T0 + 3_000)
    assert running(node)
    fired_once_on_time(rig, ats)
    [msg] = rig.bus.messages(rig.settings.rejected_topic)
    assert msg.header("cw-original-bytes") == str(len(value)).encode()
    assert orjson.loads(msg.value or b"") == {
        "original_bytes": len(value), "original_sha256": hashlib.sha256(value).hexdigest()}
    assert len(msg.header("cw-reason") or b"") <= limits.MAX_REASON_BYTES


async def test_a_reason_is_cut_to_its_limit(rig: NodeRig) -> None:
    await rig.start()
    unknown = {f"field_{'z' * 5_000}": 1}  # the reason quotes the field's name
    rig.submit("odd", orjson.dumps({"v": 1, "op": "upsert",
                                    "job": {"id": "odd", "at": T0 + 5_000, **unknown}}))
    await rig.settle()
    reason = rejected(rig)["odd"]
    assert 0 < len(reason) <= limits.MAX_REASON_BYTES and b"z" * 300 not in reason, reason


def test_cut_reason_keeps_whole_characters_within_the_limit() -> None:
    text = "é" * 2_000  # two bytes each: a cut in the middle of one must not split it
    cut = limits.cut_reason(text)
    assert len(cut.encode()) <= limits.MAX_REASON_BYTES and cut.endswith("...")
    assert cut[:-3] == "é" * len(cut[:-3])
    assert limits.cut_reason("short") == "short"


@pytest.mark.parametrize("job_id", ["a\nb", "nul\x00", "rtl\u202etxt", "del\x7f", "ls\u2028"])
async def test_an_id_with_unsafe_characters_is_refused_and_logged_harmlessly(
        rig: NodeRig, job_id: str, caplog: pytest.LogCaptureFixture) -> None:
    await rig.start()
    rig.submit("x", orjson.dumps({"v": 1, "op": "upsert",
                                  "job": {"id": job_id, "at": T0 + 5_000,
                                          "headers": {job_id: "v"}}}))
    await rig.settle()
    reason = rejected(rig)["x"].decode()
    assert "job.id" in reason and "control" in reason, reason
    assert not any(ch in reason for ch in ("\n", "\x00", "\u202e", "\x7f", "\u2028"))
    assert all("\n" not in r.getMessage() and "\u202e" not in r.getMessage()
               for r in caplog.records)


def test_a_horizon_and_retention_beyond_cassandras_ttl_are_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="max_horizon_ms \\+ retention_ms"):
        Settings(max_horizon_ms=limits.CASSANDRA_MAX_TTL_S * 1000, retention_ms=1)
    Settings(max_horizon_ms=limits.CASSANDRA_MAX_TTL_S * 1000 - 1, retention_ms=1)  # the limit


@pytest.mark.parametrize("exc", [MemoryError(), ConnectionResetError(104, "reset"),
                                 OSError(28, "No space left on device")])
def test_the_process_or_machine_failing_concerns_the_node_not_the_command(
        exc: Exception) -> None:
    from chronowheel.node.failures import concerns_the_node

    assert concerns_the_node(exc)
    assert not concerns_the_node(KeyError("a bug")) and not concerns_the_node(
        StoreRefused("Batch too large"))
