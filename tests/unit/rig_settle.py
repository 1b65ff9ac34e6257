"""How the in-memory rigs (node_rig.py, worker_rig.py) wait for their services to finish
what the last step gave them: loop turns until a fingerprint of everything they could touch
(storage calls, commits, messages, the clock) stays the same for QUIET_YIELDS turns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable

QUIET_YIELDS = 40  # this many loop turns without a change: nothing left to do
MAX_TURNS = 200_000


async def settle(fingerprint: Callable[[], Hashable], what: str) -> None:
    quiet, last = 0, None
    for _ in range(MAX_TURNS):
        await asyncio.sleep(0)
        now = fingerprint()
        if now == last:
            quiet += 1
            if quiet >= QUIET_YIELDS:
                return
        else:
            quiet, last = 0, now
    raise AssertionError(f"{what} never settled")
