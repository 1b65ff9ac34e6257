"""The worker against a real Kafka whose `<ns>.dead` refuses some dead letters: one over its
max.message.bytes (sent in the same producer batches as small ones) and one without a key (the
topic is compacted: INVALID_RECORD). Each refused letter is replaced by one without the payload,
saying why; the small ones arrive whole; the worker never stops and commits every record."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from chronowheel.bus.kafka import open_admin, plain_producer
from chronowheel.bus.ports import TopicPartition
from chronowheel.node.pending import encode_headers
from chronowheel.settings import Settings
from chronowheel.worker import DeadLetter, Occurrence, Worker

from testkit.fleet import until
from tests.integration.harness import collecting, make_namespace, now_ms

pytestmark = pytest.mark.integration

DEAD_LIMIT = 4_000
BIG = orjson.dumps({"blob": "x" * 10_000})


async def small_dead_topic(settings: Settings) -> None:
    """<ns>.dead compacted, taking records of at most DEAD_LIMIT bytes; returns once the
    brokers say so."""
    admin = await open_admin(settings)
    try:
        configs = {"max.message.bytes": str(DEAD_LIMIT), "cleanup.policy": "compact",
                   "min.insync.replicas": "1"}
        [response] = await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, settings.dead_topic, configs)])
        assert all(r[0] == 0 for r in response.resources), response

        async def applied() -> bool:
            [described] = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, settings.dead_topic,
                                {"max.message.bytes": None})])
            entries = described.resources[0][4]
            return any(e[0] == "max.message.bytes" and e[1] == str(DEAD_LIMIT)
                       for e in entries)

        await until(applied, 15, "the dead topic's new max.message.bytes to show")
    finally:
        await admin.close()


async def publish(settings: Settings, records: list[tuple[bytes | None, bytes, bool]]) -> None:
    """(key, value, occurrence?) records to <ns>.fired partition 0, as one burst."""
    p = plain_producer(settings)
    await p.start()
    try:
        at = now_ms()
        futs = []
        for key, value, occurrence in records:
            headers = []
            if occurrence:
                assert key is not None
                headers = encode_headers(key.decode(), at, 1, 1, 1000, (("team", "crm"),))
                headers.append(("cw-fired-at", str(at).encode()))
            futs.append(await p.send(settings.fired_topic, value, key=key, partition=0,
                                     headers=headers))
        await asyncio.gather(*futs)
    finally:
        await p.stop()


async def test_dead_letters_the_dead_topic_refuses_are_quarantined_and_the_worker_goes_on(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=1)
    await small_dead_topic(settings)
    handled: list[str] = []

    async def handler(occ: Occurrence) -> None:
        handled.append(occ.job_id)
        if occ.job_id.startswith("bad"):
            raise DeadLetter("no such mailbox")

    small = [f"bad-{i}" for i in range(6)]
    records: list[tuple[bytes | None, bytes, bool]] = [(b"good-1", b"{}", True)]
    records += [(j.encode(), b'{"n":1}', True) for j in small[:3]]
    records += [(b"bad-big", BIG, True), (None, b"not an occurrence", False)]
    records += [(j.encode(), b'{"n":1}', True) for j in small[3:]]
    records += [(b"good-2", b"{}", True)]
    tp = TopicPartition(settings.fired_topic, 0)
    worker = Worker(settings, handlers={settings.fired_topic: handler},
                    session_timeout_ms=6000)
    async with collecting(settings, settings.dead_topic) as seen:
        await worker.start()
        try:
            await publish(settings, records)
            # Barrier: the group's offset on the partition is past every record.
            await until(lambda: worker.committed_points().get(tp) == len(records), 60,
                        "every record committed")
            # And it goes on: a failure after the refusals is dead-lettered whole.
            await publish(settings, [(b"bad-after", b'{"n":2}', True)])
            await until(lambda: worker.committed_points().get(tp) == len(records) + 1, 60,
                        "the later record committed")
            await seen.read_to_end()
        finally:
            await worker.shutdown()
    assert worker.failure is None, repr(worker.failure)
    assert sorted(handled) == sorted(["good-1", "good-2", "bad-big", "bad-after", *small])
    letters = {m.key: m for m in seen.on(settings.dead_topic)}
    assert len(letters) == len(seen.on(settings.dead_topic)) == len(small) + 3
    for j in [*small, "bad-after"]:  # whole, though sent beside the big one
        whole = letters[j.encode()]
        assert whole.value == (b'{"n":2}' if j == "bad-after" else b'{"n":1}')
        assert whole.headers["team"] == "crm" and "cw-reason" not in whole.headers
    big = letters[b"bad-big"]
    assert orjson.loads(big.value)["size"] == len(BIG)
    assert big.headers["cw-original-bytes"] == str(len(BIG)) and "team" not in big.headers
    assert big.headers["cw-reason"].startswith(
        "dead letter refused: too_large: MessageSizeTooLargeError"), big.headers
    assert big.headers["cw-error"] == "DeadLetter: no such mailbox"
    assert big.headers["cw-source-offset"] == "4"
    keyless = letters[f"{settings.fired_topic}:0@5".encode()]
    assert keyless.headers["cw-reason"].startswith("dead letter refused: invalid: "
                                                   "InvalidRecordError"), keyless.headers
    assert keyless.headers["cw-error"].startswith("MalformedOccurrence")
    assert (worker.stats.quarantined, worker.stats.unlettered) == (2, 0)
    assert worker.stats.dead == len(small) + 3
