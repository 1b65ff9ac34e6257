"""Locust scenarios for chronowheel: users submit jobs through Kafka, a probe reports lateness.

Prerequisites: the local stack is up, the namespace is initialised and at least one node runs
(see loadtest/README.md). Then, for example:

  .venv/bin/locust -f loadtest/locustfile.py --headless -u 20 -r 10 -t 60s \
      --cw-namespace loadtest --csv loadtest/results/locust SteadyUser HerdUser

User classes (pick them on the command line; all three run when none is named), each with a
tag of the same scenario name (`--tags steady` etc. work too):
  SteadyUser       `steady`   one-shot jobs due --cw-lead-s seconds after submission, at
                              --cw-rate jobs/s per user: a steady firing rate
  HerdUser         `herd`     jobs all due at the next top of a minute at least --cw-lead-s
                              ahead: a top-of-minute herd
  LongHorizonUser  `horizon`  jobs due 1 to 365 days ahead, and cancels of some of them: ingest
                              and storage load that never fires during the run

Statistics: request type `submit` (name = scenario) is the time until Kafka acknowledged the
command; request type `fire`, name `lateness`, is each occurrence's lateness as seen by a
read_committed consumer (receive time - cw-scheduled-at), and name `lateness (cw-fired-at)` is
cw-fired-at - cw-scheduled-at. With --cw-worker, request type `handler`, name `start lateness`,
is when chronowheel's Worker (default settings, run beside the probe) started the handler of
each occurrence - cw-scheduled-at: what a user's handler sees. An occurrence received or
handled before its scheduled instant, or twice, is a failure. Only jobs of this run (their ids
start with the run's prefix) are measured.

Bounds: every user submits at a fixed rate; no job is submitted that is due after the end of a
`-t` run (so every submitted occurrence can be measured before the run ends); the whole run
stops after --cw-max-runtime-s and submitting stops after --cw-max-jobs. Kafka must be a
loopback address.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import orjson
from chronowheel.core.model import encode_cancel, encode_upsert
from chronowheel.testing import LatenessTally, require_loopback
from gevent.event import AsyncResult
from gevent.lock import Semaphore
from locust import User, events, tag, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

HERE = Path(__file__).resolve().parent
BRIDGE = HERE / "kafka_bridge.py"
PAD = "x" * 48
MINUTE_MS = 60_000
# Jobs due this close to the end of a -t run are not submitted: they could not be measured.
END_MARGIN_MS = 3_000
DRAIN_S = 10.0


def now_ms() -> float:
    return time.time_ns() / 1e6


class EarlyFire(Exception):
    pass


class DuplicateFire(Exception):
    pass


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--cw-namespace", default=os.environ.get("CHRONOWHEEL_NAMESPACE",
                                                                 "loadtest"),
                        help="chronowheel namespace (initialised, with a node running)")
    parser.add_argument("--cw-kafka", default=os.environ.get("CHRONOWHEEL_KAFKA",
                                                             "127.0.0.1:9092"),
                        help="Kafka bootstrap servers; loopback only")
    parser.add_argument("--cw-rate", type=float, default=20.0,
                        help="jobs per second per user")
    parser.add_argument("--cw-lead-s", type=float, default=10.0,
                        help="steady: due this long after submission; herd: minimum lead")
    parser.add_argument("--cw-max-jobs", type=int, default=500_000,
                        help="stop submitting after this many jobs in the run")
    parser.add_argument("--cw-max-runtime-s", type=float, default=900.0,
                        help="stop the whole run after this long, whatever -t says")
    parser.add_argument("--cw-worker", action="store_true",
                        help="also run chronowheel's Worker (default settings) and report its "
                             "handler's start lateness as request type `handler`")
    parser.add_argument("--cw-cassandra", default=os.environ.get("CHRONOWHEEL_CASSANDRA",
                                                                 "127.0.0.1:9042"),
                        help="Cassandra of the namespace, for --cw-worker; loopback only")


class KafkaBridge:
    """Runs kafka_bridge.py as a child process and talks to it over a socket pair."""

    def __init__(self, kafka: str, namespace: str, prefix: str,
                 on_fires: Callable[[list[list[Any]]], None],
                 on_starts: Callable[[list[list[Any]]], None],
                 worker_cassandra: str | None) -> None:
        self.on_fires = on_fires
        self.on_starts = on_starts
        self._next_id = 0
        self._pending: dict[int, AsyncResult] = {}
        self._lock = Semaphore()
        self._ready = AsyncResult()
        self.sock, child = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, str(BRIDGE), "--fd", str(child.fileno()), "--kafka", kafka,
             "--namespace", namespace, "--prefix", prefix,
             *(() if worker_cassandra is None else ("--worker", "--cassandra", worker_cassandra))],
            pass_fds=[child.fileno()], stdin=subprocess.DEVNULL)
        child.close()
        self._reader = gevent.spawn(self._read)

    def wait_ready(self, timeout: float = 60) -> None:
        self._ready.get(timeout=timeout)

    def _read(self) -> None:
        f = self.sock.makefile("rb")
        for line in f:
            msg = orjson.loads(line)
            kind = msg["t"]
            if kind == "ack":
                res = self._pending.pop(msg["id"], None)
                if res is not None:
                    res.set(msg["err"])
            elif kind == "fires":
                self.on_fires(msg["items"])
            elif kind == "starts":
                self.on_starts(msg["items"])
            elif kind == "ready":
                self._ready.set(msg)
            elif kind == "error":
                self._ready.set_exception(RuntimeError(msg["err"]))
        if not self._ready.ready():
            self._ready.set_exception(RuntimeError("the Kafka bridge exited"))
        for res in self._pending.values():
            res.set("the Kafka bridge exited")
        self._pending.clear()

    def _write(self, obj: dict[str, Any]) -> None:
        with self._lock:
            self.sock.sendall(orjson.dumps(obj) + b"\n")

    def send(self, key: str, value: bytes, timeout: float = 30) -> str | None:
        """Send one command to <ns>.submit; returns None once acknowledged, else the error."""
        self._next_id += 1
        req_id = self._next_id
        res = AsyncResult()
        self._pending[req_id] = res
        self._write({"t": "send", "id": req_id, "k": key, "v": value.decode()})
        try:
            err: str | None = res.get(timeout=timeout)
            return err
        except gevent.Timeout:
            self._pending.pop(req_id, None)
            return f"no acknowledgement within {timeout}s"

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

    def __init__(self, environment: Environment) -> None:
        o = environment.parsed_options
        self.env = environment
        self.namespace: str = o.cw_namespace if o else "loadtest"
        self.kafka: str = o.cw_kafka if o else "127.0.0.1:9092"
        self.rate: float = o.cw_rate if o else 20.0
        self.lead_ms: float = (o.cw_lead_s if o else 10.0) * 1000
        self.max_jobs: int = o.cw_max_jobs if o else 500_000
        self.max_runtime_s: float = o.cw_max_runtime_s if o else 900.0
        run_time = getattr(o, "run_time", None) if o else None
        self.started_ms = now_ms()
        self.end_ms: float | None = self.started_ms + float(run_time) * 1000 if run_time \
            else None
        self.prefix = f"lc{int(time.time())}-{os.getpid()}."
        self.seq = 0
        self.submitted = 0
        self.expected: set[str] = set()  # occurrences due before the end of the run
        self.received = LatenessTally()  # by the read_committed probe
        self.worker = bool(o.cw_worker) if o else False
        self.started = LatenessTally()  # handler starts, with --cw-worker
        self.cap_logged = False
        self.horizon_ids: list[str] = []
        self.stopped_ms = self.started_ms
        require_loopback("--cw-kafka", self.kafka)
        cassandra: str | None = None
        if self.worker:
            cassandra = o.cw_cassandra if o else "127.0.0.1:9042"
            require_loopback("--cw-cassandra", cassandra)
        self.bridge = KafkaBridge(self.kafka, self.namespace, self.prefix, self.on_fires,
                                  self.on_starts, cassandra)
        self.bridge.wait_ready()

    def new_id(self, scenario: str) -> str:
        self.seq += 1
        return f"{self.prefix}{scenario}.{self.seq}"

    def may_submit(self, due_ms: float | None) -> bool:
        if self.submitted >= self.max_jobs:
            if not self.cap_logged:
                self.cap_logged = True
                print(f"chronowheel: --cw-max-jobs {self.max_jobs} reached; no more submits",
                      file=sys.stderr)
            return False
        return due_ms is None or self.end_ms is None or due_ms <= self.end_ms - END_MARGIN_MS

    def submit(self, scenario: str, job_id: str, value: bytes,
               occurrence: str | None = None) -> None:
        t0 = time.perf_counter()
        err = self.bridge.send(job_id, value)
        self.submitted += 1
        if err is None and occurrence is not None:
            self.expected.add(occurrence)
        events.request.fire(request_type="submit", name=scenario,
                            response_time=(time.perf_counter() - t0) * 1000,
                            response_length=len(value),
                            exception=None if err is None else RuntimeError(err), context={})

    def on_fires(self, items: list[list[Any]]) -> None:
        fire = events.request.fire
        tally = self.received
        for occurrence, scheduled, fired, received in items:
            late = received - scheduled
            early_before = tally.early
            exc: Exception | None = None
            if not tally.observe(occurrence, scheduled, received, fired_ms=fired):
                exc = DuplicateFire(occurrence)
            if tally.early > early_before:
                exc = EarlyFire(f"{occurrence} received {late:.1f} ms, fired "
                                f"{fired - scheduled} ms")
            fire(request_type="fire", name="lateness", response_time=max(0.0, late),
                 response_length=0, exception=exc, context={})
            fire(request_type="fire", name="lateness (cw-fired-at)",
                 response_time=max(0, fired - scheduled), response_length=0, exception=None,
                 context={})

    def on_starts(self, items: list[list[Any]]) -> None:
        fire = events.request.fire
        tally = self.started
        for occurrence, scheduled, started in items:
            late = started - scheduled
            early_before = tally.early
            exc: Exception | None = None
            if not tally.observe(occurrence, scheduled, started):
                exc = DuplicateFire(f"{occurrence} handled twice")
            if tally.early > early_before:
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
        """After the users stopped: give occurrences due by now a bounded time to arrive (and
        be handled, with --cw-worker)."""
        self.stopped_ms = now_ms()
        deadline = time.monotonic() + DRAIN_S
        while (any(self._overdue(t, self.stopped_ms) for t in self._tallies())
               and time.monotonic() < deadline):
            gevent.sleep(0.1)

    def _figures(self, tally: LatenessTally) -> dict[str, Any]:
        overdue = len(self._overdue(tally, self.stopped_ms))
        lateness = {k: None if v is None else round(v, 1)
                    for k, v in tally.summary().items() if k != "n"}
        return {"missing": overdue,
                "not_yet_due": len(self.expected - tally.seen.keys()) - overdue,
                "duplicates": tally.duplicates, "early": tally.early, "lateness_ms": lateness}

    def summary(self) -> dict[str, Any]:
        out = {"prefix": self.prefix, "namespace": self.namespace, "submitted": self.submitted,
               "expected_fires": len(self.expected), "received": self.received.distinct,
               **self._figures(self.received)}
        if self.worker:
            out["handler_start"] = {"started": self.started.distinct,
                                    **self._figures(self.started)}
        return out


RUN: Run | None = None


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kw: Any) -> None:
    global RUN
    if isinstance(environment.runner, MasterRunner):
        return  # the workers submit and measure; the master aggregates
    RUN = Run(environment)
    print(f"chronowheel: run prefix {RUN.prefix}, namespace {RUN.namespace}, Kafka {RUN.kafka}",
          file=sys.stderr)

    def guard(run: Run) -> None:
        gevent.sleep(run.max_runtime_s)
        if environment.runner is not None:
            print(f"chronowheel: --cw-max-runtime-s {run.max_runtime_s:.0f} reached; stopping",
                  file=sys.stderr)
            environment.runner.quit()

    gevent.spawn(guard, RUN)


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_kw: Any) -> None:
    global RUN
    run, RUN = RUN, None
    if run is None:
        return
    run.drain()
    summary = run.summary()
    run.bridge.close()
    print("chronowheel lateness summary: " + json.dumps(summary), file=sys.stderr)
    o = environment.parsed_options
    csv_prefix = getattr(o, "csv_prefix", None) if o else None
    if csv_prefix:
        worker = environment.runner.worker_index \
            if isinstance(environment.runner, WorkerRunner) else None
        suffix = "" if worker is None else f"_worker{worker}"
        Path(f"{csv_prefix}_chronowheel{suffix}.json").write_text(
            json.dumps(summary, indent=2) + "\n")


class _Submitter(User):
    """A user that runs its task at --cw-rate per second (fixed pacing, no bursts)."""

    abstract = True

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self._next = time.monotonic()

    def wait_time(self) -> float:
        rate = RUN.rate if RUN is not None else 1.0
        self._next = max(self._next + 1.0 / rate, time.monotonic())
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
        due = int(now_ms() + run.lead_ms)
        if not run.may_submit(due):
            return
        jid = run.new_id("steady")
        run.submit("steady", jid, encode_upsert(
            {"id": jid, "at": due, "payload": {"scenario": "steady", "pad": PAD}}),
            occurrence=f"{jid}@{due}")


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
        jid = run.new_id("herd")
        run.submit("herd", jid, encode_upsert(
            {"id": jid, "at": due, "payload": {"scenario": "herd", "pad": PAD}}),
            occurrence=f"{jid}@{due}")


class LongHorizonUser(_Submitter):
    @tag("horizon")
    @task
    def horizon(self) -> None:
        run = self.run_state()
        if run is None or not run.may_submit(None):
            return
        if run.horizon_ids and random.random() < 0.1:
            jid = run.horizon_ids.pop(random.randrange(len(run.horizon_ids)))
            run.submit("cancel", jid, encode_cancel(jid))
            return
        due = int(now_ms() + random.uniform(1, 365) * 86_400_000)
        jid = run.new_id("horizon")
        run.submit("horizon", jid, encode_upsert(
            {"id": jid, "at": due, "payload": {"scenario": "horizon", "pad": PAD}}))
        if len(run.horizon_ids) < 10_000:
            run.horizon_ids.append(jid)
