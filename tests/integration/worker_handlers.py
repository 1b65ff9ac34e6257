"""Handlers for `chronowheel worker` child processes in tests. They report through a file named
by CHRONOWHEEL_TEST_LOG: one JSON line per call, read back with `read_events`."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import orjson
from chronowheel.worker import Occurrence


def _log(event: str, occ: Occurrence, **extra: Any) -> None:
    line = orjson.dumps({"event": event, "occurrence": occ.occurrence, "attempt": occ.attempt,
                         "pid": os.getpid(), "payload": occ.payload.decode(),
                         "partition": occ.partition, "offset": occ.offset, **extra})
    with open(os.environ["CHRONOWHEEL_TEST_LOG"], "ab") as f:
        f.write(line + b"\n")


def read_events(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a handler log. A test polls it while the worker writes, so the
    last line may be cut in the middle: only lines that end in a newline are read."""
    if not path.exists():
        return []
    complete, _, _ = path.read_bytes().rpartition(b"\n")
    return [orjson.loads(line) for line in complete.split(b"\n") if line.strip()]


def record(occ: Occurrence) -> None:
    """A plain (sync) handler: runs in the worker's thread pool."""
    _log("handled", occ)


async def hang(occ: Occurrence) -> None:
    """Starts and never finishes: the process is killed meanwhile."""
    _log("started", occ)
    await asyncio.Event().wait()


async def timed(occ: Occurrence) -> None:
    """Logs its start (with the wall time) and its end around a short piece of work."""
    _log("started", occ, t=time.time())
    await asyncio.sleep(float(os.environ.get("CHRONOWHEEL_TEST_WORK_S", "0.02")))
    _log("done", occ, t=time.time())


async def overlapping(occ: Occurrence) -> None:
    """Works for the payload's `work_s` seconds; logs its start, its end, or its cancellation
    (each with the wall time), for the overlap-policy tests."""
    work_s = float(orjson.loads(occ.payload or b"{}").get("work_s", 0.02))
    _log("started", occ, job=occ.job_id, t=time.time())
    try:
        await asyncio.sleep(work_s)
    except asyncio.CancelledError:
        _log("cancelled", occ, job=occ.job_id, t=time.time())
        raise
    _log("done", occ, job=occ.job_id, t=time.time())
