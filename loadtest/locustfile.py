"""Locust scenarios for chronowheel: users submit jobs through Kafka, a probe reports lateness.

Prerequisites: the namespace is initialised and at least one node serves it (see
loadtest/README.md). Then, for example:

  .venv/bin/locust -f loadtest/locustfile.py --headless -u 10 -r 10 -t 60s \
      --namespace loadtest --cw-rate 500 --csv loadtest/results/locust SteadyUser

The cluster: the same flags and environment as every chronowheel command (--namespace,
--kafka, --cassandra, --consistency and their TLS, SASL and Cassandra authentication flags;
CHRONOWHEEL_* variables; secrets only from CHRONOWHEEL_<NAME> or CHRONOWHEEL_<NAME>_FILE). The
run prints the cluster it is about to load and refuses servers that are not on this machine
unless given --cw-allow-remote-cluster (or CHRONOWHEEL_LOADTEST_ALLOW_REMOTE=1).

User classes (pick them on the command line; all three run when none is named), each with a
tag of the same scenario name (`--tags steady` etc. work too):
  SteadyUser       `steady`   one-shot jobs due --cw-lead-s seconds after submission, at
                              --cw-rate jobs/s per user: a steady firing rate
  HerdUser         `herd`     jobs all due at the next top of a minute at least --cw-lead-s
                              ahead: a top-of-minute herd
  LongHorizonUser  `horizon`  jobs due 1 to 365 days ahead, and cancels of some of them: ingest
                              and storage load that never fires during the run

Each user submits --cw-batch jobs at a time (default: a fiftieth of a second's worth), paced to
--cw-rate; a batch goes to the Kafka bridge without waiting for its acknowledgement (at most
MAX_BATCHES_IN_FLIGHT batches per process wait for one).

Statistics: request type `submit` (name = scenario) is, per command, the time until Kafka
acknowledged the batch that carried it. Request type `fire`, name `lateness, received`, is each
occurrence's receive time by a read_committed consumer, put on Cassandra's clock (minus this
machine's measured offset to it), minus cw-scheduled-at; name `lateness, cw-fired-at` is
cw-fired-at (the node's clock) minus cw-scheduled-at. With --cw-worker, request type `handler`,
name `start lateness`, is when chronowheel's Worker (default settings, run beside the probe)
started the handler of each occurrence (on Cassandra's clock) - cw-scheduled-at. A duplicate
occurrence, one whose cw-fired-at is before its instant, or one received before it by more than
the offset's uncertainty, is a failure. Only jobs of this run (their ids start with the run's
prefix) are measured.

Bounds: every user submits at a fixed rate; no job is submitted that is due after the end of a
`-t` run (so every submitted occurrence can be measured before the run ends); the whole run
stops after --cw-max-runtime-s and submitting stops after --cw-max-jobs (per process).

Distributed runs (`--processes N`, or a master and workers): each worker process has its own
bridge and measures its own jobs; at the end the master asks every worker to drain and merges
their figures into one summary.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gevent
import orjson
from chronowheel.settings import Settings
from chronowheel.testing import LatenessTally
from gevent import Greenlet
from gevent.event import AsyncResult
from gevent.lock import BoundedSemaphore, Semaphore
from locust import User, events, tag, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
import locust_support as support  # beside this file, free of locust

HERE = Path(__file__).resolve().parent
BRIDGE = HERE / "kafka_bridge.py"
PAD = "x" * 48
MINUTE_MS = 60_000
# Jobs due this close to the end of a -t run are not submitted: they could not be measured.
END_MARGIN_MS = 3_000
DRAIN_S = 10.0
MAX_BATCHES_IN_FLIGHT = 256
BATCHES_PER_S = 50  # per user, when --cw-batch is not given

Command = tuple[str, dict[str, Any] | None, str | None]
"""(job id, the upsert or None for a cancel, the occurrence it fires or None)"""


def now_ms() -> float:
    return time.time_ns() / 1e6


class EarlyFire(Exception):
    pass


class DuplicateFire(Exception):
    pass


OPTIONS: support.Options = {
    "--cw-rate": (20.0, "jobs per second per user"),
    "--cw-batch": (0, "jobs per submitted batch (default: --cw-rate / 50, at least 1)"),
    "--cw-lead-s": (10.0, "steady: due this long after submission; herd: minimum lead"),
    "--cw-max-jobs": (500_000, "stop submitting after this many jobs in one locust process"),
    "--cw-max-runtime-s": (900.0, "stop the whole run after this long, whatever -t says"),
    "--cw-worker": (False, "also run chronowheel's Worker (default settings) and report its "
                           "handler's start lateness as request type `handler`"),
}


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    support.add_cluster_arguments(parser)
    support.add_options(parser, OPTIONS)


class KafkaBridge:
    """Runs kafka_bridge.py as a child process and talks to it over a socket pair."""

    def __init__(self, settings: Settings, prefix: str,
                 on_fires: Callable[[list[list[Any]]], None],
                 on_starts: Callable[[list[list[Any]]], None],
                 on_skew: Callable[[int, int], None], worker: bool) -> None:
        self.on_fires = on_fires
        self.on_starts = on_starts
        self.on_skew = on_skew
        self._next_id = 0
        self._pending: dict[int, Callable[[str | None], None]] = {}
        self._lock = Semaphore()
        self._ready = AsyncResult()
        self.sock, child = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, str(BRIDGE), "--fd", str(child.fileno()), "--prefix", prefix,
             *support.bridge_arguments(settings), *(("--worker",) if worker else ())],
            pass_fds=[child.fileno()], stdin=subprocess.DEVNULL)
        child.close()
        self._reader = gevent.spawn(self._read)

    def wait_ready(self, timeout: float = 90) -> dict[str, Any]:
        """The bridge's `ready` message: the cluster as it sees it."""
        ready: dict[str, Any] = self._ready.get(timeout=timeout)
        return ready

    def _read(self) -> None:
        f = self.sock.makefile("rb")
        for line in f:
            msg = orjson.loads(line)
            kind = msg["t"]
            if kind == "ack":
                done = self._pending.pop(msg["id"], None)
                if done is not None:
                    done(msg["err"])
            elif kind == "fires":
                self.on_fires(msg["items"])
            elif kind == "starts":
                self.on_starts(msg["items"])
            elif kind == "skew":
                self.on_skew(msg["skew_ms"], msg["uncertainty_ms"])
            elif kind == "ready":
                self._ready.set(msg)
            elif kind == "error":
                self._ready.set_exception(RuntimeError(msg["err"]))
        if not self._ready.ready():
            self._ready.set_exception(RuntimeError("the Kafka bridge exited"))
        pending, self._pending = self._pending, {}
        for done in pending.values():
            done("the Kafka bridge exited")

    def _write(self, obj: dict[str, Any]) -> None:
        with self._lock:
            self.sock.sendall(orjson.dumps(obj) + b"\n")

    def send(self, jobs: list[list[Any]], done: Callable[[str | None], None]) -> None:
        """Hand a batch of commands ([job id, upsert dict or None for a cancel], ...) to the
        bridge without waiting; `done(None)` once Kafka acknowledged all, else done(error)."""
        self._next_id += 1
        self._pending[self._next_id] = done
        self._write({"t": "send", "id": self._next_id, "jobs": jobs})

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._write({"t": "stop"})
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(timeout=5)
        self.sock.close()


