"""Schedule controls and job listing in the Python client (fake producer, no Kafka) and the
CLI (argument parsing and the pure views of `jobs list`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from chronowheel import cli
from chronowheel.cli import build_parser, jobs
from chronowheel.client import JobPage, JobSummary, job_query
from chronowheel.errors import ValidationError
from chronowheel.store.base import JobQuery

from tests.unit.test_client import NOW, FakeProducer, client

T = 1_796_115_600_000  # 2026-12-01T09:00:00Z


async def test_the_client_sends_each_control_keyed_by_the_job_id() -> None:
    producer = FakeProducer()
    async with client(producer) as c:
        await c.pause("report")
        await c.resume("report")
        await c.trigger("report", request_id="rerun-1")
        await c.backfill("report", datetime(2026, 11, 1, tzinfo=UTC), NOW - 1,
                         request_id="fix-1")
        producer.ack()
    assert [k for _t, k, _v in producer.sent] == [b"report"] * 4
    assert producer.docs() == [
        {"v": 1, "op": "pause", "id": "report"},
        {"v": 1, "op": "resume", "id": "report"},
        {"v": 1, "op": "trigger", "id": "report", "request_id": "rerun-1"},
        {"v": 1, "op": "backfill", "id": "report", "request_id": "fix-1",
         "from": "2026-11-01T00:00:00Z", "to": NOW - 1},
    ]


async def test_the_client_refuses_invalid_controls_before_sending() -> None:
    producer = FakeProducer()
    async with client(producer) as c:
        with pytest.raises(ValidationError, match=r"request_id: must be 1\.\.128"):
            await c.trigger("report", request_id="no spaces")
        with pytest.raises(ValidationError, match="to: must not be in the future"):
            await c.backfill("report", NOW - 1000, NOW + 1000, request_id="r")
        with pytest.raises(ValidationError, match="naive"):
            await c.backfill("report", datetime(2026, 11, 1), NOW, request_id="r")
        with pytest.raises(ValidationError, match="id: must be a string"):
            await c.pause(7)  # type: ignore[arg-type]
    assert producer.sent == []


def test_job_query_checks_every_filter() -> None:
    assert job_query(tenant="acme", status="paused", prefix="inv-",
                     due_before="2026-12-01T09:00:00Z", limit=5) == JobQuery(
        tenant="acme", status="paused", prefix="inv-", due_before_ms=T, limit=5)
    assert job_query(due_before=datetime(2026, 12, 1, 9, tzinfo=UTC)).due_before_ms == T
    assert job_query(prefix="").prefix is None
    for kwargs, message in (
            ({"status": "running"}, "status: must be one of scheduled, paused, finished, "
                                    "cancelled"),
            ({"limit": 0}, "limit: must be an integer between 1 and 1000"),
            ({"limit": 1001}, "limit: must be an integer between 1 and 1000"),
            ({"due_before": "tomorrow"}, "due_before: must be an RFC 3339 time"),
    ):
        with pytest.raises(ValidationError, match=message):
            job_query(**kwargs)


def _parse(argv: list[str]) -> Any:
    return build_parser().parse_args(argv)


def test_the_cli_has_the_controls_and_the_listing() -> None:
    assert "chronowheel.cli.jobs" in cli.COMMAND_MODULES
    args = _parse(["job", "pause", "report"])
    assert (args.op, args.id) == ("pause", "report")
    args = _parse(["job", "resume", "report"])
    assert (args.op, args.id) == ("resume", "report")
    args = _parse(["job", "trigger", "report", "--request-id", "r-1"])
    assert (args.id, args.request_id) == ("report", "r-1")
    args = _parse(["job", "backfill", "report", "--from", "2026-11-01T00:00:00Z",
                   "--to", "1796115600000"])
    assert (args.start, args.end, args.request_id) == ("2026-11-01T00:00:00Z",
                                                       "1796115600000", None)
    with pytest.raises(SystemExit):
        _parse(["job", "backfill", "report", "--from", "2026-11-01T00:00:00Z"])
    args = _parse(["jobs", "list", "--tenant", "acme", "--status", "paused", "--prefix", "a",
                   "--due-before", "2026-12-02T00:00:00Z", "--limit", "50"])
    assert (args.tenant, args.status, args.prefix, args.due_before, args.limit) == (
        "acme", "paused", "a", "2026-12-02T00:00:00Z", 50)
    with pytest.raises(SystemExit):
        _parse(["jobs", "list", "--status", "running"])


def test_the_listing_views() -> None:
    page = JobPage([JobSummary("inv-1", 3, "paused", "acme", T, 4),
                    JobSummary("inv-2", 1, "cancelled", None, None, 2)], "abc")
    assert orjson.loads(orjson.dumps(jobs.view(page))) == {
        "jobs": [{"id": "inv-1", "status": "paused", "stored_status": "paused",
                  "tenant": "acme", "shard": 3, "version": 4, "due_ms": T,
                  "due": "2026-12-01T09:00:00.000Z", "counters": None, "note": None},
                 {"id": "inv-2", "status": "cancelled", "stored_status": "cancelled",
                  "tenant": None, "shard": 1, "version": 2, "due_ms": None, "due": None,
                  "counters": None, "note": None}],
        "next_page": "abc"}
    text = jobs.render(page, T - 60_000)
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "TENANT", "DUE", "RUNS",
                                "(FIRED/OK/FAILED/LAST)"]
    assert lines[1].split()[:4] == ["inv-1", "paused", "acme", "2026-12-01T09:00:00.000Z"]
    assert lines[2].split() == ["inv-2", "cancelled", "-", "-", "-"]
    assert lines[-1] == "more: --page abc"
    assert jobs.render(JobPage([], None), T) == "no jobs on this page"
