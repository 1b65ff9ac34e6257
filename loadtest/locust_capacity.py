"""The capacity test: the locust kit (locustfile.py) with a load shape that raises the rate step
by step until the SLO breaks, then reports the knee and records it for `chronowheel capacity`.

  .venv/bin/locust -f loadtest/locust_capacity.py --headless -u 10 --namespace loadtest \\
      --cw-nodes 1 --cw-slo 'p99<100ms' --cw-mix steady=80,herd=10,horizon=8,cancel=2 \\
      --cw-step-start 500 --cw-step-factor 1.5 --cw-step-max 20000 --cw-step-s 60

Each step sends --cw-step-start × --cw-step-factor^k commands per second (or the rates of
--cw-steps) for --cw-step-s seconds, in the proportions of --cw-mix: steady one-shot jobs due
--cw-lead-s after they are sent, herd jobs all due at the next multiple of --cw-herd-every-s
(60: the top of each minute) at least --cw-lead-s ahead, long-horizon jobs due 1 to 365 days
ahead, and cancels of some of those. -u users (default 10) share the rate. A warm-up of
--cw-warmup-s (30 s) at the first step's rate comes first: a cluster's first seconds of load
are slower than its steady state (fresh connections, caches and compiled code), so the
warm-up's lateness is not judged; a lost, early or duplicate occurrence in it stops the run
as in any step.

A step's jobs are its own: its occurrences are judged once the last of them was due
--cw-grace-s ago (a herd step's up to a minute after the step), while the next steps run. A step
holds when its p-th percentile of lateness (receive time on Cassandra's clock -
cw-scheduled-at, as `lateness, received` of the kit) is within the SLO's bound and none of its
occurrences was early, a duplicate or missing, no submit failed, and it sent at least 90 % of
its rate (else the load generator, not the cluster, was the limit). Loading stops at the first
step that does not hold (or after the last step); the run ends once every step before it is
judged. The knee is the last step that held before the first that did not.

The report (stderr, `capacity: ...`) gives the knee's rate, fires per second, p50/p99/max of
both lateness measures (received, on Cassandra's clock, and cw-fired-at, the node's), and every
step's figures; the record, with the cluster's size (--cw-nodes scheduler nodes, the
namespace's shards, the Cassandra nodes and Kafka brokers the clients see, or
--cw-cassandra-nodes / --cw-kafka-nodes), the date, the code version (git describe) and the
command, is appended to --cw-knee-file (loadtest/results/knees.json), which `chronowheel
capacity --cluster nodes=N,shards=S,cassandra=C,kafka=K` reads. One locust process only (about
5,000 commands/s; the distributed mode is not supported by this shape yet).
"""

from __future__ import annotations

import math
import random
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gevent
from locust import LoadTestShape, User, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capacity_steps as steps  # beside this file, free of locust
import locust_support as support

DEFAULT_USERS = 10
TICKS_PER_S = 20  # batches per second per user and kind
SETTLE_EXTRA_S = 15.0  # beyond the last due instant + grace, before giving up on judging


OPTIONS: support.Options = {
    "--cw-slo": ("p99<100ms", "the SLO a step must hold: pNN<BOUND of lateness (received), "
                              "e.g. p99<250ms; any early, duplicate or missing occurrence "
                              "breaks it too"),
    "--cw-mix": ("steady=80,herd=10,horizon=8,cancel=2",
                 "shares of the commands: steady, herd, horizon, cancel"),
    "--cw-steps": ("", "the steps' rates, commands/s (e.g. 500,1000,2000); else start, factor "
                       "and ceiling below"),
    "--cw-step-start": (500.0, "first step, commands/s"),
    "--cw-step-factor": (1.5, "each step's rate over the previous"),
    "--cw-step-max": (20_000.0, "the rate ceiling: no step above it"),
    "--cw-step-s": (60.0, "how long each step lasts"),
    "--cw-warmup-s": (30.0, "a warm-up at the first step's rate before it, judged like a step "
                            "except for lateness (0: none)"),
    "--cw-herd-every-s": (60.0, "herd jobs fall due at the next multiple of this (60: top of "
                                "minute)"),
    "--cw-grace-s": (5.0, "a step is judged this long after its last occurrence was due"),
    "--cw-nodes": (0, "scheduler nodes serving the namespace (recorded with the knee)"),
    "--cw-cassandra-nodes": (0, "Cassandra nodes (default: as many as the driver sees)"),
    "--cw-kafka-nodes": (0, "Kafka brokers (default: as many as the producer sees)"),
    "--cw-knee-file": (str(steps.KNEES_FILE), "the knees file the record is appended to "
                                              "(chronowheel capacity reads it)"),
}


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    support.add_options(parser.add_argument_group("capacity test (locust_capacity.py)"),
                        OPTIONS)


