"""SchedulerClient without Kafka: a fake producer records what would be sent."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from chronowheel.client import DeliveryError, SchedulerClient, SubmitProgress
from chronowheel.errors import ChronowheelError, RetriableError, ValidationError
from chronowheel.settings import Settings

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z


class FakeProducer:
    """Acknowledges each send when `ack()` is called, or fails those whose id is in `fail`."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.futures: list[asyncio.Future[Any]] = []
        self.fail = fail
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   **kw: Any) -> asyncio.Future[Any]:
        assert value is not None and key is not None
        self.sent.append((topic, key, value))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut

    def ack(self) -> None:
        for (_topic, key, _v), fut in zip(self.sent, self.futures, strict=True):
            if fut.done():
                continue
            if key.decode() in self.fail:
                fut.set_exception(RuntimeError(f"broker said no to {key.decode()}"))
            else:
                fut.set_result(("meta", key.decode()))

    def docs(self) -> list[Any]:
        return [orjson.loads(v) for _t, _k, v in self.sent]


def client(producer: FakeProducer, **settings: Any) -> SchedulerClient:
    return SchedulerClient(Settings(namespace="acme", **settings), producer=producer,
                           now_ms=lambda: NOW)


async def acking(producer: FakeProducer) -> None:
    """Acknowledge in the background, like a broker would, until cancelled."""
    while True:
        producer.ack()
        await asyncio.sleep(0)


async def test_schedule_writes_the_wire_format_keyed_by_job_id() -> None:
    p = FakeProducer()
    async with client(p) as c:
        d = await c.schedule("reminder-42", datetime(2027, 2, 1, 9, tzinfo=UTC),
                             {"to": "ada"}, headers={"trace": "t1"}, max_attempts=3,
                             backoff=timedelta(seconds=30), window=5000, tenant="acme")
        assert not d.done()  # queued, not yet acknowledged
        p.ack()
    assert d.result() == ("meta", "reminder-42")
    assert p.started and not p.stopped  # a producer passed in is its owner's to stop
    topic, key, _ = p.sent[0]
    assert (topic, key) == ("acme.submit", b"reminder-42")
    assert p.docs() == [{"v": 1, "op": "upsert", "job": {
        "id": "reminder-42", "at": "2027-02-01T09:00:00Z", "payload": {"to": "ada"},
        "headers": {"trace": "t1"}, "window": "5s", "max_attempts": 3, "backoff": "30s",
        "tenant": "acme"}}]


async def test_cron_every_cancel_and_bytes_payload() -> None:
    p = FakeProducer()
    async with client(p) as c:
        await c.cron("standup", "0 9 * * 1-5", tz="Europe/London", catch_up="skip")
        await c.cron("utc", "@daily")
        await c.every("poll", "15m", b"\x00\x01", start=NOW + 1000)
        await c.cancel("old")
        p.ack()
    docs = p.docs()
    assert docs[0]["job"] == {"id": "standup", "cron": "0 9 * * 1-5", "tz": "Europe/London",
                              "catch_up": "skip"}
    assert docs[1]["job"] == {"id": "utc", "cron": "@daily"}  # UTC is the default: left out
    assert docs[2]["job"] == {"id": "poll", "every": "15m", "start": NOW + 1000,
                              "payload_b64": base64.b64encode(b"\x00\x01").decode()}
    assert docs[3] == {"v": 1, "op": "cancel", "id": "old"}
    assert [k for _t, k, _v in p.sent] == [b"standup", b"utc", b"poll", b"old"]


async def test_max_lateness_on_every_kind_of_job() -> None:
    p = FakeProducer()
    async with client(p) as c:
        await c.schedule("once", NOW + 60_000, max_lateness=timedelta(minutes=5))
        await c.cron("daily", "@daily", max_lateness="1h")
        await c.every("poll", "15m", max_lateness=90_000)
        p.ack()
    assert [d["job"]["max_lateness"] for d in p.docs()] == ["5m", "1h", "90s"]


@pytest.mark.parametrize(("call", "path"), [
    (lambda c: c.schedule("a", "2027-02-01T09:00:00"), "job.at"),          # no offset
    (lambda c: c.every("a", "1m", max_lateness="500ms"), "job.max_lateness"),  # under 1 s
    (lambda c: c.schedule("a", NOW + 11 * 366 * 86_400_000), "job.at"),    # beyond horizon
    (lambda c: c.cron("a", "0 9 * * *", tz="Europe/Lundon"), "job.tz"),
    (lambda c: c.cron("a", "61 * * * *"), "job.cron"),
    (lambda c: c.schedule("a", NOW, topic="acme.state"), "job.topic"),     # internal topic
    (lambda c: c.schedule("a", NOW, headers={"cw-attempt": "2"}), "job.headers.cw-attempt"),
    (lambda c: c.schedule("a", datetime(2027, 2, 1, 9)), "job"),            # naive datetime
    (lambda c: c.schedule("a", NOW, payload={1, 2}), "job.payload"),       # not JSON
    (lambda c: c.submit({"id": "a", "at": NOW, "tpoic": "x"}), "job.tpoic"),
    (lambda c: c.cancel(""), "id"),
    (lambda c: c.send_command({"v": 1, "op": "upsert"}), "job"),
])
async def test_invalid_commands_raise_before_anything_is_sent(call: Any, path: str) -> None:
    p = FakeProducer()
    async with client(p) as c:
        with pytest.raises(ValidationError) as err:
            await call(c)
    assert err.value.path == path
    assert p.sent == []