class Run:
    """State of one locust run in this process: the bridge, counters, the lateness probe."""

    def __init__(self, environment: Environment, settings: Settings) -> None:
        o = environment.parsed_options
        self.env = environment
        self.settings = settings
        self.namespace = settings.namespace
        self.rate: float = o.cw_rate if o else 20.0
        batch = int(o.cw_batch) if o and o.cw_batch else 0
        self.batch = batch if batch > 0 else max(1, math.ceil(self.rate / BATCHES_PER_S))
        self.lead_ms: float = (o.cw_lead_s if o else 10.0) * 1000
        self.max_jobs: int = o.cw_max_jobs if o else 500_000
        self.max_runtime_s: float = o.cw_max_runtime_s if o else 900.0
        self.end_ms: float | None = None
        self.begun = False
        self.prefix = f"lc{int(time.time())}-{os.getpid()}."
        self.seq = 0
        self.submitted = 0
        self.submit_failed = 0
        self.first_submit_ms: float | None = None
        self.last_submit_ms: float | None = None
        self.submitting = True
        self.expected: set[str] = set()  # occurrences due before the end of the run
        self.received = LatenessTally()  # by the read_committed probe
        self.early_fired = 0
        self.early_received = 0
        self.worker = bool(o.cw_worker) if o else False
        self.started = LatenessTally()  # handler starts, with --cw-worker
        self.early_started = 0
        self.offsets: list[list[int]] = []
        self.cap_logged = False
        self.horizon_ids: list[str] = []
        self.stopped_ms = now_ms()
        self.in_flight = BoundedSemaphore(MAX_BATCHES_IN_FLIGHT)
        self.bridge = KafkaBridge(settings, self.prefix, self.on_fires, self.on_starts,
                                  self.on_skew, self.worker)
        self.cluster = self.bridge.wait_ready()
        self.tap: Any = None
        """the capacity test's per-step accounting (locust_capacity.py), or None: told of
        each batch sent (`sent`, which returns a token), acknowledged (`acked`) and of each
        occurrence received (`fired`)"""

    def begin(self, end_ms: float | None) -> None:
        """The test starts; it ends at end_ms (None: when stopped)."""
        self.begun = True
        self.end_ms = end_ms

    def new_id(self, scenario: str) -> str:
        self.seq += 1
        return f"{self.prefix}{scenario}.{self.seq}"

    def may_submit(self, due_ms: float | None) -> bool:
        if not self.submitting:
            return False
        if self.submitted >= self.max_jobs:
            if not self.cap_logged:
                self.cap_logged = True
                print(f"chronowheel: --cw-max-jobs {self.max_jobs} reached; no more submits",
                      file=sys.stderr)
            return False
        return due_ms is None or self.end_ms is None or due_ms <= self.end_ms - END_MARGIN_MS

    def submit(self, scenario: str, jobs: Sequence[Command]) -> None:
        """Send a batch of commands without waiting for Kafka; its acknowledgement is
        reported when it comes. Waits only while MAX_BATCHES_IN_FLIGHT batches of this
        process wait for theirs."""
        if not jobs:
            return
        self.in_flight.acquire()
        t0 = time.perf_counter()
        sent_ms = now_ms()
        if self.first_submit_ms is None:
            self.first_submit_ms = sent_ms
        self.last_submit_ms = sent_ms
        self.submitted += len(jobs)
        tap = self.tap
        token = None if tap is None else tap.sent(jobs)

        def done(err: str | None) -> None:
            self.in_flight.release()
            elapsed = (time.perf_counter() - t0) * 1000
            exc = None if err is None else RuntimeError(err)
            if err is None:
                self.expected.update(occ for _, _, occ in jobs if occ is not None)
            else:
                self.submit_failed += len(jobs)
            if tap is not None:
                tap.acked(token, jobs, err)
            fire = events.request.fire
            for _ in jobs:
                fire(request_type="submit", name=scenario, response_time=elapsed,
                     response_length=0, exception=exc, context={})

        self.bridge.send([[jid, spec] for jid, spec, _ in jobs], done)

    def on_skew(self, skew_ms: int, uncertainty_ms: int) -> None:
        self.offsets.append([skew_ms, uncertainty_ms])

    def on_fires(self, items: list[list[Any]]) -> None:
        fire = events.request.fire
        tally = self.received
        for occurrence, scheduled, fired, received, skew, uncertainty in items:
            at = received - skew  # the receive time on Cassandra's clock
            late = at - scheduled
            exc: Exception | None = None
            duplicate = not tally.observe(occurrence, scheduled, at, fired_ms=fired)
            if duplicate:
                exc = DuplicateFire(occurrence)
            if fired < scheduled:
                self.early_fired += 1
                exc = EarlyFire(f"{occurrence}: cw-fired-at {fired - scheduled} ms")
            elif late + uncertainty < 0:
                self.early_received += 1
                exc = EarlyFire(f"{occurrence}: received {late:.1f} ms (± {uncertainty} ms)")
            if self.tap is not None:
                self.tap.fired(occurrence, late, fired - scheduled, duplicate,
                               isinstance(exc, EarlyFire))
            fire(request_type="fire", name="lateness, received", response_time=max(0.0, late),
                 response_length=0, exception=exc, context={})
            fire(request_type="fire", name="lateness, cw-fired-at",
                 response_time=max(0, fired - scheduled), response_length=0, exception=None,
                 context={})

    def on_starts(self, items: list[list[Any]]) -> None:
        fire = events.request.fire
        tally = self.started
        for occurrence, scheduled, started, skew, uncertainty in items:
            at = started - skew
            late = at - scheduled
            exc: Exception | None = None
            if not tally.observe(occurrence, scheduled, at):
                exc = DuplicateFire(f"{occurrence} handled twice")
            if late + uncertainty < 0:
                self.early_started += 1
                exc = EarlyFire(f"{occurrence} handler started {late:.1f} ms after its time")
            fire(request_type="handler", name="start lateness", response_time=max(0.0, late),
                 response_length=0, exception=exc, context={})

    def _overdue(self, tally: LatenessTally, at_ms: float) -> set[str]:
        """Expected occurrences due by at_ms that the tally has not seen."""
        return {o for o in self.expected - tally.seen.keys()
                if int(o.rsplit("@", 1)[1]) <= at_ms}

    def _tallies(self) -> list[LatenessTally]:
        return [self.received, self.started] if self.worker else [self.received]

    def drain(self) -> None:
        """Stop submitting; give the batches in flight and the occurrences due by now a
        bounded time to arrive (and be handled, with --cw-worker). Once."""
        if not self.submitting:
            return
        self.submitting = False
        self.stopped_ms = now_ms()
        deadline = time.monotonic() + DRAIN_S
        while ((self.bridge.in_flight
                or any(self._overdue(t, self.stopped_ms) for t in self._tallies()))
               and time.monotonic() < deadline):
            gevent.sleep(0.1)

    def _counts(self, tally: LatenessTally) -> dict[str, int]:
        overdue = len(self._overdue(tally, self.stopped_ms))
        return {"missing": overdue,
                "not_yet_due": len(self.expected - tally.seen.keys()) - overdue,
                "duplicates": tally.duplicates}

    def part(self) -> dict[str, Any]:
        """What this process measured, for `locust_support.summarize`."""
        g = self.received.group()
        out: dict[str, Any] = {
            "prefix": self.prefix, "submitted": self.submitted,
            "submit_failed": self.submit_failed, "expected_fires": len(self.expected),
            "received": self.received.distinct, **self._counts(self.received),
            "early_fired": self.early_fired, "early_received": self.early_received,
            "first_submit_ms": self.first_submit_ms, "last_submit_ms": self.last_submit_ms,
            "lateness_ms": [round(x, 2) for x in g.lateness_ms],
            "fired_lateness_ms": g.fired_lateness_ms, "offsets": self.offsets}
        if self.worker:
            out["handler"] = {"started": self.started.distinct, **self._counts(self.started),
                              "early": self.early_started,
                              "lateness_ms": [round(x, 2) for x in self.started.lateness_ms()]}
        return out