def _check(environment: Environment) -> str | None:
    """Why the capacity test cannot run with these options (None: it can)."""
    o = environment.parsed_options
    if isinstance(environment.runner, MasterRunner | WorkerRunner):
        return "the capacity shape runs in one locust process (no --processes, master or worker)"
    if o is None or o.cw_nodes < 1:
        return "--cw-nodes N: how many scheduler nodes serve the namespace (kept with the knee)"
    try:
        steps.parse_slo(o.cw_slo)
        steps.parse_mix(o.cw_mix)
        steps.step_rates(o.cw_steps, o.cw_step_start, o.cw_step_factor, o.cw_step_max)
    except ValueError as exc:
        return str(exc)
    if o.cw_step_s <= 0 or o.cw_herd_every_s <= 0 or o.cw_grace_s < 0 or o.cw_warmup_s < 0:
        return "--cw-step-s and --cw-herd-every-s must be positive, --cw-grace-s and " \
               "--cw-warmup-s not negative"
    return None


# before the kit's: refuse bad options before its bridge connects to the cluster
@events.init.add_listener
def _on_init(environment: Environment, **_kw: Any) -> None:
    why = _check(environment)
    if why is not None:
        print(f"chronowheel: capacity: {why}", file=sys.stderr)
        raise SystemExit(2)


import locustfile as kit  # noqa: E402  the kit: its options, bridge, probe and summary


