"""How the driver's answers reach the event loop (`store/cassandra.py`: `_await_future` and its
settler): every awaited request is settled, whatever the driver's threads are doing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from cassandra import DriverException
from chronowheel.store.cassandra import _await_future


class AnswerJustArrived:
    """A ResponseFuture as the driver leaves it when its I/O thread has stored the answer
    (`_set_result`: warnings, column names, the final rows) but not yet set the request's
    event: `add_callbacks` then runs the callback at once, on the caller's thread, while the
    public `warnings` raises and `result()` would wait for the event."""

    def __init__(self, rows: list[tuple[Any, ...]], warnings: list[str] | None = None,
                 fail_clear: bool = False) -> None:
        self._rows = rows
        self._warnings = warnings
        self._col_names = ["id"]
        self._col_types = None
        self._paging_state = None
        self.has_more_pages = False
        self._timer: object | None = object()
        self._fail_clear = fail_clear

    @property
    def warnings(self) -> list[str] | None:
        raise DriverException("warnings cannot be retrieved before ResponseFuture is finalized")

    def result(self) -> Any:
        raise AssertionError("result() waits for the driver's event: never on the event loop")

    def add_callbacks(self, callback: Callable[[Any], None],
                      errback: Callable[[BaseException], None]) -> None:
        callback(self._rows)

    def clear_callbacks(self) -> None:
        if self._fail_clear:
            raise RuntimeError("a bug while settling this one answer")


async def settled_soon(*futures: asyncio.Future[Any]) -> None:
    """Let the loop run the settler's drain (scheduled with call_soon_threadsafe)."""
    for _ in range(3):
        await asyncio.sleep(0)
    assert all(f.done() for f in futures), "an answer was left unsettled"


async def test_an_answer_handed_over_before_the_driver_marks_it_finished_is_settled() -> None:
    rf = AnswerJustArrived([("job-1",), ("job-2",)])
    fut = _await_future(rf, "read bucket page")  # type: ignore[arg-type]
    await settled_soon(fut)
    assert list(fut.result()) == [("job-1",), ("job-2",)]
    assert rf._timer is None  # the request's reference cycles are broken as before


async def test_one_answer_that_cannot_be_settled_fails_its_waiter_and_spares_the_others(
        caplog: Any) -> None:
    before = AnswerJustArrived([("a",)])
    broken = AnswerJustArrived([("b",)], fail_clear=True)
    after = AnswerJustArrived([("c",)])
    # All three are handed over before the loop runs again: one drain settles them.
    futures = [_await_future(rf, what)  # type: ignore[arg-type]
               for rf, what in ((before, "one"), (broken, "two"), (after, "three"))]
    await settled_soon(*futures)
    assert list(futures[0].result()) == [("a",)]
    assert isinstance(futures[1].exception(), RuntimeError)
    assert list(futures[2].result()) == [("c",)]
    assert "settling the answer to two failed" in caplog.text
