"""The worker library against a real node, Kafka and Cassandra: handling, retries with backoff,
dead letters, idempotency across duplicates, groups and crashes, graceful shutdown."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from chronowheel.bus.kafka import open_admin, plain_producer
from chronowheel.core.shard import shard_of
from chronowheel.node.pending import encode_headers
from chronowheel.settings import Settings
from chronowheel.store.base import Claim
from chronowheel.store.cassandra import CassandraStore
from chronowheel.store.cassandra_marks import CassandraMarks
from chronowheel.worker import DeadLetter, Occurrence, Worker, WorkerStats

from testkit.fleet import until as wait_until
from tests.integration.harness import (
    REPO,
    collecting,
    make_namespace,
    now_ms,
    produce,
    running_node,
    running_worker,
    upsert,
)
from tests.integration.worker_handlers import read_events as events

pytestmark = pytest.mark.integration


async def committed_offsets(settings: Settings, group: str) -> dict[int, int]:
    """Committed offset per partition of <ns>.fired for `group`."""
    admin = await open_admin(settings)
    try:
        raw = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in raw.items()
            if tp.topic == settings.fired_topic and meta.offset >= 0}


async def claim_of(settings: Settings, scope: str, occurrence: str) -> Claim | None:
    """The ledger row, read with a compare-and-set that can never apply."""
    store = await asyncio.to_thread(CassandraStore.open, settings)
    try:
        probe = Claim("probe", -1, "no-such-owner")
        _, current = await store.swap_claim(scope, occurrence, probe, probe, "test", 1)
        return current
    finally:
        await asyncio.to_thread(store.close)


async def marks_of(settings: Settings, scope: str, topic: str, partition: int,
                   ) -> dict[int, tuple[str, str]]:
    """The worker's stored outcome marks of one partition: offset -> (state, occurrence)."""
    store = await asyncio.to_thread(CassandraStore.open, settings)
    try:
        marks = CassandraMarks(store.session, settings.keyspace)
        return {m.offset: (m.state, m.occurrence)
                for m in await marks.read_marks(scope, topic, partition, 0, 0)}
    finally:
        await asyncio.to_thread(store.close)


def job_on_partition(prefix: str, partition: int, partitions: int) -> str:
    """A job id whose fired message lands on `partition` (the node partitions by murmur2)."""
    return next(f"{prefix}-{i}" for i in range(10_000)
                if shard_of(f"{prefix}-{i}", partitions) == partition)


# --- the success path --------------------------------------------------------------------------

