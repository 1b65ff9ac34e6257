"""The C heap of the node process: what ingest frees goes back to the operating system.

CPython takes objects up to 512 bytes from its own arenas, which return themselves once empty.
Everything larger comes from the C library's malloc: dict tables and lists (the wheels' among
them), fetched Kafka record batches, the Cassandra driver's request and response buffers.
Ingest allocates many of those briefly, on three threads (the event loop, the group thread
that fetches, the driver's thread that reads), and glibc gives each thread that allocates a
heap of its own.

glibc's thresholds are dynamic by default: each time a block it had mapped on its own is freed,
the size above which it maps blocks on their own rises to that block's size (up to 32 MiB) and
the free space a heap must have at its top before it is shrunk rises to twice that. After a
few megabyte-sized fetches were freed, later buffers came from the heaps and their free tops
were never shrunk. `malloc_trim` does not help there: it returns free pages inside a heap and
shrinks the main heap's top, but not the top of a thread's heap. In the benchmark that left
about 30 MiB resident after a 300,000-job herd's ingest: 453-479 bytes of RSS per wheel entry,
against 362-365 with the thresholds fixed (loadtest/RESULTS.md, "The C heap after ingest").

So the node process fixes both thresholds (`malloc_threshold_bytes`, 128 KiB, glibc's own
starting value; fixing either turns the adjustment off): a freed large buffer is unmapped at
once, and a heap whose free top exceeds the threshold shrinks. With that, calling
`malloc_trim(0)` every few seconds as well gave back nothing more that could be measured (365
against 362 bytes per entry), so the node does not. C libraries without `mallopt` (musl,
macOS) are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Set in the environment, these make glibc's thresholds the operator's choice.
GLIBC_THRESHOLD_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's `mallopt`, or None where the C library has none."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def fix_thresholds(threshold_bytes: int) -> str:
    """Fix glibc's mmap and trim thresholds of this process at `threshold_bytes` (0 leaves
    them dynamic). Returns what was done, for the node's start-up log."""
    if not threshold_bytes:
        return "glibc's malloc thresholds left dynamic (malloc_threshold_bytes is 0)"
    chosen = [name for name in GLIBC_THRESHOLD_VARIABLES if name in os.environ]
    if chosen:
        return f"glibc's malloc thresholds left to {', '.join(chosen)} from the environment"
    mallopt = glibc_mallopt()
    if mallopt is None:
        return "no glibc mallopt here: malloc thresholds left as they are"
    for param in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD):
        if mallopt(param, threshold_bytes) != 1:
            return f"glibc refused a malloc threshold of {threshold_bytes} bytes: left dynamic"
    return f"glibc's mmap and trim thresholds fixed at {threshold_bytes} bytes"
