"""The overlap policy (`concurrency`) across two real worker processes, with a real node,
Kafka and Cassandra. Worker A handles `<ns>.fired`, worker B `<ns>.other`, in different
consumer groups sharing one idempotency scope, so the only thing coordinating them is the
job's run lease in Cassandra. The node fires the jobs to A; occurrences of the same jobs are
also produced straight to B's topic while A is running one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import pytest
from chronowheel.bus.kafka import TopicSpec, ensure_topics, open_admin, plain_producer
from chronowheel.core import wire
from chronowheel.node.pending import encode_headers
from chronowheel.settings import Settings

from testkit.fleet import until as wait_until
from tests.integration.harness import REPO, make_namespace, now_ms, produce, running_node, upsert
from tests.integration.worker_handlers import read_events as events

pytestmark = pytest.mark.integration


async def fire_directly(settings: Settings, topic: str, job_id: str, scheduled_ms: int,
                        policy: str, work_s: float) -> str:
    """An occurrence as the node would publish it, straight onto `topic`."""
    headers = encode_headers(job_id, scheduled_ms, 1, 5, 10_000,
                             ((wire.CONCURRENCY, policy),))
    headers.append((wire.FIRED_AT, str(now_ms()).encode()))
    producer = plain_producer(settings)
    await producer.start()
    try:
        await producer.send_and_wait(topic, orjson.dumps({"work_s": work_s}),
                                     key=job_id.encode(), headers=headers)
    finally:
        await producer.stop()
    return wire.occurrence_id(job_id, scheduled_ms)


def start_worker(settings: Settings, topic: str, group: str, scope: str, log: Path,
                 out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CHRONOWHEEL_NAMESPACE": settings.namespace,
           "CHRONOWHEEL_CASSANDRA_KEYSPACE": settings.keyspace,
           "CHRONOWHEEL_CASSANDRA": settings.cassandra, "CHRONOWHEEL_KAFKA": settings.kafka,
           "CHRONOWHEEL_TEST_LOG": str(log), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "chronowheel", "worker", "--topic", topic,
           "--handler", "tests.integration.worker_handlers:overlapping", "--group", group,
           "--idempotency-scope", scope, "--concurrency", "8", "--session-timeout-ms", "6000",
           # At the end each worker still runs a minute-long refresh: stopping, it cancels
           # that at once instead of letting it run up to the default deadline of 30 s (the
           # test checks the runs' overlap, not the stop).
           "--shutdown-deadline-s", "1",
           # Two workers on one host: each its own free metrics port.
           "--http-port", "0"]
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out.open("wb"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def intervals(evs: list[dict[str, Any]], job: str) -> list[tuple[float, float]]:
    starts = {e["occurrence"]: e["t"] for e in evs if e.get("job") == job
              and e["event"] == "started"}
    ends = {e["occurrence"]: e["t"] for e in evs if e.get("job") == job
            and e["event"] in ("done", "cancelled")}
    return sorted((t, ends.get(occ, float("inf"))) for occ, t in starts.items())


def skipped(out: Path, occurrence: str) -> int:
    """How many occurrences (those whose id starts with `occurrence`) a worker's output says
    it skipped under concurrency=forbid."""
    text = out.read_text(errors="replace") if out.exists() else ""
    return sum(1 for line in text.splitlines()
               if occurrence in line and ": skipped: concurrency=forbid" in line)


def started_after(evs: list[dict[str, Any]], job: str, t: float) -> bool:
    return any(e.get("job") == job and e["event"] == "started" and e["t"] > t for e in evs)


async def test_forbid_and_replace_across_two_worker_processes(
        stack: Any, namespace: str, tmp_path: Path) -> None:
    other = f"{namespace}.other"
    settings = await make_namespace(stack, namespace, allowed_topics=re.escape(other))
    admin = await open_admin(settings)
    try:
        await ensure_topics(admin, [TopicSpec(other, 4)], 1)
    finally:
        await admin.close()
    scope = f"{namespace}-overlap"
    log_a, log_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    out_a, out_b = tmp_path / "a.out", tmp_path / "b.out"
    a = start_worker(settings, settings.fired_topic, f"{namespace}-a", scope, log_a, out_a)
    b = start_worker(settings, other, f"{namespace}-b", scope, log_b, out_b)
    try:
        # B is ready once it handled a first record of its topic.
        warm = await fire_directly(settings, other, "warm-up", 1, "allow", 0.01)
        await wait_until(lambda: any(e["occurrence"] == warm for e in events(log_b)), 90,
                         "worker B to handle its first record")
        async with running_node(settings):
            # forbid: every 2 s, each run takes 5 s.
            await produce(settings, [upsert("nightly", every="2s", concurrency="forbid",
                                            payload={"work_s": 5})])
            await wait_until(lambda: any(e.get("job") == "nightly" for e in events(log_a)), 60,
                             "A to start a nightly occurrence")
            blocked = await fire_directly(settings, other, "nightly", 7, "forbid", 0.5)
            # B's attempt, and A's own overlapping deliveries: each worker logs the
            # occurrences it skipped (a 5 s run and one every 2 s: the second skip on A
            # comes about 4 s after its first start).
            await wait_until(lambda: skipped(out_b, blocked) > 0, 60,
                             "B to skip the nightly occurrence A is running")
            await wait_until(lambda: skipped(out_a, "nightly@") >= 2, 60,
                             "A to skip two nightly occurrences of its own")
            # replace: every 3 s, each run would take a minute.
            await produce(settings, [upsert("refresh", every="3s", concurrency="replace",
                                            payload={"work_s": 60})])
            await wait_until(lambda: any(e.get("job") == "refresh" for e in events(log_a)),
                             60, "A to start a refresh occurrence")
            newer = await fire_directly(settings, other, "refresh", 9, "replace", 60)
            await wait_until(lambda: any(e["occurrence"] == newer for e in events(log_b)), 60,
                             "B to start the replacing occurrence")
            # and A's next delivery (every 3 s) to replace B's in turn
            b_started = next(e["t"] for e in events(log_b) if e["occurrence"] == newer)
            await wait_until(lambda: started_after(events(log_a), "refresh", b_started), 60,
                             "A to start a refresh occurrence after B's")
    finally:
        for proc in (a, b):
            proc.terminate()
        for proc in (a, b):
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    ev_a, ev_b = events(log_a), events(log_b)
    everything = ev_a + ev_b
    # forbid: B never ran its nightly occurrence (A's was running), and no two nightly runs
    # overlapped anywhere, although the node fired one every 2 s for 5 s runs.
    assert not any(e["occurrence"] == blocked for e in ev_b)
    nightly = intervals(everything, "nightly")
    assert nightly
    for (_, end), (start, _) in pairwise(nightly):
        assert start >= end - 0.05, nightly  # 50 ms for the two clocks' write order
    # replace: A's running refresh was cancelled (its task, an async handler), and B's started
    # only after that; A's later occurrences replace in turn, never running alongside.
    refresh = intervals(everything, "refresh")
    b_start = next(e["t"] for e in ev_b if e["occurrence"] == newer)
    cancelled_a = [e["t"] for e in ev_a if e.get("job") == "refresh"
                   and e["event"] == "cancelled"]
    assert cancelled_a and min(cancelled_a) <= b_start + 0.05
    for (_, end), (start, _) in pairwise(refresh):
        assert start >= end - 0.05, refresh