async def test_allowed_topics_come_from_the_settings() -> None:
    p = FakeProducer()
    async with client(p, allowed_topics=r"emails\..+") as c:
        await c.schedule("a", NOW, topic="emails.send")
        with pytest.raises(ValidationError):
            await c.schedule("b", NOW, topic="billing.charge")
        p.ack()
    assert len(p.sent) == 1


async def test_validation_can_be_turned_off() -> None:
    p = FakeProducer()
    c = SchedulerClient(Settings(namespace="acme"), producer=p, validate=False)
    async with c:
        await c.cron("a", "not a cron")
        p.ack()
    assert p.docs()[0]["job"]["cron"] == "not a cron"


async def test_flush_waits_for_every_ack_and_reports_failures_once() -> None:
    p = FakeProducer(fail=frozenset({"bad"}))
    c = client(p)
    await c.start()
    for job_id in ("a", "bad", "b"):
        await c.schedule(job_id, NOW)
    assert c.in_flight == 3
    flushing = asyncio.ensure_future(c.flush())
    await asyncio.sleep(0)
    assert not flushing.done()  # nothing acknowledged yet
    p.ack()
    with pytest.raises(DeliveryError) as err:
        await flushing
    assert [job_id for job_id, _ in err.value.failures] == ["bad"]
    assert c.in_flight == 0 and c.acked == 2
    await c.flush()  # reported once: a second flush is clean
    await c.close()


async def test_context_exit_raises_delivery_error_but_not_over_another_error() -> None:
    p = FakeProducer(fail=frozenset({"bad"}))
    with pytest.raises(DeliveryError):
        async with client(p) as c:
            await c.schedule("bad", NOW)
            p.ack()
    p2 = FakeProducer(fail=frozenset({"bad"}))
    with pytest.raises(KeyError):
        async with client(p2) as c:
            await c.schedule("bad", NOW)
            p2.ack()
            raise KeyError("the caller's own error wins")


async def test_use_before_start_and_after_close_is_refused() -> None:
    c = client(FakeProducer())
    with pytest.raises(ChronowheelError, match="not started"):
        await c.schedule("a", NOW)
    await c.start()
    await c.close()
    with pytest.raises(ChronowheelError, match="closed"):
        await c.schedule("a", NOW)


async def test_submit_many_mixes_jobs_and_commands_and_skips_invalid_items() -> None:
    p = FakeProducer(fail=frozenset({"j3"}))
    seen: list[tuple[int, str]] = []
    progress: list[SubmitProgress] = []
    items: list[dict[str, Any]] = [
        {"id": "j1", "at": NOW},
        {"id": "j2", "at": NOW, "tz": "UTC"},            # tz only with cron: invalid
        {"v": 1, "op": "cancel", "id": "j1"},
        {"id": "j3", "every": "1h"},
        {"v": 1, "op": "upsert", "job": {"id": "j4", "cron": "@hourly"}},
    ]
    async with client(p) as c:
        acker = asyncio.ensure_future(acking(p))
        try:
            report = await c.submit_many(
                items, progress=progress.append, progress_interval_s=0,
                on_invalid=lambda i, e: seen.append((i, e.path)))
        finally:
            acker.cancel()
    assert seen == [(1, "job.tz")]
    assert [i for i, _ in report.invalid] == [1]
    assert report.queued == 4 and report.acked == 3
    assert [job_id for job_id, _ in report.failed] == ["j3"]
    assert not report.ok
    assert [k for _t, k, _v in p.sent] == [b"j1", b"j1", b"j3", b"j4"]
    assert progress[-1].queued == 4 and progress[-1].acked == 3
    assert progress[-1].invalid == 1 and progress[-1].failed == 1
    assert [pr.queued for pr in progress] == sorted(pr.queued for pr in progress)


async def test_submit_many_raises_on_invalid_by_default_after_draining() -> None:
    p = FakeProducer()
    async with client(p) as c:
        acker = asyncio.ensure_future(acking(p))
        try:
            with pytest.raises(ValidationError):
                await c.submit_many([{"id": "ok", "at": NOW}, {"id": "bad"}])
            assert c.in_flight == 0  # what was queued before the bad item was awaited
        finally:
            acker.cancel()
    assert [k for _t, k, _v in p.sent] == [b"ok"]


async def test_an_unreachable_kafka_is_a_clear_retriable_error() -> None:
    class Unreachable(FakeProducer):
        async def start(self) -> None:
            raise ConnectionRefusedError("connect call failed")

    c = SchedulerClient(Settings(namespace="acme", kafka="127.0.0.1:1"), producer=Unreachable())
    with pytest.raises(RetriableError, match=r"cannot reach Kafka at 127\.0\.0\.1:1"):
        await c.start()
    with pytest.raises(ChronowheelError, match="not started"):
        await c.schedule("a", NOW)
