"""Bulk operations (`SchedulerClient.bulk`, `chronowheel jobs pause|resume|cancel|trigger`)
without servers: selection on the in-memory store, dry run, request ids, the journal and
resuming after an interruption, and a whole node on the in-memory bus applying what is sent."""

from __future__ import annotations

import argparse
import asyncio
import io
import re
from collections import Counter
from typing import Any

import orjson
import pytest
from chronowheel.cli import build_parser
from chronowheel.cli import bulk as cli_bulk
from chronowheel.client import SchedulerClient
from chronowheel.client.bulk import (
    BulkProgress,
    FileJournal,
    JobSelector,
    MemoryJournal,
    job_selector,
    request_id_for,
)
from chronowheel.core import wire
from chronowheel.core.shard import shard_of
from chronowheel.errors import ValidationError
from chronowheel.settings import Settings
from chronowheel.store.base import JobRow, RequestRow
from chronowheel.store.memory import MemoryStore

from tests.unit.node_rig import T0, NodeRig
from tests.unit.test_client import NOW, FakeProducer, acking

MIN = 60_000


def row(job_id: str, *, tenant: str | None = "acme", status: str = "scheduled",
        due: int | None = NOW + MIN, spec: bytes = b'{"every":"1m"}') -> JobRow:
    return JobRow(job_id, shard_of(job_id, 4), spec, 1, status,  # type: ignore[arg-type]
                  due, due, 0, tenant)


async def store_with(rows: list[JobRow]) -> MemoryStore:
    store = MemoryStore()
    await store.put_jobs(rows)
    return store


def bulk_client(producer: Any, store: MemoryStore, **kw: Any) -> SchedulerClient:
    return SchedulerClient(Settings(namespace="acme"), producer=producer, store=store,
                           now_ms=kw.pop("now_ms", lambda: NOW), **kw)


@pytest.fixture
async def fleet() -> MemoryStore:
    """Jobs of two tenants: inv-0..inv-9 and other-0..4 of acme (due NOW + i minutes),
    inv-0..4 of globex, and acme jobs in every other state."""
    rows = [row(f"inv-{i}", due=NOW + i * MIN) for i in range(10)]
    rows += [row(f"other-{i}", due=NOW + i * MIN) for i in range(5)]
    rows += [row(f"g-inv-{i}", tenant="globex") for i in range(5)]
    rows += [row("inv-paused", status="paused"), row("inv-done", status="finished", due=None),
             row("inv-gone", status="cancelled", due=None)]
    return await store_with(rows)


def sent_ids(producer: FakeProducer) -> list[str]:
    return [k.decode() for _t, k, _v in producer.sent]


# --- selection and dry run ------------------------------------------------------------------

async def test_a_dry_run_selects_by_tenant_prefix_and_due_range_and_sends_nothing(
        fleet: MemoryStore) -> None:
    producer = FakeProducer()
    async with bulk_client(producer, fleet) as c:
        s = await c.bulk("pause", tenant="acme", prefix="inv-", due_after=NOW + 2 * MIN,
                         due_before=NOW + 6 * MIN, dry_run=True, operation_id="dry-1")
    assert producer.sent == []
    assert sorted(s.changed) == [f"inv-{i}" for i in range(2, 6)]
    assert (s.matched, s.already, s.refused, s.dry_run) == (4, [], [], True)
    assert s.to_json(sample=2)["changed_ids"] == s.changed[:2]


async def test_jobs_in_the_target_state_get_nothing_and_unfit_ones_are_refused(
        fleet: MemoryStore) -> None:
    producer = FakeProducer()
    async with bulk_client(producer, fleet) as c:
        task = asyncio.create_task(acking(producer))
        s = await c.bulk("pause", tenant="acme", prefix="inv-")
        task.cancel()
    assert sorted(sent_ids(producer)) == sorted(f"inv-{i}" for i in range(10))
    assert producer.docs()[0] == {"v": 1, "op": "pause", "id": s.changed[0]}
    assert s.already == ["inv-paused"]
    assert sorted(s.refused) == [
        ("inv-done", "id: job 'inv-done' is finished; there is nothing to pause"),
        ("inv-gone", "id: job 'inv-gone' is cancelled; there is nothing to pause")]
    assert s.refusal_counts() == {"id: job <job> is finished; there is nothing to pause": 1,
                                  "id: job <job> is cancelled; there is nothing to pause": 1}
    assert s.matched == 13 and s.ok


