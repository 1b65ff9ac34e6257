"""The node process's cyclic garbage collector: fewer and shorter pauses of its event loop.

CPython's collector is generational. Each collection of the oldest generation walks every
tracked object of the process, and the node keeps many: every occurrence in its wheels is one,
so with 1,000,000 loaded a full collection stops the event loop for about half a second. With
the default young threshold (700 allocations) the objects of a Cassandra request, which form a
reference cycle inside the driver (the response future, its timer and callbacks), outlive two
young collections while the request is in flight and are promoted to the oldest generation;
at a few thousand requests a second that promoted enough to trigger a full collection every
few seconds, 100 ms to 2 s each on this kind of machine (measured with `gc.callbacks` while
the node ingested and fired: 8 full collections in a one-minute run with the default
threshold, 1 with 50,000).

So `chronowheel node` (the process entry point, never a node run inside another program)
raises the young threshold (`gc_young_threshold`) so that those cycles die young, and freezes
what exists at start-up (modules, classes, the settings), so no later collection walks it.
`chronowheel worker` does the same: its lease and mark writes make the same cycles (in a
traced 1,000/s run, 11 to 31 collections of 5 ms or more in the 16 s around the window, up to
0.6 s each, before; one after).
`GcPauses` reports each collection's pause as `chronowheel_gc_pause_seconds{generation}`.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Histogram


def tune_process(young_threshold: int) -> None:
    """Process-wide settings of the collector (see the module doc); 0 keeps Python's."""
    if young_threshold:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)
    # What is alive now lives as long as the process: keep it out of every later collection.
    gc.collect()
    gc.freeze()


class GcPauses:
    """Observe the pause of every collection of this process into a histogram labelled by
    generation (0, 1, 2). Remove it when the node stops (callbacks are process-wide)."""

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        self._started = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._on_gc)

    def remove(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Collections run with the GIL held, start and stop on the same thread, never nested.
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._histogram.labels(str(info["generation"])).observe(
                time.perf_counter() - self._started)
