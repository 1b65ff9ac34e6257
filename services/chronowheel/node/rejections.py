"""Rejections of an ingest batch: commands refused on parsing, for the state of their job, or
set aside because applying them failed (quarantine), all to `<ns>.rejected` with the batch.

One `Rejections` per shard, shared by the batch's front (`node/ingest.py`), its grouped writes
(`node/ingest_batch.py`) and the per-command transitions (`node/transitions.py`).
"""

from __future__ import annotations

import hashlib
import logging

import orjson

from chronowheel.bus.ports import SubmitRecord
from chronowheel.core import limits, wire
from chronowheel.core.model import Command
from chronowheel.node import failures
from chronowheel.node.metrics import NodeMetrics
from chronowheel.node.state import Outgoing

log = logging.getLogger(__name__)


class Rejections:
    def __init__(self, *, shard: int, rejected_topic: str, metrics: NodeMetrics) -> None:
        self.shard = shard
        self.rejected_topic = rejected_topic
        self.metrics = metrics
        self.sources: dict[int, SubmitRecord] = {}
        """id() of each command of the current batch -> its record (for late rejections)."""
        self.late: list[Outgoing] = []
        """Commands of the current batch refused for the state of their job (an unknown job,
        a one-shot asked to backfill); published with the batch like parse rejections."""

    def quarantine(self, cmd: Command, exc: Exception) -> None:
        """Set aside a command that failed for a reason about it alone: to `<ns>.rejected`
        with the reason, counted by kind, and the node goes on. An error about all the
        node's work (`failures.concerns_the_node`) is raised again instead."""
        if failures.concerns_the_node(exc):
            raise exc
        label = failures.reason_label(exc)
        self.metrics.quarantined.labels("ingest", label).inc()
        rec = self.sources[id(cmd)]
        if label == failures.INTERNAL:
            log.warning("shard %d: a bug while applying offset %d; the command is quarantined",
                        self.shard, rec.offset, exc_info=exc,
                        extra={"shard": self.shard, "offset": rec.offset})
        self.reject(cmd, failures.describe(exc))

    def reject(self, cmd: Command, reason: str) -> None:
        """Refuse a parsed command for the state of its job: to `<ns>.rejected` with the
        batch, like a parse rejection."""
        self.rejection(self.sources[id(cmd)], reason, self.late)

    def rejection(self, rec: SubmitRecord, reason: str, outbox: list[Outgoing]) -> None:
        headers = [(wire.REASON, limits.cut_reason(reason).encode()),
                   (wire.SOURCE_TOPIC, rec.topic.encode()),
                   (wire.SOURCE_PARTITION, str(rec.partition).encode()),
                   (wire.SOURCE_OFFSET, str(rec.offset).encode())]
        value = rec.value or b""
        if limits.record_bytes(rec.key, value, headers) > limits.KAFKA_MAX_MESSAGE_BYTES:
            # The original would not fit beside our headers: its size and digest stand in
            # for it, so the rejection itself can never be refused by the broker.
            headers.append((wire.ORIGINAL_BYTES, str(len(value)).encode()))
            value = orjson.dumps({"original_bytes": len(value),
                                  "original_sha256": hashlib.sha256(value).hexdigest()})
        outbox.append(Outgoing(self.rejected_topic, None, rec.key, value, headers))
        self.metrics.rejected.inc()
        log.info("shard %d: rejected offset %d: %s", self.shard, rec.offset,
                 limits.cut_reason(reason, 300),
                 extra={"shard": self.shard, "offset": rec.offset, "partition": rec.partition})