@pytest.mark.parametrize(("action", "statuses", "target"), [
    ("resume", {"paused"}, "scheduled"), ("cancel", {"scheduled", "paused"}, "cancelled")])
async def test_resume_and_cancel_send_only_to_jobs_not_yet_in_that_state(
        fleet: MemoryStore, action: Any, statuses: set[str], target: str) -> None:
    producer = FakeProducer()
    async with bulk_client(producer, fleet) as c:
        task = asyncio.create_task(acking(producer))
        s = await c.bulk(action, tenant="acme", prefix="inv-")
        task.cancel()
    rows = {j: await fleet.get_job(j) for j in sent_ids(producer) + s.already}
    assert {r.status for j, r in rows.items() if r is not None and j in sent_ids(producer)
            } == statuses
    assert all(r is not None and r.status == target for j, r in rows.items() if j in s.already)
    assert {d["op"] for d in producer.docs()} == {action}


async def test_a_bulk_trigger_derives_its_request_id_and_skips_requests_applied_before(
        fleet: MemoryStore) -> None:
    assert request_id_for("op-7", "inv-1") == request_id_for("op-7", "inv-2") == "bulk:op-7"
    job = await fleet.get_job("inv-3")
    assert job is not None
    await fleet.put_request(RequestRow(job.shard, "inv-3", "bulk:op-7", wire.TRIGGER_ORIGIN,
                                       NOW, NOW, None, 1, 1, job.spec))
    producer = FakeProducer()
    async with bulk_client(producer, fleet) as c:
        task = asyncio.create_task(acking(producer))
        s = await c.bulk("trigger", tenant="acme", prefix="inv-", operation_id="op-7")
        task.cancel()
    assert {d["request_id"] for d in producer.docs()} == {"bulk:op-7"}
    assert s.already == ["inv-3"] and "inv-3" not in sent_ids(producer)
    assert dict(s.refused)["inv-paused"] == ("id: job 'inv-paused' is paused; resume it "
                                             "before it can be triggered")
    assert len(s.changed) == 9


async def test_at_most_window_commands_are_unacknowledged_at_a_time(
        fleet: MemoryStore) -> None:
    producer = FakeProducer()
    most = 0

    async def ack_slowly() -> None:
        nonlocal most
        while True:
            await asyncio.sleep(0)
            most = max(most, sum(not f.done() for f in producer.futures))
            producer.ack()

    seen: list[BulkProgress] = []
    async with bulk_client(producer, fleet) as c:
        task = asyncio.create_task(ack_slowly())
        s = await c.bulk("cancel", tenant="acme", window=3, progress=seen.append,
                         progress_interval_s=0)
        task.cancel()
    assert 1 <= most <= 3
    assert len(s.changed) == 16 and s.already == ["inv-gone"]
    last = seen[-1]
    assert (last.done, last.listed, last.listing_done, last.eta_s) == (18, 18, True, 0)
    assert "18/18 jobs" in cli_bulk.format_progress(last)


async def test_selectors_are_checked_naming_the_filter_and_the_value() -> None:
    for kwargs, message in (
            ({"status": "running"}, "status: must be one of scheduled, paused, finished, "
                                    "cancelled (got 'running')"),
            ({"due_before": "tomorrow"}, "due_before: must be an RFC 3339 time"),
            ({"due_after": 20, "due_before": 10}, "due_after: must be before due_before"),
            ({"tenant": ""}, "tenant: must be 1..128 characters"),
    ):
        with pytest.raises(ValidationError, match=re.escape(message)):
            job_selector(**kwargs)
    assert job_selector(due_after="1000", prefix="").to_json() == {"due_after_ms": 1000}
    producer = FakeProducer()
    async with bulk_client(producer, MemoryStore()) as c:
        with pytest.raises(ValidationError, match="action: must be one of"):
            await c.bulk("delete", tenant="a")  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match=r"operation_id: must be 1\.\.100"):
            await c.bulk("pause", tenant="a", operation_id="no spaces")