RUN: Run | None = None
PREPARING: Greenlet | None = None  # the Run being started before the test (its bridge)
PARTS: dict[str, dict[str, Any]] = {}  # on a master: each worker's part, by worker id
READY: dict[str, bool] = {}  # on a master: whether each worker's bridge started, by worker id
RUN_END_MS: float | None = None  # when locust's -t timer fires


def _settings(environment: Environment) -> Settings | None:
    """The cluster to load, checked: None (and the reason printed) when it may not be."""
    o = environment.parsed_options
    settings = support.resolve(o)
    why = support.refusal(settings, support.remote_allowed(o))
    if why is not None:
        print(f"chronowheel: {why}", file=sys.stderr)
        return None
    return settings


def _start_run(environment: Environment, settings: Settings) -> Run | None:
    """A Run with its bridge ready, or None (the reason printed)."""
    try:
        return Run(environment, settings)
    except Exception as exc:
        print(f"chronowheel: cannot load {support.describe(settings)}: {exc}", file=sys.stderr)
        return None


@events.init.add_listener
def _on_init(environment: Environment, **_kw: Any) -> None:
    """Check and print the cluster; start the bridge before the test, so that its start (a
    few seconds: Kafka, Cassandra, the clock offset) does not count in -t."""
    global PREPARING, RUN, RUN_END_MS
    runner = environment.runner
    o = environment.parsed_options
    if isinstance(runner, WorkerRunner):
        runner.register_message("cw_drain", _on_drain, concurrent=True)
        # The master's options come with the test: checked again then, and the bridge
        # started again if they name another cluster.
        settings = support.resolve(o)
        allowed = support.refusal(settings, support.remote_allowed(o)) is None
        PREPARING = gevent.spawn(_prepare_worker, runner, environment, settings if allowed
                                 else None)
        return
    if isinstance(runner, MasterRunner):
        runner.register_message("cw_part", _on_part)
        runner.register_message("cw_ready", _on_ready)
    settings = support.resolve(o)
    why = support.refusal(settings, support.remote_allowed(o))
    if why is not None:
        print(f"chronowheel: the cluster: {support.describe(settings)}\nchronowheel: {why}",
              file=sys.stderr)
        raise SystemExit(2)
    print(f"chronowheel: about to load {support.describe(settings)}", file=sys.stderr)
    if isinstance(runner, MasterRunner):
        _await_workers(environment)
        return  # the workers submit and measure; the master aggregates
    RUN = _start_run(environment, settings)
    if RUN is None:
        raise SystemExit(2)
    run_time = getattr(o, "run_time", None) if o else None
    if run_time:
        # locust's -t timer is set from the event loop's clock as it was when the loop last
        # ran (now: nothing yields from here to the timer), not from the wall clock.
        RUN_END_MS = (gevent.get_hub().loop.now() + float(run_time)) * 1000