def _code_version() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parent, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Capacity:
    """The ladder under way: steps by time, the Run's tap (each batch and occurrence is
    counted to the step that sent it), judgement when each step's time comes."""

    def __init__(self, environment: Environment, run: kit.Run) -> None:
        o: Any = environment.parsed_options  # checked by _check before the test
        self.env = environment
        self.run = run
        self.slo = steps.parse_slo(o.cw_slo)
        self.mix = steps.parse_mix(o.cw_mix)
        self.rates = steps.step_rates(o.cw_steps, o.cw_step_start, o.cw_step_factor,
                                      o.cw_step_max)
        self.step_s = float(o.cw_step_s)
        self.warmup_s = float(o.cw_warmup_s)
        self.herd_every_ms = float(o.cw_herd_every_s) * 1000
        self.grace_ms = float(o.cw_grace_s) * 1000
        self.users = int(o.num_users or DEFAULT_USERS)
        fire_share = sum(self.mix[k] for k in steps.FIRING)
        self.ladder = steps.Ladder(self.rates, self.slo, fire_share)
        self.current: steps.StepStats | None = None
        self.step_started = 0.0
        self.rate = 0.0
        self.occ_step: dict[str, steps.StepStats] = {}
        self.unacked: dict[int, int] = {}
        self.ended_ms: dict[int, float] = {}
        self.stopping = False
        self.done = False
        self.settle_deadline = 0.0
        run.tap = self
        self.driver = gevent.spawn(self._drive)

    @property
    def rate_per_user(self) -> float:
        runner = self.env.runner
        users = runner.user_count if runner is not None else 0
        return self.rate / users if users else 0.0

    # --- the Run's tap ---------------------------------------------------------------------

    def sent(self, jobs: list[kit.Command]) -> steps.StepStats | None:
        step = self.current
        if step is None:
            return None
        step.sent += len(jobs)
        self.unacked[step.index] = self.unacked.get(step.index, 0) + 1
        for _, spec, occ in jobs:
            if occ is not None and spec is not None:
                self.occ_step[occ] = step
                step.last_due_ms = max(step.last_due_ms, float(spec["at"]))
        return step

    def acked(self, step: steps.StepStats | None, jobs: list[kit.Command],
              err: str | None) -> None:
        if step is None:
            return
        self.unacked[step.index] -= 1
        if err is not None:
            step.submit_failed += len(jobs)
        else:
            step.expected.update(occ for _, _, occ in jobs if occ is not None)

    def fired(self, occurrence: str, late_ms: float, fired_late_ms: float, duplicate: bool,
              early: bool) -> None:
        step = self.occ_step.get(occurrence)
        if step is not None:
            step.observe(occurrence, late_ms, fired_late_ms, duplicate, early)

    # --- the steps -------------------------------------------------------------------------

    def _end_step(self, now: float) -> None:
        step = self.current
        if step is not None:
            step.duration_s = now - self.step_started
            self.ended_ms[step.index] = kit.now_ms()
        self.current = None

    def _stop_loading(self, now: float) -> None:
        if self.current is not None and self.current.index != steps.WARMUP \
                and self.ladder.stop_loading():
            # a step cut short by an earlier one's failure is not judged
            self.ladder.steps.remove(self.current)
        self._end_step(now)
        self.rate = 0.0
        self.stopping = True
        last_due = max([s.last_due_ms for s in self.ladder.started()] + [kit.now_ms()])
        self.settle_deadline = now + max(0.0, last_due - kit.now_ms()) / 1000 \
            + self.grace_ms / 1000 + SETTLE_EXTRA_S

    def _judge_ready(self) -> None:
        now_ms = kit.now_ms()
        for step in self.ladder.started():
            if step.index in self.ladder.verdicts or step.index not in self.ended_ms:
                continue
            if self.unacked.get(step.index, 0):
                continue
            if now_ms >= max(step.last_due_ms, self.ended_ms[step.index]) + self.grace_ms:
                self.ladder.judge(step)
                f = step.figures(self.slo)
                why = self.ladder.verdicts[step.index] + (
                    [self.ladder.short[step.index]] if step.index in self.ladder.short else [])
                name = f"step {step.index}" if step.index != steps.WARMUP else \
                    "warm-up (lateness not judged)"
                print(f"capacity: {name} ({step.rate:g} commands/s, "
                      f"{f['sent_per_s']} sent/s, {f['expected_fires']} fires): "
                      f"p{self.slo.percentile:g} {f['slo_percentile_ms']} ms, max "
                      f"{f['lateness_ms']['received']['max']} ms; "
                      f"{'; '.join(why) if why else 'held'}", file=sys.stderr)

    def _drive(self) -> None:
        warm = f"a {self.warmup_s:g} s warm-up, then " if self.warmup_s > 0 else ""
        print(f"capacity: SLO {self.slo}; {warm}steps "
              f"{', '.join(f'{r:g}' for r in self.rates)} commands/s, {self.step_s:g} s each; mix "
              f"{', '.join(f'{k} {v:.0%}' for k, v in self.mix.items() if v)}", file=sys.stderr)
        while True:
            now = time.monotonic()
            if not self.stopping:
                step = self.current
                following = 0 if step is None else step.index + 1
                lasts = self.warmup_s if step is not None and step.warmup else self.step_s
                if self.ladder.stop_loading() or (step is not None and now - self.step_started
                                                  >= lasts
                                                  and following >= len(self.rates)):
                    self._stop_loading(now)
                elif step is None and self.warmup_s > 0 and self.ladder.warmup is None:
                    self.current = self.ladder.start_warmup()
                    self.step_started = now
                    self.rate = self.rates[0]
                elif step is None or now - self.step_started >= lasts:
                    self._end_step(now)
                    self.current = self.ladder.start_step(following)
                    self.step_started = now
                    self.rate = self.rates[following]
            self._judge_ready()
            if self.stopping and (self.ladder.decided() or now > self.settle_deadline):
                self.done = True
                return
            gevent.sleep(0.1)

    def record(self) -> dict[str, Any]:
        o: Any = self.env.parsed_options
        cluster = {"nodes": int(o.cw_nodes),
                   "shards": int(self.run.cluster.get("partitions") or 0),
                   "cassandra_nodes": int(o.cw_cassandra_nodes
                                          or self.run.cluster.get("cassandra_nodes") or 0),
                   "kafka_nodes": int(o.cw_kafka_nodes
                                      or self.run.cluster.get("kafka_brokers") or 0)}
        command = shlex.join(["locust", *sys.argv[1:]])
        return steps.knee_record(
            self.ladder, cluster=cluster, namespace=self.run.namespace,
            measured_on=datetime.now(UTC).isoformat(timespec="seconds"),
            code=_code_version(), command=command, mix=self.mix, step_s=self.step_s,
            lead_s=self.run.lead_ms / 1000, herd_every_s=self.herd_every_ms / 1000)


