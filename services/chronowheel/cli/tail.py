"""`chronowheel tail TOPIC`: print messages of a topic as they are committed (read_committed),
decoded: the chronowheel headers, the payload as JSON when it parses."""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import time
from dataclasses import dataclass
from typing import Any

import orjson

from chronowheel.cli._format import human_ms, rfc3339
from chronowheel.core import wire
from chronowheel.errors import ChronowheelError
from chronowheel.settings import Settings, add_settings_arguments, settings_from_args


@dataclass(frozen=True)
class TailMessage:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


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
        "key": None if m.key is None else _text(m.key),
        "headers": {k: _text(v) for k, v in m.headers},
        name: payload,
    }


def format_message(m: TailMessage) -> str:
    """Three lines: where and when, the headers, the payload."""
    headers = {k: _text(v) for k, v in m.headers}
    first = [f"{m.topic}[{m.partition}]@{m.offset}",
             "key=" + ("(none)" if m.key is None else _text(m.key))]
    scheduled = _int(headers.get(wire.SCHEDULED_AT))
    fired = _int(headers.get(wire.FIRED_AT))
    if scheduled is not None:
        first.append(f"scheduled={rfc3339(scheduled)}")
    if fired is not None:
        first.append(f"fired={rfc3339(fired)}")
        if scheduled is not None:
            first.append(f"late={human_ms(fired - scheduled)}")
    elif m.timestamp_ms is not None:
        first.append(f"time={rfc3339(m.timestamp_ms)}")
    if wire.ATTEMPT in headers:
        first.append(f"attempt={headers[wire.ATTEMPT]}")
    shown = {wire.SCHEDULED_AT, wire.FIRED_AT, wire.ATTEMPT}
    rest = " ".join(f"{k}={v}" for k, v in headers.items() if k not in shown)
    name, payload = payload_view(m.value)
    if name == "payload":
        body = "(empty)" if payload is None and not m.value else orjson.dumps(payload).decode()
    elif name == "payload_text":
        body = "text " + orjson.dumps(payload).decode()
    else:
        body = "base64 " + payload
    return "\n".join(["  ".join(first), f"  headers  {rest or '(none)'}", f"  payload  {body}"])


def _int(text: str | None) -> int | None:
    if text is None or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "tail", help="print a topic's committed messages, decoded",
        description="Print the messages of TOPIC (e.g. <ns>.fired, a target topic, or "
                    "<ns>.rejected) committed from now on (--from-beginning: all), with their "
                    "headers; the payload is shown as JSON when it parses. Reads with "
                    "isolation.level=read_committed and no consumer group (commits nothing).")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--from-beginning", action="store_true", help="start at the oldest message")
    p.add_argument("--max", type=int, metavar="N", help="stop after N messages")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="stop after SECONDS; exit status 1 if --max was not reached")
    p.add_argument("--json", action="store_true", help="one JSON object per message")
    add_settings_arguments(p, ("namespace", "kafka"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from chronowheel.cli._cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    try:
        return asyncio.run(_tail(settings, args))
    except BrokenPipeError:  # `| head`: the reader is gone, which is not an error
        return 0


async def _tail(settings: Settings, args: argparse.Namespace) -> int:
    from aiokafka import TopicPartition

    from chronowheel.bus.kafka import open_admin, partition_counts, reader

    admin = await open_admin(settings)
    try:
        parts = (await partition_counts(admin, [args.topic])).get(args.topic)
    finally:
        await admin.close()
    if parts is None:
        raise ChronowheelError(f"topic {args.topic} does not exist at {settings.kafka}")
    consumer = reader(settings, max_partition_fetch_bytes=4 << 20)
    await consumer.start()
    shown = 0
    try:
        tps = [TopicPartition(args.topic, k) for k in range(parts)]
        consumer.assign(tps)
        if args.from_beginning:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        while args.max is None or shown < args.max:
            if deadline is not None and time.monotonic() >= deadline:
                break
            batches = await consumer.getmany(timeout_ms=200)
            for tp, msgs in sorted(batches.items(), key=lambda kv: kv[0].partition):
                for r in msgs:
                    if args.max is not None and shown >= args.max:
                        break
                    m = TailMessage(tp.topic, tp.partition, r.offset, r.timestamp, r.key,
                                    r.value, tuple(r.headers or ()))
                    print(orjson.dumps(message_json(m)).decode() if args.json
                          else format_message(m))
                    shown += 1
            sys.stdout.flush()
    finally:
        await consumer.stop()
    return 1 if args.max is not None and shown < args.max else 0