def _prepare_worker(runner: WorkerRunner, environment: Environment,
                    settings: Settings | None) -> Run | None:
    """A worker's Run, started before the test; the master hears when it is ready. (None
    settings: refused with the worker's own options; the master's may differ.)"""
    run = None if settings is None else _start_run(environment, settings)
    runner.send_message("cw_ready", {"ok": settings is None or run is not None})
    return run


def _await_workers(environment: Environment) -> None:
    """On a headless master: wait until the expected workers' bridges are ready, so that
    their start does not count in -t (the timer is set after this event)."""
    o = environment.parsed_options
    expect = int(getattr(o, "expect_workers", 0) or 0) if o else 0
    if not (o and o.headless and expect):
        return
    deadline = time.monotonic() + max(120.0, float(o.expect_workers_max_wait or 0))
    while len(READY) < expect and time.monotonic() < deadline:
        gevent.sleep(0.1)
    failed = sum(1 for ok in READY.values() if not ok)
    if failed:
        print(f"chronowheel: {failed} worker(s) could not reach the cluster (their output "
              f"says why)", file=sys.stderr)
        raise SystemExit(2)


def _on_ready(environment: Environment, msg: Any, **_kw: Any) -> None:
    READY[str(msg.node_id)] = bool(msg.data.get("ok"))


