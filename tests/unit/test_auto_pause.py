"""Auto-pause (`pause_after_failures`) without servers: the field and the pause's new fields on
the wire, the streak as `core.runs.failure_streak` counts it, the node's conditional pause
(once per streak, whoever reports it, however often, and never from before a resume), and a
node and workers on the in-memory store and bus pausing a job that keeps failing."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from chronowheel.cli.job import describe, render
from chronowheel.cli.jobs import render as jobs_render
from chronowheel.cli.jobs import view as jobs_view
from chronowheel.core import limits, runs, wire
from chronowheel.core.model import (
    Pause,
    Retry,
    Upsert,
    ValidationPolicy,
    encode_control,
    encode_retry,
    parse_command,
)
from chronowheel.core.runs import RunRecord, failure_streak
from chronowheel.core.shard import shard_of
from chronowheel.errors import ValidationError
from chronowheel.node.service import Node
from chronowheel.store.base import DueRow, JobPage, JobQuery
from chronowheel.store.memory_history import MemoryRunHistory
from chronowheel.worker import Occurrence, Worker
from chronowheel.worker.autopause import pause_note
from chronowheel.worker.occurrence import optional_count

from tests.unit.node_rig import T0, NodeRig, scheduled_at
from tests.unit.worker_rig import WorkerRig

POLICY = ValidationPolicy()


def parse(doc: dict[str, Any]) -> Any:
    return parse_command(orjson.dumps(doc), key=None, policy=POLICY, now_ms=T0)


def refusal(doc: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        parse(doc)
    return info.value


def upsert(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "op": "upsert", "job": {"id": "j", **fields}}


# --- the wire -----------------------------------------------------------------------------------
def test_pause_after_failures_is_carried_on_every_delivery_of_a_recurring_job() -> None:
    cmd = parse(upsert(every="1m", pause_after_failures=3, max_attempts=4))
    assert isinstance(cmd, Upsert) and cmd.job.pause_after_failures == 3
    assert (wire.PAUSE_AFTER_FAILURES, "3") in cmd.job.fired_headers
    plain = parse(upsert(every="1m"))
    assert plain.job.pause_after_failures is None
    assert all(name != wire.PAUSE_AFTER_FAILURES for name, _ in plain.job.fired_headers)
    # A retry carries it to the retried delivery: the last attempt decides on the run.
    raw = encode_retry(id="j", scheduled_ms=T0, attempt=2, at_ms=T0 + 1_000,
                       topic="chronowheel.fired", payload=b"", max_attempts=4,
                       pause_after_failures=3)
    retry = parse(orjson.loads(raw))
    assert isinstance(retry, Retry) and retry.pause_after_failures == 3
    due = DueRow.for_retry(retry, shard=0, slot_ms=T0 + 1_000)
    assert (wire.PAUSE_AFTER_FAILURES, "3") in due.headers


@pytest.mark.parametrize(("raw", "count"), [
    ("3", 3), ("100", 100), (None, None), ("0", None), ("", None), ("-1", None), ("²", None),
    ("1²", None), ("٣", None), (" 3", None),
])
def test_a_delivery_s_pause_after_failures_header_is_read_in_ascii_digits_only(
        raw: str | None, count: int | None) -> None:
    """A bad header turns the auto-pause off for that record; it must never raise (a
    ValueError out of parsing one delivery) nor read another script's digits."""
    assert optional_count(raw) == count


@pytest.mark.parametrize(("fields", "path", "rule"), [
    ({"at": T0 + 1_000, "pause_after_failures": 3}, "job.pause_after_failures",
     "only allowed for recurring jobs (cron or every)"),
    ({"every": "1m", "pause_after_failures": "3"}, "job.pause_after_failures",
     "must be an integer"),
    ({"every": "1m", "pause_after_failures": 3.0}, "job.pause_after_failures",
     "must be an integer"),
    ({"every": "1m", "pause_after_failures": True}, "job.pause_after_failures",
     "must be an integer"),
    ({"every": "1m", "pause_after_failures": 0}, "job.pause_after_failures",
     "must be between 1 and 100"),
    ({"every": "1m", "pause_after_failures": 101}, "job.pause_after_failures",
     "must be between 1 and 100"),
    ({"every": "1m", "pause_after_failures": 11, "max_attempts": 100},
     "job.pause_after_failures", "times max_attempts (100) must be at most 1000"),
])
def test_an_invalid_pause_after_failures_is_refused_with_the_field_and_the_limit(
        fields: dict[str, Any], path: str, rule: str) -> None:
    err = refusal(upsert(**fields))
    assert err.path == path and rule in str(err)


