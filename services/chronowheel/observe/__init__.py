"""What node and worker share for being watched: the HTTP endpoint (/metrics, /healthz) and
the optional OpenTelemetry tracing."""
