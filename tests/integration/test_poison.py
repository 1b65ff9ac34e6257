"""One command that a server refuses never stops a node (real Cassandra and Kafka).

Each case puts the bad command between good one-shots on the same shard (one shard in all) and
checks that the node keeps running, that the good jobs fire once each and never early, and
that the bad command is in `<ns>.rejected` with the limit or the server's refusal named."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.integration.harness import (
    collecting,
    make_namespace,
    now_ms,
    produce,
    running_node,
    upsert,
)

pytestmark = pytest.mark.integration

PAYLOAD_60_KB = {"blob": "x" * 60_000}


async def _run(settings: Any, bad: list[tuple[bytes, bytes]]) -> tuple[dict[bytes, str], Any]:
    """Good, bad, good on the one shard; returns key -> reason of each rejection, and the
    fired messages of the good jobs (checked here)."""
    t0 = now_ms() + 3_000
    before = [upsert(f"before-{i}", at=t0 + i) for i in range(3)]
    after = [upsert(f"after-{i}", at=t0 + 100 + i) for i in range(3)]
    good = {k for k, _ in before + after}
    async with collecting(settings, settings.fired_topic, settings.rejected_topic) as seen, \
            running_node(settings) as node:
        await produce(settings, before + bad + after)
        await seen.wait_for(
            lambda ms: len([m for m in ms if m.topic == settings.rejected_topic]) >= len(bad)
            and len([m for m in ms if m.topic == settings.fired_topic]) >= len(good),
            60, "every rejection and every good job")
        assert node.failure is None and all(o.actor.ready and not o.task.done()
                                            for o in node.owned.values())
    fired = seen.on(settings.fired_topic)
    assert sorted(m.key for m in fired) == sorted(good), "each good job once"
    for m in fired:
        assert m.fired_ms >= m.scheduled_ms, ("early", m.key)
    return {m.key: m.headers["cw-reason"] for m in seen.on(settings.rejected_topic)}, fired


async def test_a_60_kb_payload_is_rejected_with_the_batch_limit_named(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=1)
    reasons, _ = await _run(settings, [upsert("big", at=now_ms() + 3_000,
                                              payload=PAYLOAD_60_KB)])
    assert "store_batch_fail_bytes" in reasons[b"big"], reasons


async def test_a_cron_20_years_away_is_rejected_with_the_ttl_limit_named(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=1)
    reasons, _ = await _run(settings, [upsert("far", cron="0 0 29 2 */7",
                                              exclude_dates=["2032-02-29"])])
    assert re.search(r"20[ -]year", reasons[b"far"]), reasons


async def test_a_batch_cassandra_refuses_costs_only_the_job_it_refuses(
        stack: Any, namespace: str) -> None:
    # The node believes the cluster takes batches of 10 MB: its own check lets the 60 KB job
    # through, and Cassandra (50 KiB) refuses the group that holds it. The group is halved
    # until that job alone is refused; the good jobs written with it are not.
    settings = await make_namespace(stack, namespace, shards=1,
                                    store_batch_fail_bytes=10_000_000,
                                    ingest_group_bytes=1_000_000)
    bad = [upsert("big", at=now_ms() + 3_000, payload=PAYLOAD_60_KB)]
    reasons, _ = await _run(settings, bad)
    assert "Batch too large" in reasons[b"big"], reasons
