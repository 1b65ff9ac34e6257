"""Handing the C heap's free pages back: the periodic task, glibc's call, and the node's use."""

from __future__ import annotations

import asyncio
import os
import random
import threading

import pytest
from chronowheel.errors import ConfigError
from chronowheel.node.heap_trim import libc_trim, trim_periodically
from chronowheel.node.metrics import NodeMetrics
from chronowheel.settings import Settings

from tests.unit.node_rig import NodeRig


def _resident_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_trims_on_a_thread_once_per_interval_and_observes_each_call() -> None:
    metrics = NodeMetrics()
    slept: list[float] = []
    trimmed_on: list[int] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) > 3:
            raise asyncio.CancelledError

    def trim() -> int:
        trimmed_on.append(threading.get_ident())
        return 1

    with pytest.raises(asyncio.CancelledError):
        await trim_periodically(trim, 5_000, metrics.heap_trim, sleep)
    assert slept == [5.0] * 4
    assert len(trimmed_on) == 3
    # Off the event loop's thread: a trim that walks a big heap must not stall dispatch.
    assert threading.get_ident() not in trimmed_on
    assert metrics.registry.get_sample_value("chronowheel_heap_trim_seconds_count") == 3


async def test_an_interval_of_zero_is_refused_by_the_task_and_negative_by_the_settings() -> None:
    with pytest.raises(ValueError, match="heap_trim_interval_ms"):
        await trim_periodically(lambda: 0, 0, NodeMetrics().heap_trim)
    with pytest.raises(ConfigError, match="heap_trim_interval_ms: must be 0"):
        Settings(heap_trim_interval_ms=-1)


@pytest.mark.skipif(libc_trim() is None, reason="the C library has no malloc_trim")
def test_glibc_hands_back_free_pages_between_live_blocks() -> None:
    trim = libc_trim()
    assert trim is not None
    trim()
    rng = random.Random(1)
    kept, transient = [], []
    # Blocks above CPython's 512-byte limit and below glibc's mmap threshold come from the C
    # heap; a small block kept every 50 pins the heap around the freed ones, as ingest's
    # long-lived objects do, so free() alone cannot shrink it.
    for i in range(60_000):
        transient.append(bytearray(rng.randint(600, 60_000)))
        if i % 50 == 0:
            kept.append(bytearray(2_000))
        if len(transient) >= 1_000:
            transient.clear()
    transient.clear()
    before = _resident_bytes()
    trim()
    released = before - _resident_bytes()
    # About 30 MiB are free between the kept blocks; most of it must go.
    assert released > 16 << 20, f"released {released / 2**20:.1f} MiB"
    assert len(kept) == 1_200


async def test_the_node_runs_the_trim_task_unless_it_is_turned_off() -> None:
    for interval, expected in ((5_000, libc_trim() is not None), (0, False)):
        rig = NodeRig(heap_trim_interval_ms=interval)
        await rig.start()
        try:
            names = {t.get_name() for t in asyncio.all_tasks()}
            assert ("heap-trim" in names) is expected
        finally:
            await rig.stop_all()