def test_a_pause_may_carry_a_note_a_request_id_and_a_condition() -> None:
    raw = encode_control("pause", "j", note="bad config", request_id="r-1", after_failures=2)
    cmd = parse(orjson.loads(raw))
    assert cmd == Pause("j", "bad config", "r-1", 2)
    assert parse({"v": 1, "op": "pause", "id": "j"}) == Pause("j")
    for doc, path in (({"note": "two\nlines"}, "note"), ({"note": ""}, "note"),
                      ({"note": "x" * 501}, "note"), ({"request_id": "a b"}, "request_id"),
                      ({"after_failures": 0}, "after_failures")):
        assert refusal({"v": 1, "op": "pause", "id": "j", **doc}).path == path
    # A resume takes none of them.
    assert refusal({"v": 1, "op": "resume", "id": "j", "note": "x"}).path == "note"
    with pytest.raises(ValueError, match="resume carries"):
        encode_control("resume", "j", note="x")


def test_a_long_note_is_cut_after_whole_escapes_only() -> None:
    def note(error: str) -> str:
        last = RunRecord("j", T0, 2, "", outcome=runs.DEAD_LETTERED, error=error)
        return pause_note(3, last, "w-1", T0 + 7)

    start = len(note("y")) - 1  # where the handler's error begins in the note
    limit = limits.MAX_PAUSE_NOTE_CHARS
    # An unsafe character whose escape (6 characters) would straddle the limit: left out
    # whole, never cut to `\u20`, which would read as text.
    k = limit - 2 - start
    cut = note("x" * k + "\u202e" + "tail")
    assert cut == note("x" * k)
    assert len(cut) == limit - 2
    # One that fits is kept whole, as its escape.
    fits = note("x" * (k - 4) + "\u202e" + "tail")
    assert len(fits) == limit and fits.endswith("x\\u202e")
    # Either way a note the wire takes.
    for text in (cut, fits):
        assert parse(orjson.loads(encode_control("pause", "j", note=text))).note == text


# --- the streak -------------------------------------------------------------------------------
def run(ms: int, outcome: str | None, attempt: int = 1, job: str = "j",
        occurrence: str = "") -> RunRecord:
    return RunRecord(job, ms, attempt, occurrence, outcome=outcome)


def test_the_streak_counts_final_failures_back_to_a_success() -> None:
    history = [run(1, runs.DEAD_LETTERED), run(2, runs.SUCCEEDED), run(3, runs.DEAD_LETTERED),
               run(4, runs.FAILED), run(5, runs.DEAD_LETTERED)]
    streak = failure_streak(reversed(history), job_id="j", since_ms=0)
    assert streak.count == 3 and streak.newest == history[-1]
    # A success after them resets it.
    assert failure_streak([*history, run(6, runs.SUCCEEDED)], job_id="j", since_ms=0).count == 0


def test_an_attempt_with_a_retry_to_come_is_not_yet_a_failed_run() -> None:
    history = [run(1, runs.DEAD_LETTERED), run(2, runs.RETRIED)]
    assert failure_streak(history, job_id="j", since_ms=0).count == 1
    # Its retry published and not handled yet: still not a failed run.
    assert failure_streak([*history, run(2, None, attempt=2)], job_id="j",
                          since_ms=0).count == 1
    # Its last attempt failed: now it is, once (its attempts are one run).
    done = [*history, run(2, runs.DEAD_LETTERED, attempt=2)]
    assert failure_streak(done, job_id="j", since_ms=0).count == 2
    # Its retry succeeded: the run succeeded, and ends the streak.
    ok = [*history, run(2, runs.SUCCEEDED, attempt=2)]
    assert failure_streak(ok, job_id="j", since_ms=0).count == 0


def test_the_streak_starts_at_since_and_counts_only_the_jobs_own_occurrences() -> None:
    history = [run(1, runs.DEAD_LETTERED), run(2, runs.DEAD_LETTERED),
               run(3, runs.DEAD_LETTERED),
               run(3, runs.DEAD_LETTERED, occurrence="j@3/trigger/t1"),
               run(4, runs.SKIPPED), run(5, runs.MISSED), run(6, runs.DEAD_LETTERED),
               run(7, runs.DEAD_LETTERED, job="other")]
    assert failure_streak(history, job_id="j", since_ms=0).count == 4
    assert failure_streak(history, job_id="j", since_ms=3).count == 2  # resumed at 3
    # A run recorded twice (a redelivery) is one run.
    assert failure_streak([*history, run(6, runs.DEAD_LETTERED)], job_id="j",
                          since_ms=3).count == 2


