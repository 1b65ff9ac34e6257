"""The overlap policy's run leases (worker/overlap.py) on the in-memory store, with a manual
clock: two `Overlap` objects with different worker ids stand for two worker processes."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from chronowheel.core import wire
from chronowheel.core.clock import ManualClock
from chronowheel.core.model import ValidationPolicy, encode_upsert, parse_command
from chronowheel.errors import ValidationError
from chronowheel.store.memory import MemoryStore
from chronowheel.worker.occurrence import Occurrence
from chronowheel.worker.overlap import Overlap, Run, Skip

T0 = 1_796_115_600_000
LEASE_S = 10


def occurrence(job: str, scheduled_ms: int, policy: str | None) -> Occurrence:
    headers = [(wire.JOB_ID, job.encode()), (wire.SCHEDULED_AT, str(scheduled_ms).encode()),
               (wire.FIRED_AT, str(scheduled_ms).encode()), (wire.ATTEMPT, b"1"),
               (wire.OCCURRENCE, wire.occurrence_id(job, scheduled_ms).encode())]
    if policy is not None:
        headers.append((wire.CONCURRENCY, policy.encode()))
    return Occurrence.from_record("ns.fired", 0, scheduled_ms, b"", headers)


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


def pair(clock: ManualClock, **kw: Any) -> tuple[Overlap, Overlap]:
    store = MemoryStore(clock=clock)
    return (Overlap(store, "group", "worker-a", lease_s=LEASE_S, clock=clock, **kw),
            Overlap(store, "group", "worker-b", lease_s=LEASE_S, clock=clock, **kw))


def test_the_policy_header_is_read_and_an_unknown_one_means_allow() -> None:
    assert occurrence("j", 1, None).concurrency == "allow"
    assert occurrence("j", 1, "forbid").concurrency == "forbid"
    assert occurrence("j", 1, "replace").concurrency == "replace"
    assert occurrence("j", 1, "sometimes").concurrency == "allow"
    assert not occurrence("j", 1, "replace").cancelled()


def test_the_job_field_reaches_the_fired_headers_and_is_for_recurring_jobs_only() -> None:
    policy = ValidationPolicy()
    cmd = parse_command(encode_upsert({"id": "j", "every": "1m", "concurrency": "forbid",
                                       "headers": {"team": "x"}}),
                        key=None, policy=policy, now_ms=T0)
    job = cmd.job  # type: ignore[union-attr]
    assert job.concurrency == "forbid"
    assert job.fired_headers == (("team", "x"), (wire.CONCURRENCY, "forbid"))
    allow = parse_command(encode_upsert({"id": "j", "every": "1m"}), key=None, policy=policy,
                          now_ms=T0)
    assert allow.job.fired_headers == ()  # type: ignore[union-attr]
    for doc, path, rule in [
        ({"id": "j", "every": "1m", "concurrency": "never"}, "job.concurrency",
         "must be one of allow, forbid, replace"),
        ({"id": "j", "at": T0 + 1000, "concurrency": "forbid"}, "job.concurrency",
         "only allowed for recurring jobs (cron or every)"),
    ]:
        with pytest.raises(ValidationError) as err:
            parse_command(orjson.dumps({"v": 1, "op": "upsert", "job": doc}), key=None,
                          policy=policy, now_ms=T0)
        assert (err.value.path, err.value.rule) == (path, rule)


async def test_forbid_skips_while_another_occurrence_runs_anywhere(clock: ManualClock) -> None:
    a, b = pair(clock)
    first = await a.begin(occurrence("j", 1000, "forbid"))
    assert isinstance(first, Run)
    skipped = await b.begin(occurrence("j", 2000, "forbid"))
    assert isinstance(skipped, Skip)
    assert skipped.reason == "concurrency=forbid: j@1000 is still running on worker-a"
    # Another job is not affected.
    assert isinstance(await b.begin(occurrence("k", 2000, "forbid")), Run)
    await first.release()
    assert isinstance(await b.begin(occurrence("j", 3000, "forbid")), Run)


async def test_a_lease_renewed_while_running_and_one_left_behind_expires(
        clock: ManualClock) -> None:
    a, b = pair(clock, poll_s=1.0)
    running = await a.begin(occurrence("j", 1000, "forbid"))
    assert isinstance(running, Run)
    stopped: list[bool] = []
    running.start(lambda: stopped.append(True))
    for _ in range(3 * LEASE_S):  # long past one lease period, renewed every second
        clock.advance(1000)
        await settle()
    assert isinstance(await b.begin(occurrence("j", 2000, "forbid")), Skip)
    assert stopped == []
    # A holder that died (its keeper gone, lease not released) blocks only until the TTL.
    assert running._keeper is not None
    running._keeper.cancel()
    await settle()
    clock.advance(LEASE_S * 1000)
    assert isinstance(await b.begin(occurrence("j", 3000, "forbid")), Run)


async def test_replace_asks_the_running_one_to_stop_and_runs_once_it_has(
        clock: ManualClock) -> None:
    a, b = pair(clock, poll_s=1.0, replace_wait_s=30.0)
    old = await a.begin(occurrence("j", 1000, "replace"))
    assert isinstance(old, Run)
    stop = asyncio.Event()
    old.start(stop.set)
    newer = asyncio.ensure_future(b.begin(occurrence("j", 2000, "replace")))
    await settle()
    assert not newer.done()
    clock.advance(1000)  # the holder's next renewal sees the request
    await settle()
    assert stop.is_set() and old.stop_requested
    await old.release()  # its handler stopped
    clock.advance(200)
    await settle()
    got = newer.result()
    assert isinstance(got, Run) and got.lease.occurrence == "j@2000"


async def test_replace_runs_anyway_when_the_old_one_does_not_stop_in_time(
        clock: ManualClock) -> None:
    a, b = pair(clock, poll_s=1.0, replace_wait_s=5.0)
    old = await a.begin(occurrence("j", 1000, "replace"))
    assert isinstance(old, Run)
    told: list[bool] = []
    old.start(lambda: told.append(True))  # a plain function: told, but it keeps running
    newer = asyncio.ensure_future(b.begin(occurrence("j", 2000, "replace")))
    await settle()
    for _ in range(24):  # 4.8 s: still waiting for the old one to stop
        clock.advance(200)
        await settle()
        assert not newer.done()
    clock.advance(200)  # replace_wait_s has passed
    await settle()
    got = newer.result()
    assert isinstance(got, Run) and got.lease.worker == "worker-b"
    assert told == [True]
    await old.release()  # the old handler's end must not end the new lease
    assert isinstance(await a.begin(occurrence("j", 3000, "forbid")), Skip)


async def test_the_same_occurrence_delivered_twice_waits_instead_of_being_skipped(
        clock: ManualClock) -> None:
    a, b = pair(clock, poll_s=1.0)
    first = await a.begin(occurrence("j", 1000, "forbid"))
    assert isinstance(first, Run)
    again = asyncio.ensure_future(b.begin(occurrence("j", 1000, "forbid")))
    clock.advance(1000)
    await settle()
    assert not again.done()  # neither skipped nor run alongside
    await first.release()
    clock.advance(1000)
    await settle()
    assert isinstance(again.result(), Run)


def test_the_poll_must_fit_in_the_lease() -> None:
    with pytest.raises(ValueError, match="under half of lease_s"):
        Overlap(MemoryStore(), "g", "w", lease_s=2, clock=ManualClock(0), poll_s=1.0)