def test_the_cli_names_the_flag_of_a_bad_selector_and_wants_one(tmp_path: Any) -> None:
    def parse(*argv: str) -> argparse.Namespace:
        return build_parser().parse_args(["jobs", *argv])

    args = parse("pause", "--tenant", "acme", "--due-after", "soon")
    with pytest.raises(ValidationError, match=r"--due-after: must be an RFC 3339 time .* "
                                              r"\(got 'soon'\)"):
        cli_bulk.selector_from_args(args)
    args = parse("cancel", "--journal-dir", str(tmp_path))
    with pytest.raises(ValidationError, match=r"selector: none given: .* or give --all"):
        cli_bulk.run_bulk(args)
    args = parse("resume", "--resume", "nope", "--journal-dir", str(tmp_path))
    with pytest.raises(ValidationError, match="--resume: no operation of that id"):
        cli_bulk.run_bulk(args)
    args = parse("trigger", "--prefix", "inv-", "--due-before", "2026-12-01T09:00:00Z",
                 "--dry-run", "--operation-id", "x1", "--wait", "5")
    assert (args.action, args.prefix, args.dry_run, args.operation_id, args.wait) == (
        "trigger", "inv-", True, "x1", 5.0)
    assert cli_bulk.selector_from_args(args) == JobSelector(prefix="inv-",
                                                            due_before_ms=1_796_115_600_000)


# --- resuming after an interruption --------------------------------------------------------

class Interrupted(Exception):
    pass


class DyingProducer(FakeProducer):
    """Raises on the (k+1)th send, as a process stopped there."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   **kw: Any) -> asyncio.Future[Any]:
        if len(self.sent) >= self.k:
            raise Interrupted
        return await super().send(topic, value, key, **kw)


@pytest.mark.parametrize("journal_kind", ["memory", "file"])
async def test_an_interrupted_operation_resumed_gives_each_job_exactly_one_command(
        fleet: MemoryStore, tmp_path: Any, journal_kind: str) -> None:
    journal = MemoryJournal() if journal_kind == "memory" else FileJournal(tmp_path, "acme")
    every: Counter[str] = Counter()
    first = DyingProducer(k=6)
    async with bulk_client(first, fleet) as c:
        task = asyncio.create_task(acking(first))
        with pytest.raises(Interrupted):
            await c.bulk("trigger", tenant="acme", operation_id="op-1", journal=journal,
                         window=2)
        task.cancel()
    every.update(sent_ids(first))
    assert len(first.sent) == 6
    state = journal.load("op-1")
    assert state is not None and state.done == set(sent_ids(first))

    second = FakeProducer()
    async with bulk_client(second, fleet) as c:
        task = asyncio.create_task(acking(second))
        with pytest.raises(ValidationError, match="started with selector 'tenant=acme', not "
                                                  "'tenant=globex'"):
            await c.bulk("trigger", tenant="globex", operation_id="op-1", journal=journal)
        s = await c.bulk("trigger", tenant="acme", operation_id="op-1", journal=journal)
        again = await c.bulk("trigger", tenant="acme", operation_id="op-1", journal=journal)
        task.cancel()
    every.update(sent_ids(second))
    selected = {f"inv-{i}" for i in range(10)} | {f"other-{i}" for i in range(5)}
    assert set(every) == selected and set(every.values()) == {1}
    assert sorted(s.done_before) == sorted(sent_ids(first))
    assert len(s.changed) == len(selected) - 6
    assert again.changed == [] and len(again.done_before) == len(selected)


async def test_a_journal_line_cut_short_by_a_crash_is_redone(tmp_path: Any) -> None:
    journal = FileJournal(tmp_path, "acme")
    from chronowheel.client.bulk import JournalState

    journal.begin(JournalState("op-2", "acme", "pause", JobSelector(tenant="a"), NOW))
    journal.record("op-2", ["a", "b"])
    with journal.path("op-2").open("a") as f:
        f.write('{"done":["c",')
    state = journal.load("op-2")
    assert state is not None and state.done == {"a", "b"}
    assert state.selector == JobSelector(tenant="a") and state.action == "pause"


# --- a whole node on the in-memory bus ------------------------------------------------------

class BusProducer:
    """A producer writing to the rig's in-memory `<ns>.submit`, acknowledged at once."""

    def __init__(self, rig: NodeRig) -> None:
        self.rig = rig
        self.sent: list[bytes] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   **kw: Any) -> asyncio.Future[Any]:
        assert key is not None and value is not None
        self.sent.append(key)
        msg = self.rig.bus.produce(topic, shard_of(key.decode(), self.rig.settings.shards),
                                   key, value)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(msg)  # has partition and offset, like aiokafka's RecordMetadata
        return fut


