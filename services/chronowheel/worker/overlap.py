"""Overlap policy: what happens when an occurrence of a job arrives while an earlier one of the
same job is still being handled, after Kubernetes CronJob's `concurrencyPolicy`.

The job's `concurrency` travels on each fired message as `cw-concurrency`:

- `allow` (the default, no header): occurrences run concurrently, nothing is checked.
- `forbid`: if another occurrence of the job is running, anywhere in the consumer group (the
  idempotency scope), the new one is not run: it is marked `skipped` and committed.
- `replace`: the running occurrence is asked to stop and the new one runs once it has (or once
  `replace_wait_s` has passed, see below).

Across processes the running occurrence is a lease in Cassandra (`job_runs`, one row per scope
and job), taken with a compare-and-set and renewed every `poll_s` by the worker running it. A
renewal also reads the row, so the holder learns within `poll_s` that a newer occurrence asked
it to stop (`cancel` set), that its lease was taken over, or that it expired. Then:

- an `async def` handler's task is cancelled (it sees `CancelledError` at its next await);
- a plain function cannot be interrupted (Python cannot stop a thread): `occ.cancelled()`
  becomes true and the function may check it and return early; if it does not, it runs to its
  end while the new occurrence waits up to `replace_wait_s`, after which the new occurrence
  takes the lease over and runs anyway, overlapping the old one (a warning is logged).

An occurrence asked to stop is marked `skipped` (it is not retried), whatever its handler then
returns. A worker that dies holding a lease blocks the job (forbid skips, replace
waits) until the lease's TTL (`lease_s`) runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace

from chronowheel.core import wire
from chronowheel.core.clock import Clock
from chronowheel.store.base import RunLease, RunStore
from chronowheel.worker.occurrence import Occurrence

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 1.0
DEFAULT_REPLACE_WAIT_S = 30.0


@dataclass(frozen=True)
class Skip:
    """The occurrence does not run; `reason` says why (logged with the `skipped` mark)."""

    reason: str


class Run:
    """A held lease on a job: renewed in the background until `release`."""

    def __init__(self, overlap: Overlap, job_id: str, lease: RunLease) -> None:
        self.overlap = overlap
        self.job_id = job_id
        self.lease = lease
        self.stop_requested = False
        """A newer occurrence replaced this one (or the lease was lost): the handler was told
        to stop."""
        self._on_stop: Callable[[], object] | None = None
        self._keeper: asyncio.Task[None] | None = None

    def start(self, on_stop: Callable[[], object]) -> None:
        """Keep the lease while the handler runs; call `on_stop` if it must stop."""
        self._on_stop = on_stop
        self._keeper = asyncio.ensure_future(self._keep())

    async def _keep(self) -> None:
        o = self.overlap
        while True:
            await o.pause(o.poll_s)
            try:
                ok, current = await o.store.swap_run(o.scope, self.job_id, self.lease,
                                                     self.lease, o.lease_s)
            except Exception as exc:  # keep going: the next renewal may work
                log.warning("renewing the run lease of job %s failed: %r", self.job_id, exc)
                continue
            if ok:
                continue
            if current is None:
                why = "its run lease expired"
            elif current.owner != self.lease.owner:
                why = f"{current.occurrence} took its run lease over"
            else:
                why = "a newer occurrence replaces it"
            log.info("%s: asked to stop (%s)", self.lease.occurrence, why)
            self.stop_requested = True
            if self._on_stop is not None:
                self._on_stop()
            return

    async def release(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        o = self.overlap
        try:
            await o.store.end_run(o.scope, self.job_id, self.lease.owner)
        except Exception as exc:  # the lease then expires by its TTL
            log.warning("ending the run lease of job %s failed: %r", self.job_id, exc)


class Overlap:
    def __init__(self, store: RunStore, scope: str, worker_id: str, *, lease_s: int,
                 clock: Clock, poll_s: float = DEFAULT_POLL_S,
                 replace_wait_s: float = DEFAULT_REPLACE_WAIT_S) -> None:
        if poll_s <= 0 or poll_s * 2 >= lease_s:
            raise ValueError(f"poll_s ({poll_s}) must be positive and under half of lease_s "
                             f"({lease_s}), so a running lease is renewed before it expires")
        self.store = store
        self.clock = clock
        self.scope = scope
        self.worker_id = worker_id
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.replace_wait_s = replace_wait_s

    async def pause(self, seconds: float) -> None:
        """Wait on the injected clock (sleep_until may return early: callers poll anyway)."""
        await self.clock.sleep_until(self.clock.now_ms() + int(seconds * 1000))

    async def begin(self, occ: Occurrence) -> Run | Skip:
        """Take the job's run lease for `occ` as its policy says, or decide not to run it."""
        mine = RunLease(occ.occurrence, f"{self.worker_id}/{secrets.token_hex(8)}",
                        self.worker_id)
        deadline = self.clock.now_ms() + int(self.replace_wait_s * 1000)
        while True:
            ok, current = await self.store.swap_run(self.scope, occ.job_id, None, mine,
                                                    self.lease_s)
            if ok:
                return Run(self, occ.job_id, mine)
            if current is None:
                continue  # it ended between the two reads: try again
            if current.occurrence == occ.occurrence:
                # The same occurrence delivered again while its first delivery still runs:
                # the idempotency checks decide about it once that one has ended.
                await self.pause(self.poll_s)
                continue
            if occ.concurrency == wire.CONCURRENCY_FORBID:
                return Skip(f"concurrency=forbid: {current.occurrence} is still running on "
                            f"{current.worker}")
            if not current.cancel:
                stop = replace(current, cancel=True)
                done, _ = await self.store.swap_run(self.scope, occ.job_id, current, stop,
                                                       self.lease_s)
                if done:
                    log.info("%s: concurrency=replace: asked %s on %s to stop",
                             occ.occurrence, current.occurrence, current.worker)
                continue
            if self.clock.now_ms() >= deadline:
                # It did not stop in time (a plain-function handler cannot be interrupted):
                # run anyway, overlapping it, rather than never.
                took, _ = await self.store.swap_run(self.scope, occ.job_id, current, mine,
                                                    self.lease_s)
                if took:
                    log.warning("%s: concurrency=replace: %s on %s did not stop within %.0fs; "
                                "running alongside it", occ.occurrence, current.occurrence,
                                current.worker, self.replace_wait_s)
                    return Run(self, occ.job_id, mine)
                continue
            await self.pause(min(self.poll_s, 0.2))  # until the holder ends its lease
