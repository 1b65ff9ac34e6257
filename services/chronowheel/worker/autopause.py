"""Auto-pause: a job with `pause_after_failures: N` is paused after N consecutive failed runs.

Where the streak lives: in the run history the worker library already writes (a row per run,
keyed by the run, in Cassandra), and nowhere else. Nothing is kept per job in a worker, so a
worker restart, a rebalance or another worker handling the next run changes nothing, and a
run recorded twice (a redelivery) is still one run.

Who decides: the node, the only writer of job state. When a run of such a job ends failed
(dead-lettered, or failed with neither a retry nor a dead letter; an attempt whose retry is
to come is not yet a failed run), the worker sends a `pause` command on `<ns>.submit` with
`after_failures: N`, a note saying why and when, and a request id of its own run. The node
applies it under the job's lock only if the job's run history shows N failed runs in a row
since the job was last stored or resumed (`core.runs.failure_streak`); otherwise it changes
nothing. So two workers reporting failures of the same job, a report sent twice or one that
arrives after a resume pause it once per streak, and a resume starts a new streak.

For such a job only, the worker writes the final outcome of each run (succeeded or failed)
itself, awaited, before it sends the report and marks the record, instead of queueing it for
the history writer (which drops rows when Cassandra is slow): the node then reads every run
the streak is made of, and a success is never lost to a full queue.
"""

from __future__ import annotations

import logging

from chronowheel.bus.ports import RecordRefused, WorkerProducer
from chronowheel.core import limits, runs
from chronowheel.core.clock import Clock
from chronowheel.core.model import encode_control
from chronowheel.core.runs import RunRecord, counter_deltas, iso_ms
from chronowheel.errors import harmless_within
from chronowheel.history import RunRecorder
from chronowheel.worker.occurrence import Occurrence

log = logging.getLogger(__name__)


def request_id(record: RunRecord) -> str:
    """The request id of the report of a failed run: the run itself (a report sent again,
    after a crash, is the same request)."""
    return f"auto-pause:{record.scheduled_ms}:{record.attempt}"


def pause_note(n: int, last: RunRecord, worker_id: str, now_ms: int) -> str:
    """Why and when, within the wire's limit on a note (the error is the handler's text:
    its unsafe characters are escaped, and a long one is cut after whole escapes only)."""
    error = f": {last.error}" if last.error else ""
    text = (f"auto-paused after {n} consecutive failed runs (pause_after_failures) at "
            f"{iso_ms(now_ms)}, reported by worker {worker_id}; the last: scheduled "
            f"{iso_ms(last.scheduled_ms)}, attempt {last.attempt}, {last.state}{error}")
    return harmless_within(text, limits.MAX_PAUSE_NOTE_CHARS)


class AutoPause:
    def __init__(self, *, recorder: RunRecorder, producer: WorkerProducer, submit_topic: str,
                 clock: Clock, worker_id: str) -> None:
        self.recorder = recorder
        self.producer = producer
        self.submit_topic = submit_topic
        self.clock = clock
        self.worker_id = worker_id
        self.reported = 0
        """Failed runs reported to the node (each a conditional pause)."""
        self.errors = 0
        """Runs whose record or report failed (logged; the handling goes on)."""

    async def ran(self, occ: Occurrence, record: RunRecord) -> None:
        """The final outcome of a run of a job with `pause_after_failures`: record it now,
        and report a failed run to the node. Never raises for a store or broker error:
        auto-pause is an aid, the handling goes on."""
        recorder = self.recorder
        try:
            await recorder.store.write_runs(occ.job_id, [record], recorder.ttl_s)
        except Exception as exc:
            self.errors += 1
            log.warning("%s: recording its run for auto-pause failed (%s: %s); queued for "
                        "the history writer instead: the streak may miss it", occ.occurrence,
                        type(exc).__name__, exc)
            recorder.add(record)
            return
        for name, delta in counter_deltas(record).items():
            recorder.count(occ.job_id, name, delta)
        n = occ.pause_after_failures
        if record.outcome not in runs.FINAL_FAILURES or n is None:
            return
        value = encode_control("pause", occ.job_id, after_failures=n,
                               note=pause_note(n, record, self.worker_id, self.clock.now_ms()),
                               request_id=request_id(record))
        try:
            await self.producer.send(self.submit_topic, occ.job_id.encode(), value)
        except RecordRefused as refused:
            self.errors += 1
            log.error("job %s: the report of its failed run %s was refused by the broker "
                      "(%s: %s); it is not auto-paused for it", occ.job_id, occ.occurrence,
                      refused.kind, refused.reason)
            return
        self.reported += 1
