"""A node reads the largest record and the partition count of its namespace's fired and dead
topics at its start, before it joins the group: a shard's first part then finds them known
(`Node._read_topics_ahead`). Read at the first part, they came on the path of a new node's
first transaction, while its loop was busiest taking shards over."""

from __future__ import annotations

from typing import Any

from tests.unit.node_rig import T0, NodeRig


async def test_the_namespaces_topics_are_read_before_the_node_joins_its_group() -> None:
    async with NodeRig(shards=2) as rig:
        bus = rig.bus
        events: list[tuple[str, str]] = []
        make_producer, make_group = bus.producer, bus.submit_group

        def producer(transactional_id: str, group_id: str) -> Any:
            made = make_producer(transactional_id, group_id)
            limit, count = made.max_record_bytes, made.partition_count

            async def max_record_bytes(topic: str) -> int:
                events.append(("limit", topic))
                return await limit(topic)

            async def partition_count(topic: str) -> int | None:
                events.append(("partitions", topic))
                return await count(topic)

            made.max_record_bytes = max_record_bytes  # type: ignore[method-assign]
            made.partition_count = partition_count  # type: ignore[method-assign]
            return made

        def submit_group(**kw: Any) -> Any:
            events.append(("group", ""))
            return make_group(**kw)

        bus.producer = producer  # type: ignore[method-assign]
        bus.submit_group = submit_group  # type: ignore[method-assign]
        await rig.start()
        s = rig.settings
        before = set(events[:events.index(("group", ""))])
        assert before == {("limit", s.fired_topic), ("limit", s.dead_topic),
                          ("partitions", s.fired_topic), ("partitions", s.dead_topic)}


async def test_a_read_ahead_that_fails_does_not_stop_the_start_and_is_read_at_first_use(
) -> None:
    async with NodeRig(shards=1) as rig:
        bus = rig.bus
        failed: list[str] = []
        make_producer = bus.producer

        def producer(transactional_id: str, group_id: str) -> Any:
            made = make_producer(transactional_id, group_id)
            limit = made.max_record_bytes

            async def max_record_bytes(topic: str) -> int:
                if not failed:  # the first read, at the start: a bug in the read, say
                    failed.append(topic)
                    raise RuntimeError("describe_configs answered nonsense")
                return await limit(topic)

            made.max_record_bytes = max_record_bytes  # type: ignore[method-assign]
            return made

        bus.producer = producer  # type: ignore[method-assign]
        await rig.start()
        assert failed  # it was read ahead, and failed
        rig.upsert("after", at=T0 + 5_000)
        await rig.settle()
        await rig.advance_to(T0 + 5_000, step_ms=10)
        assert len(rig.fired("after")) == 1