async def test_a_node_applies_a_bulk_pause_resume_and_trigger_once(rig: NodeRig) -> None:
    await rig.start()
    for i in range(6):
        rig.upsert(f"a-{i}", every="1m", start=T0 + MIN, tenant="a")
        rig.upsert(f"b-{i}", every="1m", start=T0 + MIN, tenant="b")
    await rig.settle()
    journal = MemoryJournal()
    producer = BusProducer(rig)
    client = SchedulerClient(rig.settings, producer=producer, store=rig.store,
                             now_ms=rig.clock.now_ms)

    async def statuses() -> dict[str, str]:
        page = await rig.store.list_jobs(JobSelector().query(None))
        return {j.job_id: j.status for j in page.jobs}

    async with client:
        s = await client.bulk_pause(tenant="a", operation_id="p1", journal=journal)
        await rig.settle()
        assert len(s.changed) == 6
        assert {j: st for j, st in (await statuses()).items() if st == "paused"} == {
            f"a-{i}": "paused" for i in range(6)}
        n = len(producer.sent)
        again = await client.bulk_pause(tenant="a", operation_id="p1", journal=journal)
        other = await client.bulk_pause(tenant="a", operation_id="p2")  # no journal
        assert len(producer.sent) == n  # nothing re-sent
        assert (len(again.done_before), len(other.already)) == (6, 6)

        s = await client.bulk_resume(tenant="a", prefix="a-", journal=journal)
        await rig.settle()
        assert set((await statuses()).values()) == {"scheduled"}

        trig = await client.bulk_trigger(tenant="b", operation_id="t1")
        await rig.advance(300)
        # The journal lost (another machine): the same operation id again; the node's request
        # rows say every trigger was applied, so nothing is sent, and nothing fires twice.
        n = len(producer.sent)
        again = await client.bulk_trigger(tenant="b", operation_id="t1")
        assert len(producer.sent) == n and len(again.already) == 6
        # Sent again all the same (acknowledged, not journaled before a crash): a no-op.
        for i in range(6):
            await client.trigger(f"b-{i}", request_id=request_id_for("t1", f"b-{i}"))
        await rig.advance(300)
    assert len(trig.changed) == 6
    triggered = Counter(m.key for m in rig.fired() if m.header(wire.TRIGGERED) is not None)
    assert triggered == {f"b-{i}".encode(): 1 for i in range(6)}


def test_the_summary_reads_for_people_and_as_json() -> None:
    from chronowheel.client.bulk import BulkSummary

    s = BulkSummary("op-9", "pause", JobSelector(tenant="acme"), changed=["a", "b", "c"],
                    already=["d"], refused=[("e", "id: job 'e' is finished; there is "
                                                  "nothing to pause")], matched=5)
    text = cli_bulk.render(s, show=2)
    assert "operation op-9: pause tenant=acme" in text
    assert "changed       3 (written to Kafka; --wait confirms" in text
    assert "a, b, ... 1 more" in text
    assert "1 x id: job <job> is finished; there is nothing to pause" in text
    doc = orjson.loads(orjson.dumps(s.to_json(sample=1)))
    assert (doc["changed"], doc["changed_ids"], doc["already"], doc["refused"]) == (
        3, ["a"], 1, 1)
    line = cli_bulk.ProgressLine(io.StringIO(), "always")
    line(BulkProgress(10, False, 8, 2, 2, 1.0))
    assert "4/10+ jobs" in line.stream.getvalue()  # type: ignore[attr-defined]


