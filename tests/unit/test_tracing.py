"""Tracing switches and context handling, without servers (the end-to-end trace is in
tests/integration/test_observe.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from chronowheel.observe import tracing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@pytest.mark.parametrize("env, on", [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}, False),
])
def test_tracing_is_on_only_when_the_otel_variables_ask(env: dict[str, str], on: bool) -> None:
    assert tracing.env_enabled(env) is on


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.configure(provider)
    try:
        yield spans
    finally:
        tracing.configure(None)


def test_without_a_traceparent_or_with_tracing_off_nothing_is_recorded(
        exporter: InMemorySpanExporter) -> None:
    tracing.record_ingest("job", "upsert", 3, [("team", "billing")])
    assert exporter.get_finished_spans() == ()
    tracing.configure(None)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    tracing.record_ingest("job", "upsert", 3, [("traceparent", parent)])
    assert tracing.tracer() is None and exporter.get_finished_spans() == ()


def test_spans_continue_the_jobs_traceparent_and_the_fire_span_spans_the_lateness(
        exporter: InMemorySpanExporter) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = [("team", "billing"), ("traceparent", parent)]
    tracing.record_ingest("job", "upsert", 3, headers)
    tracing.record_fire("job", "job@1000", 3, headers, scheduled_ms=1_000, committed_ms=1_250)
    ingest, fire = exporter.get_finished_spans()
    for span in (ingest, fire):
        assert span.context is not None and span.parent is not None
        assert f"{span.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
        assert f"{span.parent.span_id:016x}" == "b7ad6b7169203331"
    assert (fire.start_time, fire.end_time) == (1_000_000_000, 1_250_000_000)
    assert fire.attributes is not None and fire.attributes["chronowheel.lateness_ms"] == 250


def test_trace_headers_are_those_of_the_current_span(exporter: InMemorySpanExporter) -> None:
    assert tracing.trace_headers() == {}
    provider = TracerProvider()
    with provider.get_tracer("app").start_as_current_span("submit") as span:
        headers = tracing.trace_headers()
    ctx = span.get_span_context()
    assert headers["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
