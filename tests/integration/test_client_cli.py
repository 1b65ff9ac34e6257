"""The client and the ops commands against real Cassandra + Kafka and a real in-process node.

The CLI commands run their own asyncio loop, so they are called in a worker thread while the
node runs on the test's loop; capsys captures what they print.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from chronowheel.client import SchedulerClient
from chronowheel.core.shard import shard_of
from chronowheel.settings import Settings
from chronowheel.store.cassandra import CassandraStore

from testkit.fleet import until
from tests.integration.harness import collecting, make_namespace, now_ms, run_cli, running_node

pytestmark = pytest.mark.integration


async def wait_job(settings: Settings, job_id: str, status: str, timeout_s: float = 30) -> None:
    """Until the node applied a command: the job's row in the jobs table has `status`."""
    store = await asyncio.to_thread(CassandraStore.open, settings)
    try:
        async def applied() -> bool:
            row = await store.get_job(job_id)
            return row is not None and row.status == status

        await until(applied, timeout_s, f"job {job_id} to be {status}")
    finally:
        await asyncio.to_thread(store.close)


async def test_client_writes_to_the_job_shard_and_the_node_fires_it(
        stack: Any, namespace: str) -> None:
    settings = await make_namespace(stack, namespace, shards=8)
    at = now_ms() + 1_500
    ids = [f"client-{i}" for i in range(40)]
    async with collecting(settings) as fired, running_node(settings):
        async with SchedulerClient(settings) as client:
            deliveries = [await client.schedule(job_id, at, {"n": i},
                                                headers={"src": "client"})
                          for i, job_id in enumerate(ids)]
            await client.cron("client-cron", "0 0 1 1 *", tz="Europe/London")
        # aiokafka's default partitioner is the Java client's murmur2: partition = shard
        for job_id, d in zip(ids, deliveries, strict=True):
            meta = d.result()  # done: leaving the block flushed everything
            assert meta.topic == settings.submit_topic
            assert meta.partition == shard_of(job_id, settings.shards), job_id
        await fired.wait_for(lambda ms: len(ms) >= len(ids), 30, "the client's jobs")
    by_key = {m.key.decode(): m for m in fired.messages if m.key}
    assert sorted(by_key) == sorted(ids)
    for i, job_id in enumerate(ids):
        m = by_key[job_id]
        assert orjson.loads(m.value) == {"n": i}
        assert m.headers["src"] == "client"
        assert m.scheduled_ms == at and m.fired_ms >= at


