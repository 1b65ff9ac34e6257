"""`chronowheel calendar put|get|delete`: the namespace's named calendars of excluded dates."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import date
from typing import Any

import orjson

from chronowheel.errors import ChronowheelError, ValidationError
from chronowheel.settings import (
    CONNECTION_SETTINGS,
    Settings,
    add_settings_arguments,
    settings_from_args,
)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "calendar", help="named calendars of dates cron jobs skip",
        description="Named calendars of a namespace: local dates on which the cron jobs that "
                    "name one (job field `calendar`) do not fire, read in each job's zone.")
    actions = p.add_subparsers(dest="calendar_command", metavar="ACTION", required=True)

    put = actions.add_parser(
        "put", help="create or replace a calendar",
        description="Send a put_calendar command to <ns>.submit: the calendar NAME becomes "
                    "exactly these dates (a replace, not a merge). Nodes computing next "
                    "occurrences see it at once on the shard that applies it and within "
                    "calendar_refresh_ms elsewhere.")
    put.add_argument("name", metavar="NAME")
    put.add_argument("dates", nargs="*", metavar="YYYY-MM-DD", help="the dates")
    put.add_argument("--file", metavar="PATH",
                     help="also read dates from a file, one per line ('#' starts a comment)")
    put.add_argument("--wait", type=float, metavar="SECONDS",
                     help="wait up to SECONDS until the calendar reads back as sent")
    add_settings_arguments(put, CONNECTION_SETTINGS)
    put.set_defaults(func=run_put)

    get = actions.add_parser("get", help="print a calendar's dates",
                             description="Print the stored dates of calendar NAME, one per "
                                         "line. Exit status 1 when there is no such calendar.")
    get.add_argument("name", metavar="NAME")
    get.add_argument("--json", action="store_true", help="one JSON object")
    add_settings_arguments(get, CONNECTION_SETTINGS)
    get.set_defaults(func=run_get)

    delete = actions.add_parser(
        "delete", help="delete a calendar",
        description="Send a delete_calendar command. Jobs naming the calendar then exclude "
                    "nothing but their own exclude_dates.")
    delete.add_argument("name", metavar="NAME")
    delete.add_argument("--wait", type=float, metavar="SECONDS",
                        help="wait up to SECONDS until the calendar is gone")
    add_settings_arguments(delete, CONNECTION_SETTINGS)
    delete.set_defaults(func=run_delete)


def read_dates(args: list[str], path: str | None) -> list[str]:
    """Dates from the command line and the file, as given (the parser validates them)."""
    dates = list(args)
    if path is not None:
        with open(path, encoding="utf-8") as f:
            for line in f:
                text = line.split("#", 1)[0].strip()
                if text:
                    dates.append(text)
    return dates


def run_put(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    dates = read_dates(args.dates, args.file)
    return asyncio.run(_send(settings, args.name, dates, args.wait))


def run_delete(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    return asyncio.run(_send(settings, args.name, None, args.wait))


async def _send(settings: Settings, name: str, dates: list[str] | None,
                wait_s: float | None) -> int:
    from chronowheel.client import SchedulerClient

    async with SchedulerClient(settings) as client:
        delivery = (client.delete_calendar(name) if dates is None
                    else client.put_calendar(name, dates))
        meta = await (await delivery)
    what = "delete" if dates is None else f"put ({len(set(dates))} dates)"
    print(f"calendar {name}: {what} written to {meta.topic} partition {meta.partition} "
          f"offset {meta.offset}")
    if wait_s is None:
        return 0
    want = None if dates is None else frozenset(date.fromisoformat(d) for d in dates)
    return await _wait_for(settings, name, want, wait_s)


async def _wait_for(settings: Settings, name: str, want: frozenset[date] | None,
                    wait_s: float) -> int:
    from chronowheel.ops.cluster import open_store

    store = await open_store(settings)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if await store.get_calendar(name) == want:
                print(f"calendar {name}: applied")
                return 0
            if time.monotonic() > deadline:
                raise ChronowheelError(f"calendar {name}: not applied after {wait_s:g}s (is a "
                                       f"node running for namespace {settings.namespace}?)")
            await asyncio.sleep(0.2)  # polling Cassandra, bounded by the deadline
    finally:
        await asyncio.to_thread(store.close)


def run_get(args: argparse.Namespace) -> int:
    from chronowheel.ops.cluster import quiet_kafka_logs

    quiet_kafka_logs()
    settings = settings_from_args(args)
    return asyncio.run(_get(settings, args.name, args.json))


async def _get(settings: Settings, name: str, as_json: bool) -> int:
    from chronowheel.ops.cluster import open_store

    if not name:
        raise ValidationError("NAME", "must not be empty", name)
    store = await open_store(settings)
    try:
        dates = await store.get_calendar(name)
    finally:
        await asyncio.to_thread(store.close)
    if dates is None:
        print(f"calendar {name!r}: not found", file=sys.stderr)
        return 1
    days = sorted(d.isoformat() for d in dates)
    if as_json:
        print(orjson.dumps({"name": name, "dates": days}).decode())
    else:
        print("\n".join(days) if days else f"calendar {name}: no dates")
    return 0
