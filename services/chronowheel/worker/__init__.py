"""Worker library: consume fired occurrences, deduplicate, retry, dead-letter.

    from chronowheel.worker import Occurrence, Worker

    async def send_email(occ: Occurrence) -> None:
        ...

    await Worker(settings, handlers={"emails.send": send_email}).run()

See docs/worker.md for the semantics (retries, dead letters, idempotency, shutdown).
"""

from chronowheel.worker.occurrence import MalformedOccurrence, Occurrence
from chronowheel.worker.policy import DeadLetter, retry_delay_ms
from chronowheel.worker.service import (
    Handler,
    Worker,
    WorkerError,
    WorkerSettings,
    WorkerStats,
    default_group_id,
    install_signal_handlers,
)

__all__ = [
    "DeadLetter",
    "Handler",
    "MalformedOccurrence",
    "Occurrence",
    "Worker",
    "WorkerError",
    "WorkerSettings",
    "WorkerStats",
    "default_group_id",
    "install_signal_handlers",
    "retry_delay_ms",
]