async def test_submit_file_skips_a_bad_line_and_sends_the_rest(
        stack: Any, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = await make_namespace(stack, namespace)
    far = now_ms() + 86_400_000
    path = tmp_path / "jobs.jsonl"
    path.write_text(
        orjson.dumps({"id": "f-1", "at": far}).decode() + "\n"
        + '{"id": "f-2", "at": "tomorrow"}\n'
        + orjson.dumps({"v": 1, "op": "upsert",
                        "job": {"id": "f-3", "every": "1h", "payload": [1]}}).decode() + "\n")
    async with running_node(settings):
        code, out, err = await run_cli(capsys, settings, "submit", "--file", str(path),
                                           connection=False)
        assert code == 1
        assert f"{path}:2: job.at: must be an RFC 3339 time" in err
        assert "2 command(s) written" in out and "1 bad line(s) skipped" in out
        await wait_job(settings, "f-1", "scheduled")
        await wait_job(settings, "f-3", "scheduled")
        code, out, err = await run_cli(capsys, settings, "job", "show", "f-2")
        assert code == 1 and "not found" in err


async def test_job_show_and_cancel(stack: Any, namespace: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    settings = await make_namespace(stack, namespace)
    at = now_ms() + 3_600_000
    async with running_node(settings):
        code, out, _ = await run_cli(
            capsys, settings, "submit", "--id", "show-me", "--at", str(at), "--payload",
            '{"x": 1}', "--header", "team=ops", connection=False)
        assert code == 0
        assert f"partition {shard_of('show-me', settings.shards)} " in out
        await wait_job(settings, "show-me", "scheduled")

        code, out, _ = await run_cli(capsys, settings, "job", "show", "show-me", "--json")
        assert code == 0
        view = orjson.loads(out)
        assert view["status"] == "scheduled" and view["version"] == 1
        assert view["shard"] == shard_of("show-me", settings.shards)
        assert view["next_scheduled_ms"] == at == view["slot_ms"]
        assert view["published"] is False  # an hour ahead: not yet
        assert view["spec"] == {"id": "show-me", "at": at, "payload": {"x": 1},
                                "headers": {"team": "ops"}}
        code, text, _ = await run_cli(capsys, settings, "job", "show", "show-me")
        assert "status     scheduled" in text and "published  not yet" in text

        code, out, _ = await run_cli(capsys, settings, "job", "cancel", "show-me",
                                         "--wait", "30")
        assert code == 0
        assert "job show-me: cancelled (version 2)" in out
        code, out, _ = await run_cli(capsys, settings, "job", "show", "show-me", "--json")
        view = orjson.loads(out)
        assert (view["status"], view["next_scheduled_ms"]) == ("cancelled", None)


async def test_status_shows_every_shard_owned_with_a_watermark(
        stack: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    settings = await make_namespace(stack, namespace, shards=4)
    async with running_node(settings, node_id="status-node"):
        async with SchedulerClient(settings) as client:
            await client.schedule("due-soon", now_ms() + 5 * 60_000)
        await wait_job(settings, "due-soon", "scheduled")
        # A watermark record from this node's dispatch for every shard (commits at least every
        # 2 s); the claim a takeover commits first has no horizon yet.
        doc: dict[str, Any] = {}

        async def every_shard_dispatching() -> bool:
            nonlocal doc
            code, out, _ = await run_cli(capsys, settings, "status", "--json")
            assert code == 0
            doc = orjson.loads(out)
            return all(r["writer"] == "status-node" and r["horizon_ahead_ms"] is not None
                       for r in doc["rows"])

        await until(every_shard_dispatching, 30,
                    "a watermark record of status-node for every shard", poll_s=0.5)
        assert doc["shards"] == 4 and doc["group"]["state"] == "Stable"
        assert len(doc["group"]["members"]) == 1
        owner = doc["rows"][0]["owner"]
        assert owner is not None
        for r in doc["rows"]:
            assert r["owner"] == owner
            assert r["watermark_ms"] is not None and r["lag_ms"] is None
            assert r["watermark_age_ms"] < 10_000
            assert r["horizon_ahead_ms"] > 0  # the wheel is loaded ahead of now
        due = {r["shard"]: r["due_rows"] for r in doc["rows"]}
        assert due[shard_of("due-soon", 4)] == 1 and sum(due.values()) == 1

        code, text, _ = await run_cli(capsys, settings, "status")
        assert code == 0
        lines = text.splitlines()
        assert lines[0].startswith("SHARD  OWNER")
        assert len(lines) == 1 + 4 + 1
        assert "4 shards, 4 owned by 1 group member(s)" in lines[-1]
    # With the node gone, no shard has an owner and the watermarks age.
    code, out, _ = await run_cli(capsys, settings, "status", "--json", "--behind-ms", "0")
    assert code == 0
    doc = orjson.loads(out)
    assert all(r["owner"] is None and r["lag_ms"] is not None for r in doc["rows"])


async def test_tail_prints_a_fired_message(stack: Any, namespace: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    settings = await make_namespace(stack, namespace)
    at = now_ms()
    async with collecting(settings) as fired, running_node(settings):
        async with SchedulerClient(settings) as client:
            await client.schedule("tail-me", at, {"hello": "world"}, headers={"k": "v"})
        await fired.wait_for(lambda ms: len(ms) >= 1, 30, "the job")
    code, out, _ = await run_cli(capsys, settings, "tail", settings.fired_topic,
                                     "--from-beginning", "--max", "1", "--timeout", "30",
                                     connection=False)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"{settings.fired_topic}[{shard_of('tail-me', 4)}]@0  "
                               f"key=tail-me  scheduled=")
    assert f"cw-occurrence=tail-me@{at}" in lines[1] and "k=v" in lines[1]
    assert lines[2] == '  payload  {"hello":"world"}'
    code, out, _ = await run_cli(capsys, settings, "tail", settings.fired_topic,
                                     "--from-beginning", "--max", "1", "--json",
                                     "--timeout", "30", connection=False)
    doc = orjson.loads(out)
    assert doc["payload"] == {"hello": "world"} and doc["key"] == "tail-me"
    assert doc["headers"]["cw-scheduled-at"] == str(at)
    # Nothing new arrives: --max is not reached before --timeout, exit status 1.
    code, out, _ = await run_cli(capsys, settings, "tail", settings.fired_topic,
                                     "--max", "1", "--timeout", "1", connection=False)
    assert (code, out) == (1, "")
