"""Wire model v1: the commands any Kafka producer may send to `<ns>.submit`.

This module holds the data types; parsing and validation live below them (`parse_command`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

CatchUp = Literal["coalesce", "all", "skip"]
DstPolicy = Literal["skip", "cron"]


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job. Times are UTC epoch milliseconds; durations are milliseconds."""

    id: str
    topic: str
    payload: bytes
    at_ms: int | None = None
    cron: str | None = None
    every_ms: int | None = None
    tz: str = "UTC"
    start_ms: int | None = None
    end_ms: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    catch_up: CatchUp = "coalesce"
    max_catch_up: int = 100
    dst: DstPolicy = "skip"
    window_ms: int = 0
    max_attempts: int = 5
    backoff_ms: int = 10_000
    tenant: str | None = None
    # The canonical JSON of the job as submitted (orjson, sorted keys): equal bytes = same spec,
    # which is what makes an identical re-submit a no-op.
    canonical: bytes = field(default=b"", compare=False)

    @property
    def recurring(self) -> bool:
        return self.at_ms is None


@dataclass(frozen=True, slots=True)
class Upsert:
    job: JobSpec
    op: Literal["upsert"] = "upsert"


@dataclass(frozen=True, slots=True)
class Cancel:
    id: str
    op: Literal["cancel"] = "cancel"


@dataclass(frozen=True, slots=True)
class Retry:
    """Internal: a worker asks for one more delivery of an occurrence that failed.

    Wire: {"v":1,"op":"retry","id":..,"scheduled_at":ms,"attempt":n,"at":ms,"topic":..,
           "payload_b64":..,"headers":{..},"max_attempts":n,"backoff":"10s"}
    """

    id: str
    scheduled_ms: int
    attempt: int
    at_ms: int
    topic: str
    payload: bytes
    headers: tuple[tuple[str, str], ...] = ()
    op: Literal["retry"] = "retry"


Command = Upsert | Cancel | Retry