async def test_handler_sees_payload_and_headers_and_the_offset_is_committed(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    seen: list[Occurrence] = []

    async def handler(occ: Occurrence) -> None:
        seen.append(occ)

    at = now_ms()
    async with running_node(settings), running_worker(settings, handler) as worker:
        await produce(settings, [upsert("hello", at=at, payload={"to": "ada"},
                                        headers={"team": "billing"}, max_attempts=3,
                                        backoff="2s")])
        await wait_until(lambda: bool(seen), 30, "the handler call")
        await wait_until(lambda: bool(worker.committed_points()), 10, "a commit")

    [occ] = seen
    assert occ.json() == {"to": "ada"} and occ.payload == b'{"to":"ada"}'
    assert (occ.job_id, occ.scheduled_ms, occ.attempt) == ("hello", at, 1)
    assert occ.occurrence == f"hello@{at}"
    assert (occ.max_attempts, occ.backoff_ms) == (3, 2000)
    assert occ.fired_ms >= at
    assert occ.topic == settings.fired_topic
    assert occ.headers["team"] == "billing" and occ.job_headers == {"team": "billing"}
    assert occ.headers["cw-occurrence"] == occ.occurrence
    assert worker.stats == WorkerStats(succeeded=1)
    assert worker.group_id == f"{namespace}-workers-{settings.fired_topic}"
    assert await committed_offsets(settings, worker.group_id) == {occ.partition: occ.offset + 1}
    # A first delivery is recorded as a mark of its offset, not as a per-occurrence claim.
    marks = await marks_of(settings, worker.group_id, occ.topic, occ.partition)
    assert marks == {occ.offset: ("done", occ.occurrence)}
    assert await claim_of(settings, worker.group_id, occ.occurrence) is None


async def test_concurrency_is_bounded_and_sync_handlers_run_in_threads(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    lock = threading.Lock()
    active = peak = 0
    handled: list[str] = []
    loop_thread = threading.get_ident()
    threads: set[int] = set()

    def handler(occ: Occurrence) -> None:  # plain function: must not block the event loop
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
            threads.add(threading.get_ident())
        time.sleep(0.3)  # the work
        with lock:
            active -= 1
            handled.append(occ.job_id)

    at = now_ms()
    async with running_node(settings), running_worker(settings, handler, concurrency=2,
                                                      idempotency=False) as worker:
        await produce(settings, [upsert(f"c{i}", at=at, payload=i) for i in range(8)])
        await wait_until(lambda: len(handled) == 8, 60, "8 handler calls")
    assert sorted(handled) == sorted(f"c{i}" for i in range(8))
    assert peak == 2
    assert loop_thread not in threads
    assert worker.stats == WorkerStats(succeeded=8)


# --- failures: retries and dead letters ----------------------------------------------------------

async def test_failing_twice_then_succeeding_is_delivered_three_times_with_backoff(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    calls: list[Occurrence] = []
    failed_at: dict[int, int] = {}

    async def handler(occ: Occurrence) -> None:
        calls.append(occ)
        if occ.attempt < 3:
            failed_at[occ.attempt] = now_ms()
            raise RuntimeError(f"flaky downstream, attempt {occ.attempt}")

    at = now_ms()
    async with (collecting(settings, settings.submit_topic) as submitted,
                running_node(settings),
                running_worker(settings, handler) as worker):
        await produce(settings, [upsert("flaky", at=at, payload={"n": 1}, max_attempts=5,
                                        backoff="1s", headers={"team": "billing"})])
        await wait_until(lambda: worker.stats.succeeded == 1, 60, "the third attempt")

    assert [c.attempt for c in calls] == [1, 2, 3]
    assert {c.occurrence for c in calls} == {f"flaky@{at}"}
    assert {c.scheduled_ms for c in calls} == {at}
    assert all(c.payload == b'{"n":1}' and c.headers["team"] == "billing" for c in calls)
    assert all(c.max_attempts == 5 and c.backoff_ms == 1000 for c in calls)
    # backoff doubles: 1 s after the first failure, 2 s after the second (never earlier)
    assert calls[1].fired_ms >= failed_at[1] + 1000
    assert calls[2].fired_ms >= failed_at[2] + 2000
    assert calls[2].fired_ms - failed_at[2] < 10_000
    assert worker.stats == WorkerStats(succeeded=1, failed=2, retried=2)
    retries = [(orjson.loads(m.value), m.key) for m in submitted.messages
               if b'"op":"retry"' in m.value]
    assert [(r["attempt"], r["scheduled_at"], key) for r, key in retries] == [
        (2, at, b"flaky"), (3, at, b"flaky")]
    row = await claim_of(settings, worker.group_id, f"flaky@{at}")
    assert row is not None and (row.state, row.attempt) == ("done", 3)


async def test_always_failing_is_dead_lettered_once_after_max_attempts(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    attempts: list[int] = []

    async def handler(occ: Occurrence) -> None:
        attempts.append(occ.attempt)
        raise ValueError(f"no such mailbox: {'x' * 5000}")

    at = now_ms()
    async with (collecting(settings, settings.dead_topic) as dead, running_node(settings),
                running_worker(settings, handler) as worker):
        await produce(settings, [upsert("doomed", at=at, payload={"to": "nobody"},
                                        max_attempts=3, backoff="1s",
                                        headers={"team": "billing"})])
        await wait_until(lambda: worker.stats.dead == 1, 60, "the dead letter")
        await dead.wait_for(lambda ms: len(ms) >= 1, 10, "the dead letter on <ns>.dead")

    assert attempts == [1, 2, 3]
    assert worker.stats == WorkerStats(failed=3, retried=2, dead=1)
    [letter] = dead.messages
    assert letter.key == b"doomed" and letter.value == b'{"to":"nobody"}'
    h = letter.headers
    assert h["cw-error"].startswith("ValueError: no such mailbox: xxx")
    assert len(h["cw-error"].encode()) <= 2048
    assert h["cw-source-topic"] == settings.fired_topic
    assert int(h["cw-failed-at"]) >= at
    assert (h["cw-occurrence"], h["cw-attempt"], h["team"]) == (f"doomed@{at}", "3", "billing")
    row = await claim_of(settings, worker.group_id, f"doomed@{at}")
    assert row is not None and (row.state, row.attempt) == ("failed", 3)


async def test_dead_letter_exception_skips_the_remaining_attempts(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    attempts: list[int] = []

    async def handler(occ: Occurrence) -> None:
        attempts.append(occ.attempt)
        raise DeadLetter("permanently invalid address")

    async with (collecting(settings, settings.dead_topic) as dead, running_node(settings),
                running_worker(settings, handler) as worker):
        await produce(settings, [upsert("invalid", at=now_ms(), max_attempts=5)])
        await dead.wait_for(lambda ms: len(ms) >= 1, 30, "the dead letter")
    assert attempts == [1]
    assert worker.stats == WorkerStats(failed=1, dead=1)
    assert dead.messages[0].headers["cw-error"] == "DeadLetter: permanently invalid address"


async def test_a_record_that_is_not_an_occurrence_is_dead_lettered_and_committed(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    seen: list[str] = []

    async def handler(occ: Occurrence) -> None:
        seen.append(occ.job_id)

    async with (collecting(settings, settings.dead_topic) as dead,
                running_worker(settings, handler) as worker):
        p = plain_producer(settings)
        await p.start()
        try:
            meta = await p.send_and_wait(settings.fired_topic, b"stray", key=b"k", partition=1,
                                         headers=[("trace", b"t1")])
        finally:
            await p.stop()
        await dead.wait_for(lambda ms: len(ms) >= 1, 30, "the dead letter")
        await wait_until(lambda: bool(worker.committed_points()), 10, "the commit")
    [letter] = dead.messages
    assert (letter.key, letter.value, letter.headers["trace"]) == (b"k", b"stray", "t1")
    assert letter.headers["cw-error"].startswith("MalformedOccurrence: not a chronowheel "
                                                 "occurrence: missing header cw-job-id")
    assert (letter.headers["cw-source-partition"], letter.headers["cw-source-offset"]) == (
        "1", str(meta.offset))
    assert seen == []
    assert await committed_offsets(settings, worker.group_id) == {1: meta.offset + 1}


# --- idempotency ---------------------------------------------------------------------------------

async def test_duplicates_are_handled_once_per_idempotency_scope(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    calls: dict[str, list[Occurrence]] = {"first": [], "shared": [], "other": []}

    def recorder(name: str) -> Callable[[Occurrence], Any]:
        async def handler(occ: Occurrence) -> None:
            calls[name].append(occ)
        return handler

    at = now_ms()
    async with running_node(settings), running_worker(settings, recorder("first")) as first:
        await produce(settings, [upsert("once", at=at, payload="p", headers={"h": "v"})])
        await wait_until(lambda: bool(calls["first"]), 30, "the first delivery")
        occ = calls["first"][0]
        # The same fired message again on the same partition (what a plain re-publish, or a
        # worker crash before its commit, looks like).
        p = plain_producer(settings)
        await p.start()
        try:
            copy = await p.send_and_wait(occ.topic, occ.payload, key=occ.job_id.encode(),
                                         partition=occ.partition, headers=list(occ.raw_headers))
        finally:
            await p.stop()
        await wait_until(lambda: first.stats.skipped == 1, 30, "the copy to be skipped")
    assert len(calls["first"]) == 1
    assert await committed_offsets(settings, first.group_id) == {occ.partition: copy.offset + 1}

    # A new group reading from offset 0 but sharing the first group's ledger: nothing to do.
    async with running_worker(settings, recorder("shared"), group_id=f"{namespace}-g2",
                              idempotency_scope=first.group_id) as shared:
        await wait_until(lambda: shared.stats.skipped == 2, 30, "both copies skipped")
    assert calls["shared"] == []

    # A different consumer group with its own ledger processes it too, once.
    async with running_worker(settings, recorder("other"), group_id=f"{namespace}-g3") as other:
        await wait_until(lambda: other.stats.skipped == 1, 30, "its copy skipped")
    assert [c.occurrence for c in calls["other"]] == [occ.occurrence]
    assert other.stats == WorkerStats(succeeded=1, skipped=1)


async def test_concurrent_duplicates_in_two_groups_sharing_a_ledger_run_once(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    started: list[str] = []
    release = asyncio.Event()

    async def slow(occ: Occurrence) -> None:
        started.append(occ.occurrence)
        await release.wait()

    async with (running_node(settings),
                running_worker(settings, slow, group_id=f"{namespace}-a",
                               idempotency_scope="shared") as a,
                running_worker(settings, slow, group_id=f"{namespace}-b",
                               idempotency_scope="shared") as b):
        await produce(settings, [upsert("contended", at=now_ms())])
        # Both workers hold the delivery; one runs the handler, the other waits on its lease.
        await wait_until(lambda: a.holding() == 1 and b.holding() == 1, 30,
                         "both workers to hold the delivery")
        await wait_until(lambda: len(started) == 1, 10, "one handler call")
        release.set()
        await wait_until(lambda: a.stats.succeeded + b.stats.succeeded == 1
                         and a.stats.skipped + b.stats.skipped == 1, 30,
                         "one success and one skip")
    assert len(started) == 1


async def test_a_killed_worker_loses_nothing_its_claim_expires(
        stack: Any, namespace: str, tmp_path: Path) -> None:
    settings = await make_namespace(stack, namespace)
    log = tmp_path / "calls.jsonl"
    group = f"{namespace}-crash"
    env = {**os.environ, "CHRONOWHEEL_NAMESPACE": namespace,
           "CHRONOWHEEL_CASSANDRA_KEYSPACE": settings.keyspace,
           "CHRONOWHEEL_CASSANDRA": settings.cassandra, "CHRONOWHEEL_KAFKA": settings.kafka,
           "CHRONOWHEEL_TEST_LOG": str(log), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "chronowheel", "worker", "--topic", settings.fired_topic,
           "--handler", "tests.integration.worker_handlers:hang", "--group", group,
           "--lease-s", "15", "--session-timeout-ms", "6000", "--http-port", "0"]
    out = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    seen: list[Occurrence] = []

    handled_at = 0.0

    async def handler(occ: Occurrence) -> None:
        nonlocal handled_at
        handled_at = time.monotonic()
        seen.append(occ)

    try:
        at = now_ms()
        async with running_node(settings):
            await produce(settings, [upsert("survivor", at=at, payload="work")])
            await wait_until(lambda: log.exists() and b"started" in log.read_bytes(), 60,
                             "the child worker to start the handler")
            proc.send_signal(signal.SIGKILL)  # mid-handler: claimed, not done, not committed
            proc.wait(30)
            killed_at = time.monotonic()
            async with running_worker(settings, handler, group_id=group) as worker:
                await wait_until(lambda: bool(seen), 60, "the redelivery to be handled")
                await wait_until(lambda: bool(worker.committed_points()), 10, "the commit")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        out.close()
    assert [(o.occurrence, o.attempt) for o in seen] == [(f"survivor@{at}", 1)]
    # The dead worker's partition lease was honoured until it expired: renewed every 5 s, it
    # lived at least 10 s past the kill (the group itself moved the partition after ~6 s).
    assert handled_at - killed_at >= 10
    [occ] = seen
    marks = await marks_of(settings, group, occ.topic, occ.partition)
    assert marks == {occ.offset: ("done", f"survivor@{at}")}


# --- rebalancing ---------------------------------------------------------------------------------

async def test_a_rebalance_lets_in_flight_handlers_finish_and_commits_before_partitions_move(
        stack: Any, namespace: str) -> None:
    # No ledger here: a record handled twice would show, so this checks the revoke path alone.
    settings = await make_namespace(stack, namespace)
    calls: Counter[str] = Counter()

    async def handler(occ: Occurrence) -> None:
        calls[occ.job_id] += 1
        if occ.job_id.startswith("slow"):
            await asyncio.sleep(5)  # the work, still running when the group rebalances

    group = f"{namespace}-rebalance"
    first = [job_on_partition(f"slow{p}", p, settings.shards) for p in range(settings.shards)]
    second = [job_on_partition(f"next{p}", p, settings.shards) for p in range(settings.shards)]
    async with (running_node(settings),
                running_worker(settings, handler, group_id=group, idempotency=False) as a):
        await produce(settings, [upsert(j, at=now_ms()) for j in first])
        await wait_until(lambda: len(calls) == len(first), 30, "A to start every handler")
        async with running_worker(settings, handler, group_id=group, idempotency=False) as b:
            assert b._consumer is not None
            consumer = b._consumer
            await wait_until(lambda: bool(consumer.assignment()), 30, "B to join the group")
            await produce(settings, [upsert(j, at=now_ms()) for j in second])
            await wait_until(lambda: len(calls) == len(first) + len(second), 30,
                             "the second round")
            assert a.stats.succeeded + b.stats.succeeded >= len(first)
    assert calls == Counter({j: 1 for j in first + second})
    assert a.stats.cancelled == 0  # they finished within the revoke deadline
    assert b.stats.succeeded > 0


# --- shutdown ------------------------------------------------------------------------------------

async def test_graceful_shutdown_commits_what_finished_and_redelivers_what_was_cancelled(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    fast_id = job_on_partition("fast", 0, settings.shards)
    slow_id = job_on_partition("slow", 1, settings.shards)
    first: list[Occurrence] = []

    async def handler(occ: Occurrence) -> None:
        first.append(occ)
        if occ.job_id == slow_id:
            await asyncio.Event().wait()  # never finishes on its own

    at = now_ms()
    async with running_node(settings):
        worker = Worker(settings, handlers={settings.fired_topic: handler}, lease_s=30,
                        session_timeout_ms=6000)
        await worker.start()
        try:
            await produce(settings, [upsert(fast_id, at=at), upsert(slow_id, at=at)])
            await wait_until(lambda: len(first) == 2, 30, "both handlers to start")
        finally:
            await worker.shutdown(deadline_s=1.0)
        assert worker.failure is None
        assert worker.stats == WorkerStats(succeeded=1, cancelled=1)
        by_id = {o.job_id: o for o in first}
        committed = await committed_offsets(settings, worker.group_id)
        assert committed.get(0) == by_id[fast_id].offset + 1
        assert committed.get(1, -1) <= by_id[slow_id].offset

        again: list[Occurrence] = []

        async def record(occ: Occurrence) -> None:
            again.append(occ)

        t0 = time.monotonic()
        async with running_worker(settings, record, lease_s=30) as second:
            await wait_until(lambda: bool(again), 30, "the cancelled occurrence again")
            await wait_until(lambda: any(tp.partition == 1 for tp in second.committed_points()),
                             10, "its commit")
        # The cancelled handler's lease was released: no waiting for its 30 s expiry.
        assert time.monotonic() - t0 < 25
        assert [o.job_id for o in again] == [slow_id]


async def test_cli_worker_stops_gracefully_on_sigterm(
        stack: Any, namespace: str, tmp_path: Path) -> None:
    settings = await make_namespace(stack, namespace)
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "CHRONOWHEEL_NAMESPACE": namespace,
           "CHRONOWHEEL_CASSANDRA_KEYSPACE": settings.keyspace,
           "CHRONOWHEEL_CASSANDRA": settings.cassandra, "CHRONOWHEEL_KAFKA": settings.kafka,
           "CHRONOWHEEL_TEST_LOG": str(log), "PYTHONUNBUFFERED": "1"}
    group = f"{namespace}-cli"
    cmd = [sys.executable, "-m", "chronowheel", "worker", "--topic", settings.fired_topic,
           "--handler", "tests.integration.worker_handlers:record", "--group", group,
           "--concurrency", "4", "--http-port", "0"]
    out_path = tmp_path / "worker.log"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            at = now_ms()
            async with running_node(settings):
                await produce(settings, [upsert("by-cli", at=at, payload={"x": 1})])
                await wait_until(lambda: log.exists() and b"handled" in log.read_bytes(), 60,
                                 "the child worker's handler")
            proc.send_signal(signal.SIGTERM)
            rc = await asyncio.to_thread(proc.wait, 60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    text = out_path.read_text(errors="replace")
    assert rc == 0, text
    assert "stop requested" in text and "stopped" in text
    [call] = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert (call["occurrence"], call["attempt"], call["payload"]) == (
        f"by-cli@{at}", 1, '{"x":1}')
    part = shard_of("by-cli", settings.shards)
    committed = await committed_offsets(settings, group)
    assert set(committed) == {part} and committed[part] >= 1


# --- handled once under crashes, zombies and duplicated retries ---------------------------------

async def put_fired(settings: Settings, job_ids: list[str], *, attempt: int = 1,
                    scheduled_ms: int | None = None) -> list[tuple[int, int]]:
    """Fired-like occurrences straight on <ns>.fired (what a node publishes), keyed by job id;
    returns (partition, offset) of each."""
    at = scheduled_ms or now_ms()
    p = plain_producer(settings)
    await p.start()
    try:
        futs = []
        for jid in job_ids:
            headers = encode_headers(jid, at, attempt, 5, 1000, ())
            headers.append(("cw-fired-at", str(at).encode()))
            futs.append(await p.send(settings.fired_topic, b"{}", key=jid.encode(),
                                     headers=headers))
        metas = await asyncio.gather(*futs)
    finally:
        await p.stop()
    return [(m.partition, m.offset) for m in metas]


def worker_child(settings: Settings, log: Path, out: Path, group: str, *extra: str,
                 work_s: float = 0.02) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CHRONOWHEEL_NAMESPACE": settings.namespace,
           "CHRONOWHEEL_CASSANDRA_KEYSPACE": settings.keyspace,
           "CHRONOWHEEL_CASSANDRA": settings.cassandra, "CHRONOWHEEL_KAFKA": settings.kafka,
           "CHRONOWHEEL_TEST_LOG": str(log), "CHRONOWHEEL_TEST_WORK_S": str(work_s),
           "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "chronowheel", "worker", "--topic", settings.fired_topic,
           "--handler", "tests.integration.worker_handlers:timed", "--group", group,
           "--lease-s", "6", "--session-timeout-ms", "6000", *extra, "--http-port", "0"]
    with out.open("wb") as sink:
        return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


async def durable_marks(settings: Settings, scope: str) -> set[str]:
    """Occurrences whose outcome mark is stored, over every partition of <ns>.fired."""
    out: set[str] = set()
    for part in range(settings.shards):
        marks = await marks_of(settings, scope, settings.fired_topic, part)
        out |= {occ for state, occ in marks.values() if state == "done"}
    return out


async def test_kill_9_mid_batch_reruns_only_what_was_not_recorded_as_handled(
        stack: Any, namespace: str, tmp_path: Path) -> None:
    settings = await make_namespace(stack, namespace)
    ids = [f"batch-{i}" for i in range(2000)]
    await put_fired(settings, ids)
    log, group = tmp_path / "calls.jsonl", f"{namespace}-kill"
    proc = worker_child(settings, log, tmp_path / "first.log", group)
    try:
        await wait_until(lambda: sum(e["event"] == "done" for e in events(log)) >= 500, 90,
                         "the first worker to be well into the batch")
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = events(log)
    first_done = {e["occurrence"] for e in first if e["event"] == "done"}
    first_started = {e["occurrence"] for e in first if e["event"] == "started"}
    assert 500 <= len(first_done) < len(ids), "the kill must land mid-batch"
    recorded = await durable_marks(settings, group)  # what the dead worker had recorded
    assert recorded <= first_done

    again: list[Occurrence] = []

    async def handler(occ: Occurrence) -> None:
        again.append(occ)

    async with running_worker(settings, handler, group_id=group, lease_s=6) as second:
        await wait_until(lambda: len(first_done | {o.occurrence for o in again}) == len(ids),
                         90, "every occurrence to be handled")
        await wait_until(lambda: second.holding() == 0, 30, "the second worker to settle")
    handled_again = [o.occurrence for o in again]
    assert len(handled_again) == len(set(handled_again)), "the second worker ran one twice"
    # Nothing recorded as handled ran again; what ran again was done but not yet recorded, or
    # still running, when the first worker died.
    assert not recorded & set(handled_again)
    rerun = first_done & set(handled_again)
    assert len(rerun) <= 2 * 16, f"{len(rerun)} handled twice: more than in flight at the kill"
    # Every handler that had started and not finished ran again (at least once).
    assert first_started - first_done <= set(handled_again)


def rejoined(out: Path, since: int) -> bool:
    """Whether a worker child's log, from byte `since` on, says it was revoked and then
    assigned partitions again."""
    with out.open("rb") as f:
        f.seek(since)
        said = re.findall(r"chronowheel\.worker\.service worker \S+ (revoked|assigned) ",
                          f.read().decode(errors="replace"))
    return "revoked" in said and "assigned" in said[said.index("revoked"):]


async def test_a_paused_worker_starts_no_handler_after_it_wakes(
        stack: Any, namespace: str, tmp_path: Path) -> None:
    settings = await make_namespace(stack, namespace)
    ids = [f"z-{i}" for i in range(600)]
    placed = await put_fired(settings, ids)
    ends = {part: max(o for p, o in placed if p == part) + 1 for part, _ in placed}
    log, group = tmp_path / "calls.jsonl", f"{namespace}-zombie"
    out = tmp_path / "zombie.log"
    zombie = worker_child(settings, log, out, group, "--concurrency", "4", work_s=0.05)
    again: list[Occurrence] = []

    async def handler(occ: Occurrence) -> None:
        again.append(occ)

    try:
        await wait_until(lambda: sum(e["event"] == "done" for e in events(log)) >= 100, 90,
                         "the worker to be handling")
        zombie.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        async with running_worker(settings, handler, group_id=group, lease_s=6) as heir:
            done_before = {e["occurrence"] for e in events(log) if e["event"] == "done"}
            await wait_until(lambda: len(done_before | {o.occurrence for o in again})
                             == len(ids), 120, "the heir to handle the rest")
            woke = out.stat().st_size
            zombie.send_signal(signal.SIGCONT)
            # The zombie runs on with a full buffer, stale leases and an old group generation
            # until it notices; the heir holds the partitions meanwhile. Wait until it has let
            # go of what it held (revoked: nothing of it starts any more) and joined the group
            # again, and until the group's offsets are committed past every record: nothing is
            # left for either worker to start.
            await wait_until(lambda: rejoined(out, woke), 60,
                             "the zombie to let go of its partitions and join the group again")

            async def all_committed() -> bool:
                committed = await committed_offsets(settings, group)
                return all(committed.get(part, -1) >= end for part, end in ends.items())

            await wait_until(all_committed, 60, "the group's offsets past every record")
            assert heir.failure is None
        zombie.send_signal(signal.SIGTERM)
        await asyncio.to_thread(zombie.wait, 60)
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.wait(30)
    late_starts = [e for e in events(log)
                   if e["event"] == "started" and e["t"] > stopped_at + 0.5]
    assert late_starts == [], f"the zombie started {len(late_starts)} handler(s) after waking"
    text = (tmp_path / "zombie.log").read_text(errors="replace")
    assert "lease" in text  # it said why it stopped handling
    handled = {e["occurrence"] for e in events(log) if e["event"] == "done"}
    assert len(handled | {o.occurrence for o in again}) == len(ids)


async def test_a_duplicated_retry_is_handled_once(stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    at = now_ms() - 5000
    seen: list[tuple[str, int, int]] = []

    async def handler(occ: Occurrence) -> None:
        seen.append((occ.occurrence, occ.attempt, occ.offset))

    async with running_worker(settings, handler) as worker:
        # The same retry (attempt 2) twice, as a crash between producing a retry command and
        # committing makes the node fire it twice, far apart on the partition.
        [(_, first)] = await put_fired(settings, ["retried"], attempt=2, scheduled_ms=at)
        await put_fired(settings, [f"filler-{i}" for i in range(200)])
        [(_, second)] = await put_fired(settings, ["retried"], attempt=2, scheduled_ms=at)
        await wait_until(lambda: worker.stats.skipped == 1, 30, "the second copy to be skipped")
    assert [s for s in seen if s[0] == f"retried@{at}"] == [(f"retried@{at}", 2, first)]
    assert second > first
    row = await claim_of(settings, worker.group_id, f"retried@{at}")
    assert row is not None and (row.state, row.attempt) == ("done", 2)


async def test_a_retry_command_sent_twice_runs_its_attempt_once(
        stack: Any, namespace: str) -> None:
    """The worker's producer is not idempotent: a request retried after its acknowledgement
    was lost writes its retry command twice. Here the copy comes after the first copy's
    attempt ran: the node fires the attempt again and the ledger skips it."""
    settings = await make_namespace(stack, namespace, shards=2)
    attempts: list[int] = []

    async def handler(occ: Occurrence) -> None:
        attempts.append(occ.attempt)
        if occ.attempt == 1:
            raise RuntimeError("downstream unavailable")

    at = now_ms()
    async with (collecting(settings, settings.submit_topic) as submitted,
                collecting(settings) as fired,
                running_node(settings),
                running_worker(settings, handler) as worker):
        await produce(settings, [upsert("twice", at=at, max_attempts=3, backoff="1s")])
        await wait_until(lambda: worker.stats.succeeded == 1, 60, "attempt 2 to succeed")
        [retry] = [m for m in submitted.messages if b'"op":"retry"' in m.value]
        await produce(settings, [(retry.key, retry.value)])  # the same record again
        await wait_until(lambda: worker.stats.skipped == 1, 60,
                         "the second delivery of attempt 2 to be skipped")

        def fired_attempts() -> list[str]:
            return sorted(m.headers["cw-attempt"] for m in fired.messages
                          if m.job_id == "twice")

        # the worker read it committed: so does the collector
        await wait_until(lambda: len(fired_attempts()) >= 3, 30, "the three deliveries")
    assert fired_attempts() == ["1", "2", "2"]
    assert attempts == [1, 2]
    assert worker.stats == WorkerStats(succeeded=1, failed=1, retried=1, skipped=1)
    row = await claim_of(settings, worker.group_id, f"twice@{at}")
    assert row is not None and (row.state, row.attempt) == ("done", 2)
