"""`chronowheel node`: run a scheduler node (joins the namespace's cluster via Kafka)."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import time
from typing import Any

from chronowheel.settings import (
    HISTORY_SETTINGS,
    NODE_TUNABLES,
    add_settings_arguments,
    settings_from_args,
)

log = logging.getLogger("chronowheel.node")

NODE_SETTINGS = (
    "namespace", "cassandra", "kafka", "consistency", "http_port", "lookahead_ms", "prewarm_ms",
    "hot_bucket_rows", "bucket_page_rows", "bucket_cap_rows", "max_clock_skew_ms", "tick_ms",
    "max_batch", "node_transaction_spacing_ms", "node_transaction_spacing_max_ms",
    "node_session_timeout_ms",
    "node_heartbeat_interval_ms",
    "node_loop_stall_limit_ms", "node_group_protocol",
    "node_instance_id", "retention_ms", "allowed_topics", "max_id_bytes",
    "max_payload_bytes", "max_horizon_ms", "min_period_ms", "max_lateness_ms",
    "store_batch_fail_bytes", "due_deletes",
    *NODE_TUNABLES, *HISTORY_SETTINGS,
)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "node", help="run a scheduler node",
        description="Run a scheduler node. Nodes of one namespace share its shards through the "
                    "Kafka consumer group of <ns>.submit. SIGTERM stops gracefully; a second "
                    "SIGTERM aborts.")
    add_settings_arguments(p, NODE_SETTINGS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronowheel.node.c_heap import fix_thresholds
    from chronowheel.node.gc_policy import GcPauses, tune_process
    from chronowheel.node.service import Node
    from chronowheel.supervise import install_stop_signals

    settings = settings_from_args(args)

    async def main() -> None:
        node = Node(settings)
        install_stop_signals(node.request_stop,
                             graceful="finishing open transactions, leaving the group")
        tune_process(settings.gc_young_threshold)
        log.info("node process: %s", fix_thresholds(settings.malloc_threshold_bytes))
        pauses = GcPauses(node.metrics.gc_pause)
        pauses.install()
        try:
            await node.run()
        finally:
            pauses.remove()

    asyncio.run(main())
    # The interpreter's exit joins the threads still closing clients before it runs atexit
    # functions, so the line says how long that took; a restarted node's shards wait for it.
    loop_closed = time.monotonic()
    atexit.register(lambda: log.info("node process: exiting, %d ms after its event loop closed",
                                     (time.monotonic() - loop_closed) * 1000))
    return 0
