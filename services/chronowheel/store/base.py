"""What the node and the worker need from storage. Pure types and a Protocol: no driver here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class JobRow:
    job_id: str
    shard: int
    spec: bytes
    version: int
    status: str
    scheduled_ms: int | None
    slot_ms: int | None
    # Seconds until the row expires (0 = never): finished one-shots and cancelled jobs are
    # remembered for the retention period, which bounds how long re-submits are no-ops.
    ttl_s: int = 0


@dataclass(frozen=True, slots=True)
class DueRow:
    """One pending occurrence, with everything needed to publish it."""

    minute: int
    shard: int
    slot_ms: int
    job_id: str
    attempt: int
    scheduled_ms: int
    version: int
    topic: str
    payload: bytes
    headers: tuple[tuple[str, str], ...]
    spec: bytes | None  # recurring jobs only
    max_attempts: int = 5
    backoff_ms: int = 10_000


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's idempotency record of one occurrence (table `processed`).

    `state` is "running" (a lease), "failed" or "done"; `attempt` is the delivery it is about;
    `owner` is a random token of the handling that wrote it, so a compare-and-set on the whole
    record is also a check of who holds the lease.
    """

    state: str
    attempt: int
    owner: str


class JobStore(Protocol):
    async def get_job(self, job_id: str) -> JobRow | None: ...

    async def put_job(self, row: JobRow) -> None: ...

    async def put_due(self, row: DueRow, ttl_s: int) -> None: ...

    async def put_due_and_job(self, row: DueRow, ttl_s: int, job: JobRow) -> None:
        """Both rows, atomically (a logged batch): never one without the other."""
        ...

    async def delete_due(self, minute: int, shard: int, slot_ms: int, job_id: str,
                         attempt: int) -> None: ...

    async def add_bucket_count(self, shard: int, minute: int, rows: int) -> None: ...

    async def bucket_counts(self, shard: int, from_minute: int, to_minute: int) -> dict[int, int]:
        ...

    def read_bucket(self, minute: int, shard: int, *, from_slot_ms: int | None = None,
                    page_rows: int = 5000) -> AsyncIterator[list[DueRow]]: ...

    async def clock_sample(self) -> tuple[int, int, int]:
        """(Cassandra's now() in epoch ms, local ms when sent, local ms when answered)."""
        ...

    async def swap_claim(self, consumer: str, occurrence: str, expected: Claim | None,
                         new: Claim, worker: str, ttl_s: int) -> tuple[bool, Claim | None]: ...

    async def release_claim(self, consumer: str, occurrence: str, owner: str) -> None: ...

    async def get_meta(self, name: str) -> str | None: ...