def _on_part(environment: Environment, msg: Any, **_kw: Any) -> None:
    PARTS[str(msg.node_id)] = msg.data


def _on_drain(environment: Environment, msg: Any, **_kw: Any) -> None:
    """On a worker, asked by the master as the run stops: drain, report the figures."""
    run = RUN
    runner = environment.runner
    if run is None or not isinstance(runner, WorkerRunner):
        return
    run.drain()
    runner._send_stats()  # the fires counted while draining, ahead of the part
    runner.send_message("cw_part", run.part())


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kw: Any) -> None:
    global PREPARING, RUN
    runner = environment.runner
    o = environment.parsed_options
    if isinstance(runner, MasterRunner):
        PARTS.clear()
        run_time = getattr(o, "run_time", None) if o else None
        if o is not None and run_time:
            # sent to the workers with the other custom options: they do not know -t
            o.cw_end_ms = now_ms() + float(run_time) * 1000
        gevent.spawn(_guard, environment)
        return
    settings = _settings(environment)
    if settings is None:
        _give_up(environment)
        return
    if PREPARING is not None:
        RUN, PREPARING = PREPARING.get(), None
    if RUN is None or RUN.settings != settings or RUN.begun:
        if RUN is not None:
            RUN.bridge.close()
        RUN = _start_run(environment, settings)
        if RUN is None:
            _give_up(environment)
            return
    worker = isinstance(runner, WorkerRunner)
    RUN.begin(getattr(o, "cw_end_ms", None) if worker else RUN_END_MS)
    print(f"chronowheel: run prefix {RUN.prefix}, {RUN.batch} jobs per batch, namespace "
          f"{RUN.namespace}", file=sys.stderr)
    if not worker:
        gevent.spawn(_guard, environment)


def _give_up(environment: Environment) -> None:
    """End the run with exit status 2 (from a greenlet of its own: this may be the one that
    quit() stops)."""
    environment.process_exit_code = 2
    if environment.runner is not None:
        gevent.spawn(environment.runner.quit)


def _guard(environment: Environment) -> None:
    o = environment.parsed_options
    limit = float(o.cw_max_runtime_s) if o else 900.0
    gevent.sleep(limit)
    if environment.runner is not None:
        print(f"chronowheel: --cw-max-runtime-s {limit:.0f} reached; stopping", file=sys.stderr)
        environment.runner.quit()


