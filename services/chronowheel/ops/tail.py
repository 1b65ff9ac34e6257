"""The messages of a topic as they are committed (read_committed), decoded: the chronowheel
headers, the payload as JSON when it parses (`chronowheel tail`, the console's tails)."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import orjson

from chronowheel.errors import ChronowheelError
from chronowheel.settings import Settings


@dataclass(frozen=True)
class TailMessage:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def text(b: bytes) -> str:
    """Bytes of a key or header as text (not UTF-8: replacement characters)."""
    return b.decode("utf-8", "replace")


def decimal(value: str | None) -> int | None:
    """A header holding a non-negative decimal integer (an instant, a count), else None."""
    if value is None or not value.isascii() or not value.isdigit():
        return None
    return int(value)


def payload_view(value: bytes | None) -> tuple[str, Any]:
    """("payload", JSON value) when it parses, ("payload_text", str) for other UTF-8,
    ("payload_b64", str) for binary; ("payload", None) when empty."""
    if not value:
        return "payload", None
    try:
        return "payload", orjson.loads(value)
    except orjson.JSONDecodeError:
        pass
    try:
        return "payload_text", value.decode("utf-8")
    except UnicodeDecodeError:
        return "payload_b64", base64.b64encode(value).decode("ascii")


def message_json(m: TailMessage) -> dict[str, Any]:
    name, payload = payload_view(m.value)
    return {
        "topic": m.topic, "partition": m.partition, "offset": m.offset,
        "timestamp_ms": m.timestamp_ms,
        "key": None if m.key is None else text(m.key),
        "headers": {k: text(v) for k, v in m.headers},
        name: payload,
    }


async def follow(settings: Settings, topic: str, *, from_beginning: bool,
                 limit: int | None = None, timeout_s: float | None = None
                 ) -> AsyncGenerator[list[TailMessage], None]:
    """The committed messages of every partition of `topic` from now on (`from_beginning`:
    all), batch after batch, in partition order within a batch; until `limit` messages were
    yielded or `timeout_s` passed, else for ever. Reads with no consumer group (commits
    nothing). Raises ChronowheelError when the topic does not exist."""
    from aiokafka import TopicPartition

    from chronowheel.bus.kafka import open_admin, partition_counts, reader

    admin = await open_admin(settings)
    try:
        parts = (await partition_counts(admin, [topic])).get(topic)
    finally:
        await admin.close()
    if parts is None:
        raise ChronowheelError(f"topic {topic} does not exist at {settings.kafka}")
    consumer = reader(settings, max_partition_fetch_bytes=4 << 20)
    await consumer.start()
    shown = 0
    try:
        tps = [TopicPartition(topic, k) for k in range(parts)]
        consumer.assign(tps)
        if from_beginning:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while limit is None or shown < limit:
            if deadline is not None and time.monotonic() >= deadline:
                break
            batches = await consumer.getmany(timeout_ms=200)
            out: list[TailMessage] = []
            for tp, msgs in sorted(batches.items(), key=lambda kv: kv[0].partition):
                for r in msgs:
                    if limit is not None and shown >= limit:
                        break
                    out.append(TailMessage(tp.topic, tp.partition, r.offset, r.timestamp,
                                           r.key, r.value, tuple(r.headers or ())))
                    shown += 1
            yield out
    finally:
        await consumer.stop()
