"""Timeouts that never swallow a cancellation: the project's one replacement for
`asyncio.wait_for`.

On Python 3.11, `asyncio.wait_for` loses a cancellation that arrives in the same event-loop
turn as the awaited result (CPython issue gh-86296, fixed in 3.12 by rebuilding `wait_for` on
`asyncio.timeout`): it sees its waiter cancelled, finds the inner future done and returns the
result, so the task goes on as if nobody had cancelled it. A loop such as the node's clock-skew
monitor then runs forever, and a graceful stop that cancels it and waits never ends. That is
how a node once ignored SIGTERM until it was killed.

`asyncio.timeout` counts cancellations (`Task.cancelling`/`uncancel`), so it tells its own
expiry from a cancellation by someone else, and it awaits in the calling task instead of in a
second one. ruff bans `asyncio.wait_for` outside the tests (rule TID251 in pyproject.toml).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(aw: Awaitable[T], timeout_s: float | None) -> T:
    """Await `aw` for at most `timeout_s` seconds (None: no limit); raise `TimeoutError` past
    it. A cancellation of the calling task always propagates, even one that arrives together
    with the result or with the expiry."""
    async with asyncio.timeout(timeout_s):
        return await aw


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set or `timeout_s` seconds have passed; True if it is set. For the
    loops that work every so often and sooner when woken."""
    try:
        await within(event.wait(), timeout_s)
    except TimeoutError:
        return event.is_set()
    return True
