"""One-shot jobs through a real node: mixed horizons, headers, never early, exactly once."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest
from chronowheel.core.clock import OffsetClock

from tests.integration.harness import (
    collecting,
    make_namespace,
    now_ms,
    produce,
    running_node,
    settled,
    upsert,
)

pytestmark = pytest.mark.integration

MINUTE = 60_000
DAY = 86_400_000


async def test_one_shot_jobs_fire_once_never_early_at_mixed_horizons(
        stack: Any, namespace: str) -> None:
    # No skew check against Cassandra: this node's clock is made to jump ahead on purpose.
    settings = await make_namespace(stack, namespace, max_clock_skew_ms=10 * 365 * DAY)
    clock = OffsetClock()
    async with collecting(settings) as fired, running_node(settings, clock=clock):
        # The instants count from the node owning its shards, not from before its start: on a
        # busy machine the start alone took longer than the near jobs' leads.
        t0 = now_ms()
        jobs = {
            "past": t0 - 3_600_000,          # an hour ago: fires now
            "soon-1": t0 + 1_500,
            "soon-2": t0 + 3_000,
            "minutes": t0 + 4 * MINUTE,       # beyond the 2-minute lookahead at submit time
            "next-month": t0 + 30 * DAY,
        }
        await produce(settings, [
            upsert(name, at=at, payload={"job": name}, headers={"team": "billing"})
            for name, at in jobs.items()
        ])
        await fired.wait_for(lambda ms: len(ms) >= 3, 30, "past + soon jobs")
        # everything due up to the node's now is in `fired`: nothing far ahead among it
        await settled(settings, fired, clock=clock, upto_ms=clock.now_ms())
        assert {m.key for m in fired.messages} == {b"past", b"soon-1", b"soon-2"}

        clock.jump(4 * MINUTE)  # node time is now past "minutes"
        await fired.wait_for(lambda ms: len(ms) >= 4, 30, "the 4-minute job")
        assert fired.messages[-1].key == b"minutes"

        clock.jump(30 * DAY)
        await fired.wait_for(lambda ms: len(ms) >= 5, 60, "the next-month job")
        await settled(settings, fired, clock=clock, upto_ms=clock.now_ms())  # no duplicate

    by_key = {m.key.decode(): m for m in fired.messages if m.key}
    assert Counter(m.key for m in fired.messages) == Counter(k.encode() for k in jobs)
    for name, at in jobs.items():
        m = by_key[name]
        assert m.topic == settings.fired_topic
        assert orjson.loads(m.value) == {"job": name}
        h = m.headers
        assert h["cw-job-id"] == name
        assert h["cw-scheduled-at"] == str(at)
        assert h["cw-occurrence"] == f"{name}@{at}"
        assert h["cw-attempt"] == "1"
        assert h["team"] == "billing"
        # never early, judged by the node's own clock (which cw-fired-at reports)
        assert m.fired_ms >= at, f"{name} fired {at - m.fired_ms} ms early"
    # the past job fired promptly, the near ones close to their instant
    assert by_key["past"].fired_ms - t0 < 20_000
    assert by_key["soon-1"].fired_ms - jobs["soon-1"] < 2_000
