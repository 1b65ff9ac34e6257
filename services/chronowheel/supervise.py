"""The skeleton of a long-running service (node, worker, demo): supervised tasks whose crash
stops the service loudly, and stop signals (the first graceful, the second aborts).

A service keeps one `Supervisor`. Its loops are spawned with `spawn` (their end, whether by
an exception or by returning, is a failure) and its pieces of work that do end with `job` (only
an exception is a failure). The first failure is kept, logged with its traceback, and sets the
stop event the service waits on; later failures are logged too but do not replace it, so the
error the service raises is the cause, not a consequence of the shutdown. `run` is a service's
run(): start, wait for the stop, shut down, raise the failure; during a shutdown
(`begin_shutdown`, `cancel_all`) tasks that end are no failures.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, NoReturn

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
ABORT_EXIT_CODE = 130
"""Exit status after a second stop signal (128 + SIGINT, as a shell reports an interrupt)."""
CANCEL_GRACE_S = 5.0
"""How long a stop waits for cancelled tasks to end; they need an event-loop turn or two, so
a task still running after this ignored its cancellation."""

Expected = Callable[[asyncio.Task[Any], BaseException | None], bool]
"""Decides that a task's end is not a failure (e.g. a shard given up because it was fenced);
called with the task and its exception (None when it returned)."""


class Supervisor:
    """Tasks of one service, and the event that stops it."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.stop_requested = asyncio.Event()
        self.failure: BaseException | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    # --- starting work ----------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, *,
              expected: Expected | None = None) -> asyncio.Task[Any]:
        """A task that runs for the service's life: its end is a failure, unless the service
        is stopping or `expected` says otherwise."""
        return self._start(coro, name, loop=True, expected=expected)

    def job(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A task that ends: only an exception is a failure (cancellation is not)."""
        return self._start(coro, name, loop=False, expected=None)

    def _start(self, coro: Coroutine[Any, Any, Any], name: str, *, loop: bool,
               expected: Expected | None) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._ended(t, loop, expected))
        return task

    def _ended(self, task: asyncio.Task[Any], loop: bool, expected: Expected | None) -> None:
        self._tasks.discard(task)
        if task.cancelled() or self._closing:
            return
        exc = task.exception()
        if exc is None and not loop:
            return
        if expected is not None and expected(task, exc):
            return
        self.fail(task.get_name(), exc or RuntimeError(f"{task.get_name()} ended unexpectedly"))

    # --- stopping ---------------------------------------------------------------------------
    def fail(self, what: str, exc: BaseException) -> None:
        """Record a failure (the first one is kept) and request the stop."""
        if self.failure is None:
            self.failure = exc
        log.critical("%s failed; stopping the %s: %r", what, self.service, exc, exc_info=exc)
        self.stop_requested.set()

    def request_stop(self) -> None:
        self.stop_requested.set()

    @property
    def stopping(self) -> bool:
        return self.stop_requested.is_set()

    async def wait(self) -> None:
        """Until a stop is requested or a supervised task failed."""
        await self.stop_requested.wait()

    def begin_shutdown(self) -> None:
        """From here on a task that ends is the shutdown's doing, not a failure: call it before
        cancelling tasks one by one in the order the service needs."""
        self._closing = True
        self.stop_requested.set()

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for them (after begin_shutdown)."""
        self.begin_shutdown()
        await self.cancel_and_wait(list(self._tasks))

    async def cancel_and_wait(self, tasks: Sequence[asyncio.Task[Any]], *,
                              within_s: float = CANCEL_GRACE_S) -> None:
        """Cancel `tasks` and wait until they end, at most `within_s` seconds. A task still
        running then has ignored its cancellation (a library that swallows one, a loop that
        catches CancelledError): it is logged with where it waits, and the stop goes on
        without it instead of hanging until the process is killed."""
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        ended, stuck = await asyncio.wait(tasks, timeout=within_s)
        for task in ended:  # raised while stopping: worth a line, not a failure
            exc = None if task.cancelled() else task.exception()
            if exc is not None:
                log.warning("%s: task %s ended with %r while stopping", self.service,
                            task.get_name(), exc)
        for task in stuck:
            where = io.StringIO()
            task.print_stack(file=where)
            log.error("%s: task %s still running %.1f s after it was cancelled; the stop goes "
                      "on without it. %s", self.service, task.get_name(), within_s,
                      where.getvalue().rstrip())

    def raise_failure(self, error: type[Exception] = RuntimeError) -> None:
        """Raise `error` chained to the recorded failure, if there is one."""
        if self.failure is not None:
            raise error(f"{self.service} stopped: {self.failure!r}") from self.failure

    async def run(self, start: Callable[[], Awaitable[None]],
                  shutdown: Callable[[], Awaitable[None]], *,
                  error: type[Exception] = RuntimeError) -> None:
        """A service's `run()`: start, wait until a stop is requested or a task failed, shut
        down (also when cancelled), then raise `error` for a failure."""
        await start()
        try:
            await self.wait()
        finally:
            await shutdown()
        self.raise_failure(error)


def install_stop_signals(request_stop: Callable[[], None], *, graceful: str,
                         signals: Sequence[signal.Signals] = STOP_SIGNALS,
                         abort: Callable[[int], NoReturn] = os._exit) -> None:
    """On the running loop: the first of `signals` logs `graceful` and calls `request_stop`;
    a second one aborts the process at once (exit status 130), for an operator who does not
    want to wait for a graceful stop."""
    loop = asyncio.get_running_loop()
    received = 0

    def on_signal() -> None:
        nonlocal received
        received += 1
        if received == 1:
            log.warning("stop requested: %s", graceful)
            request_stop()
        else:
            log.error("second stop signal: aborting")
            abort(ABORT_EXIT_CODE)

    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
