"""The overlap policy (`concurrency`) between two real workers on the in-memory rig: worker A
handles `<ns>.fired`, worker B `unit.other`, in different consumer groups sharing one
idempotency scope and one store, so only the job's run lease coordinates them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from chronowheel.core import wire
from chronowheel.worker import Handler, Occurrence, Worker

from tests.unit.worker_rig import WorkerRig

OTHER = "unit.other"


@pytest.fixture
async def rig() -> AsyncIterator[WorkerRig]:
    async with WorkerRig() as r:
        r.memory.create_topic(OTHER, 2)
        yield r


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []  # (worker, event, occurrence)

    def handler(self, name: str, work: dict[str, asyncio.Event]) -> Handler:
        async def handle(occ: Occurrence) -> None:
            self.events.append((name, "started", occ.occurrence))
            try:
                await work.setdefault(occ.occurrence, asyncio.Event()).wait()
            except asyncio.CancelledError:
                self.events.append((name, "cancelled", occ.occurrence))
                raise
            self.events.append((name, "done", occ.occurrence))
        return handle


async def two_workers(rig: WorkerRig, log: Log, work: dict[str, asyncio.Event],
                      ) -> tuple[Worker, Worker]:
    a = await rig.start(log.handler("a", work), group_id="unit-a", idempotency_scope="overlap",
                        worker_id="a", lease_s=10)
    b = await rig.start(log.handler("b", work), group_id="unit-b", idempotency_scope="overlap",
                        worker_id="b", lease_s=10, topic=OTHER)
    return a, b


async def test_forbid_skips_an_occurrence_while_another_of_its_job_runs_in_another_worker(
        rig: WorkerRig) -> None:
    log, work = Log(), {}
    a, b = await two_workers(rig, log, work)
    policy = ((wire.CONCURRENCY, "forbid"),)
    rig.fire("nightly", scheduled_ms=1000, headers=policy)
    await rig.until("A to run it", lambda: ("a", "started", "nightly@1000") in log.events)
    rig.fire("nightly", scheduled_ms=7000, headers=policy, topic=OTHER)
    await rig.until("B to skip its occurrence", lambda: b.stats.overlap_skipped == 1)
    assert not any(e[0] == "b" for e in log.events)
    work["nightly@1000"].set()
    await rig.until("A to finish", lambda: a.stats.succeeded == 1)
    # Once it ended, the next occurrence runs.
    rig.fire("nightly", scheduled_ms=9000, headers=policy, topic=OTHER)
    await rig.until("B to run the next one", lambda: ("b", "started", "nightly@9000")
                    in log.events)
    work["nightly@9000"].set()
    await rig.until("B to finish", lambda: b.stats.succeeded == 1)
    await rig.until("B's skip to be committed", lambda: sum(
        o for (g, t, _), o in rig.memory.group_offsets.items() if g == "unit-b") == 2)


async def test_replace_cancels_the_running_occurrence_in_the_other_worker_then_runs(
        rig: WorkerRig) -> None:
    log, work = Log(), {}
    a, b = await two_workers(rig, log, work)
    policy = ((wire.CONCURRENCY, "replace"),)
    rig.fire("refresh", scheduled_ms=1000, headers=policy)
    await rig.until("A to run it", lambda: ("a", "started", "refresh@1000") in log.events)
    rig.fire("refresh", scheduled_ms=9000, headers=policy, topic=OTHER)
    await rig.until("B to start the newer one", lambda: ("b", "started", "refresh@9000")
                    in log.events)
    assert log.events.index(("a", "cancelled", "refresh@1000")) < log.events.index(
        ("b", "started", "refresh@9000"))
    assert a.stats.replaced == 1 and a.stats.failed == 0 and a.stats.retried == 0
    work["refresh@9000"].set()
    await rig.until("B to finish", lambda: b.stats.succeeded == 1)


async def test_only_a_first_delivery_is_governed_a_retry_only_carries_the_policy(
        rig: WorkerRig, caplog: pytest.LogCaptureFixture) -> None:
    """A worker without a store (idempotency off) cannot enforce the policy and says so for
    a first delivery; a retry carries the header since retries keep it, but the policy is
    for first deliveries only, so the retry is neither governed nor warned about."""
    attempts: list[int] = []

    async def handle(occ: Occurrence) -> None:
        attempts.append(occ.attempt)

    await rig.start(handle, group_id="unit-plain", idempotency=False)
    policy = ((wire.CONCURRENCY, "forbid"),)
    with caplog.at_level(logging.WARNING, logger="chronowheel"):
        rig.fire("retried", attempt=2, headers=policy)
        await rig.until("the retry handled", lambda: attempts == [2])
        assert "is not enforced" not in caplog.text
        rig.fire("first", headers=policy)
        await rig.until("the first delivery handled", lambda: attempts == [2, 1])
    assert caplog.text.count("is not enforced") == 1
