"""The actions the console offers. Each runs the client library's own code, exactly as an
application would; the console adds a confirmation step and nothing else.

An action acts on a subject: a job (by id, from its Jobs page) or a dead letter (by its
position `<partition>@<offset>` in `<ns>.dead`, from the Dead letters page). Each kind of
subject has its set of actions (`JOB_ACTIONS`, `LETTER_ACTIONS`), a confirmation page
(`GET <path>/confirm`) and a POST route (`POST <path>/action`); both are generic, so a further
operation (pause, resume, trigger) is one more `Action` in a set. After the POST the browser is
sent back to the subject's page, whose query says what the action did (`Outcome`), so a reload
sends nothing.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlencode

import orjson

from chronowheel.client import SchedulerClient
from chronowheel.client.dead import is_position
from chronowheel.errors import ChronowheelError


@dataclass(frozen=True)
class Outcome:
    """What an action did: the query parameters of the notice on the subject's page."""

    params: dict[str, str]
    summary: str
    """One line for the console's log."""


@dataclass(frozen=True)
class Preview:
    """What the confirmation page says will happen, found when it is shown."""

    sendable: bool
    """False: nothing would be sent (the page says why and offers no button)."""
    message: str
    command: str | None = None
    """The command that will be sent, as it will be sent (shown verbatim)."""


@dataclass(frozen=True)
class Action:
    name: str          # the form's `action` field
    label: str         # the button
    confirm: str       # the question on the confirmation page ({id} is the subject)
    effect: str        # what happens, in one sentence, shown under the question
    run: Callable[[SchedulerClient, str], Awaitable[Outcome]]
    danger: bool = False
    preview: Callable[[SchedulerClient, str], Awaitable[Preview]] | None = None
    """What exactly would be sent for this subject now (None: `effect` says it all)."""


def job_href(job_id: str) -> str:
    # Ids may hold "/" or "?": a query parameter carries any of them.
    return "/jobs?" + urlencode({"id": job_id})


def letter_href(position: str) -> str:
    return "/dead?" + urlencode({"letter": position})


@dataclass(frozen=True)
class Subject:
    """A kind of thing actions act on, and where its pages are."""

    kind: str          # "job" or "letter": the form field naming the subject is `id`
    path: str          # GET <path>/confirm, POST <path>/action
    page: Callable[[str], str]  # the subject's page, where the browser goes back to
    active: str        # the navigation entry of its pages
    actions: dict[str, Action] = field(default_factory=dict)
    valid: Callable[[str], bool] = bool

    def confirm_href(self, subject_id: str, action: str) -> str:
        return f"{self.path}/confirm?" + urlencode({"id": subject_id, "action": action})


# --- jobs ------------------------------------------------------------------------------------

async def _cancel(client: SchedulerClient, job_id: str) -> Outcome:
    delivery = await client.cancel(job_id)
    await client.flush()
    meta = delivery.result()
    return Outcome({"sent": "cancel", "partition": str(meta.partition),
                    "offset": str(meta.offset)},
                   f"cancel of job {job_id} sent to {meta.topic}[{meta.partition}]@"
                   f"{meta.offset}")


JOB_ACTIONS: dict[str, Action] = {
    a.name: a for a in (
        Action(
            name="cancel", label="Cancel job",
            confirm="Cancel job {id}?",
            effect=("Sends {\"v\":1,\"op\":\"cancel\"} to the submit topic. Occurrences not yet "
                    "published are dropped when the owning node applies it; one already "
                    "published may still be handled by its consumer."),
            run=_cancel, danger=True),
    )
}


# --- dead letters ----------------------------------------------------------------------------

REDRIVE_OUTCOMES = ("redriven", "already", "refused", "missing")
"""What a redrive of one letter did (the `redrive` parameter of the notice)."""


async def _redrive(client: SchedulerClient, position: str) -> Outcome:
    """`SchedulerClient.redrive` of the one letter at `position`: its request id
    `redrive:<position>` makes a second run (a double submit, the CLI) send nothing."""
    s = await client.redrive(letter=position)
    if s.failed:
        error = s.failed[0][1]
        if s.unrecorded:
            raise ChronowheelError(
                f"the retry of dead letter {position} was sent (Kafka took it) but its "
                f"request row was not written: {error!r}; confirming again sends a second "
                f"copy, which the node delivers nothing of (it carries the same redrive id)")
        raise ChronowheelError(f"the retry of dead letter {position} was not sent (Kafka did "
                               f"not take it): {error!r}; confirming again sends it")
    outcome = ("redriven" if s.redriven else "already" if s.already
               else "refused" if s.refused else "missing")
    return Outcome({"redrive": outcome}, f"redrive of dead letter {position}: {outcome}")


async def _redrive_preview(client: SchedulerClient, position: str) -> Preview:
    """The retry the redrive would send now, or why it would send nothing (a dry run of the
    redrive's own code)."""
    from chronowheel.client.dead import redrive_request_id, retry_value

    page = await client.dead_letters(letter=position, limit=1)
    if not page.letters:
        return Preview(False, f"There is no dead letter at {position} (no longer kept by the "
                              f"topic, or never written).")
    letter = page.letters[0]
    s = await client.redrive(letter=position, dry_run=True)
    if s.already:
        return Preview(False, f"Dead letter {position} was redriven before (request id "
                              f"{letter.request_id} is recorded): nothing is sent again.")
    if s.refused:
        return Preview(False, f"Dead letter {position} cannot be redriven: {s.refused[0][1]}")
    value = retry_value(letter, time.time_ns() // 1_000_000)
    shown = orjson.dumps(orjson.loads(value), option=orjson.OPT_INDENT_2).decode()
    return Preview(
        True,
        f"One retry command to {client.topic}, key {letter.job_id}, under the request id "
        f"{redrive_request_id(letter.partition, letter.offset)}: the next attempt of the "
        f"occurrence, due when it is sent (its \"at\" is set then; here, as of now):",
        f"{shown}")


LETTER_ACTIONS: dict[str, Action] = {
    a.name: a for a in (
        Action(
            name="redrive", label="Redrive",
            confirm="Redrive dead letter {id}?",
            effect=("Sends the letter again as a retry command to the submit topic, as "
                    "chronowheel dead redrive does, once: its request id is recorded when "
                    "Kafka took the retry, and a letter recorded before is not sent again, "
                    "from here or from the command line."),
            run=_redrive, preview=_redrive_preview),
    )
}

JOBS = Subject(kind="job", path="/jobs", page=job_href, active="jobs", actions=JOB_ACTIONS)
LETTERS = Subject(kind="letter", path="/dead", page=letter_href, active="dead",
                  actions=LETTER_ACTIONS, valid=is_position)
