"""A broker's refusal of one record the worker produces (its retry command, its dead letter)
never stops the worker: the record is quarantined with the reason and the worker goes on; only
what concerns every record (the topic refused by the authorizer, the cluster unreachable past
the delivery deadline) stops it (docs/worker.md, "When the broker refuses a retry or a dead
letter"). On the in-memory rig, whose bus refuses records over a topic's `max.message.bytes`
(`topic_limits`) and, when a test says so, as invalid."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator

import orjson
import pytest
from chronowheel.bus.kafka import KafkaAccessError
from chronowheel.bus.ports import BusError
from chronowheel.worker import DeadLetter, Occurrence, Worker, WorkerStats
from prometheus_client import generate_latest

from tests.unit.worker_rig import T0, WorkerRig

BIG = b'{"blob":"' + b"x" * 20_000 + b'"}'
DEAD_LIMIT = 8_000
"""`<ns>.dead`'s max.message.bytes in these tests: the big payload's dead letter is over it."""


@pytest.fixture
async def rig() -> AsyncIterator[WorkerRig]:
    async with WorkerRig(partitions=1) as r:
        yield r


def headers(msg: object) -> dict[str, str]:
    return {k: v.decode() for k, v in getattr(msg, "headers")}  # noqa: B009


async def handled_in_order(rig: WorkerRig, worker: Worker, n: int) -> None:
    await rig.until(f"{n} records committed", lambda: rig.committed(worker).get(0) == n)


async def test_a_dead_letter_over_the_dead_topics_limit_goes_without_its_payload(
        rig: WorkerRig) -> None:
    rig.memory.topic_limits[rig.settings.dead_topic] = DEAD_LIMIT
    ran: list[str] = []

    async def handler(occ: Occurrence) -> None:
        ran.append(occ.job_id)
        if occ.job_id.startswith("bad"):
            raise DeadLetter("the address does not exist")

    worker = await rig.start(handler)
    rig.fire("good-1")
    big = rig.fire("bad-big", payload=BIG, headers=(("team", "billing"),))
    rig.fire("good-2")
    rig.fire("bad-small", payload=b'{"n":1}')
    rig.fire("good-3")
    await handled_in_order(rig, worker, 5)
    assert worker.failure is None
    assert sorted(ran) == ["bad-big", "bad-small", "good-1", "good-2", "good-3"]
    assert worker.stats == WorkerStats(succeeded=3, failed=2, dead=2, quarantined=1)

    letters = {m.key: m for m in rig.messages(rig.settings.dead_topic)}
    minimal, full = letters[b"bad-big"], letters[b"bad-small"]
    # The big one: no payload, no job headers, why it failed and why the letter is minimal.
    h = headers(minimal)
    assert minimal.key == b"bad-big"
    assert orjson.loads(minimal.value or b"") == {
        "replaced": "the broker refused the dead letter", "size": len(BIG),
        "sha256": hashlib.sha256(BIG).hexdigest()}
    assert "team" not in h and h["cw-original-bytes"] == str(len(BIG))
    assert h["cw-error"] == "DeadLetter: the address does not exist"
    assert h["cw-reason"].startswith("dead letter refused: too_large: MessageSizeTooLarge")
    assert (h["cw-source-topic"], h["cw-source-partition"], h["cw-source-offset"]) == (
        rig.topic, "0", str(big.offset))
    assert (h["cw-occurrence"], h["cw-attempt"]) == (f"bad-big@{T0}", "1")
    # The payload is still where the letter says.
    assert rig.memory.topics[rig.topic][0][big.offset].value == BIG
    # A later failure that fits is dead-lettered in full: the refusal changed nothing else.
    assert full.key == b"bad-small" and full.value == b'{"n":1}'
    assert "cw-reason" not in headers(full)
    text = generate_latest(worker.metrics.registry).decode()
    assert 'chronowheel_worker_quarantined_total{kept="letter"} 1.0' in text
    assert 'chronowheel_worker_quarantined_total{kept="log"} 0.0' in text


async def test_a_retry_the_submit_topic_refuses_is_dead_lettered_with_the_reason(
        rig: WorkerRig) -> None:
    rig.memory.topic_limits[rig.settings.submit_topic] = DEAD_LIMIT
    attempts: list[tuple[str, int]] = []

    async def handler(occ: Occurrence) -> None:
        attempts.append((occ.job_id, occ.attempt))
        raise RuntimeError("downstream unavailable")

    worker = await rig.start(handler)
    big = rig.fire("big", payload=BIG, max_attempts=3, attempt=2)
    rig.fire("small", max_attempts=3)
    await handled_in_order(rig, worker, 2)
    assert worker.failure is None
    assert worker.stats == WorkerStats(failed=2, retried=1, dead=1)
    [retry] = rig.messages(rig.settings.submit_topic)
    assert retry.key == b"small"  # the small one's retry went through
    [letter] = rig.messages(rig.settings.dead_topic)
    h = headers(letter)
    assert letter.key == b"big" and letter.value == BIG  # the dead topic takes it: in full
    assert h["cw-error"] == "RuntimeError: downstream unavailable"
    assert h["cw-reason"].startswith("retry refused: too_large: ")
    assert h["cw-source-offset"] == str(big.offset)
    # The retry's claim is settled as failed once the dead letter is durable.
    claim, _, _ = rig.store.claims[(worker.group_id, f"big@{T0}")]
    assert (claim.state, claim.attempt) == ("failed", 2)


async def test_a_record_refused_as_invalid_is_dead_lettered_under_its_source_as_key(
        rig: WorkerRig) -> None:
    # As a compacted dead-letter topic does, the broker refuses records without a key.
    rig.bus.invalid = lambda topic, key, value, hdrs: key is None

    async def handler(occ: Occurrence) -> None:
        return None

    worker = await rig.start(handler)
    junk = rig.memory.produce(rig.topic, 0, None, b"not an occurrence", [])
    rig.fire("good")
    await handled_in_order(rig, worker, 2)
    assert worker.failure is None
    assert worker.stats == WorkerStats(succeeded=1, dead=1, quarantined=1)
    [letter] = rig.messages(rig.settings.dead_topic)
    assert letter.key == f"{rig.topic}:0@{junk.offset}".encode()
    h = headers(letter)
    assert h["cw-reason"] == "dead letter refused: invalid: InvalidRecordError: [Error 87] " \
                             "INVALID_RECORD"
    assert h["cw-error"].startswith("MalformedOccurrence")


async def test_a_refused_minimal_dead_letter_is_logged_loudly_and_the_partition_goes_on(
        rig: WorkerRig, caplog: pytest.LogCaptureFixture) -> None:
    rig.bus.invalid = lambda topic, key, value, hdrs: topic == rig.settings.dead_topic \
        and key == b"cursed"

    async def handler(occ: Occurrence) -> None:
        if occ.job_id == "cursed":
            raise DeadLetter("no")

    worker = await rig.start(handler)
    with caplog.at_level(logging.ERROR, logger="chronowheel.worker.handling"):
        cursed = rig.fire("cursed")
        rig.fire("after")
        await handled_in_order(rig, worker, 2)
    assert worker.failure is None
    assert worker.stats == WorkerStats(succeeded=1, failed=1, quarantined=1, unlettered=1)
    assert rig.messages(rig.settings.dead_topic) == []
    [line] = [r.getMessage() for r in caplog.records if "NOT dead-lettered" in r.getMessage()]
    assert f"{rig.topic}[0]@{cursed.offset}" in line and "DeadLetter: no" in line
    text = generate_latest(worker.metrics.registry).decode()
    assert 'chronowheel_worker_quarantined_total{kept="log"} 1.0' in text
    assert len(rig.bus.refused) == 2  # the full letter, then the minimal one


async def test_a_dead_topic_the_authorizer_refuses_stops_the_worker_uncommitted(
        rig: WorkerRig) -> None:
    rig.memory.refused_topics.add(rig.settings.dead_topic)

    async def handler(occ: Occurrence) -> None:
        raise DeadLetter("no")

    worker = await rig.start(handler)
    rig.fire("doomed")
    await rig.until("the worker stops", lambda: worker.failure is not None)
    assert isinstance(worker.failure, KafkaAccessError)
    assert worker.stats.quarantined == 0
    rig.workers.remove(worker)
    await rig.shutdown(worker, 0.0)
    assert rig.committed(worker).get(0, 0) == 0  # redelivered to the next worker


async def test_a_send_not_acknowledged_in_time_stops_the_worker_uncommitted(
        rig: WorkerRig) -> None:
    rig.bus.fail_sends = 1

    async def handler(occ: Occurrence) -> None:
        raise RuntimeError("flaky")

    worker = await rig.start(handler)
    rig.fire("flaky")
    await rig.until("the worker stops", lambda: worker.failure is not None)
    assert isinstance(worker.failure, BusError)
    assert (worker.stats.retried, worker.stats.quarantined) == (0, 0)
    rig.workers.remove(worker)
    await rig.shutdown(worker, 0.0)
    assert rig.committed(worker).get(0, 0) == 0
    # A new worker, the cluster back, handles the redelivered record.
    again = await rig.start(lambda occ: None, worker_id="w2")
    await rig.until("the redelivery", lambda: rig.committed(again).get(0) == 1)
