"""Dead-letter redrive against a real node, worker, Kafka and Cassandra: a handler that fails
dead-letters a few jobs, `chronowheel dead list` shows them, `chronowheel dead redrive` of one
tenant's letters runs each of them again once (the handler now succeeds), and a second redrive
sends nothing."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest
from chronowheel.client import SchedulerClient
from chronowheel.worker import DeadLetter, Occurrence

from testkit.fleet import until as wait_until
from tests.integration.harness import make_namespace, now_ms, run_cli, running_node, running_worker
from tests.integration.test_bulk import submitted

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
async def test_dead_list_then_redrive_one_tenant_once(
        stack: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    settings = await make_namespace(stack, namespace, shards=4)
    calls: Counter[tuple[str, int]] = Counter()
    failing = True

    async def handler(occ: Occurrence) -> None:
        calls[(occ.job_id, occ.attempt)] += 1
        if failing:
            raise DeadLetter(f"downstream down for {occ.job_id}")

    a_jobs = [f"a-{i}" for i in range(3)]
    b_jobs = [f"b-{i}" for i in range(2)]
    at = now_ms()
    async with running_node(settings), SchedulerClient(settings) as client, \
            running_worker(settings, handler) as worker:
        for j in a_jobs + b_jobs:
            await client.schedule(j, at, {"job": j}, tenant=j[0])
        await client.flush()
        await wait_until(lambda: worker.stats.dead == 5, 60, "five dead letters")

        code, out, err = await run_cli(capsys, settings, "dead", "list", "--json")
        assert code == 0, err
        listed = orjson.loads(out)["letters"]
        assert sorted((x["job_id"], x["tenant"], x["attempt"]) for x in listed) == [
            *((j, "a", 1) for j in a_jobs), *((j, "b", 1) for j in b_jobs)]
        assert all(x["error"].startswith("DeadLetter: downstream down") for x in listed)
        assert all(x["source_topic"] == settings.fired_topic for x in listed)
        code, out, err = await run_cli(capsys, settings, "dead", "list", "--tenant", "a",
                                       "--reason", "DOWNSTREAM")
        assert code == 0, err
        assert all(j in out for j in a_jobs) and not any(j in out for j in b_jobs)

        code, out, err = await run_cli(capsys, settings, "dead", "redrive", "--tenant",
                                       "a", "--dry-run")
        assert code == 0, err
        assert "would send    3" in out

        failing = False
        sent_before = await submitted(settings)
        code, out, err = await run_cli(capsys, settings, "dead", "redrive", "--tenant",
                                       "a", "--json")
        assert code == 0, err
        summary = orjson.loads(out)
        assert (summary["matched"], summary["redriven"], summary["already"]) == (3, 3, 0)
        await wait_until(lambda: all(calls[(j, 2)] == 1 for j in a_jobs), 60,
                         "each redriven letter handled as attempt 2")
        await wait_until(lambda: worker.stats.succeeded == 3, 30, "three successes")
        assert await submitted(settings) == sent_before + 3

        # The same redrive again: every letter was redriven; nothing is sent.
        code, out, err = await run_cli(capsys, settings, "dead", "redrive", "--tenant",
                                       "a", "--json")
        assert code == 0, err
        again = orjson.loads(out)
        assert (again["redriven"], again["already"]) == (0, 3)
        assert await submitted(settings) == sent_before + 3
        summary = await client.redrive(tenant="a")
        assert summary.redriven == [] and len(summary.already) == 3

    # Nothing ran twice, and the other tenant's letters were left alone.
    assert {k: n for k, n in calls.items() if k[1] == 2} == {(j, 2): 1 for j in a_jobs}
    assert all(calls[(j, 1)] == 1 for j in a_jobs + b_jobs)
