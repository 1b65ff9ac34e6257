"""Client helpers that write the v1 wire format to `<ns>.submit`.

    async with SchedulerClient(Settings.from_env(namespace="acme")) as client:
        await client.schedule("reminder-42", "2026-12-01T09:00:00Z", {"to": "ada"})
        await client.cron("standup", "0 9 * * 1-5", tz="Europe/London")
        await client.cancel("old-job")
        await client.pause("standup")
        await client.trigger("standup", request_id="run-now-1")
        page = await client.list_jobs(tenant="acme", status="paused", limit=50)
        summary = await client.bulk_pause(tenant="acme", prefix="inv-", wait=60)
        letters = await client.dead_letters(tenant="acme", reason="Timeout")
        redrive = await client.redrive(tenant="acme", reason="Timeout")
        history = await client.job_history("standup", limit=20)  # runs and counters
    # leaving the block waits until Kafka acknowledged every command

See `chronowheel.client.scheduler` for the details.
"""

from chronowheel.client.bulk import (
    BulkProgress,
    BulkSummary,
    FileJournal,
    JobSelector,
    MemoryJournal,
    job_selector,
)
from chronowheel.client.dead import DeadLetterInfo, DeadLetterPage, RedriveSummary
from chronowheel.client.scheduler import (
    Delivery,
    DeliveryError,
    SchedulerClient,
    SubmitProgress,
    SubmitReport,
    job_query,
)
from chronowheel.core.runs import JobHistory, RunCounters, RunRecord
from chronowheel.store.base import JobPage, JobSummary

__all__ = ["BulkProgress", "BulkSummary", "DeadLetterInfo", "DeadLetterPage", "Delivery",
           "DeliveryError", "FileJournal", "JobHistory", "JobPage", "JobSelector",
           "JobSummary", "MemoryJournal", "RedriveSummary", "RunCounters", "RunRecord",
           "SchedulerClient", "SubmitProgress", "SubmitReport", "job_query", "job_selector"]
