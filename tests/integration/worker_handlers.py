"""Handlers for `chronowheel worker` child processes in tests. They report through a file named
by CHRONOWHEEL_TEST_LOG: one JSON line per call."""

from __future__ import annotations

import asyncio
import os

import orjson
from chronowheel.worker import Occurrence


def _log(event: str, occ: Occurrence) -> None:
    line = orjson.dumps({"event": event, "occurrence": occ.occurrence, "attempt": occ.attempt,
                         "pid": os.getpid(), "payload": occ.payload.decode()})
    with open(os.environ["CHRONOWHEEL_TEST_LOG"], "ab") as f:
        f.write(line + b"\n")


def record(occ: Occurrence) -> None:
    """A plain (sync) handler: runs in the worker's thread pool."""
    _log("handled", occ)


async def hang(occ: Occurrence) -> None:
    """Starts and never finishes: the process is killed meanwhile."""
    _log("started", occ)
    await asyncio.Event().wait()
