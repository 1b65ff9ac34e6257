"""What operators watch, against a real node, worker, Kafka and Cassandra: the worker's /metrics
and /healthz, and the node's namespace-level gauges the dashboard and alerts use."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from typing import Any

import orjson
import pytest
from chronowheel.settings import Settings
from chronowheel.testing.node_process import metric_sum, parse_metrics
from chronowheel.worker import Occurrence

from tests.integration.harness import (
    make_namespace,
    now_ms,
    produce,
    running_node,
    running_worker,
    upsert,
)
from tests.integration.test_worker import put_fired, wait_until

pytestmark = pytest.mark.integration


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def scrape(port: int) -> dict[str, float]:
    status, body = await asyncio.to_thread(_get, port, "/metrics")
    assert status == 200
    return parse_metrics(body.decode())


async def test_worker_metrics_and_health_follow_what_it_handled(
        stack: Any, namespace: str) -> None:
    settings: Settings = await make_namespace(stack, namespace)

    async def handler(occ: Occurrence) -> None:
        if occ.job_id.startswith("doomed"):
            raise RuntimeError("downstream refuses it")

    at = now_ms()
    async with running_node(settings) as node, \
            running_worker(settings, handler, http_port=0) as worker:
        assert worker.http is not None
        port = worker.http.port
        await produce(settings, [upsert(f"ok-{i}", at=at) for i in range(5)]
                      + [upsert("doomed", at=at, max_attempts=2, backoff="1s")]
                      + [upsert("later", at=at + 600_000)])
        await wait_until(lambda: worker.stats.succeeded == 5 and worker.stats.dead == 1, 60,
                         "five handled and one dead letter")
        # The same first delivery again, as a crash before the commit would bring it: skipped.
        await put_fired(settings, ["ok-0"], scheduled_ms=at)
        await wait_until(lambda: worker.stats.skipped == 1, 30, "the duplicate skipped")

        m: dict[str, float] = {}

        async def settled() -> bool:
            nonlocal m
            m = await scrape(port)
            return m.get("chronowheel_worker_skipped_total") == 1 and metric_sum(
                m, "chronowheel_worker_consumer_lag") == 0 and metric_sum(
                m, "chronowheel_worker_assigned_partitions") > 0

        await wait_until(settled, 20, "the worker's metrics to settle", poll_s=0.2)

        topic = settings.fired_topic
        assert m[f'chronowheel_worker_handled_total{{outcome="succeeded",topic="{topic}"}}'] == 5
        assert m[f'chronowheel_worker_handled_total{{outcome="failed",topic="{topic}"}}'] == 2
        assert m[f'chronowheel_worker_handler_seconds_count{{topic="{topic}"}}'] == 7
        assert m["chronowheel_worker_retried_total"] == 1
        assert m["chronowheel_worker_dead_lettered_total"] == 1
        partitions = [k for k in m if k.startswith("chronowheel_worker_consumer_lag{")]
        assert partitions and all(f'topic="{topic}"' in k for k in partitions)

        status, body = await asyncio.to_thread(_get, port, "/healthz")
        health = orjson.loads(body)
        assert status == 200 and health["ok"] is True
        assert health["group"] == worker.group_id and health["partitions"]
        assert (await asyncio.to_thread(_get, port, "/healthz/live"))[0] == 200

        # The node's namespace gauges: every shard owned, the coming job counted ahead.
        assert node.http is not None
        nm = await scrape(node.http.port)
        assert nm["chronowheel_shards"] == settings.shards
        assert nm["chronowheel_owned_shards"] == settings.shards
        node_port = node.http.port

        async def upcoming_counted() -> bool:
            nonlocal nm
            nm = await scrape(node_port)
            return metric_sum(nm, "chronowheel_upcoming_rows") >= 1

        await wait_until(upcoming_counted, 10, "the coming job counted in upcoming rows",
                         poll_s=0.5)
    # Stopped: the endpoint is gone with the worker.
    with pytest.raises(OSError):
        await asyncio.to_thread(_get, port, "/healthz")


async def test_one_trace_from_submit_to_handled(stack: Any, namespace: str) -> None:
    from chronowheel.observe import tracing
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    try:
        settings = await make_namespace(stack, namespace)
        seen: list[tuple[Occurrence, int]] = []

        async def handler(occ: Occurrence) -> None:
            seen.append((occ, trace.get_current_span().get_span_context().span_id))

        submitter = provider.get_tracer("the-submitting-application")
        at = now_ms() + 1_000
        async with running_node(settings), running_worker(settings, handler):
            with submitter.start_as_current_span("submit") as submit_span:
                headers = tracing.trace_headers()
                await produce(settings, [upsert("traced", at=at, headers=headers),
                                         upsert("untraced", at=at)])
            await wait_until(lambda: len(seen) == 2, 60, "both occurrences handled")
    finally:
        tracing.configure(None)

    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"submit", "chronowheel.ingest", "chronowheel.fire",
                          "chronowheel.handle"}, "the untraced job made no span"
    root = submit_span.get_span_context()
    for name in ("chronowheel.ingest", "chronowheel.fire", "chronowheel.handle"):
        span = spans[name]
        assert span.context is not None and span.parent is not None
        assert span.context.trace_id == root.trace_id, name
        assert span.parent.span_id == root.span_id, name
    fire, handle = spans["chronowheel.fire"], spans["chronowheel.handle"]
    assert fire.attributes is not None and fire.attributes["chronowheel.occurrence"] == \
        f"traced@{at}"
    assert fire.start_time == at * 1_000_000 and fire.end_time is not None
    assert fire.end_time >= fire.start_time  # published at or after its instant, never before
    # The handler ran inside the handle span; the fired message carried the traceparent.
    [(traced_occ, current_span_id)] = [(o, s) for o, s in seen if o.job_id == "traced"]
    assert handle.context is not None and current_span_id == handle.context.span_id
    assert traced_occ.headers["traceparent"] == headers["traceparent"]