async def test_a_cancelled_run_journals_what_kafka_acknowledged_and_resumes_from_there(
        fleet: MemoryStore) -> None:
    journal = MemoryJournal()
    producer = FakeProducer()
    gate = asyncio.Event()

    class Stalling(FakeProducer):
        async def send(self, topic: str, value: bytes | None = None,
                       key: bytes | None = None, **kw: Any) -> asyncio.Future[Any]:
            if len(producer.sent) == 5:
                gate.set()
                await asyncio.Event().wait()  # as a Ctrl-C arriving here
            return await producer.send(topic, value, key, **kw)

    async with bulk_client(Stalling(), fleet) as c:
        acker = asyncio.create_task(acking(producer))
        run = asyncio.create_task(c.bulk("cancel", tenant="acme", operation_id="op-c",
                                         journal=journal))
        await gate.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        acker.cancel()
    state = journal.load("op-c")
    assert state is not None and state.done == set(sent_ids(producer))
    assert len(state.done) == 5
    again = FakeProducer()
    async with bulk_client(again, fleet) as c:
        acker = asyncio.create_task(acking(again))
        s = await c.bulk("cancel", tenant="acme", operation_id="op-c", journal=journal)
        acker.cancel()
    assert set(sent_ids(again)).isdisjoint(sent_ids(producer))
    assert len(sent_ids(again)) + 5 == 16 and len(s.done_before) == 5  # 16 of 18 need one


async def test_a_wait_moves_the_jobs_the_node_refused_from_changed_to_refused(
        fleet: MemoryStore) -> None:
    from chronowheel.client.bulk import BulkOperation, SentCommand
    from chronowheel.errors import ChronowheelError

    producer = FakeProducer()
    seen: list[SentCommand] = []

    async def confirm(sent: Any) -> dict[str, str]:
        seen.extend(sent)
        return {"inv-1": "id: job 'inv-1' is a one-shot; only a recurring job can be triggered"}

    async def late(sent: Any) -> dict[str, str]:
        raise ChronowheelError("the nodes had not applied every command after 1s")

    async with bulk_client(producer, fleet) as c:
        acker = asyncio.create_task(acking(producer))

        def operation(check: Any) -> BulkOperation:
            return BulkOperation(
                action="trigger", selector=job_selector(tenant="acme", prefix="inv-"),
                operation_id="op-w", namespace="acme", store=fleet, confirm=check,
                send=lambda j: c.trigger(j, request_id=request_id_for("op-w", j)))

        s = await operation(confirm).run()
        t = await operation(late).run()
        acker.cancel()
    assert sorted(c.job_id for c in seen) == sorted(f"inv-{i}" for i in range(10))
    assert s.waited and s.ok and "inv-1" not in s.changed and len(s.changed) == 9
    assert s.refusal_counts()["id: job <job> is a one-shot; only a recurring job can be "
                              "triggered"] == 1
    assert not t.waited and not t.ok and t.wait_error is not None
    assert "not confirmed the nodes had not applied" in cli_bulk.render(t, 0)


async def test_list_jobs_takes_the_same_due_range(fleet: MemoryStore) -> None:
    async with bulk_client(FakeProducer(), fleet) as c:
        page = await c.list_jobs(tenant="acme", prefix="inv-", due_after=NOW + 2 * MIN,
                                 due_before=NOW + 6 * MIN)
        with pytest.raises(ValidationError, match="due_after: must be before due_before"):
            await c.list_jobs(due_after=NOW + MIN, due_before=NOW)
    assert sorted(j.job_id for j in page.jobs) == [f"inv-{i}" for i in range(2, 6)]
    args = build_parser().parse_args(["jobs", "list", "--due-after", "1000"])
    assert args.due_after == "1000"


def test_resume_refuses_another_action_or_other_selectors(tmp_path: Any) -> None:
    from chronowheel.client.bulk import JournalState

    FileJournal(tmp_path, "acme").begin(
        JournalState("op-1", "acme", "pause", JobSelector(tenant="a"), NOW))

    def run(*argv: str) -> int:
        return cli_bulk.run_bulk(build_parser().parse_args(
            ["jobs", *argv, "--namespace", "acme", "--journal-dir", str(tmp_path)]))

    with pytest.raises(ValidationError, match="--resume: operation op-1 is a pause, not a "
                                              "resume"):
        run("resume", "--resume", "op-1")
    with pytest.raises(ValidationError, match="--resume: operation op-1 selects tenant=a; "
                                              "give no selector or the same ones"):
        run("pause", "--resume", "op-1", "--tenant", "b")
    with pytest.raises(ValidationError, match="--resume: names another operation"):
        run("pause", "--resume", "op-1", "--operation-id", "op-2")