@events.test_stopping.add_listener
def _on_test_stopping(environment: Environment, **_kw: Any) -> None:
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        # Every worker drains and sends its figures before the master stops them.
        workers = {c.id for c in runner.clients.all}
        runner.send_message("cw_drain")
        deadline = time.monotonic() + DRAIN_S + 15
        while not workers <= PARTS.keys() and time.monotonic() < deadline:
            gevent.sleep(0.1)
        if not workers <= PARTS.keys():
            print(f"chronowheel: no figures from {len(workers - PARTS.keys())} worker(s)",
                  file=sys.stderr)
    elif RUN is not None and not isinstance(runner, WorkerRunner):
        RUN.drain()


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_kw: Any) -> None:
    global RUN
    runner = environment.runner
    run, RUN = RUN, None
    if isinstance(runner, MasterRunner):
        parts = list(PARTS.values())
    elif run is None:
        return
    else:
        run.drain()  # at once when already drained
        parts = [run.part()]
        run.bridge.close()
        if isinstance(runner, WorkerRunner):
            return  # the master reports
    if not parts:
        return
    summary = {"namespace": support.resolve(environment.parsed_options).namespace,
               "prefixes": [p["prefix"] for p in parts], **support.summarize(parts)}
    print("chronowheel summary: " + json.dumps(summary), file=sys.stderr)
    o = environment.parsed_options
    csv_prefix = getattr(o, "csv_prefix", None) if o else None
    if csv_prefix:
        Path(f"{csv_prefix}_chronowheel.json").write_text(json.dumps(summary, indent=2) + "\n")


class _Submitter(User):
    """A user that submits --cw-batch jobs at a time, paced to --cw-rate jobs per second
    (fixed pacing, no bursts)."""

    abstract = True

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self._next = time.monotonic()

    def wait_time(self) -> float:
        run = RUN
        interval = 1.0 if run is None else run.batch / run.rate
        self._next = max(self._next + interval, time.monotonic())
        return max(0.0, self._next - time.monotonic())

    def run_state(self) -> Run | None:
        return RUN


class SteadyUser(_Submitter):
    @tag("steady")
    @task
    def steady(self) -> None:
        run = self.run_state()
        if run is None:
            return
        first = now_ms() + run.lead_ms
        step_ms = 1000 / run.rate  # the batch's jobs fall due spread as if sent one by one
        jobs: list[Command] = []
        for i in range(run.batch):
            due = int(first + i * step_ms)
            if not run.may_submit(due):
                break
            jid = run.new_id("steady")
            jobs.append((jid, {"id": jid, "at": due,
                               "payload": {"scenario": "steady", "pad": PAD}}, f"{jid}@{due}"))
        run.submit("steady", jobs)


class HerdUser(_Submitter):
    @tag("herd")
    @task
    def herd(self) -> None:
        run = self.run_state()
        if run is None:
            return
        earliest = now_ms() + run.lead_ms
        due = int((earliest // MINUTE_MS + 1) * MINUTE_MS)
        if not run.may_submit(due):
            return
        jobs: list[Command] = []
        for _ in range(run.batch):
            jid = run.new_id("herd")
            jobs.append((jid, {"id": jid, "at": due,
                               "payload": {"scenario": "herd", "pad": PAD}}, f"{jid}@{due}"))
        run.submit("herd", jobs)


class LongHorizonUser(_Submitter):
    @tag("horizon")
    @task
    def horizon(self) -> None:
        run = self.run_state()
        if run is None or not run.may_submit(None):
            return
        jobs: list[Command] = []
        cancels: list[Command] = []
        for _ in range(run.batch):
            if run.horizon_ids and random.random() < 0.1:
                jid = run.horizon_ids.pop(random.randrange(len(run.horizon_ids)))
                cancels.append((jid, None, None))
                continue
            due = int(now_ms() + random.uniform(1, 365) * 86_400_000)
            jid = run.new_id("horizon")
            jobs.append((jid, {"id": jid, "at": due,
                               "payload": {"scenario": "horizon", "pad": PAD}}, None))
        run.submit("horizon", jobs)
        run.submit("cancel", cancels)
        # cancels pick among jobs of earlier batches, whose upserts went to Kafka first
        room = 10_000 - len(run.horizon_ids)
        run.horizon_ids.extend(jid for jid, _, _ in jobs[:max(0, room)])
