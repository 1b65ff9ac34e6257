"""The service skeleton: supervised tasks stop the service loudly; stop signals."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import IO, Any

import pytest
from chronowheel.supervise import ABORT_EXIT_CODE, Supervisor, install_stop_signals
from chronowheel.timeouts import within


class Boom(Exception):
    pass


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_crashed_loop_stops_the_service_and_is_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    sup = Supervisor("demo service")

    async def crash() -> None:
        raise Boom("disk on fire")

    with caplog.at_level(logging.CRITICAL, logger="chronowheel.supervise"):
        sup.spawn(crash(), "pump")
        await asyncio.wait_for(sup.wait(), 1)
    assert isinstance(sup.failure, Boom)
    assert "pump failed; stopping the demo service" in caplog.text
    with pytest.raises(RuntimeError, match="demo service stopped: Boom") as info:
        sup.raise_failure()
    assert info.value.__cause__ is sup.failure


async def test_a_loop_that_returns_is_a_failure_too() -> None:
    sup = Supervisor("svc")

    async def quits() -> None:
        return None

    sup.spawn(quits(), "skew-monitor")
    await asyncio.wait_for(sup.wait(), 1)
    assert isinstance(sup.failure, RuntimeError)
    assert "skew-monitor ended unexpectedly" in str(sup.failure)


async def test_a_job_may_end_but_not_raise() -> None:
    sup = Supervisor("svc")

    async def done() -> int:
        return 1

    async def raises() -> None:
        raise Boom("marks")

    await sup.job(done(), "flush")
    await settle()
    assert sup.failure is None and not sup.stopping
    job = sup.job(raises(), "flush-2")
    with pytest.raises(Boom):
        await job
    await settle()
    assert isinstance(sup.failure, Boom)
    assert sup.stopping


async def test_an_expected_end_is_not_a_failure() -> None:
    sup = Supervisor("svc")
    seen: list[tuple[str, BaseException | None]] = []

    def fenced_is_fine(task: asyncio.Task[Any], exc: BaseException | None) -> bool:
        seen.append((task.get_name(), exc))
        return isinstance(exc, Boom)

    async def fenced() -> None:
        raise Boom("fenced")

    task = sup.spawn(fenced(), "shard-3", expected=fenced_is_fine)
    with pytest.raises(Boom):
        await task
    await settle()
    assert sup.failure is None and not sup.stopping
    assert [name for name, _ in seen] == ["shard-3"]


async def test_the_first_failure_is_kept() -> None:
    sup = Supervisor("svc")
    first, second = Boom("first"), Boom("second")
    sup.fail("a", first)
    sup.fail("b", second)
    assert sup.failure is first


async def test_cancel_all_ends_the_tasks_without_failing(
        caplog: pytest.LogCaptureFixture) -> None:
    sup = Supervisor("svc")
    cleaned: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(name)
            if name == "noisy":
                raise Boom("raised while cancelled")

    tasks = [sup.spawn(forever("quiet"), "quiet"), sup.spawn(forever("noisy"), "noisy")]
    await settle()
    with caplog.at_level(logging.WARNING, logger="chronowheel.supervise"):
        await sup.cancel_all()
    assert "svc: task noisy ended with Boom('raised while cancelled') while stopping" in caplog.text
    assert "quiet" not in caplog.text
    assert all(t.done() for t in tasks)
    assert sorted(cleaned) == ["noisy", "quiet"]
    assert sup.failure is None
    assert sup.stopping
    sup.raise_failure()  # nothing to raise


async def test_begin_shutdown_lets_the_service_cancel_tasks_in_its_own_order() -> None:
    sup = Supervisor("svc")
    fetch = sup.spawn(asyncio.Event().wait(), "fetch")
    commit = sup.spawn(asyncio.Event().wait(), "commit")
    await settle()
    sup.begin_shutdown()
    fetch.cancel()
    await asyncio.gather(fetch, return_exceptions=True)
    assert not commit.done()  # still running: the service ends it when it is ready to
    await sup.cancel_all()
    assert commit.cancelled() and sup.failure is None


class ServiceError(Exception):
    pass


async def test_run_starts_waits_shuts_down_and_raises_the_failure() -> None:
    sup = Supervisor("svc")
    steps: list[str] = []

    async def start() -> None:
        steps.append("start")

        async def crash() -> None:
            await asyncio.sleep(0.01)
            raise Boom("lost Cassandra")

        sup.spawn(crash(), "ingest")

    async def shutdown() -> None:
        steps.append("shutdown")
        await sup.cancel_all()

    with pytest.raises(ServiceError, match="svc stopped: Boom") as info:
        await asyncio.wait_for(sup.run(start, shutdown, error=ServiceError), 2)
    assert steps == ["start", "shutdown"]
    assert isinstance(info.value.__cause__, Boom)


async def test_run_returns_after_a_requested_stop() -> None:
    sup = Supervisor("svc")
    steps: list[str] = []

    async def start() -> None:
        steps.append("start")
        asyncio.get_running_loop().call_later(0.01, sup.request_stop)

    async def shutdown() -> None:
        steps.append("shutdown")

    await asyncio.wait_for(sup.run(start, shutdown), 2)
    assert steps == ["start", "shutdown"] and sup.failure is None


async def test_first_signal_requests_a_stop_and_the_second_aborts() -> None:
    # SIGUSR1/SIGUSR2 stand for SIGTERM/SIGINT: the test loop is shared, so its handlers go.
    user_signals = (signal.SIGUSR1, signal.SIGUSR2)
    stops: list[str] = []
    aborts: list[int] = []
    handled = asyncio.Event()  # the loop ran the handler of the signal just sent

    def stop() -> None:
        stops.append("stop")
        handled.set()

    def abort(code: int) -> Any:
        aborts.append(code)
        handled.set()

    install_stop_signals(stop, graceful="finishing up", signals=user_signals, abort=abort)
    try:
        os.kill(os.getpid(), user_signals[0])
        await within(handled.wait(), 10)
        assert stops == ["stop"] and aborts == []
        handled.clear()
        os.kill(os.getpid(), user_signals[1])  # either signal counts as the second
        await within(handled.wait(), 10)
        assert stops == ["stop"] and aborts == [ABORT_EXIT_CODE]
    finally:
        loop = asyncio.get_running_loop()
        for sig in user_signals:
            loop.remove_signal_handler(sig)


SERVICE = textwrap.dedent("""
    import asyncio, sys
    from chronowheel.supervise import Supervisor, install_stop_signals

    async def main() -> int:
        sup = Supervisor("svc")
        install_stop_signals(sup.request_stop, graceful="draining")
        print("ready", flush=True)
        await sup.wait()
        print("graceful stop", flush=True)
        await asyncio.sleep(float(sys.argv[1]))  # a slow shutdown
        return 0

    sys.exit(asyncio.run(main()))
