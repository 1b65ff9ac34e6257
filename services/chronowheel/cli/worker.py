"""`chronowheel worker`: run handlers for the occurrences fired to some topics."""

from __future__ import annotations

import argparse
import asyncio
import importlib
from typing import TYPE_CHECKING, Any

from chronowheel.errors import ConfigError
from chronowheel.settings import (
    CONNECTION_SETTINGS,
    HISTORY_SETTINGS,
    add_settings_arguments,
    settings_from_args,
)

if TYPE_CHECKING:
    from chronowheel.worker import WorkerSettings


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "worker", help="run handlers for fired occurrences (retries, dead letters, idempotency)",
        description="Consume the given topics in one consumer group (read_committed) and call a "
                    "handler per occurrence. A handler that raises is retried with exponential "
                    "backoff through the scheduler, then dead-lettered to <ns>.dead. SIGTERM "
                    "stops gracefully (in-flight handlers finish up to --shutdown-deadline-s); a "
                    "second SIGTERM aborts. Serves /metrics and /healthz on --http-port.")
    p.add_argument("--topic", action="append", required=True, metavar="TOPIC",
                   help="a topic to consume; repeat for several")
    p.add_argument("--handler", action="append", required=True, metavar="[TOPIC=]MODULE:FUNC",
                   help="the handler, `package.module:function` (async def or plain function); "
                        "prefix `TOPIC=` to use it for one topic only; repeat as needed")
    p.add_argument("--concurrency", type=int, default=16,
                   help="most handlers running at once (default 16)")
    p.add_argument("--group", default=None,
                   help="consumer group (default <ns>-workers-<topics joined by '+'>)")
    p.add_argument("--no-idempotency", dest="idempotency", action="store_false",
                   help="do not deduplicate on cw-occurrence (no Cassandra needed)")
    p.add_argument("--idempotency-scope", default=None,
                   help="share deduplication with other groups under this name "
                        "(default: the group)")
    p.add_argument("--lease-s", type=int, default=15,
                   help="seconds a crashed worker's partitions stay fenced before another "
                        "worker may handle them (renewed every third of it; default 15)")
    p.add_argument("--prefetch", type=int, default=None,
                   help="most records received and not yet handled (default max(1000, 8 x "
                        "concurrency))")
    p.add_argument("--shutdown-deadline-s", type=float, default=30.0,
                   help="seconds in-flight handlers get to finish on stop (default 30)")
    p.add_argument("--session-timeout-ms", type=int, default=10_000,
                   help="Kafka group session timeout (default 10000)")
    add_settings_arguments(p, (*CONNECTION_SETTINGS, "http_port", *HISTORY_SETTINGS,
                               "gc_young_threshold", "marks_wait_ms"))
    p.set_defaults(func=run)


def load_handler(spec: str) -> Any:
    """Import `package.module:function` (the function may be a dotted attribute path)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"handler {spec!r}: expected module:function")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"handler {spec!r}: cannot import {module_name}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"handler {spec!r}: {module_name} has no {attr}") from None
    if not callable(obj):
        raise ConfigError(f"handler {spec!r}: not callable")
    return obj


def handler_map(topics: list[str], specs: list[str]) -> dict[str, Any]:
    """Topic -> handler from `--topic`s and `--handler [TOPIC=]MODULE:FUNC`s."""
    default: Any = None
    per_topic: dict[str, Any] = {}
    for spec in specs:
        topic, eq, target = spec.partition("=")
        if eq:
            if topic not in topics:
                raise ConfigError(f"handler {spec!r}: {topic!r} is not one of the --topic values")
            if topic in per_topic:
                raise ConfigError(f"two handlers for topic {topic!r}")
            per_topic[topic] = load_handler(target)
        else:
            if default is not None:
                raise ConfigError("more than one default handler (give TOPIC=... for others)")
            default = load_handler(spec)
    out: dict[str, Any] = {}
    for t in topics:
        h = per_topic.get(t, default)
        if h is None:
            raise ConfigError(f"no handler for topic {t!r}")
        out[t] = h
    return out


def worker_settings(args: argparse.Namespace, http_port: int | None) -> WorkerSettings:
    """The worker's options from the command line (ConfigError for a value out of range)."""
    from chronowheel.worker import WorkerSettings

    if args.concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    if args.lease_s < 1:
        raise ConfigError("--lease-s must be at least 1")
    if args.prefetch is not None and args.prefetch < 1:
        raise ConfigError("--prefetch must be at least 1")
    return WorkerSettings(group_id=args.group, concurrency=args.concurrency,
                          idempotency=args.idempotency,
                          idempotency_scope=args.idempotency_scope, lease_s=args.lease_s,
                          shutdown_deadline_s=args.shutdown_deadline_s,
                          prefetch=args.prefetch, session_timeout_ms=args.session_timeout_ms,
                          http_port=http_port)


def run(args: argparse.Namespace) -> int:
    from chronowheel.node.gc_policy import tune_process
    from chronowheel.worker import Worker, install_signal_handlers

    settings = settings_from_args(args)
    topics = list(dict.fromkeys(args.topic))
    handlers = handler_map(topics, args.handler)
    options = worker_settings(args, settings.http_port)

    async def main() -> None:
        worker = Worker(settings, handlers=handlers, options=options)
        install_signal_handlers(worker)
        # As in the node (node/gc_policy.py): the driver's reference cycles of the worker's
        # lease and mark writes, promoted by young collections, made full collections that
        # held the event loop (up to 0.6 s) between a record's fetch and its handler's start.
        tune_process(settings.gc_young_threshold)
        await worker.run()

    asyncio.run(main())
    return 0
