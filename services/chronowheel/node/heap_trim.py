"""Giving the C heap's free pages back to the operating system.

CPython takes objects up to 512 bytes from its own arenas and everything larger from the C
library's malloc: dict tables, lists of rows, fetched Kafka record batches, the Cassandra
driver's request and response buffers. Ingest allocates many of those briefly and on several
threads (the group thread fetches, the driver's thread reads). glibc keeps what is freed in its
heaps, and the pages stay resident. In the benchmark, after ingesting a 300,000-job herd the
node's heaps held 25-33 MiB free but resident, as much as 110 bytes per wheel entry, against
some 345 bytes for the entry itself (loadtest/RESULTS.md, "The C heap after ingest").

`malloc_trim(0)` hands every whole free page of every glibc heap back (since glibc 2.8 it
advises the kernel on pages inside a heap, not only at its top). The node calls it on a
thread every `heap_trim_interval_ms`: the call releases the GIL and takes a few milliseconds
when there is much to return, well under one otherwise. It holds each heap's lock while it
walks it, so a thread that allocates from that heap meanwhile waits that long. The C
libraries without `malloc_trim` (musl, macOS) are left alone; Python's own arenas return
themselves once empty and need nothing of this.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import sys
import time
from collections.abc import Awaitable, Callable

from prometheus_client import Histogram

Trim = Callable[[], int]


def libc_trim() -> Trim | None:
    """glibc's `malloc_trim(0)`, or None where the C library has none."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def trim_all() -> int:
        # 0: keep no padding at the top of the main heap; 1 if memory was returned.
        return int(trim(0))

    return trim_all


async def trim_periodically(trim: Trim, interval_ms: int, histogram: Histogram,
                            sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Return the C heaps' free pages every `interval_ms`, on a thread, observing each call's
    duration; runs until cancelled."""
    if interval_ms <= 0:
        raise ValueError(f"heap_trim_interval_ms: must be more than 0 here, got {interval_ms}")
    while True:
        await sleep(interval_ms / 1000)
        started = time.perf_counter()
        await asyncio.to_thread(trim)
        histogram.observe(time.perf_counter() - started)
