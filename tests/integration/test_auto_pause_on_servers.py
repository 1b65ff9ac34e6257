"""Auto-pause on the real servers: a job every second whose handler always fails, with
`pause_after_failures: 3`, is paused by the node once a real worker reports its third failed
run, with a note; `job show` and `jobs list --status paused` show the note; a resume clears
it, and the job fires again (and, failing on, is paused again after three more)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from chronowheel.client import SchedulerClient
from chronowheel.core import runs
from chronowheel.worker import Occurrence

from testkit.fleet import until
from tests.integration.harness import make_namespace, run_cli, running_node, running_worker

pytestmark = pytest.mark.integration


async def test_a_job_failing_every_run_is_paused_after_three_with_a_note_and_resumes(
        stack: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    settings = await make_namespace(stack, namespace, shards=2)
    handled: list[tuple[int, int]] = []  # (scheduled ms, fired ms) of each run handled

    async def handler(occ: Occurrence) -> None:
        handled.append((occ.scheduled_ms, occ.fired_ms))
        raise RuntimeError("the payment provider refused the call")

    async with (running_node(settings, node_id="ap-n"),
                running_worker(settings, handler, worker_id="ap-w"),
                SchedulerClient(settings) as client):
        await (await client.every("flaky", "1s", max_attempts=1, pause_after_failures=3))

        async def paused() -> bool:
            page = await client.list_jobs(status="paused", prefix="flaky")
            return any(j.job_id == "flaky" for j in page.jobs)

        await until(paused, 60, "the job paused after its failed runs")
        history = await client.job_history("flaky", limit=20)
        failed = sorted(r.scheduled_ms for r in history.runs if r.state == runs.DEAD_LETTERED)
        # Paused on the third failed run's report: a fourth may have been on its way out while
        # the report travelled, never more than one more a second later.
        assert 3 <= len(failed) <= 5, failed
        assert all(fired >= scheduled for scheduled, fired in handled)  # never early
        page = await client.list_jobs(status="paused", prefix="flaky")
        (job,) = page.jobs
        assert job.note is not None
        assert job.note.startswith("auto-paused after 3 consecutive failed runs")
        assert "ap-w" in job.note and "payment provider refused" in job.note

        # The command line shows the note.
        code, out, _ = await run_cli(capsys, settings, "job", "show", "flaky")
        assert code == 0 and "note       auto-paused after 3 consecutive" in out
        code, out, _ = await run_cli(capsys, settings, "job", "show", "flaky", "--json")
        view = orjson.loads(out)
        assert view["status"] == "paused" and view["note"] == job.note
        code, out, _ = await run_cli(capsys, settings, "jobs", "list", "--status", "paused")
        assert code == 0 and "flaky: auto-paused after 3" in out

        # Resume: the note goes and the job fires again; failing on, a new streak of three
        # pauses it again.
        before_resume = len(handled)
        await (await client.resume("flaky"))

        async def cleared() -> bool:
            (row,) = (await client.list_jobs(prefix="flaky")).jobs
            return row.status == "scheduled" and row.note is None

        await until(cleared, 30, "the job resumed without its note")

        async def fired_again() -> bool:
            return len(handled) > before_resume

        await until(fired_again, 30, "the job fired again")
        code, out, _ = await run_cli(capsys, settings, "job", "show", "flaky", "--json")
        view = orjson.loads(out)
        if view["status"] == "scheduled":
            assert view["note"] is None
        await until(paused, 60, "the job paused again after three more failed runs")
        assert len(handled) - before_resume >= 3
