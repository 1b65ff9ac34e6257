"""The job actions the console offers. Each sends one v1 command through the client library,
exactly as an application would; the console adds a confirmation step and nothing else.

A further operation (pause, resume, trigger) is one more `JobAction` in `JOB_ACTIONS`: the
Jobs page shows a button per entry, the confirmation page and the POST route are generic.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from chronowheel.client import SchedulerClient


@dataclass(frozen=True)
class JobAction:
    name: str          # the URL segment: POST /jobs/<id>/<name>
    label: str         # the button
    confirm: str       # the question on the confirmation page ({id} is the job id)
    effect: str        # what happens, in one sentence, shown under the question
    send: Callable[[SchedulerClient, str], Awaitable[Any]]  # returns the client's Delivery
    danger: bool = False


async def _cancel(client: SchedulerClient, job_id: str) -> Any:
    return await client.cancel(job_id)


JOB_ACTIONS: dict[str, JobAction] = {
    a.name: a for a in (
        JobAction(
            name="cancel", label="Cancel job",
            confirm="Cancel job {id}?",
            effect=("Sends {\"v\":1,\"op\":\"cancel\"} to the submit topic. Occurrences not yet "
                    "published are dropped when the owning node applies it; one already "
                    "published may still be handled by its consumer."),
            send=_cancel, danger=True),
    )
}
