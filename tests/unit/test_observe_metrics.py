"""Worker and node metrics without servers: the handler wrapper, the worker's tallies as
counters, per-shard series dropped when a shard leaves, the liveness route."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from chronowheel.node.metrics import NodeMetrics
from chronowheel.observe.http import HttpEndpoint
from chronowheel.worker.handling import WorkerStats, is_async_handler
from chronowheel.worker.metrics import WorkerMetrics, observed
from chronowheel.worker.occurrence import Occurrence
from prometheus_client import generate_latest

TOPIC = "acme.fired"


def sample(metrics: WorkerMetrics | NodeMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_an_async_handler_stays_async_and_is_timed_and_counted() -> None:
    metrics = WorkerMetrics(WorkerStats())
    calls: list[Any] = []

    async def handler(occ: Any) -> None:
        calls.append(occ)
        if occ == "bad":
            raise ValueError("no")

    wrapped = observed(handler, TOPIC, metrics)
    assert is_async_handler(wrapped)
    await wrapped("good")  # type: ignore[misc, arg-type]
    with pytest.raises(ValueError):
        await wrapped("bad")  # type: ignore[misc, arg-type]
    assert calls == ["good", "bad"]
    assert sample(metrics, "chronowheel_worker_handled_total", topic=TOPIC,
                  outcome="succeeded") == 1
    assert sample(metrics, "chronowheel_worker_handled_total", topic=TOPIC, outcome="failed") == 1
    assert sample(metrics, "chronowheel_worker_handler_seconds_count", topic=TOPIC) == 2


async def test_a_cancelled_handler_is_timed_but_not_counted_as_failed() -> None:
    metrics = WorkerMetrics(WorkerStats())

    async def handler(occ: Occurrence) -> None:
        await asyncio.sleep(60)

    task = asyncio.ensure_future(observed(handler, TOPIC, metrics)(None))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sample(metrics, "chronowheel_worker_handled_total", topic=TOPIC,
                  outcome="failed") in (None, 0)
    assert sample(metrics, "chronowheel_worker_handler_seconds_count", topic=TOPIC) == 1


def test_a_plain_handler_stays_plain_and_an_awaitable_result_counts_as_failed() -> None:
    metrics = WorkerMetrics(WorkerStats())

    def handler(occ: Any) -> Any:
        if occ == "raise":
            raise RuntimeError("down")
        return asyncio.sleep(0) if occ == "coroutine" else None

    wrapped = observed(handler, TOPIC, metrics)
    assert not is_async_handler(wrapped)
    assert wrapped("fine") is None  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        wrapped("raise")  # type: ignore[arg-type]
    coroutine = wrapped("coroutine")  # type: ignore[arg-type]
    coroutine.close()  # type: ignore[union-attr]  # the slots refuse it as a failure
    assert sample(metrics, "chronowheel_worker_handled_total", topic=TOPIC,
                  outcome="succeeded") == 1
    assert sample(metrics, "chronowheel_worker_handled_total", topic=TOPIC, outcome="failed") == 2


def test_the_worker_tallies_are_exported_as_counters_read_at_scrape_time() -> None:
    stats = WorkerStats()
    metrics = WorkerMetrics(stats)
    stats.retried, stats.dead, stats.skipped, stats.cancelled = 3, 2, 7, 1
    assert sample(metrics, "chronowheel_worker_retried_total") == 3
    assert sample(metrics, "chronowheel_worker_dead_lettered_total") == 2
    assert sample(metrics, "chronowheel_worker_skipped_total") == 7
    assert sample(metrics, "chronowheel_worker_cancelled_total") == 1
    stats.skipped += 1
    assert sample(metrics, "chronowheel_worker_skipped_total") == 8


def test_the_rounds_of_marks_and_their_requests_are_exported_at_scrape_time() -> None:
    class Counts:  # what the worker's intake counts (`Intake.rounds`, `.mark_requests`)
        rounds = 0
        mark_requests = 0

    counts = Counts()
    metrics = WorkerMetrics(WorkerStats())
    metrics.count_marks(counts)
    counts.rounds, counts.mark_requests = 4, 9
    assert sample(metrics, "chronowheel_worker_mark_rounds_total") == 4
    assert sample(metrics, "chronowheel_worker_mark_requests_total") == 9


def test_a_revoked_partition_loses_its_lag_series() -> None:
    metrics = WorkerMetrics(WorkerStats())
    metrics.consumer_lag.labels(TOPIC, "3").set(12)
    metrics.consumer_lag.labels(TOPIC, "4").set(5)
    metrics.forget_partition(TOPIC, 3)
    metrics.forget_partition(TOPIC, 9)  # never measured: nothing to drop, no error
    text = generate_latest(metrics.registry).decode()
    assert 'partition="3"' not in text and 'partition="4"' in text


def test_a_shard_that_leaves_the_node_leaves_no_frozen_series() -> None:
    metrics = NodeMetrics()
    for shard in ("1", "2"):
        metrics.dispatch_lag.labels(shard).set(42)
        metrics.watermark.labels(shard).set(1e9)
        metrics.upcoming_rows.labels(shard).set(10)
    metrics.forget_shard("1")
    text = generate_latest(metrics.registry).decode()
    assert 'shard="1"' not in text
    assert text.count('shard="2"') == 3


async def test_liveness_answers_200_while_readiness_says_503() -> None:
    endpoint = HttpEndpoint(NodeMetrics().registry, lambda: (False, {"why": "lagging"}), 0)
    await endpoint.start()
    try:
        async def get(path: str) -> tuple[int, bytes]:
            reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            data = await reader.read()
            writer.close()
            head, _, body = data.partition(b"\r\n\r\n")
            return int(head.split()[1]), body

        assert await get("/healthz/live") == (200, b'{"ok":true}')
        status, body = await get("/healthz")
        assert status == 503 and b"lagging" in body
    finally:
        await endpoint.stop()