# --- the node's conditional pause ----------------------------------------------------------------
@pytest.fixture
async def rigs() -> AsyncIterator[tuple[NodeRig, WorkerRig, MemoryRunHistory]]:
    # No pacing of the history writers, nor rounds: they would sleep in real time.
    async with NodeRig(history_writes_per_s=0, history_round_ms=0) as nodes, \
            WorkerRig(node=nodes) as workers:
        yield nodes, workers, MemoryRunHistory(clock=nodes.clock)


async def start_node(nodes: NodeRig, history: MemoryRunHistory | None) -> Node:
    node = Node(nodes.settings, clock=nodes.clock, store=nodes.store, bus=nodes.bus,
                shards=nodes.settings.shards, node_id="n1", history=history)
    nodes.nodes.append(node)
    await node.start()
    await nodes.settle()
    return node


def report(nodes: NodeRig, job_id: str, n: int, request: str, note: str = "failing") -> None:
    nodes.submit(job_id, encode_control("pause", job_id, note=note, request_id=request,
                                        after_failures=n))


def reasons(nodes: NodeRig) -> list[str]:
    return [(m.header(wire.REASON) or b"").decode()
            for m in nodes.bus.messages(nodes.settings.rejected_topic)]


async def failed_runs(history: MemoryRunHistory, job_id: str, *instants: int) -> None:
    await history.write_runs(job_id, [run(ms, runs.DEAD_LETTERED, job=job_id)
                                      for ms in instants], 3600)


async def test_the_node_pauses_once_per_streak_whoever_reports_it(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory],
        caplog: pytest.LogCaptureFixture) -> None:
    nodes, _, history = rigs
    node = await start_node(nodes, history)

    def auto_paused() -> float | None:
        return node.metrics.registry.get_sample_value(
            "chronowheel_auto_paused_total", {"namespace": nodes.settings.namespace})

    nodes.upsert("j", every="10s", start=T0 + 10_000, pause_after_failures=3)
    await nodes.settle()
    row = await nodes.store.get_job("j")
    assert row is not None and row.since_ms == T0 + 10_000
    await nodes.advance_to(T0 + 30_500)  # three occurrences published, each failed:
    assert [scheduled_at(m) for m in nodes.fired("j")] == [T0 + 10_000, T0 + 20_000,
                                                           T0 + 30_000]
    await failed_runs(history, "j", T0 + 10_000, T0 + 20_000)
    report(nodes, "j", 3, "auto-pause:2")  # two failed runs recorded: not yet
    await nodes.settle()
    row = await nodes.store.get_job("j")
    assert row is not None and (row.status, row.note) == ("scheduled", None)
    assert not auto_paused()  # a report that found no streak pauses nothing: not counted
    await failed_runs(history, "j", T0 + 30_000)
    # Two workers report the third failure, and one reports it twice: one pause, its note.
    report(nodes, "j", 3, "auto-pause:3", note="from w1")
    report(nodes, "j", 3, "auto-pause:3b", note="from w2")
    report(nodes, "j", 3, "auto-pause:3", note="from w1 again")
    with caplog.at_level(logging.WARNING, logger="chronowheel.node.transitions"):
        await nodes.settle()
    said = [r.getMessage() for r in caplog.records if "consecutive failed runs" in r.getMessage()]
    shard = shard_of("j", nodes.settings.shards)
    assert said == [f"shard {shard}: job j paused after 3 consecutive failed runs: from w1"]
    row = await nodes.store.get_job("j")
    assert row is not None and (row.status, row.note) == ("paused", "from w1")
    assert auto_paused() == 1  # three reports of the streak: one pause, counted once
    version = row.version
    assert reasons(nodes) == []  # an unchanged pause is no refusal
    # Resume: the note goes, and the streak starts again from the withheld occurrence.
    nodes.submit("j", encode_control("resume", "j"))
    await nodes.settle()
    row = await nodes.store.get_job("j")
    assert row is not None and row.status == "scheduled" and row.note is None
    assert row.since_ms is not None and row.since_ms > T0 + 30_000
    assert row.version == version + 1
    # A report from before the resume, late, or sent again, pauses nothing.
    report(nodes, "j", 3, "auto-pause:late")
    report(nodes, "j", 3, "auto-pause:3b")
    await nodes.settle()
    row = await nodes.store.get_job("j")
    assert row is not None and row.status == "scheduled"
    assert auto_paused() == 1


