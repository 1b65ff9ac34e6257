"""Handlers for the worker benchmark: record when each handler call started.

`chronowheel worker --handler bench_handler:handle` (with this directory on PYTHONPATH) appends
`job_id,scheduled_ms,start_ms,pid` to the file named by CHRONOWHEEL_BENCH_SINK, one write()
per call on an O_APPEND descriptor, so several processes can share the sink. The clock is read
first thing, so the figure is the start of the user's code.
"""

from __future__ import annotations

import os
import time

from chronowheel.worker import Occurrence

_fd: int | None = None


def _sink() -> int:
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["CHRONOWHEEL_BENCH_SINK"],
                      os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return _fd


def _record(occ: Occurrence, start_ms: float) -> None:
    line = f"{occ.job_id},{occ.scheduled_ms},{start_ms:.3f},{os.getpid()}\n"
    os.write(_sink(), line.encode())


async def handle(occ: Occurrence) -> None:
    """The benchmark's async handler (runs on the worker's event loop)."""
    _record(occ, time.time() * 1000.0)


def handle_sync(occ: Occurrence) -> None:
    """The same as a plain function (runs in the worker's thread pool)."""
    _record(occ, time.time() * 1000.0)
