"""Dead-letter redrive against a real node, worker, Kafka and Cassandra: a handler that fails
dead-letters a few jobs, `chronowheel dead list` shows them, `chronowheel dead redrive` of one
tenant's letters runs each of them again once (the handler now succeeds), and a second redrive
sends nothing; two redrives of one letter at the same moment, from two clients, deliver it
once."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import orjson
import pytest
from chronowheel.client import SchedulerClient
from chronowheel.core import wire
from chronowheel.store.cassandra import CassandraStore
from chronowheel.testing.collect import Collector, collecting
from chronowheel.worker import DeadLetter, Occurrence

from testkit.fleet import until as wait_until
from tests.integration.harness import (
    make_namespace,
    now_ms,
    run_cli,
    running_node,
    running_worker,
    settled,
)
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


@pytest.mark.timeout(180)
async def test_two_redrives_of_one_letter_at_the_same_moment_deliver_it_once(
        stack: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two clients (two processes' worth: each its own producer and store session) start a
    redrive of the same letter together. Neither finds a request row: the first client's
    row is written only once the second has sent its retry too, and the second looks only
    once the node has delivered the first's. The node applies the letter's redrive id once:
    one new delivery on the fired topic."""
    settings = await make_namespace(stack, namespace, shards=4)

    async def handler(occ: Occurrence) -> None:
        raise DeadLetter(f"downstream down for {occ.job_id}")

    first_delivered, second_sent = asyncio.Event(), asyncio.Event()
    stores = [await asyncio.to_thread(CassandraStore.open, settings) for _ in range(2)]
    put_first, put_second = stores[0].put_request, stores[1].put_request
    get_second = stores[1].get_request

    async def put_after_the_second(row: Any, *args: Any, **kwargs: Any) -> None:
        if row.kind == "redrive":
            await second_sent.wait()
        await put_first(row, *args, **kwargs)

    async def get_after_the_delivery(*args: Any) -> Any:
        await first_delivered.wait()
        return await get_second(*args)

    async def put_and_tell(row: Any, *args: Any, **kwargs: Any) -> None:
        if row.kind == "redrive":  # its retry is out (Kafka took it)
            second_sent.set()
        await put_second(row, *args, **kwargs)

    monkeypatch.setattr(stores[0], "put_request", put_after_the_second)
    monkeypatch.setattr(stores[1], "get_request", get_after_the_delivery)
    monkeypatch.setattr(stores[1], "put_request", put_and_tell)

    def deliveries(seen: Collector) -> Counter[str | None]:
        return Counter(m.headers.get(wire.ATTEMPT) for m in seen.messages if m.key == b"r-1")

    try:
        async with collecting(settings) as seen, running_node(settings), \
                SchedulerClient(settings) as client:
            async with running_worker(settings, handler) as worker:
                await client.schedule("r-1", now_ms(), {"job": "r-1"})
                await client.flush()
                await wait_until(lambda: worker.stats.dead == 1, 60, "one dead letter")
            sent_before = await submitted(settings)

            async def tell_first_delivery() -> None:
                await seen.wait_for(lambda _m: deliveries(seen)["2"] >= 1, 60,
                                    "the first redrive's delivery")
                first_delivered.set()

            async with SchedulerClient(settings, store=stores[0]) as one, \
                    SchedulerClient(settings, store=stores[1]) as other:
                first, second, _ = await asyncio.wait_for(asyncio.gather(
                    one.redrive(job_id="r-1"), other.redrive(job_id="r-1"),
                    tell_first_delivery()), 90)
            assert first.ok and second.ok
            assert first.redriven == second.redriven and len(first.redriven) == 1
            assert await submitted(settings) == sent_before + 2  # both retries went out
            await settled(settings, seen)
            assert deliveries(seen) == {"1": 1, "2": 1}, seen.messages
            assert len({m.headers[wire.OCCURRENCE] for m in seen.messages
                        if m.key == b"r-1"}) == 1  # the same occurrence again
    finally:
        for store in stores:
            await asyncio.to_thread(store.close)