async def test_a_pause_reapplied_after_a_failover_pauses_once_and_publishes_each_once(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory]) -> None:
    # The node that applies the report stops mid-commit (its transaction open); another node
    # fences it and applies the report again from the committed offset.
    nodes, _, history = rigs

    async def node_named(name: str) -> Node:
        node = Node(nodes.settings, clock=nodes.clock, store=nodes.store, bus=nodes.bus,
                    shards=nodes.settings.shards, node_id=name, history=history)
        nodes.nodes.append(node)
        await node.start()
        await nodes.settle()
        return node

    await node_named("first")
    nodes.upsert("j", every="10s", start=T0 + 10_000, pause_after_failures=2)
    await nodes.advance_to(T0 + 20_500)
    await failed_runs(history, "j", T0 + 10_000, T0 + 20_000)
    hold = nodes.bus.hold_commits(f"{nodes.settings.namespace}-node-first")
    report(nodes, "j", 2, "auto-pause:20000:1", note="two failed")
    await nodes.advance(300)
    assert await paused(nodes, "j")  # stored; its offset not committed
    second = await node_named("second")
    await nodes.advance(15_000)
    assert shard_of("j", nodes.settings.shards) in second.owned  # taken over
    hold.set()
    await nodes.advance(500)
    row = await nodes.store.get_job("j")
    assert row is not None and (row.status, row.note) == ("paused", "two failed")
    assert reasons(nodes) == []
    instants = [scheduled_at(m) for m in nodes.fired("j")]
    assert sorted(instants) == [T0 + 10_000, T0 + 20_000]  # once each, nothing while paused
    nodes.submit("j", encode_control("resume", "j"))
    await nodes.advance(11_000)
    after = [scheduled_at(m) for m in nodes.fired("j")]
    assert len(after) == len(set(after)) and len(after) > 2
    assert all(scheduled_at(m) <= m.committed_ms for m in nodes.fired("j"))  # never early


async def test_a_report_about_an_ended_job_changes_nothing_quietly(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory]) -> None:
    nodes, _, history = rigs
    await start_node(nodes, history)
    nodes.upsert("gone", every="10s", pause_after_failures=1)
    await nodes.settle()
    nodes.cancel("gone")
    report(nodes, "gone", 1, "r")  # its last occurrence failed after the cancel
    report(nodes, "never", 1, "r")
    await nodes.settle()
    row = await nodes.store.get_job("gone")
    assert row is not None and row.status == "cancelled"
    assert reasons(nodes) == []
    # A plain pause of them is still refused with the reason.
    nodes.submit("gone", encode_control("pause", "gone"))
    await nodes.settle()
    assert reasons(nodes) == ["id: job 'gone' is cancelled; there is nothing to pause"]


async def test_without_run_history_the_node_refuses_a_conditional_pause(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory]) -> None:
    nodes, _, _ = rigs
    await start_node(nodes, None)
    nodes.upsert("j", every="10s", pause_after_failures=1)
    await nodes.settle()
    report(nodes, "j", 1, "r")
    await nodes.settle()
    row = await nodes.store.get_job("j")
    assert row is not None and row.status == "scheduled"
    (reason,) = reasons(nodes)
    assert reason.startswith("after_failures: this node records no run history")


async def test_a_paused_job_lists_and_shows_its_note(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory]) -> None:
    nodes, _, history = rigs
    await start_node(nodes, history)
    nodes.upsert("j", every="10s")
    await nodes.settle()
    nodes.submit("j", encode_control("pause", "j", note="billing API down, see INC-7"))
    await nodes.settle()
    page = await nodes.store.list_jobs(JobQuery(status="paused"))
    assert [(j.job_id, j.note) for j in page.jobs] == [("j", "billing API down, see INC-7")]
    listed = jobs_view(JobPage(page.jobs, None), {}, {})
    assert listed["jobs"][0]["note"] == "billing API down, see INC-7"
    row = await nodes.store.get_job("j")
    assert row is not None
    shown = describe(row, 2, None, nodes.clock.now_ms(), None)
    assert shown["note"] == "billing API down, see INC-7"
    assert "note       billing API down, see INC-7" in render(shown, nodes.clock.now_ms())
    assert "j: billing API down, see INC-7" in jobs_render(JobPage(page.jobs, None),
                                                          nodes.clock.now_ms())
    nodes.submit("j", encode_control("resume", "j"))
    await nodes.settle()
    row = await nodes.store.get_job("j")
    assert row is not None and row.note is None
    assert describe(row, 2, None, nodes.clock.now_ms(), None)["note"] is None


