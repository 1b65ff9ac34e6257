"""A shard whose committed submit offset retention has already deleted, against the real
broker: the node's group member seeks to the log start itself and says how many offsets it
passed over, where aiokafka alone would reset there without a word."""

from __future__ import annotations

from aiokafka import TopicPartition
from aiokafka.admin import RecordsToDelete
from chronowheel.bus.kafka import Consumer, open_admin
from chronowheel.bus.kafka_node import KafkaSubmitGroup

from testkit.fleet import until
from tests.conftest import Stack
from tests.integration.harness import make_namespace, produce


async def test_a_seek_below_the_log_start_reports_what_retention_deleted(
        stack: Stack, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=1)
    topic, group_id = settings.submit_topic, f"{namespace}.log-start"
    tp = TopicPartition(topic, 0)
    await produce(settings, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(10)],
                  partition=lambda key: 0)
    # The group applied two commands; then retention took the first six.
    committer = Consumer(settings, "offset committer", group_id=group_id,
                         enable_auto_commit=False)
    await committer.start()
    try:
        committer.assign([tp])
        await committer.commit({tp: 2})
    finally:
        await committer.stop()
    admin = await open_admin(settings)
    try:
        await admin.delete_records({tp: RecordsToDelete(before_offset=6)})
    finally:
        await admin.close()

    async def nothing(shards: list[int]) -> None:
        return None

    group = KafkaSubmitGroup(settings, group_id=group_id, client_id="node-a",
                             session_timeout_ms=settings.node_session_timeout_ms,
                             on_assigned=nothing, on_revoked=nothing)
    await group.start()
    try:
        await until(lambda: group.assigned() == {0}, 60, "the member to be given shard 0")
        assert await group.committed(0) == 2
        assert await group.seek(0, 2) == 4
        group.deliver(0)
        offsets: list[int] = []

        async def read_all() -> bool:
            got = await group.fetch(timeout_ms=200, max_records=100)
            offsets.extend(r.offset for r in got.get(0, []))
            return len(offsets) >= 4

        await until(read_all, 30, "the records from the log start")
        assert offsets == [6, 7, 8, 9]
        assert await group.seek(0, 8) == 0  # above the log start: nothing passed over
    finally:
        await group.stop()
