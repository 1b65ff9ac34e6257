"""A retry command written twice to `<ns>.submit` runs its attempt once (in memory: a node and a
worker on one bus, store and manual clock).

The worker's producer is not idempotent (bus/kafka_worker.py: a refused batch would leave an
idempotent one failing every later batch of its partition), so a request whose acknowledgement
was lost is sent again and its retry command lands twice. Copies the node applies together
rewrite one due row, so the attempt fires once; a copy applied after the first has fired fires
the attempt again, and then the per-occurrence ledger lets only one delivery of the attempt run
the handler."""

from __future__ import annotations

import orjson
from chronowheel.bus.memory import Message
from chronowheel.core import wire
from chronowheel.worker import Occurrence, Worker, WorkerStats

from tests.unit.node_rig import T0, NodeRig
from tests.unit.worker_rig import WorkerRig

JOB = "invoice-7"
OCC = f"{JOB}@{T0 + 1_000}"


def header(msg: object, name: str) -> str | None:
    return next((v.decode() for k, v in getattr(msg, "headers") if k == name), None)  # noqa: B009


async def fail_first_attempt(nodes: NodeRig, rig: WorkerRig) -> tuple[Worker, list[int]]:
    """A worker whose handler fails the job's first attempt and succeeds after; the job due
    in a second with a 1 s backoff. Returns the worker and the attempts its handler ran."""
    attempts: list[int] = []

    async def handler(occ: Occurrence) -> None:
        assert occ.occurrence == OCC
        attempts.append(occ.attempt)
        if occ.attempt == 1:
            raise RuntimeError("downstream unavailable")

    await nodes.start()
    worker = await rig.start(handler)
    nodes.upsert(JOB, at=T0 + 1_000, max_attempts=3, backoff="1s")
    return worker, attempts


def retries(rig: WorkerRig) -> list[Message]:
    """The retry commands on `<ns>.submit`."""
    return [m for m in rig.messages(rig.settings.submit_topic)
            if orjson.loads(m.value or b"{}").get("op") == "retry"]


def fired_attempts(nodes: NodeRig) -> list[str | None]:
    return [header(m, wire.ATTEMPT) for m in nodes.fired(JOB)]


async def test_a_retry_written_twice_at_once_runs_its_attempt_once() -> None:
    async with NodeRig() as nodes, WorkerRig(node=nodes) as rig:
        worker, attempts = await fail_first_attempt(nodes, rig)
        rig.bus.duplicate_sends = 1  # the retry: written twice, acknowledged once
        await rig.until("attempt 2 to run", lambda: 2 in attempts)
        await rig.advance(5_000)  # whatever else the two copies could fire
        [first, second] = retries(rig)
        assert (first.key, first.value, first.headers) == (second.key, second.value,
                                                           second.headers)
        assert second.offset == first.offset + 1
        # Both copies in one ingest step: the same due row written twice, fired once.
        assert fired_attempts(nodes) == ["1", "2"]
        assert attempts == [1, 2]
        assert worker.stats == WorkerStats(succeeded=1, failed=1, retried=1)
        claim, _, _ = rig.store.claims[(worker.group_id, OCC)]
        assert (claim.state, claim.attempt) == ("done", 2)


async def test_a_retry_written_again_after_its_attempt_ran_is_skipped_by_the_ledger() -> None:
    async with NodeRig() as nodes, WorkerRig(node=nodes) as rig:
        worker, attempts = await fail_first_attempt(nodes, rig)
        await rig.until("attempt 2 to run", lambda: 2 in attempts)
        [retry] = retries(rig)
        assert fired_attempts(nodes) == ["1", "2"]
        # The copy of a request retried late (its acknowledgement lost), after the first copy
        # fired and its attempt ran: the node schedules it again and fires it at once.
        rig.memory.produce(retry.topic, retry.partition, retry.key, retry.value, retry.headers)
        await rig.until("the second delivery of attempt 2 to be skipped",
                        lambda: worker.stats.skipped == 1)
        assert fired_attempts(nodes) == ["1", "2", "2"]
        assert attempts == [1, 2]
        assert worker.stats == WorkerStats(succeeded=1, failed=1, retried=1, skipped=1)
        claim, _, _ = rig.store.claims[(worker.group_id, OCC)]
        assert (claim.state, claim.attempt) == ("done", 2)
