"""OpenTelemetry traces from submit to handled, off unless asked for.

On when the standard variables ask for it: `OTEL_TRACES_EXPORTER` (otlp or console) or an
`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, and not `OTEL_SDK_DISABLED=true`; the service name and
resource come from `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` as usual. The packages are
the `otel` extra (`pip install 'chronowheel[otel]'`, in the image); without them, or switched
off, every hook below is one None check.

The trace context travels as W3C `traceparent`/`tracestate` among a job's own headers
(core/wire.py): a submitter adds them (`trace_headers()` gives the current context's), the
node stores them with the job and publishes them with every occurrence. The node records a
`chronowheel.ingest` span when it applies the upsert and a `chronowheel.fire` span per
published occurrence (from its scheduled instant to the commit, so its length is the
lateness); the worker runs the handler inside a `chronowheel.handle` span, current while the
handler runs, so the handler's own spans join the trace.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from chronowheel.core import wire

TRACER_NAME = "chronowheel"

_UNRESOLVED: Any = object()
_tracer: Any = _UNRESOLVED


def env_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the OTEL_* variables ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure(provider: Any | None) -> None:
    """Trace into `provider` (an SDK TracerProvider) from now on; None switches tracing off.
    For applications that set up OpenTelemetry themselves, and for tests."""
    global _tracer
    _tracer = None if provider is None else provider.get_tracer(TRACER_NAME)


def tracer() -> Any | None:
    """The tracer, set up from the environment on first use; None when tracing is off."""
    global _tracer
    if _tracer is _UNRESOLVED:
        _tracer = _from_environment() if env_enabled() else None
    return _tracer


def _from_environment() -> Any | None:
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        import logging

        logging.getLogger(__name__).warning(
            "OTEL_* variables ask for traces but opentelemetry-sdk is not installed "
            "(pip install 'chronowheel[otel]'); tracing stays off")
        return None
    exporter: SpanExporter
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider.get_tracer(TRACER_NAME)


def trace_headers() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current span, to pass as job headers; empty
    without a current span or without OpenTelemetry."""
    try:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def parent_of(headers: Iterable[tuple[str, str]] | Mapping[str, str]) -> Any | None:
    """The context a job's `traceparent` names, or None when it has none."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    carrier = {k: v for k, v in items if k in (wire.TRACEPARENT, wire.TRACESTATE)}
    if wire.TRACEPARENT not in carrier:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)


def record_ingest(job_id: str, op: str, shard: int,
                  headers: Iterable[tuple[str, str]]) -> None:
    """A node applied an upsert of a traced job."""
    t = tracer()
    if t is None:
        return
    parent = parent_of(headers)
    if parent is None:
        return
    t.start_span("chronowheel.ingest", context=parent, attributes={
        "chronowheel.job_id": job_id, "chronowheel.op": op, "chronowheel.shard": shard,
    }).end()


def record_fire(job_id: str, occurrence: str, shard: int, headers: Iterable[tuple[str, str]],
                scheduled_ms: int, committed_ms: int) -> None:
    """A node published an occurrence of a traced job: a span from its instant to the commit."""
    t = tracer()
    if t is None:
        return
    parent = parent_of(headers)
    if parent is None:
        return
    start_ns = min(scheduled_ms, committed_ms) * 1_000_000
    t.start_span("chronowheel.fire", context=parent, start_time=start_ns, attributes={
        "chronowheel.job_id": job_id, "chronowheel.occurrence": occurrence,
        "chronowheel.shard": shard, "chronowheel.lateness_ms": committed_ms - scheduled_ms,
    }).end(end_time=committed_ms * 1_000_000)
