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
                 fail_clear: bool = False, unreadable: bool = False) -> None:
        self._rows = rows
        self._warnings = warnings
        if not unreadable:  # without its column names the answer cannot be read
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
    fut = _await_future(rf, "read bucket page")
    await settled_soon(fut)
    assert list(fut.result()) == [("job-1",), ("job-2",)]
    assert rf._timer is None  # the request's reference cycles are broken as before


async def test_one_answer_that_cannot_be_settled_fails_its_waiter_and_spares_the_others(
        caplog: Any) -> None:
    before = AnswerJustArrived([("a",)])
    unreadable = AnswerJustArrived([("b",)], unreadable=True)
    after = AnswerJustArrived([("c",)])
    # All three are handed over before the loop runs again: one drain settles them.
    futures = [_await_future(rf, what)
               for rf, what in ((before, "one"), (unreadable, "two"), (after, "three"))]
    await settled_soon(*futures)
    assert list(futures[0].result()) == [("a",)]
    assert isinstance(futures[1].exception(), AttributeError)
    assert list(futures[2].result()) == [("c",)]
    assert "settling the answer to two failed" in caplog.text


async def test_a_failure_after_the_answer_does_not_turn_it_into_an_error(caplog: Any) -> None:
    """A write Cassandra applied must not read as failed because the bookkeeping after it
    (the request's reference cycles, its warnings) went wrong."""
    rf = AnswerJustArrived([("a",)], fail_clear=True)
    fut = _await_future(rf, "write due rows")
    await settled_soon(fut)
    assert list(fut.result()) == [("a",)]
    assert "after the answer to write due rows" in caplog.text


def test_the_driver_still_keeps_what_the_settler_reads() -> None:
    """The settler reads fields the driver stores with an answer before its callbacks (see
    `_settle`); a driver that renamed them would silently stop the warnings being counted."""
    import inspect
    from pathlib import Path

    from cassandra import cluster
    from cassandra.cluster import ResultSet

    # The driver ships compiled; its source sits beside the compiled module.
    source = Path(cluster.__file__).with_name("cluster.py").read_text()
    start = source.index("    def _set_result(self")
    stored = source[start:source.index("\n    def ", start + 1)]
    for name in ("self._warnings", "self._col_names", "self._col_types", "self._paging_state"):
        assert name in stored, name
    assert stored.index("self._warnings") < stored.index("self._set_final_result(")
    assert list(inspect.signature(ResultSet.__init__).parameters) == [
        "self", "response_future", "initial_response"]