""")


class ChildOutput:
    """A child's output, read line by line by a thread so that each wait for it is bounded: a
    child that hangs fails the test, with what it wrote so far, instead of hanging it."""

    def __init__(self, pipe: IO[str], timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self.written: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()  # None: the end of the output
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        try:
            for line in pipe:
                self._lines.put(line)
        finally:
            self._lines.put(None)

    def readline(self, deadline: float | None = None) -> str:
        """The next line, or "" at the end of the output (as IO.readline); fails the test when
        none comes by `deadline` (time.monotonic(); default: `timeout_s` from now)."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"the child wrote no line within {self.timeout_s} s; it wrote so far: "
                        f"{''.join(self.written)!r}")
        if line is None:
            self._lines.put(None)  # the end stays the end for any later read
            return ""
        self.written.append(line)
        return line

    def rest(self) -> str:
        """The output to its end, within `timeout_s`."""
        deadline = time.monotonic() + self.timeout_s
        out: list[str] = []
        while line := self.readline(deadline):
            out.append(line)
        return "".join(out)

    def close(self) -> None:
        self._thread.join(5)


def run_service(shutdown_s: float, signals: int) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVICE, str(shutdown_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    with proc:  # closes the pipe and waits for the child on the way out
        output = ChildOutput(proc.stdout)
        try:
            assert output.readline().strip() == "ready"
            seen: list[str] = []
            for n in range(signals):
                proc.send_signal(signal.SIGTERM)
                if n + 1 < signals:  # the next signal once this one was handled: the stop under way
                    while line := output.readline():
                        seen.append(line)
                        if line.strip() == "graceful stop":
                            break
            out = output.rest()
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:  # a failed read or wait: no child left behind
                proc.kill()
            output.close()
    return proc.returncode, "".join(seen) + out


def test_a_process_stops_gracefully_on_sigterm_and_aborts_on_the_second() -> None:
    code, out = run_service(0.0, 1)
    assert code == 0, out
    assert "graceful stop" in out
    code, out = run_service(30.0, 2)  # the slow shutdown is cut short
    assert code == ABORT_EXIT_CODE, out
    assert "graceful stop" in out and "second stop signal: aborting" in out


async def test_a_task_that_ignores_its_cancellation_is_named_and_the_stop_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    sup = Supervisor("svc")
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # swallows the cancellation, as Python 3.11's wait_for could

    quiet = sup.spawn(asyncio.Event().wait(), "quiet")
    task = sup.spawn(stubborn(), "stubborn")
    await settle()
    sup.begin_shutdown()
    with caplog.at_level(logging.ERROR, logger="chronowheel.supervise"):
        await sup.cancel_and_wait([quiet, task], within_s=0)
    assert quiet.cancelled()
    assert not task.done()
    assert "svc: task stubborn still running 0.0 s after it was cancelled" in caplog.text
    assert "in stubborn" in caplog.text  # where it waits
    assert "quiet" not in caplog.text
    release.set()
    await task
    assert sup.failure is None