# --- a node and workers ---------------------------------------------------------------------------
async def start_worker(workers: WorkerRig, history: MemoryRunHistory | None, handler: object,
                       worker_id: str = "w1") -> Worker:
    worker = workers.worker(handler, worker_id=worker_id)  # type: ignore[arg-type]
    if history is not None:  # the rig makes its stores without a run history
        worker._stores = dataclasses.replace(worker._stores,  # type: ignore[arg-type]
                                             history=history)
    await workers.during(worker.start())
    return worker


async def always_fails(occ: Occurrence) -> None:
    raise RuntimeError(f"upstream refused (attempt {occ.attempt})")


async def paused(nodes: NodeRig, job_id: str) -> bool:
    row = await nodes.store.get_job(job_id)
    return row is not None and row.status == "paused"


async def test_a_job_that_keeps_failing_is_paused_after_its_third_failed_run_and_resumes(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory]) -> None:
    nodes, workers, history = rigs
    await start_node(nodes, history)
    worker = await start_worker(workers, history, always_fails)
    nodes.upsert("flaky", every="1s", start=T0 + 1_000, max_attempts=1,
                 pause_after_failures=3)
    state = {"paused": False}

    async def check() -> None:
        state["paused"] = await paused(nodes, "flaky")

    while not state["paused"]:
        assert nodes.clock.now_ms() < T0 + 30_000, "not paused within 30 s"
        await workers.advance(100)
        await check()
    history_runs = await history.job_runs("flaky", 20)
    failed = sorted(r.scheduled_ms for r in history_runs if r.outcome == runs.DEAD_LETTERED)
    assert failed[:3] == [T0 + 1_000, T0 + 2_000, T0 + 3_000]
    # Paused by the report of its third failed run: a fourth may have been on its way out.
    assert len(failed) in (3, 4)
    row = await nodes.store.get_job("flaky")
    assert row is not None and row.note is not None
    assert row.note.startswith("auto-paused after 3 consecutive failed runs")
    assert "worker w1" in row.note and "RuntimeError: upstream refused" in row.note
    fired = len(nodes.fired("flaky"))
    await workers.advance(3_000)
    assert len(nodes.fired("flaky")) == fired  # paused: nothing more
    assert worker.stats.dead == fired

    # Resume: the note goes, it fires again, and a new streak of three pauses it again (the
    # failed runs before the pause count no more).
    nodes.submit("flaky", encode_control("resume", "flaky"))
    await nodes.settle()
    row = await nodes.store.get_job("flaky")
    assert row is not None and row.status == "scheduled" and row.note is None
    dead_before = worker.stats.dead
    while not await paused(nodes, "flaky"):
        assert nodes.clock.now_ms() < T0 + 60_000, "not paused again within 60 s"
        await workers.advance(100)
    assert len(nodes.fired("flaky")) > fired
    assert worker.stats.dead - dead_before in (3, 4)
    row = await nodes.store.get_job("flaky")
    assert row is not None and row.note is not None and row.since_ms is not None
    again = [r for r in await history.job_runs("flaky", 50)
             if r.scheduled_ms >= row.since_ms and r.outcome == runs.DEAD_LETTERED]
    assert len(again) >= 3


