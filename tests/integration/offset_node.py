"""Runs `python -m chronowheel ...` (a node) with the system clock seen through a fixed offset:

    python -m tests.integration.offset_node OFFSET_MS PYTHON -m chronowheel ARGS...

which is what `NodeProcess.args_prefix` puts in front of a node's command (see
`offset_prefix`). A test places the node's minute boundaries where it wants them in real time,
instead of waiting for the next one on the wall clock. The node's clock-skew check sees the
offset: run such a node with a `max_clock_skew_ms` above it.
"""

from __future__ import annotations

import runpy
import sys
import time

from chronowheel.core import clock


def offset_prefix(offset_ms: int) -> list[str]:
    """The `args_prefix` of a NodeProcess whose clock runs `offset_ms` ahead of this one's."""
    return [sys.executable, "-m", "tests.integration.offset_node", str(offset_ms)]


def main(argv: list[str]) -> None:
    offset_ms, rest = int(argv[0]), argv[1:]
    if rest[1:3] != ["-m", "chronowheel"]:
        raise SystemExit(f"usage: OFFSET_MS PYTHON -m chronowheel ARGS... (got {rest})")

    # The clock's one source of time: now_ms() floors it, sleep_until() counts from it.
    def now_ns(self: clock.SystemClock) -> int:
        return time.time_ns() + offset_ms * 1_000_000

    clock.SystemClock.now_ns = now_ns  # type: ignore[method-assign]
    sys.argv = ["chronowheel", *rest[3:]]
    runpy.run_module("chronowheel", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
