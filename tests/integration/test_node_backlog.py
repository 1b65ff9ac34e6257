"""A node that starts on a submit topic already full of commands, with no committed offset (a
new namespace fed before its first node, or a group whose offsets expired): every command is
applied. Reading from the beginning must not let the first fetched records slip past the shard
while it is still taking over."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.fleet import until
from tests.integration.harness import (
    make_namespace,
    now_ms,
    produce,
    running_node,
    stored_jobs,
    upsert,
)

pytestmark = pytest.mark.integration


async def test_a_backlog_without_committed_offsets_is_applied_completely(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace)
    n = 6000
    due = now_ms() + 86_400_000  # tomorrow: nothing fires, everything must be stored
    await produce(settings, [upsert(f"b{i}", at=due + i) for i in range(n)])
    async with running_node(settings) as node:
        await until(lambda: node.metrics.ingested.labels("upsert", "stored")._value.get() >= n,
                    180, f"the node to apply the backlog of {n} jobs")
    rows = await stored_jobs(settings)
    assert rows == n, f"{n - rows} accepted commands were never stored"
