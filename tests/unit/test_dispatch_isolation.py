"""Failure isolation on the dispatch side: an occurrence that cannot be published goes to
<ns>.dead with its reason, and the shard's other occurrences of the same cycle (and the other
shards') are published once, on time; the node keeps running. On the in-memory bus, whose
topics enforce a max.message.bytes or refuse a producer as a broker does."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable

import orjson
import pytest
from chronowheel.bus.memory import Message
from chronowheel.core.shard import shard_of
from chronowheel.node.service import Node

from tests.unit.node_rig import T0, NodeRig, scheduled_at

TOPIC = "big.jobs"
LIMIT = 2_000


def ids_in_shard(shard: int, shards: int, prefix: str, n: int) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < n:
        job_id = f"{prefix}-{i}"
        if shard_of(job_id, shards) == shard:
            out.append(job_id)
        i += 1
    return out


def dead_lettered(node: Node, reason: str) -> float:
    value = node.metrics.registry.get_sample_value("chronowheel_dead_lettered_total",
                                                   {"reason": reason})
    return value or 0.0


def on(rig: NodeRig, topic: str) -> Callable[[str], list[Message]]:
    def of(job_id: str) -> list[Message]:
        return [m for m in rig.bus.messages(topic) if m.key == job_id.encode()]
    return of


async def make_rig(**bus: object) -> NodeRig:
    rig = NodeRig(allowed_topics="(big|locked)\\..*")
    rig.bus.create_topic(TOPIC, 2)
    rig.bus.create_topic("locked.jobs", 2)
    rig.bus.topic_limits[TOPIC] = LIMIT
    for name, value in bus.items():
        setattr(rig.bus, name, value)
    return rig


def herd(rig: NodeRig, *, culprit_topic: str = TOPIC) -> tuple[str, list[str], list[str]]:
    """One oversize job and small ones due at the same instant: small ones on the culprit's
    shard (on its topic and on <ns>.fired) and on the other shard."""
    huge, *same = ids_in_shard(0, 2, "job", 7)
    other = ids_in_shard(1, 2, "job", 3)
    rig.upsert(huge, at=T0 + 1_000, topic=culprit_topic, payload="x" * 3_000)
    for i, job_id in enumerate(same):
        rig.upsert(job_id, at=T0 + 1_000, topic=TOPIC if i % 2 else rig.settings.fired_topic,
                   payload={"n": i})
    for job_id in other:
        rig.upsert(job_id, at=T0 + 1_000, topic=TOPIC, payload={"other": job_id})
    return huge, same, other


def assert_published_once_on_time(rig: NodeRig, job_ids: list[str]) -> None:
    every = rig.bus.messages(TOPIC) + rig.fired()
    got = Counter((m.key or b"").decode() for m in every)
    assert {j: got[j] for j in job_ids} == dict.fromkeys(job_ids, 1)
    for m in every:
        assert T0 + 1_000 <= m.committed_ms <= T0 + 1_010, m
        assert scheduled_at(m) == T0 + 1_000


async def test_an_oversize_occurrence_is_dead_lettered_before_producing_and_the_rest_fires(
        ) -> None:
    rig = await make_rig()
    try:
        node = await rig.start()
        huge, same, other = herd(rig)
        await rig.advance_to(T0 + 1_010, step_ms=5)
        commits = rig.bus.commits
        [dead] = rig.bus.messages(rig.settings.dead_topic)
        assert dead.key == huge.encode()
        assert dead.value == b'"' + b"x" * 3_000 + b'"'
        reason = (dead.header("cw-reason") or b"").decode()
        assert reason.startswith("too_large: ") and f"over the {LIMIT} bytes" in reason
        assert TOPIC in reason and "the fired record is 3" in reason
        assert (dead.header("cw-error") or b"").startswith(b"RecordTooLarge: ")
        assert dead.header("cw-target-topic") == TOPIC.encode()
        assert dead.header("cw-occurrence") == f"{huge}@{T0 + 1_000}".encode()
        assert on(rig, TOPIC)(huge) == []
        assert_published_once_on_time(rig, same + other)
        assert dead_lettered(node, "too_large") == 1
        # Found before producing: no transaction was refused.
        assert node.metrics.registry.get_sample_value(
            "chronowheel_transaction_refused_total") == 0
        # The node keeps running: the shard's watermark moved on and later jobs fire.
        rig.upsert(same[0], at=T0 + 2_000, topic=TOPIC, payload="later")
        await rig.advance_to(T0 + 2_100)
        assert [m.value for m in on(rig, TOPIC)(same[0])] == [b'"later"']
        assert rig.bus.commits > commits and not node.blocked and len(node.owned) == 2
    finally:
        await rig.stop_all()


async def test_a_record_the_broker_refuses_aborts_and_the_rest_is_committed_again() -> None:
    # The topic's limit cannot be read (no DescribeConfigs permission): the node assumes
    # Kafka's default, the topic refuses the batch holding the large record, and the node
    # finds the culprit by sending that batch's records one by one.
    rig = await make_rig(limits_readable=False)
    try:
        node = await rig.start()
        huge, same, other = herd(rig)
        await rig.advance_to(T0 + 1_010, step_ms=5)
        [dead] = rig.bus.messages(rig.settings.dead_topic)
        assert dead.key == huge.encode()
        reason = (dead.header("cw-reason") or b"").decode()
        assert reason.startswith("too_large: the broker refused the record: ")
        assert f"max.message.bytes {LIMIT}" in reason
        assert_published_once_on_time(rig, same + other)
        assert dead_lettered(node, "too_large") == 1
        refused = node.metrics.registry.get_sample_value(
            "chronowheel_transaction_refused_total")
        assert refused is not None and refused >= 1
        assert not node.blocked and len(node.owned) == 2
        rig.upsert(other[0], at=T0 + 3_000, topic=TOPIC, payload="later")
        await rig.advance_to(T0 + 3_100)
        assert [m.value for m in on(rig, TOPIC)(other[0])][-1] == b'"later"'
    finally:
        await rig.stop_all()


async def test_a_topic_that_refuses_the_node_dead_letters_its_occurrences_only() -> None:
    rig = await make_rig(refused_topics={"locked.jobs"})
    try:
        node = await rig.start()
        rig.bus.topic_limits[TOPIC] = 1 << 20
        locked, same, other = herd(rig, culprit_topic="locked.jobs")
        await rig.advance_to(T0 + 1_010, step_ms=5)
        [dead] = rig.bus.messages(rig.settings.dead_topic)
        assert dead.key == locked.encode()
        assert (dead.header("cw-reason") or b"").startswith(b"refused: the broker refused")
        assert (dead.header("cw-error") or b"").startswith(b"TopicAuthorizationFailed: ")
        assert dead.header("cw-target-topic") == b"locked.jobs"
        assert_published_once_on_time(rig, same + other)
        assert dead_lettered(node, "refused") == 1
    finally:
        await rig.stop_all()


async def test_the_node_refused_its_own_fired_topic_stops_with_the_acl_named() -> None:
    # Every job's default target: a missing or revoked ACL there concerns all the work, so
    # the node stops and says who may not write what instead of dead-lettering everything.
    rig = await make_rig()
    try:
        node = await rig.start()
        rig.bus.refused_topics.add(rig.settings.fired_topic)
        rig.upsert("plain", at=T0 + 500)
        await rig.advance_to(T0 + 1_000, step_ms=5)
        assert node.failure is not None
        assert f"may not write topic {rig.settings.fired_topic}" in str(node.failure)
        # At once: not taken for a passing Kafka failure, which renews the producer and retries.
        assert node.transactions is not None and node.transactions.session == 0
        assert node.metrics.txn_failed._value.get() == 0
        assert rig.bus.messages(rig.settings.dead_topic) == []
        assert rig.fired() == []
    finally:
        await rig.stop_all()


async def test_a_dead_letter_too_large_for_the_dead_topic_keeps_a_note_of_the_payload(
        ) -> None:
    rig = await make_rig()
    rig.bus.topic_limits[rig.settings.dead_topic] = 1_500
    try:
        await rig.start()
        huge, same, _other = herd(rig)
        await rig.advance_to(T0 + 1_010, step_ms=5)
        [dead] = rig.bus.messages(rig.settings.dead_topic)
        payload = b'"' + b"x" * 3_000 + b'"'
        assert dead.key == huge.encode()
        assert orjson.loads(dead.value or b"") == {
            "replaced": "payload too large", "size": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest()}
        assert (dead.header("cw-reason") or b"").startswith(b"too_large: ")
        assert_published_once_on_time(rig, same)
    finally:
        await rig.stop_all()


@pytest.mark.parametrize("readable", [True, False])
async def test_small_records_sharing_a_cycle_never_make_a_batch_over_the_topic_limit(
        readable: bool) -> None:
    # Twenty records of ~400 bytes due together on one partition: more than the topic takes
    # in one batch, never more than it takes in one record.
    rig = await make_rig(limits_readable=readable, batch_rows=100)
    try:
        node = await rig.start()
        job_ids = ids_in_shard(0, 2, "many", 20)
        for job_id in job_ids:
            rig.upsert(job_id, at=T0 + 1_000, topic=TOPIC, payload="y" * 250)
        await rig.advance_to(T0 + 1_010, step_ms=5)
        assert_published_once_on_time(rig, job_ids)
        assert rig.bus.messages(rig.settings.dead_topic) == []
        refused = node.metrics.registry.get_sample_value(
            "chronowheel_transaction_refused_total")
        # Batches sized by the limit the producer knows; only an unreadable limit costs a
        # refused transaction (and then each record goes alone).
        assert (refused == 0) is readable
    finally:
        await rig.stop_all()
