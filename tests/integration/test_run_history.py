"""Run history and counters on the real servers: a recurring job and a one-shot fire from a real
node, a real worker handles them (the recurring one fails, the one-shot succeeds), and
`job history`, `job show`, `jobs list` and `SchedulerClient.job_history` show each run with its
outcome and the counters."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from chronowheel.client import SchedulerClient
from chronowheel.core import runs
from chronowheel.core.runs import JobHistory
from chronowheel.worker import Occurrence

from testkit.fleet import until
from tests.integration.harness import make_namespace, now_ms, run_cli, running_node, running_worker

pytestmark = pytest.mark.integration


async def test_runs_of_a_recurring_job_and_a_one_shot_show_with_outcomes_and_counters(
        stack: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    settings = await make_namespace(stack, namespace, shards=2)
    handled: list[str] = []

    async def handler(occ: Occurrence) -> None:
        handled.append(occ.occurrence)
        if occ.job_id == "beat":
            raise RuntimeError("the downstream refused it")

    async with (running_node(settings, node_id="hist-n"),
                running_worker(settings, handler, worker_id="hist-w"),
                SchedulerClient(settings) as client):
        at = now_ms() + 2_000
        await (await client.schedule("once", at, {"n": 1}))
        await (await client.every("beat", "1s", max_attempts=1))
        latest: dict[str, JobHistory] = {}

        async def recorded() -> bool:
            for job in ("once", "beat"):
                latest[job] = await client.job_history(job, limit=5)
            once, beat = latest["once"], latest["beat"]
            # The counters are a write of their own after the runs' rows: waited for too.
            return (bool(once.runs) and once.runs[0].state == runs.SUCCEEDED
                    and once.runs[0].fired_ms is not None
                    and sum(r.state == runs.DEAD_LETTERED and r.fired_ms is not None
                            for r in beat.runs) >= 2
                    and once.counters.fired >= 1 and once.counters.succeeded >= 1
                    and beat.counters.dead_lettered >= 2)

        await until(recorded, 60, "both jobs' runs recorded by the node and worker")

    once, beat = latest["once"], latest["beat"]
    (run,) = once.runs
    assert (run.scheduled_ms, run.attempt, run.node_id, run.worker_id) == (at, 1, "hist-n",
                                                                           "hist-w")
    assert run.fired_ms is not None and run.fired_ms >= at  # never early
    assert run.lateness_ms is not None and run.lateness_ms >= 0
    assert run.started_ms is not None and run.ended_ms is not None
    assert run.started_ms <= run.ended_ms
    assert once.counters.fired == 1 and once.counters.succeeded == 1
    assert once.counters.last_outcome == runs.SUCCEEDED
    dead = [r for r in beat.runs if r.state == runs.DEAD_LETTERED]
    assert all(r.error == "RuntimeError: the downstream refused it" for r in dead)
    assert [r.scheduled_ms for r in beat.runs] == sorted(
        (r.scheduled_ms for r in beat.runs), reverse=True)  # newest first
    assert beat.counters.dead_lettered >= 2 and beat.counters.failed >= 2
    assert beat.counters.succeeded == 0

    # The command line shows the same, after the node and worker stopped (flushed).
    code, out, _ = await run_cli(capsys, settings, "job", "history", "beat", "--json")
    assert code == 0
    shown = orjson.loads(out)
    assert shown["counters"]["dead_lettered"] >= 2
    assert {r["state"] for r in shown["runs"]} <= {runs.DEAD_LETTERED, runs.FIRED}
    code, out, _ = await run_cli(capsys, settings, "job", "history", "once")
    assert code == 0 and "succeeded" in out and "hist-w" in out
    code, out, _ = await run_cli(capsys, settings, "job", "show", "once", "--json")
    view = orjson.loads(out)
    assert (view["status"], view["stored_status"]) == ("finished", "scheduled")
    assert view["counters"]["succeeded"] == 1 and view["last_run"]["state"] == "succeeded"
    code, out, _ = await run_cli(capsys, settings, "jobs", "list", "--json")
    listed = {j["id"]: j for j in orjson.loads(out)["jobs"]}
    assert listed["once"]["status"] == "finished"
    assert listed["once"]["counters"]["fired"] == 1
    assert listed["beat"]["status"] == "scheduled"
    assert listed["beat"]["counters"]["last_outcome"] in (runs.DEAD_LETTERED, runs.FIRED)


async def test_a_namespace_without_the_history_tables_still_fires_and_handles(
        stack: Any, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    # A namespace created before run history, not `init`ed since: the node and the worker say
    # so and go on without history instead of refusing to start.
    from chronowheel.store.cassandra import connect

    settings = await make_namespace(stack, namespace, shards=2)
    ks = settings.keyspace
    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        for table in ("run_history", "run_counters"):
            await asyncio.to_thread(session.execute, f"DROP TABLE {ks}.{table}", timeout=60)
    finally:
        await asyncio.to_thread(cluster.shutdown)
    handled: list[str] = []

    async def handler(occ: Occurrence) -> None:
        handled.append(occ.job_id)

    caplog.set_level(logging.ERROR)
    async with (running_node(settings, node_id="old-n"),
                running_worker(settings, handler, worker_id="old-w"),
                SchedulerClient(settings) as client):
        await (await client.schedule("once", now_ms() + 1_500, {"n": 1}))
        await until(lambda: handled == ["once"], 60, "the one-shot handled")
    off = [r for r in caplog.records if r.getMessage().startswith("run history off")]
    assert {r.name for r in off} == {"chronowheel.node.service",
                                     "chronowheel.store.cassandra_marks"}, off
    assert all("chronowheel init" in r.getMessage() for r in off)
