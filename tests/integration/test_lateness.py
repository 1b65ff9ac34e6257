"""The lateness bound through a real node, Kafka and Cassandra (issue 28, item 3): one-shots due
while the only node is stopped, and a job every 1 s paused meanwhile, all with `max_lateness:
2s`. After the restart the one-shots more than 2 s late are not published and are counted as
missed (those without a bound fire late); on resume the paused job publishes only the withheld
occurrences its bound allows, counts the others, and every later occurrence is published; a
one-shot due after the restart fires. Each occurrence once and never early, as a read_committed
reader sees it. Barriers are the node group's submit offsets and the shards' committed
watermarks (`applied`, `settled`), and the clock for the outage itself.

Through a failover: a node catching up at a paced rate after an outage is killed with SIGKILL
halfway; the next owner finishes the catch-up from the state record's `ahead` range, and every
late occurrence is published once. A cancel and an edit of late jobs still queued hold through
such a kill: the next owner loads the queue's rows again, and theirs are gone."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from chronowheel.client import SchedulerClient
from chronowheel.store.cassandra import CassandraStore

from testkit.fleet import until
from tests.integration.harness import (
    NodeProcess,
    applied,
    collecting,
    make_namespace,
    now_ms,
    running_node,
    settled,
)

pytestmark = pytest.mark.integration

BOUND_MS = 2_000
BOUNDED = [f"bounded-{i}" for i in range(5)]
FREE = [f"free-{i}" for i in range(3)]


async def first_withheld(settings: Any, job_id: str) -> int:
    store = await asyncio.to_thread(CassandraStore.open, settings)
    try:
        row = await store.get_job(job_id)
        assert row is not None and row.status == "paused" and row.scheduled_ms is not None, row
        return row.scheduled_ms
    finally:
        await asyncio.to_thread(store.close)


async def test_occurrences_beyond_max_lateness_are_missed_counted_and_the_job_goes_on(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=2)
    async with collecting(settings) as seen, SchedulerClient(settings) as client:
        async with running_node(settings, node_id="before"):
            await client.every("tick", 1_000, {"job": "tick"}, catch_up="all",
                               max_lateness="2s")
            await client.flush()
            await seen.wait_for(lambda ms: sum(m.key == b"tick" for m in ms) >= 2, 30,
                                "two ticks")
            due = now_ms() + 5_000
            for job_id in BOUNDED:
                await client.schedule(job_id, due, {"job": job_id}, max_lateness="2s")
            for job_id in FREE:
                await client.schedule(job_id, due, {"job": job_id})
            await client.pause("tick")
            await client.flush()
            await applied(settings)
        withheld_from = await first_withheld(settings, "tick")
        # The only node is stopped: nothing is published until the one-shots are 4 s late.
        await until(lambda: now_ms() > due + 2 * BOUND_MS, 30, "the outage to pass the bound")
        assert [m for m in seen.messages if m.scheduled_ms >= withheld_from or
                m.key in {j.encode() for j in BOUNDED + FREE}] == []
        async with running_node(settings, node_id="after") as node:
            after_due = now_ms() + 3_000
            await client.schedule("after", after_due, {"job": "after"}, max_lateness="2s")
            await client.resume("tick")
            await client.flush()
            await applied(settings)
            resume_applied = now_ms()
            await settled(settings, seen, upto_ms=max(resume_applied, after_due) + 5_000)
            missed = node.metrics.missed.labels(namespace)._value.get()

    fired = seen.messages
    assert set(Counter(m.occurrence for m in fired).values()) == {1}, "exactly once"
    assert all(m.fired_ms >= m.scheduled_ms for m in fired), "never early"
    keys = Counter((m.key or b"").decode() for m in fired)
    assert not any(keys[j] for j in BOUNDED), "a one-shot beyond its bound was published"
    assert all(keys[j] == 1 for j in FREE), "a one-shot without a bound fires late"
    assert keys["after"] == 1, "a one-shot due after the restart fires"
    ticks = sorted(m.scheduled_ms for m in fired if m.key == b"tick"
                   and m.scheduled_ms >= withheld_from)
    # From the resume on the series is whole: the oldest withheld occurrences were missed, the
    # ones the bound allowed fired, then every later one.
    assert ticks and ticks == list(range(ticks[0], ticks[-1] + 1, 1_000)), ticks
    assert ticks[-1] >= resume_applied + 5_000 - 1_000
    tick_missed = (ticks[0] - withheld_from) // 1_000
    assert tick_missed >= 3, (withheld_from, ticks[0])  # paused for 6 s and more
    assert missed == len(BOUNDED) + tick_missed


SLOW_RATE = 10  # late occurrences a second per shard: the catch-up lasts about 20 s
LATE_JOBS = 400


async def test_a_node_killed_halfway_through_a_paced_catch_up_loses_and_repeats_nothing(
        stack: Any, namespace: str, tmp_path: Path) -> None:
    settings = await make_namespace(stack, namespace, shards=2)
    async with collecting(settings) as seen:
        async with running_node(settings, node_id="before") as before:
            due = now_ms() + 4_000
            late = {f"late-{i:04d}": due + i * 5 for i in range(LATE_JOBS)}
            async with SchedulerClient(settings) as client:
                for job_id, at in late.items():
                    await client.schedule(job_id, at, {"job": job_id})
                await client.flush()
            await applied(settings)
            assert before.owned  # it stops before they are due
        # Nobody runs: the jobs become more than catch_up_lag_ms late.
        await until(lambda: now_ms() > due + 2 * settings.catch_up_lag_ms, 60,
                    "the outage to make them late")
        catching_up = NodeProcess(settings, "catching-up", tmp_path)
        try:
            catching_up.start(CHRONOWHEEL_CATCH_UP_RATE=str(SLOW_RATE))
            await catching_up.wait_ready()
            # On-time work while it catches up: published past the cut, so a next owner that
            # ignored the record's `ahead` range would publish these twice.
            during = {f"during-{k}": now_ms() + 1_000 + 100 * k for k in range(5)}
            async with SchedulerClient(settings) as client:
                for job_id, at in during.items():
                    await client.schedule(job_id, at, {"job": job_id})
                await client.flush()

            def got(prefix: bytes) -> int:
                return sum(1 for m in seen.messages if (m.key or b"").startswith(prefix))

            await until(lambda: got(b"during-") == len(during) and got(b"late-") >= SLOW_RATE,
                        60, "on-time work published while the catch-up is under way")
            catching_up.kill()  # SIGKILL, halfway: its open transaction is left to the fence
            at_kill = got(b"late-")
        finally:
            if catching_up.proc is not None and catching_up.proc.poll() is None:
                catching_up.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                catching_up.wait(30)
        assert at_kill < LATE_JOBS, "the catch-up was over before the kill"
        async with running_node(settings, node_id="next"):
            on_time = {f"after-{k}": now_ms() + 2_000 + 500 * k for k in range(4)}
            async with SchedulerClient(settings) as client:
                for job_id, at in on_time.items():
                    await client.schedule(job_id, at, {"job": job_id})
                await client.flush()
            everything = set(late) | set(during) | set(on_time)
            await seen.wait_for(lambda ms: {(m.key or b"").decode() for m in ms} >= everything,
                                120, "every late and on-time job")
            await settled(settings, seen, upto_ms=max(on_time.values()) + 1_000)

    fired = seen.messages
    assert set(Counter(m.occurrence for m in fired).values()) == {1}, "exactly once"
    assert all(m.fired_ms >= m.scheduled_ms for m in fired), "never early"
    assert sorted((m.key or b"").decode() for m in fired) == sorted(everything)


async def test_a_cancel_and_an_edit_of_queued_late_jobs_hold_through_a_kill(
        stack: Any, namespace: str, tmp_path: Path) -> None:
    # Late one-shots wait in a catching-up node's queue; some are cancelled, one is moved to a
    # later instant, and the node is killed (SIGKILL) before its queue reaches them. Neither
    # it nor the next owner, which loads the queued range again from Cassandra, publishes a
    # cancelled one or the edited one's old occurrence.
    settings = await make_namespace(stack, namespace, shards=2)
    async with collecting(settings) as seen:
        async with running_node(settings, node_id="before"):
            due = now_ms() + 4_000
            late = {f"late-{i:04d}": due + i * 5 for i in range(LATE_JOBS)}
            async with SchedulerClient(settings) as client:
                for job_id, at in late.items():
                    await client.schedule(job_id, at, {"job": job_id})
                await client.flush()
            await applied(settings)
        await until(lambda: now_ms() > due + 2 * settings.catch_up_lag_ms, 60,
                    "the outage to make them late")
        cancelled = sorted(late)[-20:]
        edited = sorted(late)[-21]
        catching_up = NodeProcess(settings, "catching-up", tmp_path)
        try:
            catching_up.start(CHRONOWHEEL_CATCH_UP_RATE=str(SLOW_RATE))
            await catching_up.wait_ready()
            async with SchedulerClient(settings) as client:
                for job_id in cancelled:
                    await client.cancel(job_id)
                moved_to = now_ms() + 3_000
                await client.schedule(edited, moved_to, {"job": edited})
                await client.flush()
            await applied(settings)
            published = {(m.key or b"").decode() for m in seen.messages}
            assert not published & {*cancelled, edited}, "the queue reached them: too fast"
            catching_up.kill()
        finally:
            if catching_up.proc is not None and catching_up.proc.poll() is None:
                catching_up.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                catching_up.wait(30)
        async with running_node(settings, node_id="next"):
            expected = set(late) - set(cancelled)
            await seen.wait_for(lambda ms: {(m.key or b"").decode() for m in ms} >= expected,
                                120, "every late job left")
            await settled(settings, seen, upto_ms=max(now_ms(), moved_to) + 1_000)

    fired = seen.messages
    assert set(Counter(m.occurrence for m in fired).values()) == {1}, "exactly once"
    assert all(m.fired_ms >= m.scheduled_ms for m in fired), "never early"
    keys = Counter((m.key or b"").decode() for m in fired)
    assert not any(keys[j] for j in cancelled), "a cancelled job was published"
    assert [m.scheduled_ms for m in fired if m.key == edited.encode()] == [moved_to]
    assert sorted(keys) == sorted(expected)