CAP: Capacity | None = None


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kw: Any) -> None:
    global CAP
    run = kit.RUN  # started by the kit's listener, which runs first
    if run is not None and CAP is None:
        CAP = Capacity(environment, run)


@events.test_stopping.add_listener
def _on_test_stopping(environment: Environment, **_kw: Any) -> None:
    """After the kit drained (its listener runs first): report the knee and record it."""
    cap = CAP
    if cap is None or cap.run is not kit.RUN:
        return
    cap.driver.kill()
    if not cap.stopping:
        cap._stop_loading(time.monotonic())
    cap._judge_ready()
    rec = cap.record()
    print(steps.describe_knee(rec), file=sys.stderr)
    if rec["knee"] is None:
        environment.process_exit_code = 1
        return
    o: Any = environment.parsed_options
    path = Path(o.cw_knee_file)
    steps.write_knee(path, rec)
    print(f"capacity: knee recorded in {path}", file=sys.stderr)


class CapacityShape(LoadTestShape):
    """-u users (default 10) for as long as the ladder runs; the rate is the step's."""

    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        o = self.runner.environment.parsed_options if self.runner is not None else None
        users = int(getattr(o, "num_users", 0) or DEFAULT_USERS)
        if CAP is not None and CAP.done:
            return None
        return users, float(max(users, 100))  # all at once


class CapacityUser(User):
    """Sends its share of the step's rate, TICKS_PER_S batches a second of each kind."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.last = time.monotonic()
        self.credit = dict.fromkeys(steps.KINDS, 0.0)

    def wait_time(self) -> float:
        return 1 / TICKS_PER_S

    def _take(self, kind: str, rate: float, dt: float) -> int:
        self.credit[kind] += rate * CAP.mix[kind] * dt if CAP is not None else 0.0
        n = int(self.credit[kind])
        self.credit[kind] -= n
        return n

    @task
    def load(self) -> None:
        cap, run = CAP, kit.RUN
        now = time.monotonic()
        dt, self.last = min(now - self.last, 0.5), now
        if cap is None or run is None or cap.rate <= 0 or not run.may_submit(None):
            self.credit = dict.fromkeys(steps.KINDS, 0.0)
            return
        rate = cap.rate_per_user
        start_ms = kit.now_ms()
        steady = self._take("steady", rate, dt)
        jobs: list[kit.Command] = []
        for i in range(steady):
            due = int(start_ms + run.lead_ms + i * dt * 1000 / steady)
            jid = run.new_id("steady")
            jobs.append((jid, {"id": jid, "at": due,
                               "payload": {"scenario": "steady", "pad": kit.PAD}},
                         f"{jid}@{due}"))
        run.submit("steady", jobs)
        herd = self._take("herd", rate, dt)
        every = cap.herd_every_ms
        due = int(math.ceil((start_ms + run.lead_ms) / every) * every)
        jobs = []
        for _ in range(herd):
            jid = run.new_id("herd")
            jobs.append((jid, {"id": jid, "at": due,
                               "payload": {"scenario": "herd", "pad": kit.PAD}}, f"{jid}@{due}"))
        run.submit("herd", jobs)
        jobs = []
        for _ in range(self._take("horizon", rate, dt)):
            at = int(start_ms + random.uniform(1, 365) * 86_400_000)
            jid = run.new_id("horizon")
            jobs.append((jid, {"id": jid, "at": at,
                               "payload": {"scenario": "horizon", "pad": kit.PAD}}, None))
        cancels: list[kit.Command] = []
        for _ in range(self._take("cancel", rate, dt)):
            if not run.horizon_ids:
                break
            jid = run.horizon_ids.pop(random.randrange(len(run.horizon_ids)))
            cancels.append((jid, None, None))
        run.submit("horizon", jobs)
        run.submit("cancel", cancels)
        # cancels pick among jobs of earlier batches, whose upserts went to Kafka first
        room = 10_000 - len(run.horizon_ids)
        run.horizon_ids.extend(jid for jid, _, _ in jobs[:max(0, room)])
