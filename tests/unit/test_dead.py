"""Dead-letter listing and redrive (`SchedulerClient.dead_letters` / `redrive`, `chronowheel dead
list|redrive`) without servers: selection, paging, dry run, the request id of each letter and
the retry it becomes, exactly once across runs and after an interruption, and a node on the
in-memory bus delivering a redriven letter once."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import pytest
from chronowheel.bus.memory import Message
from chronowheel.cli import build_parser
from chronowheel.cli import dead as cli_dead
from chronowheel.client import SchedulerClient
from chronowheel.client.dead import (
    RedriveSummary,
    dead_selector,
    memory_reader,
    parse_letter,
    redrive_request_id,
    refusal,
)
from chronowheel.core import wire
from chronowheel.core.model import Retry, ValidationPolicy, encode_retry, parse_command
from chronowheel.core.shard import shard_of
from chronowheel.errors import ValidationError
from chronowheel.settings import Settings
from chronowheel.store.base import JobRow
from chronowheel.store.memory import MemoryStore
from chronowheel.worker.occurrence import Occurrence
from chronowheel.worker.policy import dead_headers, minimal_dead_letter, retry_command

from tests.unit.node_rig import T0, NodeRig
from tests.unit.test_bulk_in_memory import BusProducer, DyingProducer, Interrupted
from tests.unit.test_client import NOW, FakeProducer, acking

SETTINGS = Settings(namespace="acme")
TOPIC = SETTINGS.fired_topic


@dataclass
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def fired_headers(job_id: str, scheduled: int, attempt: int = 5,
                  extra: tuple[tuple[str, bytes], ...] = ()) -> tuple[tuple[str, bytes], ...]:
    return ((wire.JOB_ID, job_id.encode()), (wire.SCHEDULED_AT, str(scheduled).encode()),
            (wire.FIRED_AT, str(scheduled + 3).encode()), (wire.ATTEMPT, str(attempt).encode()),
            (wire.OCCURRENCE, wire.occurrence_id(job_id, scheduled).encode()),
            (wire.MAX_ATTEMPTS, b"5"), (wire.BACKOFF_MS, b"10000"), ("trace", b"abc"), *extra)


def letter(partition: int, offset: int, job_id: str, *, failed_at: int = NOW,
           error: Exception | None = None, attempt: int = 5,
           extra: tuple[tuple[str, bytes], ...] = ()) -> Rec:
    """A dead letter as the worker writes it (worker.policy.dead_headers)."""
    headers = dead_headers(fired_headers(job_id, NOW - 60_000, attempt, extra),
                           error or RuntimeError("boom"), failed_at, TOPIC, 3, 100 + offset)
    return Rec(partition, offset, job_id.encode(), b'{"n":%d}' % offset, headers)


def job(job_id: str, tenant: str) -> JobRow:
    return JobRow(job_id, shard_of(job_id, SETTINGS.shards), b'{"at":1}', 1, "scheduled",
                  NOW, NOW, 0, tenant)


@pytest.fixture
async def setup() -> tuple[MemoryStore, list[Rec]]:
    """Letters of a-0..a-3 (tenant a) and b-0..b-2 (tenant b) on two partitions, failing a
    minute apart, b's with a TimeoutError; and one payload-less stand-in of a-9."""
    store = MemoryStore()
    await store.put_jobs([job(f"a-{i}", "a") for i in range(4)]
                         + [job(f"b-{i}", "b") for i in range(3)] + [job("a-9", "a")])
    recs = [letter(i % 2, i // 2, f"a-{i}", failed_at=NOW + i * 60_000) for i in range(4)]
    recs += [letter(2, i, f"b-{i}", failed_at=NOW + i * 60_000,
                    error=TimeoutError("upstream slow")) for i in range(3)]
    full = letter(2, 3, "a-9")
    key, value, headers = minimal_dead_letter(full.key, full.value or b"", full.headers,
                                              b"dead letter refused: too_large: over 1 MiB")
    recs.append(Rec(2, 3, key, value, headers))
    return store, recs


def client(producer: Any, store: MemoryStore, recs: list[Rec]) -> SchedulerClient:
    return SchedulerClient(SETTINGS, producer=producer, store=store, now_ms=lambda: NOW,
                           dead_letters=memory_reader(recs))


def sent(producer: FakeProducer) -> list[Retry]:
    out = []
    for _topic, _key, value in producer.sent:
        cmd = parse_command(value, key=None, policy=ValidationPolicy.from_settings(SETTINGS),
                            now_ms=NOW)
        assert isinstance(cmd, Retry)
        out.append(cmd)
    return out


# --- selection and listing ------------------------------------------------------------------

async def test_letters_are_selected_by_job_tenant_failure_time_and_reason(
        setup: tuple[MemoryStore, list[Rec]]) -> None:
    store, recs = setup
    async with client(FakeProducer(), store, recs) as c:
        every = await c.dead_letters()
        by_job = await c.dead_letters(job_id="a-2")
        by_tenant = await c.dead_letters(tenant="b")
        by_time = await c.dead_letters(tenant="a", failed_after=NOW + 60_000,
                                       failed_before=NOW + 3 * 60_000)
        by_reason = await c.dead_letters(reason="timeouterror")
        stand_in = await c.dead_letters(reason="too_large")
    assert [x.position for x in every.letters] == [
        "0@0", "0@1", "1@0", "1@1", "2@0", "2@1", "2@2", "2@3"]
    assert every.next_token is None
    assert [x.job_id for x in by_job.letters] == ["a-2"]
    assert [(x.job_id, x.tenant) for x in by_tenant.letters] == [
        ("b-0", "b"), ("b-1", "b"), ("b-2", "b")]
    assert sorted(x.job_id or "" for x in by_time.letters) == ["a-1", "a-2"]
    assert [x.job_id for x in by_reason.letters] == ["b-0", "b-1", "b-2"]
    x = by_job.letters[0]
    assert (x.attempt, x.failed_at_ms, x.error, x.topic, x.source) == (
        5, NOW + 2 * 60_000, "RuntimeError: boom", TOPIC, f"{TOPIC}[3]@101")
    assert [y.replaced for y in stand_in.letters] == [True]


async def test_pages_follow_each_other_by_position(
        setup: tuple[MemoryStore, list[Rec]]) -> None:
    store, recs = setup
    seen: list[str] = []
    token = None
    async with client(FakeProducer(), store, recs) as c:
        while True:
            page = await c.dead_letters(limit=3, page_token=token)
            seen += [x.position for x in page.letters]
            token = page.next_token
            if token is None:
                break
        with pytest.raises(ValidationError, match="limit"):
            await c.dead_letters(limit=0)
        with pytest.raises(ValidationError, match="page_token"):
            await c.dead_letters(page_token="nope")
        with pytest.raises(ValidationError, match="failed_after"):
            await c.dead_letters(failed_after=NOW, failed_before=NOW)
    assert seen == ["0@0", "0@1", "1@0", "1@1", "2@0", "2@1", "2@2", "2@3"]


# --- what a redrive sends ---------------------------------------------------------------------

def test_a_letter_has_a_request_id_from_its_own_position_and_becomes_the_next_attempt() -> None:
    rec = letter(4, 17, "r-1", extra=((wire.TRIGGERED, b"rerun-1"),))
    x = parse_letter(rec.partition, rec.offset, rec.key, rec.value, rec.headers)
    assert x.request_id == redrive_request_id(4, 17) == "redrive:4@17"
    assert refusal(x) is None
    from chronowheel.client.dead import retry_value

    cmd = parse_command(retry_value(x, NOW), key=None,
                        policy=ValidationPolicy.from_settings(SETTINGS), now_ms=NOW)
    assert isinstance(cmd, Retry)
    assert (cmd.id, cmd.scheduled_ms, cmd.attempt, cmd.at_ms, cmd.topic) == (
        "r-1", NOW - 60_000, 6, NOW, TOPIC)
    assert cmd.max_attempts == 6  # one more attempt; failing again dead-letters it again
    assert cmd.payload == b'{"n":17}' and dict(cmd.headers) == {"trace": "abc"}
    assert (cmd.origin, cmd.request_id) == ("trigger", "rerun-1")  # its key is kept


def test_a_redrive_carries_every_field_of_the_job_a_workers_own_retry_carries() -> None:
    # The delivery of a recurring job with every per-job field a delivery can carry.
    job_fields = ((wire.PAUSE_AFTER_FAILURES, b"3"), (wire.CONCURRENCY, b"forbid"),
                  (wire.MAX_LATENESS_MS, b"30000"), (wire.BACKFILL, b"fix-1"))
    delivered = fired_headers("r-2", NOW - 60_000, attempt=2, extra=job_fields)
    rec = letter(1, 9, "r-2", attempt=2, extra=job_fields)
    x = parse_letter(rec.partition, rec.offset, rec.key, rec.value, rec.headers)
    from chronowheel.client.dead import retry_value

    policy = ValidationPolicy.from_settings(SETTINGS)
    redriven = parse_command(retry_value(x, NOW), key=None, policy=policy, now_ms=NOW)
    assert isinstance(redriven, Retry)
    assert redriven.pause_after_failures == 3  # auto-pause still counts its runs
    assert redriven.concurrency == "forbid"  # and the overlap policy stays the job's
    # What the worker's retry of the same delivery would send, but for when and how many
    # attempts: the redrive is due now, has one attempt more and is applied once (its id).
    occ = Occurrence.from_record(TOPIC, 3, 109, rec.value, delivered)
    _key, value = retry_command(occ, NOW)
    retried = parse_command(value, key=None, policy=policy, now_ms=NOW)
    assert isinstance(retried, Retry)
    assert redriven == replace(retried, at_ms=NOW, max_attempts=redriven.max_attempts,
                               redrive_id="redrive:1:9")
    assert retried.redrive_id == ""  # a worker's own retry has none
    assert (redriven.attempt, redriven.max_attempts) == (3, 5)
    # Neither carries the lateness bound (a redriven occurrence is long past its instant: a
    # bound would drop it as missed); catch-up is the schedule's.
    assert dict(redriven.headers) == {"trace": "abc"}


@pytest.mark.parametrize("bad", ["²", "٣", "1²", "١٢"])
def test_a_number_header_not_in_ascii_digits_reads_as_absent(bad: str) -> None:
    # str.isdigit takes each of these: int() refuses "²" and "1²" (a ValueError out of the
    # listing) and reads "٣" as 3 and "١٢" as 12.
    rec = letter(3, 8, "n-1")
    numbers = (wire.SCHEDULED_AT, wire.ATTEMPT, wire.FAILED_AT, wire.SOURCE_PARTITION,
               wire.SOURCE_OFFSET)
    assert {k for k, _v in rec.headers} >= set(numbers)
    headers = [(k, bad.encode() if k in numbers else v) for k, v in rec.headers]
    x = parse_letter(rec.partition, rec.offset, rec.key, rec.value, headers)
    assert (x.scheduled_ms, x.attempt, x.failed_at_ms, x.source_partition,
            x.source_offset) == (None, None, None, None, None)
    assert (x.job_id, x.topic) == ("n-1", TOPIC)
    assert "not a chronowheel occurrence" in (refusal(x) or "")  # no instant: no redrive


async def test_a_node_delivers_a_redriven_letter_with_its_jobs_pause_after_failures(
        rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("sync", every="10s", max_attempts=1, pause_after_failures=2)
    await rig.advance(10_500)
    [fired, *_] = rig.fired("sync")
    assert fired.header(wire.PAUSE_AFTER_FAILURES) == b"2"
    headers = dead_headers(tuple(fired.headers), RuntimeError("down"), rig.clock.now_ms(),
                           fired.topic, fired.partition, fired.offset)
    rig.bus.produce(rig.settings.dead_topic, 0, fired.key, fired.value, headers)
    reader = memory_reader(rig.bus.messages(rig.settings.dead_topic))
    async with SchedulerClient(rig.settings, producer=BusProducer(rig), store=rig.store,
                               now_ms=rig.clock.now_ms, dead_letters=reader) as c:
        s = await c.redrive(job_id="sync")
        await rig.advance(1000)
    assert s.redriven == ["0@0"]
    [again] = [m for m in rig.fired("sync") if m.header(wire.ATTEMPT) == b"2"]
    assert again.header(wire.OCCURRENCE) == fired.header(wire.OCCURRENCE)
    assert again.header(wire.PAUSE_AFTER_FAILURES) == b"2"


async def test_a_dry_run_sends_nothing_and_a_stand_in_is_refused_naming_its_source(
        setup: tuple[MemoryStore, list[Rec]]) -> None:
    store, recs = setup
    producer = FakeProducer()
    async with client(producer, store, recs) as c:
        s = await c.redrive(tenant="a", dry_run=True)
    assert producer.sent == []
    assert s.dry_run and s.matched == 5
    assert s.redriven == ["0@0", "0@1", "1@0", "1@1"]
    [(position, reason)] = s.refused
    assert position == "2@3"
    assert "payload-less" in reason and f"{TOPIC}[3]@103" in reason
    text = cli_dead.render_summary(s, 20)
    assert "would send    4" in text and "2@3: dead letter 2@3 is the payload-less" in text


async def test_a_redrive_sends_each_letter_once_across_runs_and_after_an_interruption(
        setup: tuple[MemoryStore, list[Rec]]) -> None:
    store, recs = setup
    every: Counter[str] = Counter()
    first = DyingProducer(k=2)
    async with client(first, store, recs) as c:
        task = asyncio.create_task(acking(first))
        with pytest.raises(Interrupted):
            await c.redrive(tenant="a", window=1)
        task.cancel()
    every.update(f"{r.id}@{r.attempt}" for r in sent(first))
    assert len(first.sent) == 2

    second = FakeProducer()
    async with client(second, store, recs) as c:
        task = asyncio.create_task(acking(second))
        s = await c.redrive(tenant="a")
        again = await c.redrive(tenant="a")  # another run, another day: nothing new
        task.cancel()
    every.update(f"{r.id}@{r.attempt}" for r in sent(second))
    assert every == {f"a-{i}@6": 1 for i in range(4)}
    assert len(s.redriven) == 2 and len(s.already) == 2 and s.ok
    assert again.redriven == [] and len(again.already) == 4 and len(again.refused) == 1
    row = await store.get_request(shard_of("a-0", SETTINGS.shards), "a-0", "redrive:0@0")
    assert row is not None and row.kind == "redrive"


async def test_a_retry_kafka_did_not_take_is_sent_by_the_next_run(
        setup: tuple[MemoryStore, list[Rec]]) -> None:
    store, recs = setup
    failing = FakeProducer(fail=frozenset({"b-1"}))
    async with client(failing, store, recs) as c:
        task = asyncio.create_task(acking(failing))
        s = await c.redrive(tenant="b")
        task.cancel()
    assert not s.ok and [p for p, _e in s.failed] == ["2@1"] and s.unrecorded == []
    ok = FakeProducer()
    async with client(ok, store, recs) as c:
        task = asyncio.create_task(acking(ok))
        s = await c.redrive(tenant="b")
        task.cancel()
    assert s.redriven == ["2@1"] and [r.id for r in sent(ok)] == ["b-1"]


async def test_a_retry_kafka_took_whose_row_was_not_written_is_failed_and_unrecorded(
        setup: tuple[MemoryStore, list[Rec]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka acknowledged the retry, the request row failed to write: the letter is failed
    (the next run sends a second copy) and, unlike a retry Kafka did not take, unrecorded."""
    store, recs = setup
    put = store.put_request

    async def put_request(row: Any, *args: Any, **kwargs: Any) -> Any:
        if row.job_id == "b-1":
            raise RuntimeError("write timed out")
        return await put(row, *args, **kwargs)

    monkeypatch.setattr(store, "put_request", put_request)
    producer = FakeProducer()
    async with client(producer, store, recs) as c:
        task = asyncio.create_task(acking(producer))
        s = await c.redrive(tenant="b")
        task.cancel()
    assert [p for p, _e in s.failed] == ["2@1"] and s.unrecorded == ["2@1"]
    assert "b-1" in [r.id for r in sent(producer)]


def test_the_cli_names_the_flag_of_a_bad_filter_and_wants_one() -> None:
    parser = build_parser()
    args = parser.parse_args(["dead", "redrive", "--failed-after", "yesterday"])
    with pytest.raises(ValidationError, match="--failed-after"):
        cli_dead.selector_from_args(args)
    args = parser.parse_args(["dead", "redrive"])
    with pytest.raises(ValidationError, match="--all"):
        cli_dead.run_redrive(args)


# --- through a node -------------------------------------------------------------------------

async def test_a_node_delivers_a_redriven_letter_once_as_the_next_attempt(rig: NodeRig) -> None:
    await rig.start()
    rig.upsert("once", at=T0 + 1000, max_attempts=2)
    await rig.advance(2000)
    [fired] = rig.fired("once")
    # The worker gave up on it: its dead letter, as the worker writes it.
    headers = dead_headers(tuple(fired.headers), RuntimeError("down"), rig.clock.now_ms(),
                           fired.topic, fired.partition, fired.offset)
    rig.bus.produce(rig.settings.dead_topic, 0, fired.key, fired.value, headers)
    producer = BusProducer(rig)
    reader = memory_reader(rig.bus.messages(rig.settings.dead_topic))
    async with SchedulerClient(rig.settings, producer=producer, store=rig.store,
                               now_ms=rig.clock.now_ms, dead_letters=reader) as c:
        s = await c.redrive(job_id="once")
        await rig.advance(1000)
        again = await c.redrive(job_id="once")
        await rig.advance(1000)
    assert s.redriven == ["0@0"] and again.already == ["0@0"]
    assert len(producer.sent) == 1
    redriven = [m for m in rig.fired("once") if m is not fired and m.offset != fired.offset]
    [m] = redriven
    assert m.value == fired.value
    assert m.header(wire.ATTEMPT) == b"2"
    assert m.header(wire.OCCURRENCE) == fired.header(wire.OCCURRENCE)


def attempts(rig: NodeRig, job_id: str, attempt: int) -> list[Message]:
    """The deliveries of `job_id` with that `cw-attempt`."""
    return [m for m in rig.fired(job_id) if m.header(wire.ATTEMPT) == str(attempt).encode()]


def rejections(rig: NodeRig) -> list[str]:
    return [(m.header(wire.REASON) or b"").decode()
            for m in rig.bus.messages(rig.settings.rejected_topic)]


async def fired_once(rig: NodeRig, job_id: str) -> Message:
    """A one-shot `job_id` with two attempts, fired: its first delivery."""
    await rig.start()
    rig.upsert(job_id, at=T0 + 1000, max_attempts=2)
    await rig.advance(2000)
    [fired] = rig.fired(job_id)
    return fired


def redrive_retry(fired: Message, redrive_id: str, at_ms: int) -> bytes:
    """The retry of `fired`'s next attempt, as a redrive (`redrive_id`) or, with "", as a
    worker sends it."""
    assert fired.key is not None and fired.value is not None
    return encode_retry(id=fired.key.decode(),
                        scheduled_ms=int(fired.header(wire.SCHEDULED_AT) or b"0"), attempt=2,
                        at_ms=at_ms, topic=fired.topic, payload=fired.value, max_attempts=2,
                        redrive_id=redrive_id)


async def test_a_node_applies_a_redrives_retry_once_however_many_copies_arrive(
        rig: NodeRig) -> None:
    fired = await fired_once(rig, "once")
    value = redrive_retry(fired, "redrive:0:0", rig.clock.now_ms())
    rig.submit("once", value)
    rig.submit("once", value)  # the same retry twice in one batch
    await rig.advance(1000)
    assert len(attempts(rig, "once", 2)) == 1
    # A copy sent again later (a redrive that died after Kafka took it, before its own row
    # was written, runs again) is acknowledged and delivers nothing more, also as a new
    # retry due now.
    rig.submit("once", value)
    rig.submit("once", redrive_retry(fired, "redrive:0:0", rig.clock.now_ms()))
    await rig.advance(1000)
    assert len(attempts(rig, "once", 2)) == 1
    assert rejections(rig) == []  # not an error
    shard = shard_of("once", rig.settings.shards)
    row = await rig.store.get_request(shard, "once", "retry/redrive:0:0")
    assert row is not None and row.kind == "retry"
    registry = rig.nodes[0].metrics.registry
    assert [registry.get_sample_value("chronowheel_ingested_total",
                                      {"op": "retry", "outcome": outcome})
            for outcome in ("stored", "unchanged")] == [1, 3]


async def test_a_redrives_request_row_lasts_as_long_as_its_due_row() -> None:
    """A hand-made redrive due later than the retention period: a copy sent once the retry
    was delivered, more than the retention period after the first, is still recognised (a
    request row kept for the retention period only would be gone by then)."""
    async with NodeRig(retention_ms=5_000) as rig:
        fired = await fired_once(rig, "later")
        value = redrive_retry(fired, "redrive:0:3", rig.clock.now_ms() + 20_000)
        rig.submit("later", value)
        await rig.advance(21_000)
        assert len(attempts(rig, "later", 2)) == 1
        rig.submit("later", value)  # 21 s after the first: past the retention period
        await rig.advance(2_000)
        assert len(attempts(rig, "later", 2)) == 1
        assert rejections(rig) == []


async def test_a_redrive_over_cassandras_batch_limit_is_rejected_and_the_node_goes_on() -> None:
    """The redrive's due row and request row go in one logged batch, whose size is checked
    before anything is stored: over the limit, that one retry is rejected with the limit
    named (nothing written, no delivery), the same retry without a redrive id (a due row
    alone, no batch) is delivered, and the node goes on."""
    async with NodeRig(store_batch_fail_bytes=2_000) as rig:
        fired = await fired_once(rig, "big")

        def retry(redrive_id: str) -> bytes:  # a hand-made letter's payload, over the batch
            return encode_retry(id="big", scheduled_ms=T0 + 1000, attempt=2,
                                at_ms=rig.clock.now_ms(), topic=fired.topic,
                                payload=b"x" * 2_500, max_attempts=2, redrive_id=redrive_id)

        rig.submit("big", retry("redrive:0:5"))
        await rig.advance(1000)
        assert attempts(rig, "big", 2) == []
        [reason] = rejections(rig)
        assert "payload_b64" in reason and "over the limit of 2000" in reason, reason
        shard = shard_of("big", rig.settings.shards)
        assert await rig.store.get_request(shard, "big", "retry/redrive:0:5") is None
        rig.submit("big", retry(""))
        await rig.advance(1000)
        assert len(attempts(rig, "big", 2)) == 1


async def test_a_retry_with_another_redrive_id_or_none_is_delivered(rig: NodeRig) -> None:
    fired = await fired_once(rig, "once")
    rig.submit("once", redrive_retry(fired, "redrive:0:0", rig.clock.now_ms()))
    await rig.advance(1000)
    # Another letter of the same occurrence and attempt: another redrive, delivered.
    rig.submit("once", redrive_retry(fired, "redrive:0:7", rig.clock.now_ms()))
    await rig.advance(1000)
    assert len(attempts(rig, "once", 2)) == 2
    # A worker's own retry (no redrive id) goes as before: each copy is a delivery, and
    # the node records no request for it.
    rig.submit("once", redrive_retry(fired, "", rig.clock.now_ms()))
    await rig.advance(1000)
    assert len(attempts(rig, "once", 2)) == 3
    assert rejections(rig) == []
    shard = shard_of("once", rig.settings.shards)
    assert sorted(r.request_id for r in await rig.store.shard_requests(shard)) == [
        "retry/redrive:0:0", "retry/redrive:0:7"]


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("redrive_id", "redrive:0@0",
     "redrive_id: must be 1..128 of A-Z a-z 0-9 . _ : - (got 'redrive:0@0')"),
    ("redrive_id", "", "redrive_id: must be 1..128 characters long (got '')"),
    ("redrive_id", 7, "redrive_id: must be a string (got 7)"),
    ("concurrency", "sometimes",
     "concurrency: must be one of allow, forbid, replace (got 'sometimes')"),
])
async def test_a_retry_with_an_invalid_redrive_id_or_policy_is_rejected_naming_the_field(
        rig: NodeRig, field: str, value: object, reason: str) -> None:
    fired = await fired_once(rig, "once")
    doc = orjson.loads(redrive_retry(fired, "", rig.clock.now_ms()))
    rig.submit("once", orjson.dumps({**doc, field: value}))
    await rig.advance(1000)
    assert rejections(rig) == [reason]
    assert attempts(rig, "once", 2) == []


async def test_two_redrives_of_one_letter_at_the_same_moment_deliver_it_once(
        rig: NodeRig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes redrive the same letter together: each finds no request row (neither
    has written its own yet) and sends the retry, the second after the node applied the
    first's. The node delivers one."""
    fired = await fired_once(rig, "once")
    headers = dead_headers(tuple(fired.headers), RuntimeError("down"), rig.clock.now_ms(),
                           fired.topic, fired.partition, fired.offset)
    rig.bus.produce(rig.settings.dead_topic, 0, fired.key, fired.value, headers)

    class Producer(BusProducer):
        def __init__(self) -> None:
            super().__init__(rig)
            self.out = asyncio.Event()

        async def send(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
            fut = await super().send(*args, **kwargs)
            self.out.set()
            return fut

    first, second = Producer(), Producer()
    put = rig.store.put_request

    async def put_request(row: Any, *args: Any, **kwargs: Any) -> Any:
        if row.kind == "redrive":  # a client's row: only once both retries are out
            await second.out.wait()
        return await put(row, *args, **kwargs)

    monkeypatch.setattr(rig.store, "put_request", put_request)

    async def redrive(producer: Producer) -> RedriveSummary:
        async with SchedulerClient(
                rig.settings, producer=producer, store=rig.store, now_ms=rig.clock.now_ms,
                dead_letters=memory_reader(rig.bus.messages(rig.settings.dead_topic))) as c:
            return await c.redrive(job_id="once")

    one = asyncio.create_task(redrive(first))
    await first.out.wait()
    await rig.advance(1000)  # the node applies the first retry and delivers it
    assert len(attempts(rig, "once", 2)) == 1
    other = asyncio.create_task(redrive(second))
    s1, s2 = await asyncio.gather(one, other)
    assert s1.redriven == s2.redriven == ["0@0"]  # both sent it
    await rig.advance(2000)
    [again] = attempts(rig, "once", 2)
    assert again.header(wire.OCCURRENCE) == fired.header(wire.OCCURRENCE)
    assert rejections(rig) == []


@pytest.mark.parametrize("policy", ["forbid", "replace"])
@pytest.mark.parametrize("how", ["retry", "redrive"])
async def test_a_retried_or_redriven_delivery_carries_the_jobs_overlap_policy(
        rig: NodeRig, policy: str, how: str) -> None:
    await rig.start()
    rig.upsert("sync", every="10s", max_attempts=3, concurrency=policy)
    await rig.advance(10_500)
    [fired, *_] = rig.fired("sync")
    assert fired.header(wire.CONCURRENCY) == policy.encode()
    if how == "retry":  # the worker's own retry of the failed delivery
        occ = Occurrence.from_record(fired.topic, fired.partition, fired.offset, fired.value,
                                     fired.headers)
        key, value = retry_command(occ, rig.clock.now_ms())
        rig.submit(key.decode(), value)
    else:
        headers = dead_headers(tuple(fired.headers), RuntimeError("down"),
                               rig.clock.now_ms(), fired.topic, fired.partition, fired.offset)
        rig.bus.produce(rig.settings.dead_topic, 0, fired.key, fired.value, headers)
        reader = memory_reader(rig.bus.messages(rig.settings.dead_topic))
        async with SchedulerClient(rig.settings, producer=BusProducer(rig), store=rig.store,
                                   now_ms=rig.clock.now_ms, dead_letters=reader) as c:
            assert (await c.redrive(job_id="sync")).redriven == ["0@0"]
    await rig.advance(12_000)
    [again] = [m for m in attempts(rig, "sync", 2)
               if m.header(wire.OCCURRENCE) == fired.header(wire.OCCURRENCE)]
    assert again.header(wire.CONCURRENCY) == policy.encode()


async def test_a_letter_whose_retry_the_node_would_reject_is_refused_with_the_reason() -> None:
    store = MemoryStore()
    await store.put_jobs([job("x-1", "a")])
    rec = letter(0, 0, "x-1")
    rec.headers = [(k, b"not-allowed.topic" if k == wire.SOURCE_TOPIC else v)
                   for k, v in rec.headers]
    producer = FakeProducer()
    async with client(producer, store, [rec]) as c:
        dry = await c.redrive(job_id="x-1", dry_run=True)
        s = await c.redrive(job_id="x-1")
    assert producer.sent == [] and s.redriven == [] and dry.redriven == []
    assert dry.refused == s.refused
    [(position, reason)] = s.refused
    assert position == "0@0" and reason.startswith("its retry is invalid: topic")


async def test_one_letter_is_selected_by_its_position_reading_from_it_and_stopping_after_it(
        setup: tuple[MemoryStore, list[Rec]]) -> None:
    store, recs = setup
    starts: list[tuple[int, int] | None] = []
    yielded: list[list[tuple[int, int]]] = []
    closed: list[tuple[int, int] | None] = []

    async def read(start: tuple[int, int] | None) -> Any:
        """A reader that records where it started and that it was closed (its consumer
        stopped): a finally runs on aclose() at a yield as on the end of the records."""
        starts.append(start)
        yielded.append([])
        try:
            async for rec in memory_reader(recs)(start):
                yielded[-1].append((rec.partition, rec.offset))
                yield rec
        finally:
            closed.append(start)

    producer = FakeProducer()
    acks = asyncio.ensure_future(acking(producer))
    try:
        async with SchedulerClient(SETTINGS, producer=producer, store=store,
                                   now_ms=lambda: NOW, dead_letters=read) as c:
            # each call has stopped its reader (early, after the next record) when it returns
            page = await c.dead_letters(letter="1@0")
            assert closed == starts == [(1, 0)]
            s = await c.redrive(letter="1@0")
            assert closed == starts == [(1, 0)] * 2
            again = await c.redrive(letter="1@0")
            assert closed == starts == [(1, 0)] * 3
            nothing = await c.redrive(letter="1@9")
            assert closed == starts == [(1, 0)] * 3 + [(1, 9)]
    finally:
        acks.cancel()
    assert [x.position for x in page.letters] == ["1@0"] and page.next_token is None
    assert s.redriven == ["1@0"] and s.matched == 1
    assert again.redriven == [] and again.already == ["1@0"]
    assert nothing.matched == 0 and nothing.redriven == []
    [retry] = sent(producer)
    assert (retry.id, retry.attempt) == ("a-1", 6)
    # Each read starts at the letter and stops at the first record after it.
    assert yielded[0] == [(1, 0), (1, 1)]
    selector = dead_selector(letter="2@3", job_id="a-9")
    assert selector.to_json() == {"job_id": "a-9", "letter": "2@3"}
    assert selector.describe() == "job_id=a-9 letter=2@3"
    for bad in ("", "2", "2@", "@3", "a@1", "1@-2", "0@²", "²@0"):
        with pytest.raises(ValidationError) as err:
            dead_selector(letter=bad)
        assert err.value.path == "letter"
