"""`chronowheel tail TOPIC`: print messages of a topic as they are committed (read_committed),
decoded: the chronowheel headers, the payload as JSON when it parses. The reading and decoding:
`ops/tail.py`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

import orjson

from chronowheel.core import wire
from chronowheel.ops.format import human_ms, rfc3339
from chronowheel.ops.tail import TailMessage, decimal, message_json, payload_view, text
from chronowheel.settings import Settings, add_settings_arguments, settings_from_args


def format_message(m: TailMessage) -> str:
    """Three lines: where and when, the headers, the payload."""
    headers = {k: text(v) for k, v in m.headers}
    first = [f"{m.topic}[{m.partition}]@{m.offset}",
             "key=" + ("(none)" if m.key is None else text(m.key))]
    scheduled = decimal(headers.get(wire.SCHEDULED_AT))
    fired = decimal(headers.get(wire.FIRED_AT))
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
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    try:
        return asyncio.run(_tail(settings, args))
    except BrokenPipeError:  # `| head`: the reader is gone, which is not an error
        return 0


async def _tail(settings: Settings, args: argparse.Namespace) -> int:
    from chronowheel.ops.tail import follow

    shown = 0
    async with contextlib.aclosing(follow(settings, args.topic,
                                          from_beginning=args.from_beginning, limit=args.max,
                                          timeout_s=args.timeout)) as batches:
        async for batch in batches:
            for m in batch:
                print(orjson.dumps(message_json(m)).decode() if args.json
                      else format_message(m))
                shown += 1
            sys.stdout.flush()
    return 1 if args.max is not None and shown < args.max else 0
