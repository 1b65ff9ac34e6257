"""A real `Worker` on the in-memory rig: retries through the scheduler, dead letters, records
that are not occurrences."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from chronowheel.worker import DeadLetter, Occurrence, WorkerStats

from tests.unit.worker_rig import T0, WorkerRig


@pytest.fixture
async def rig() -> AsyncIterator[WorkerRig]:
    async with WorkerRig() as r:
        yield r


async def test_a_failure_submits_a_retry_for_the_next_attempt_after_the_backoff(
        rig: WorkerRig) -> None:
    async def handler(occ: Occurrence) -> None:
        raise RuntimeError(f"flaky downstream, attempt {occ.attempt}")

    worker = await rig.start(handler)
    rig.fire("flaky", payload=b'{"n":1}', headers=(("team", "billing"),), max_attempts=5,
             backoff_ms=1000, attempt=2)
    await rig.until("the retry", lambda: worker.stats.retried == 1)
    failed_at = rig.clock.now_ms()
    [cmd] = rig.messages(rig.settings.submit_topic)
    retry = orjson.loads(cmd.value or b"")
    assert cmd.key == b"flaky" and retry["op"] == "retry"
    assert (retry["attempt"], retry["scheduled_at"]) == (3, T0)
    # backoff doubles per attempt: 2 s after the second failure
    assert failed_at + 2000 - 100 <= retry["at"] <= failed_at + 2000
    assert worker.stats == WorkerStats(failed=1, retried=1)
    await rig.until("the commit", lambda: bool(rig.committed(worker)))
    claim, _, _ = rig.store.claims[(worker.group_id, f"flaky@{T0}")]
    assert (claim.state, claim.attempt) == ("failed", 2)  # only after the retry was produced


async def test_the_last_attempt_is_dead_lettered_with_why_when_and_where(
        rig: WorkerRig) -> None:
    async def handler(occ: Occurrence) -> None:
        raise ValueError(f"no such mailbox: {'x' * 5000}")

    worker = await rig.start(handler)
    msg = rig.fire("doomed", payload=b'{"to":"nobody"}', max_attempts=3, attempt=3,
                   headers=(("team", "billing"),))
    await rig.until("the dead letter", lambda: worker.stats.dead == 1)
    assert worker.stats == WorkerStats(failed=1, dead=1)
    assert rig.messages(rig.settings.submit_topic) == []
    [letter] = rig.messages(rig.settings.dead_topic)
    assert letter.key == b"doomed" and letter.value == b'{"to":"nobody"}'
    h = {k: v.decode() for k, v in letter.headers}
    assert h["cw-error"].startswith("ValueError: no such mailbox: xxx")
    assert len(h["cw-error"].encode()) <= 2048
    assert (h["cw-source-topic"], h["cw-source-partition"], h["cw-source-offset"]) == (
        rig.topic, str(msg.partition), str(msg.offset))
    assert T0 <= int(h["cw-failed-at"]) <= rig.clock.now_ms()
    assert (h["cw-occurrence"], h["cw-attempt"], h["team"]) == (f"doomed@{T0}", "3", "billing")
    claim, _, _ = rig.store.claims[(worker.group_id, f"doomed@{T0}")]
    assert (claim.state, claim.attempt) == ("failed", 3)


async def test_dead_letter_exception_skips_the_remaining_attempts(rig: WorkerRig) -> None:
    attempts: list[int] = []

    async def handler(occ: Occurrence) -> None:
        attempts.append(occ.attempt)
        raise DeadLetter("permanently invalid address")

    worker = await rig.start(handler)
    rig.fire("invalid", max_attempts=5)
    await rig.until("the dead letter", lambda: worker.stats.dead == 1)
    assert attempts == [1]
    assert worker.stats == WorkerStats(failed=1, dead=1)
    [letter] = rig.messages(rig.settings.dead_topic)
    assert dict(letter.headers)["cw-error"] == b"DeadLetter: permanently invalid address"
    assert rig.messages(rig.settings.submit_topic) == []


async def test_a_record_that_is_not_an_occurrence_is_dead_lettered_and_committed(
        rig: WorkerRig) -> None:
    seen: list[str] = []

    async def handler(occ: Occurrence) -> None:
        seen.append(occ.job_id)

    worker = await rig.start(handler)
    stray = rig.memory.produce(rig.topic, 1, b"k", b"stray", [("trace", b"t1")])
    await rig.until("the commit", lambda: bool(rig.committed(worker)))
    [letter] = rig.messages(rig.settings.dead_topic)
    h = dict(letter.headers)
    assert (letter.key, letter.value, h["trace"]) == (b"k", b"stray", b"t1")
    assert h["cw-error"].startswith(b"MalformedOccurrence: not a chronowheel occurrence: "
                                    b"missing header cw-job-id")
    assert (h["cw-source-partition"], h["cw-source-offset"]) == (b"1", str(stray.offset).encode())
    assert seen == []
    assert rig.committed(worker) == {1: stray.offset + 1}
    assert worker.stats == WorkerStats(dead=1)
