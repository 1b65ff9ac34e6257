"""Bulk operations against a real node, Kafka and Cassandra: `SchedulerClient.bulk` and
`chronowheel jobs pause|resume|cancel|trigger` select exactly the jobs their selectors name,
a re-run of the same operation sends and changes nothing, and `--wait` reports what the node
refused with its reasons."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from chronowheel.bus.kafka import reader
from chronowheel.client import SchedulerClient
from chronowheel.client.bulk import FileJournal
from chronowheel.settings import Settings
from chronowheel.store.base import JobRow
from chronowheel.store.cassandra import CassandraStore

from tests.integration.harness import applied, make_namespace, now_ms, run_cli, running_node

pytestmark = pytest.mark.integration

MIN = 60_000


async def rows(settings: Settings, ids: list[str]) -> dict[str, JobRow]:
    store = await asyncio.to_thread(CassandraStore.open, settings)
    try:
        return await store.get_jobs(ids)
    finally:
        await asyncio.to_thread(store.close)


async def submitted(settings: Settings) -> int:
    """Records on <ns>.submit so far (every partition's end offset)."""
    tps = [TopicPartition(settings.submit_topic, k) for k in range(settings.shards)]
    consumer = reader(settings)
    await consumer.start()
    try:
        return sum((await consumer.end_offsets(tps)).values())
    finally:
        await consumer.stop()


@pytest.mark.timeout(240)
async def test_bulk_pause_resume_cancel_and_trigger_on_a_real_node(
        stack: Any, namespace: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    settings = await make_namespace(stack, namespace, shards=4)
    base = now_ms() + 3_600_000
    base -= base % MIN
    # 205 jobs: acme's inv-a* and rep-a*, globex's inv-g* (the same prefix), each hourly job
    # first due a minute after the one before, and five one-shots of globex.
    acme_inv = [f"inv-a{i:03d}" for i in range(60)]
    acme_rep = [f"rep-a{i:03d}" for i in range(60)]
    globex_inv = [f"inv-g{i:03d}" for i in range(80)]
    once = [f"once-{i}" for i in range(5)]
    due = {j: base + i * MIN for group in (acme_inv, acme_rep, globex_inv)
           for i, j in enumerate(group)}
    everyone = [*acme_inv, *acme_rep, *globex_inv, *once]
    jobs = [{"id": j, "every": "1h", "start": due[j],
             "tenant": "globex" if j.startswith("inv-g") else "acme"} for j in due]
    jobs += [{"id": j, "at": base, "tenant": "globex"} for j in once]
    journal = FileJournal(tmp_path, settings.namespace)

    async with running_node(settings), SchedulerClient(settings) as client:
        report = await client.submit_many(jobs)
        assert report.ok and report.acked == len(jobs)
        await applied(settings)
        before = await rows(settings, everyone)
        assert {r.status for r in before.values()} == {"scheduled"} and len(before) == 205

        # Pause acme's inv- jobs, and wait for the node to apply it.
        dry = await client.bulk_pause(tenant="acme", prefix="inv-", dry_run=True,
                                      operation_id="pause-1", journal=journal)
        assert sorted(dry.changed) == acme_inv
        paused = await client.bulk_pause(tenant="acme", prefix="inv-", operation_id="pause-1",
                                         journal=journal, wait=60)
        assert paused.waited and paused.ok and sorted(paused.changed) == acme_inv
        after = await rows(settings, everyone)
        assert sorted(j for j, r in after.items() if r.status == "paused") == acme_inv
        assert all(after[j].version == before[j].version for j in everyone
                   if j not in acme_inv)

        # The same operation again: nothing sent, nothing changed.
        sent = await submitted(settings)
        again = await client.bulk_pause(tenant="acme", prefix="inv-", operation_id="pause-1",
                                        journal=journal, wait=60)
        assert again.changed == [] and sorted(again.done_before) == acme_inv
        assert await submitted(settings) == sent
        assert await rows(settings, everyone) == after

        # Through the CLI: a dry run, and the same operation resumed by its id alone.
        code, out, err = await run_cli(
            capsys, settings, "jobs", "pause", "--tenant", "globex", "--prefix", "inv-g00",
            "--dry-run", "--show", "3")
        assert code == 0, err
        assert "would change  10" in out and "... 7 more" in out
        [shown] = [line for line in out.splitlines() if "more" in line]
        assert shown.count("inv-g00") == 3
        code, out, err = await run_cli(
            capsys, settings, "jobs", "pause", "--resume", "pause-1", "--journal-dir",
            str(tmp_path))
        assert code == 0, err
        assert "operation pause-1: pause tenant=acme prefix=inv-" in out
        assert "changed       0" in out and "done before   60" in out
        assert await submitted(settings) == sent

        # Resume them through the CLI (the operation id resumes from the journal's selector).
        code, out, err = await run_cli(
            capsys, settings, "jobs", "resume", "--tenant", "acme", "--prefix", "inv-",
            "--operation-id", "resume-1", "--journal-dir", str(tmp_path), "--wait", "60",
            "--json")
        assert code == 0, err
        assert "operation resume-1: resume tenant=acme prefix=inv-" in err
        summary = orjson.loads(out)
        assert (summary["changed"], summary["already"], summary["refused"]) == (60, 0, 0)
        resumed = await rows(settings, everyone)
        assert {r.status for r in resumed.values()} == {"scheduled"}
        assert all(resumed[j].version == after[j].version + 1 for j in acme_inv)

        # Cancel by due range, every tenant: the jobs first due in [base+10m, base+20m),
        # which `jobs list` shows with the same flags.
        code, out, err = await run_cli(
            capsys, settings, "jobs", "list", "--due-after", str(base + 10 * MIN),
            "--due-before", str(base + 20 * MIN), "--limit", "1000", "--json")
        assert code == 0, err
        listed = sorted(j["id"] for j in orjson.loads(out)["jobs"])
        code, out, err = await run_cli(
            capsys, settings, "jobs", "cancel", "--due-after", str(base + 10 * MIN),
            "--due-before", str(base + 20 * MIN), "--journal-dir", str(tmp_path),
            "--wait", "60")
        assert code == 0, err
        in_range = sorted(j for j, at in due.items() if base + 10 * MIN <= at < base + 20 * MIN)
        assert len(in_range) == 30 and listed == in_range
        assert "changed       30" in out and "refused       0" in out
        cancelled = await rows(settings, everyone)
        assert sorted(j for j, r in cancelled.items() if r.status == "cancelled") == in_range

        # A trigger the node refuses (one-shots) comes back with the node's reason.
        trig = await client.bulk_trigger(tenant="globex", prefix="once-",
                                         operation_id="trig-1", wait=60)
        assert trig.changed == [] and sorted(j for j, _ in trig.refused) == once
        assert trig.refusal_counts() == {
            "id: job <job> is a one-shot; only a recurring job can be triggered": 5}