async def test_retries_success_and_a_restart_keep_the_streak_honest(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory]) -> None:
    nodes, workers, history = rigs
    await start_node(nodes, history)
    fail = {"on": True}

    async def handler(occ: Occurrence) -> None:
        if fail["on"]:
            raise RuntimeError("down")

    w1 = await start_worker(workers, history, handler)
    # Two attempts per run: the first attempt's failure (retried) is not a failed run.
    nodes.upsert("job", every="10s", start=T0 + 10_000, max_attempts=2, backoff="1s",
                 pause_after_failures=2)
    await workers.until("the first attempt failed", lambda: w1.stats.retried >= 1)
    await workers.advance(200)
    assert not await paused(nodes, "job")
    await workers.until("the first run failed", lambda: w1.stats.dead >= 1)
    assert not await paused(nodes, "job")
    # A success in between resets the streak.
    fail["on"] = False
    await workers.until("a run succeeded", lambda: w1.stats.succeeded >= 1)
    fail["on"] = True
    await workers.until("another run failed", lambda: w1.stats.dead >= 2)
    await workers.advance(200)
    assert not await paused(nodes, "job")
    # The worker is replaced; the streak is in the run history, not in the worker.
    await workers.shutdown(w1)
    w2 = await start_worker(workers, history, handler, worker_id="w2")
    await workers.until("the next run failed", lambda: w2.stats.dead >= 1)
    await workers.advance(200)
    assert await paused(nodes, "job")
    row = await nodes.store.get_job("job")
    assert row is not None and row.note is not None and "worker w2" in row.note
    assert "attempt 2, dead-lettered" in row.note
    # Each final outcome recorded once, by the worker, and counted.
    counts = (await history.run_counts(["job"]))["job"]
    assert counts["succeeded"] == 1 and counts["dead_lettered"] == 3


async def test_a_worker_without_run_history_says_once_that_it_pauses_nothing(
        rigs: tuple[NodeRig, WorkerRig, MemoryRunHistory],
        caplog: pytest.LogCaptureFixture) -> None:
    nodes, workers, history = rigs
    await start_node(nodes, history)
    worker = await start_worker(workers, None, always_fails)
    nodes.upsert("j", every="1s", start=T0 + 1_000, max_attempts=1, pause_after_failures=1)
    with caplog.at_level(logging.WARNING, logger="chronowheel.worker.handling"):
        await workers.until("three failed runs", lambda: worker.stats.dead >= 3)
    said = [r for r in caplog.records if "auto-pauses no job" in r.getMessage()]
    assert len(said) == 1
    assert not await paused(nodes, "j")
    assert [scheduled_at(m) for m in nodes.fired("j")][:3] == [T0 + 1_000, T0 + 2_000,
                                                               T0 + 3_000]


def test_the_consoles_job_page_shows_the_note_escaped() -> None:
    from chronowheel.console.pages import job_page
    from chronowheel.console.sources import JobView
    from chronowheel.store.base import JobRow

    note = 'auto-paused after 3 consecutive failed runs; the last: <b>"x"</b>'
    row = JobRow("j", 0, b'{"id":"j","every":"1s"}', 4, "paused", T0, None, note=note)
    view = JobView(row, {"id": "j", "every": "1s"}, "UTC", (), None, None, None, (), 0,
                   "ns.fired")
    html = job_page(view, namespace="ns", nonce="n", now_ms=T0, actions=[])
    shown = html.split('id="job-note">', 1)[1].split("</span>", 1)[0]
    assert shown == ("auto-paused after 3 consecutive failed runs; the last: "
                     "&lt;b&gt;&quot;x&quot;&lt;/b&gt;")
    plain = JobView(JobRow("j", 0, b"{}", 1, "scheduled", T0, T0), {}, "UTC", (), None, None,
                    None, (), 0, "ns.fired")
    assert 'id="job-note"' not in job_page(plain, namespace="ns", nonce="n", now_ms=T0,
                                           actions=[])


async def test_the_client_sends_the_field_and_a_note_and_refuses_bad_ones_first() -> None:
    from tests.unit.test_client import FakeProducer, client

    p = FakeProducer()
    async with client(p) as c:
        await c.every("poll", "1m", pause_after_failures=3)
        await c.cron("daily", "@daily", pause_after_failures=1, max_attempts=10)
        await c.pause("poll", note="provider down, INC-7")
        p.ack()
        for call, path in ((c.every("x", "1m", pause_after_failures=0),
                            "job.pause_after_failures"),
                           (c.submit({"id": "x", "at": T0 + 60_000, "pause_after_failures": 2}),
                            "job.pause_after_failures"),
                           (c.pause("x", note="two\nlines"), "note")):
            with pytest.raises(ValidationError) as err:
                await call
            assert err.value.path == path
    docs = p.docs()
    assert [d.get("job", {}).get("pause_after_failures") for d in docs[:2]] == [3, 1]
    assert docs[2] == {"v": 1, "op": "pause", "id": "poll", "note": "provider down, INC-7"}
    assert len(p.sent) == 3
