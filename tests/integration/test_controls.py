"""Schedule controls and job listing through a real node, Kafka and Cassandra: pause, resume
(catch-up), trigger, backfill (paced, exactly once for a read_committed reader), their
rejections, and `list_jobs` over the SAI indexes."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import orjson
import pytest
from chronowheel.client import SchedulerClient
from chronowheel.core import wire

from tests.integration.harness import (
    Collector,
    applied,
    collecting,
    make_namespace,
    now_ms,
    produce,
    running_node,
    settled,
    upsert,
)

pytestmark = pytest.mark.integration


def fired_of(seen: Collector, topic: str, job_id: str) -> list[Any]:
    return [m for m in seen.on(topic) if m.key == job_id.encode()]


async def test_pause_resume_and_trigger_end_to_end(stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=2, catch_up_grace_ms=1_000)
    fired_topic = settings.fired_topic
    async with collecting(settings, fired_topic, settings.rejected_topic) as seen, \
            running_node(settings), SchedulerClient(settings) as client:
        await client.every("tick", 1_000, {"n": 1}, catch_up="all", tenant="acme")
        await client.cron("nightly", "0 3 * * *", payload={"r": 1})
        later_at = now_ms() + 4_000
        await client.schedule("later", later_at, {"once": True})
        await seen.wait_for(lambda ms: len(fired_of(seen, fired_topic, "tick")) >= 2, 30,
                            "two ticks")
        await client.pause("tick")
        await client.pause("later")
        await client.flush()
        await _wait_status(settings, "tick", "paused")
        await _wait_status(settings, "later", "paused")
        paused_at = len(fired_of(seen, fired_topic, "tick"))
        # The schedule passes five occurrences and `later`'s instant, and every shard's
        # watermark passes them: whatever the node would publish of them is visible here.
        await settled(settings, seen, upto_ms=max(now_ms() + 5_000, later_at))
        # At most the occurrence that was being published when the pause arrived.
        assert len(fired_of(seen, fired_topic, "tick")) <= paused_at + 1
        assert fired_of(seen, fired_topic, "later") == []

        await client.resume("tick")
        await client.resume("later")
        await client.trigger("nightly", request_id="rerun-1")
        await client.trigger("nightly", request_id="rerun-1")  # re-sent: publishes nothing
        await client.flush()
        await seen.wait_for(lambda ms: len(fired_of(seen, fired_topic, "later")) == 1
                            and len(fired_of(seen, fired_topic, "nightly")) == 1, 30,
                            "the resumed one-shot and the trigger")
        await settled(settings, seen)
        await client.trigger("nightly", request_id="rerun-1")  # and again, later
        await client.flush()
        await settled(settings, seen)

    ticks = fired_of(seen, fired_topic, "tick")
    # catch_up=all: every occurrence the pause withheld was published on resume, each once,
    # and the series went on: scheduled instants are consecutive seconds, none twice.
    instants = sorted(m.scheduled_ms for m in ticks)
    assert len(instants) >= paused_at + 5
    assert instants == list(range(instants[0], instants[0] + 1_000 * len(instants), 1_000))
    assert all(m.fired_ms >= m.scheduled_ms for m in ticks)  # never early
    [later] = fired_of(seen, fired_topic, "later")
    assert later.fired_ms >= later.scheduled_ms
    [triggered] = fired_of(seen, fired_topic, "nightly")
    assert triggered.headers[wire.TRIGGERED] == "rerun-1"
    assert triggered.occurrence == f"nightly@{triggered.scheduled_ms}/trigger/rerun-1"
    assert triggered.value == b'{"r":1}'
    assert triggered.fired_ms >= triggered.scheduled_ms
    assert seen.on(settings.rejected_topic) == []


async def test_backfill_publishes_each_occurrence_once_and_on_time_work_stays_on_time(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=2, backfill_rows_per_cycle=50)
    fired_topic = settings.fired_topic
    start = now_ms() - 3 * 3_600_000
    start -= start % 60_000
    async with collecting(settings, fired_topic) as seen, running_node(settings), \
            SchedulerClient(settings) as client:
        await client.every("report", "1m", {"kind": "report"}, start=start)
        await client.every("heartbeat", "1s")
        await client.flush()
        await applied(settings)
        for _ in range(2):  # the same request twice
            await client.backfill("report", start, start + 3 * 3_600_000,
                                  request_id="fix-1234")
        await client.flush()
        await seen.wait_for(lambda ms: len([m for m in ms if wire.BACKFILL in m.headers])
                            >= 180, 90, "180 backfilled occurrences")
        await client.backfill("report", start, start + 3 * 3_600_000, request_id="fix-1234")
        await client.flush()
        # A backfill run again would be out within four cycles (50 rows each, 100 ms apart).
        await settled(settings, seen, more_ms=1_000)
        # A quick backfill can be over within two heartbeats: wait for a third (each checked
        # for lateness below).
        await seen.wait_for(lambda ms: sum(m.key == b"heartbeat" for m in ms) >= 3, 30,
                            "three heartbeats")

    backfilled = [m for m in seen.on(fired_topic) if wire.BACKFILL in m.headers]
    assert Counter(m.scheduled_ms for m in backfilled) == Counter(
        start + k * 60_000 for k in range(180))
    assert all(m.headers[wire.BACKFILL] == "fix-1234" and m.job_id == "report"
               and m.occurrence == f"report@{m.scheduled_ms}/backfill/fix-1234"
               and m.fired_ms >= m.scheduled_ms for m in backfilled)
    beats = fired_of(seen, fired_topic, "heartbeat")
    assert len(beats) >= 3
    lateness = sorted(m.fired_ms - m.scheduled_ms for m in beats)
    assert lateness[0] >= 0 and lateness[-1] < 1_000, lateness


async def test_invalid_controls_reach_rejected_with_their_reason(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=2)
    now = now_ms()
    bad = [
        (b"j", b'{"v":1,"op":"trigger","id":"j"}', "request_id: required"),
        (b"j", b'{"v":1,"op":"pause","id":"j","until":1}', "until: unknown field"),
        (b"j", b'{"v":1,"op":"backfill","id":"j","request_id":"r","from":%d,"to":%d}'
         % (now, now + 3_600_000), "to: must not be in the future"),
        (b"j", b'{"v":1,"op":"resume","id":"k"}', "key: record key must equal the job id"),
        (b"nope", b'{"v":1,"op":"trigger","id":"nope","request_id":"r"}',
         "id: no job 'nope' to trigger"),
        (b"once", b'{"v":1,"op":"backfill","id":"once","request_id":"r","from":0,"to":1000}',
         "id: job 'once' is a one-shot; only a recurring job can be backfilled"),
        (b"often", b'{"v":1,"op":"backfill","id":"often","request_id":"r","from":%d,"to":%d}'
         % (now - 20_000_000, now - 1_000), "to: the range holds more than 10000 occurrences"),
        (b"nope", b'{"v":1,"op":"resume","id":"nope"}', "id: no job 'nope' to resume"),
    ]
    async with collecting(settings, settings.rejected_topic) as seen, running_node(settings):
        await produce(settings, [upsert("once", at=now + 3_600_000),
                                 upsert("often", every="1s", start=now - 86_400_000)])
        await applied(settings)
        await produce(settings, [(key, value) for key, value, _ in bad])
        await seen.wait_for(lambda ms: len(ms) >= len(bad), 60, "every rejection")
    reasons = sorted(m.headers[wire.REASON] for m in seen.messages)
    for _, _, reason in bad:
        assert any(r.startswith(reason) for r in reasons), (reason, reasons)
    assert {m.value for m in seen.messages} == {value for _, value, _ in bad}


async def test_jobs_list_by_tenant_and_status_through_the_client(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=2)
    async with running_node(settings), SchedulerClient(settings) as client:
        for i in range(12):
            await client.every(f"acme-{i:02d}", "1h", tenant="acme")
        await client.every("other-1", "1h", tenant="globex")
        await client.flush()
        await _wait_status(settings, "acme-11", "scheduled")
        for i in (1, 5, 9):
            await client.pause(f"acme-{i:02d}")
        await client.flush()
        await _wait_status(settings, "acme-09", "paused")
        paused = [j async for j in client.iter_jobs(tenant="acme", status="paused", limit=2)]
        assert sorted(j.job_id for j in paused) == ["acme-01", "acme-05", "acme-09"]
        everyone = [j async for j in client.iter_jobs(tenant="acme", limit=5)]
        assert sorted(j.job_id for j in everyone) == [f"acme-{i:02d}" for i in range(12)]
        prefixed = [j async for j in client.iter_jobs(prefix="other-")]
        assert [(j.job_id, j.tenant) for j in prefixed] == [("other-1", "globex")]
        soon = await client.list_jobs(tenant="acme", status="scheduled",
                                      due_before=now_ms() + 2 * 3_600_000, limit=100)
        assert len(soon.jobs) == 9


async def _wait_status(settings: Any, job_id: str, status: str) -> None:
    from tests.integration.test_client_cli import wait_job

    await wait_job(settings, job_id, status, timeout_s=30)


async def test_the_cli_controls_and_lists_jobs(stack: Any, namespace: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from tests.integration.harness import run_cli
    from tests.integration.test_client_cli import wait_job

    settings = await make_namespace(stack, namespace, shards=2)
    async with collecting(settings) as seen, running_node(settings):
        code, _, _ = await run_cli(capsys, settings, "submit", "--id", "cli-report",
                                   "--every", "1h", "--tenant", "ops", connection=False)
        assert code == 0
        await wait_job(settings, "cli-report", "scheduled")
        code, out, _ = await run_cli(capsys, settings, "job", "trigger", "cli-report",
                                     "--request-id", "cli-1", connection=False)
        assert code == 0 and "trigger cli-report (request id cli-1): written to" in out
        await seen.wait_for(lambda ms: len(ms) == 1, 30, "the triggered occurrence")
        assert seen.messages[0].headers[wire.TRIGGERED] == "cli-1"
        code, out, _ = await run_cli(capsys, settings, "job", "pause", "cli-report",
                                     connection=False)
        assert code == 0
        await wait_job(settings, "cli-report", "paused")
        code, out, _ = await run_cli(capsys, settings, "jobs", "list", "--tenant", "ops",
                                     "--status", "paused", "--json")
        assert code == 0
        listed = orjson.loads(out)
        assert [j["id"] for j in listed["jobs"]] == ["cli-report"]
        code, out, _ = await run_cli(capsys, settings, "jobs", "list", "--tenant", "ops",
                                     "--status", "scheduled")
        assert code == 0 and out.strip() == "no jobs on this page"
        code, _, err = await run_cli(capsys, settings, "job", "backfill", "cli-report",
                                     "--from", "2026-11-01T00:00:00Z", "--to",
                                     "2999-01-01T00:00:00Z", connection=False)
        assert code != 0 and "to: must not be in the future" in err
        await settled(settings, seen)
    assert len(seen.messages) == 1


async def test_init_adds_the_new_columns_and_tables_to_an_older_keyspace(
        stack: Any, namespace: str) -> None:
    from chronowheel.admin import init_namespace
    from chronowheel.errors import ConfigError
    from chronowheel.store.cassandra import CassandraStore, connect

    settings = await make_namespace(stack, namespace, shards=2)
    ks = settings.keyspace
    # Take the keyspace back to what the previous release created.
    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        for stmt in (f"DROP INDEX {ks}.jobs_by_tenant", f"DROP INDEX {ks}.jobs_by_status",
                     f"DROP INDEX {ks}.jobs_by_scheduled", f"DROP TABLE {ks}.job_requests",
                     f"ALTER TABLE {ks}.jobs DROP tenant",
                     f"ALTER TABLE {ks}.due DROP (origin, request_id)",
                     f"DROP TABLE {ks}.due_retired"):
            await asyncio.to_thread(session.execute, stmt, timeout=60)
        # A node of this version on the old keyspace refuses to start, saying what to run.
        with pytest.raises(ConfigError, match=rf"does not have this version.s tables.*"
                                              rf"chronowheel init --namespace "
                                              rf"{settings.namespace}"):
            await asyncio.to_thread(CassandraStore.open, settings)
        await init_namespace(settings)  # what an upgrade runs
        tables = await asyncio.to_thread(
            lambda: {r.table_name: None for r in session.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (ks,))})
        columns = await asyncio.to_thread(
            lambda: {(r.table_name, r.column_name) for r in session.execute(
                "SELECT table_name, column_name FROM system_schema.columns "
                "WHERE keyspace_name = %s", (ks,))})
        indexes = await asyncio.to_thread(
            lambda: {r.index_name for r in session.execute(
                "SELECT index_name FROM system_schema.indexes WHERE keyspace_name = %s",
                (ks,))})
    finally:
        await asyncio.to_thread(cluster.shutdown)
    assert {"job_requests", "due_retired"} <= tables.keys()
    assert {("jobs", "tenant"), ("due", "origin"), ("due", "request_id")} <= columns
    assert {"jobs_by_tenant", "jobs_by_status", "jobs_by_scheduled"} <= indexes
    async with running_node(settings), SchedulerClient(settings) as client:
        await client.every("after-upgrade", "1h", tenant="acme")
        await client.flush()
        await _wait_status(settings, "after-upgrade", "scheduled")
        page = await client.list_jobs(tenant="acme")
        assert [j.job_id for j in page.jobs] == ["after-upgrade"]


async def test_a_backfill_survives_kill_9_of_its_node_exactly_once(
        stack: Any, namespace: str, tmp_path: Any) -> None:
    from chronowheel.core.shard import shard_of

    from tests.integration.test_failover import Nodes, owned, sharing, until

    shards, total = 4, 3_000
    settings = await make_namespace(stack, namespace, shards=shards)
    nodes = Nodes(tmp_path)
    pace = {"CHRONOWHEEL_BACKFILL_ROWS_PER_CYCLE": "20"}  # 3,000 take 15 s at least
    try:
        async with collecting(settings) as seen, SchedulerClient(settings) as client:
            a, b = nodes.start(settings, "a", **pace), nodes.start(settings, "b", **pace)
            await until(sharing(shards, a, b), 90, "two nodes sharing the shards", nodes)
            a_shards = owned(a) or set()
            job_id = next(f"sweep-{i}" for i in range(1000)
                          if shard_of(f"sweep-{i}", shards) in a_shards)
            start = now_ms() - 2 * 3_600_000
            start -= start % 1_000
            await client.every(job_id, "1s", start=start)
            await client.flush()
            await _wait_status(settings, job_id, "scheduled")
            await client.backfill(job_id, start, start + total * 1_000, request_id="ko")
            await client.flush()

            def backfilled() -> list[Any]:
                return [m for m in seen.on(settings.fired_topic) if wire.BACKFILL in m.headers]

            await until(lambda: len(backfilled()) >= 100, 120, "the backfill to start", nodes)
            a.kill()
            at_kill = len(backfilled())
            assert at_kill < total, "the backfill finished before the kill"
            await until(lambda: owned(b) == set(range(shards)), 60, "node b to own every shard",
                        nodes)
            await until(lambda: len(backfilled()) >= total, 180, "every backfilled occurrence",
                        nodes)
            await settled(settings, seen)  # a late duplicate would show up here
        counts = Counter(m.scheduled_ms for m in backfilled())
        assert counts == Counter(start + k * 1_000 for k in range(total)), \
            f"{at_kill} seen at the kill; duplicates {[s for s, n in counts.items() if n > 1][:5]}"
        assert all(m.fired_ms >= m.scheduled_ms for m in backfilled())
    finally:
        nodes.cleanup()
