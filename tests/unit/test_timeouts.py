"""chronowheel.timeouts: a cancellation always reaches the task, whatever arrives with it.

The races are made deterministic with asyncio's FIFO order of ready callbacks: the result (or
the expiry) and the cancellation are both queued before the waiting task runs again.
"""

from __future__ import annotations

import asyncio

import pytest
from chronowheel.timeouts import wait_event, within


async def test_within_returns_the_result() -> None:
    assert await within(asyncio.sleep(0, result="done"), 5) == "done"


async def test_within_without_a_limit_waits() -> None:
    assert await within(asyncio.sleep(0, result=7), None) == 7


async def test_within_raises_timeout_error_past_the_limit() -> None:
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await within(never, 0)


async def test_a_cancel_arriving_with_the_result_is_not_swallowed() -> None:
    # Python 3.11's asyncio.wait_for returns the result here and the task carries on as if it
    # had not been cancelled: the node's clock-skew monitor then never ended on SIGTERM.
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    after: list[str] = []

    async def waiting() -> None:
        await within(fut, 10)
        after.append("went on after the cancel")

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0)  # the task now waits for fut
    fut.set_result(1)
    task.cancel()  # in the same turn as the result
    with pytest.raises(asyncio.CancelledError):
        await task
    assert after == []


async def test_a_cancel_arriving_with_the_expiry_is_a_cancel_not_a_timeout() -> None:
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outcome: list[str] = []

    async def waiting() -> None:
        try:
            await within(never, 0)  # the expiry is queued as the wait begins
        except TimeoutError:
            outcome.append("timeout")
            raise

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0)  # the task waits; its expiry is queued behind this test
    task.cancel()  # queued before the expiry runs
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcome == []


async def test_wait_event_tells_a_set_event_from_a_timeout() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0) is False
    event.set()
    assert await wait_event(event, 5) is True


async def test_wait_event_does_not_swallow_a_cancel_arriving_with_the_set() -> None:
    event = asyncio.Event()
    rounds: list[int] = []

    async def loop_until_cancelled() -> None:
        while True:  # the shape of the node's periodic loops
            event.clear()
            await wait_event(event, 10)
            rounds.append(1)

    task = asyncio.create_task(loop_until_cancelled())
    await asyncio.sleep(0)
    event.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)  # bounded: the bug would make this loop forever
    assert rounds == []
