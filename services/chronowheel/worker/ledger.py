"""Idempotency helper: handle each occurrence once per consumer group, across duplicates and
crashes, with a compare-and-set record per (scope, `cw-occurrence`) (Cassandra LWT, TTL'd).

The record moves through these states (`attempt` is the `cw-attempt` it is about):

    (none) --claim--> running(a) --success--> done(a)
                         |  \\---failure, after the retry or dead letter is produced--> failed(a)
                         \\---lease expires (crash) or is released (cancel)--> (none)
    failed(a) --a delivery of attempt b > a claims--> running(b)

`running` is a lease: written with a short TTL and renewed while the handler runs, so the
claim of a worker that died expires and a redelivery can proceed. `failed` and `done` are
kept for days. A delivery of attempt b decides from the current record:

- none, or failed(a) with a < b: claim it and run the handler;
- done, failed(a) with a >= b, or any record with a > b: skip it (the work, or this attempt's
  failure handling, is already recorded; a later attempt exists only once this attempt's
  failure was handled) and commit;
- running(a) with a <= b: another handling holds the lease; wait until it finishes or expires.

Every write is a compare-and-set of the whole record against the one last seen, and each
handling writes its own random `owner`, so a lost update is impossible and a retried write
whose first try did apply is recognised (the record then equals what we wrote).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from enum import Enum

from chronowheel.store.base import Claim, ClaimStore

log = logging.getLogger(__name__)

RUNNING, FAILED, DONE = "running", "failed", "done"
DEFAULT_LEASE_S = 15
DEFAULT_KEEP_S = 7 * 86_400


class Verdict(Enum):
    CLAIM = "claim"
    SKIP = "skip"
    WAIT = "wait"


def verdict(current: Claim | None, attempt: int) -> Verdict:
    """What a delivery of `attempt` does, given the record it found."""
    if current is None:
        return Verdict.CLAIM
    if current.attempt > attempt or current.state == DONE:
        return Verdict.SKIP
    if current.state == FAILED:
        return Verdict.SKIP if current.attempt >= attempt else Verdict.CLAIM
    return Verdict.WAIT


def may_overwrite(current: Claim | None, outcome: Claim) -> bool:
    """After losing the lease: does our outcome still say more than the record found?"""
    if current is None:
        return True
    if current.state == DONE:
        return False
    if outcome.state == DONE:
        return True  # the work is done; whoever else runs it will find that out
    return current.attempt < outcome.attempt


class Ledger:
    def __init__(self, store: ClaimStore, scope: str, worker: str, *,
                 lease_s: int = DEFAULT_LEASE_S, keep_s: int = DEFAULT_KEEP_S,
                 poll_s: float | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if lease_s < 1:
            raise ValueError(f"lease_s must be at least 1, got {lease_s}")
        self.store = store
        self.scope = scope
        self.worker = worker
        self.lease_s = lease_s
        self.keep_s = max(keep_s, lease_s)
        self.poll_s = poll_s if poll_s is not None else max(0.2, min(2.0, lease_s / 4))
        self._sleep = sleep

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / 3

    async def acquire(self, occurrence: str, attempt: int) -> Lease | None:
        """A lease to run the handler, or None when this delivery is to be skipped.

        Waits (polling) while another handling holds the lease.
        """
        mine = Claim(RUNNING, attempt, secrets.token_hex(8))
        expected: Claim | None = None
        while True:
            ok, current = await self.store.swap_claim(
                self.scope, occurrence, expected, mine, self.worker, self.lease_s)
            if ok or current == mine:
                return Lease(self, occurrence, mine)
            v = verdict(current, attempt)
            if v is Verdict.SKIP:
                return None
            if v is Verdict.CLAIM:
                expected = current  # take over from exactly what we saw
                continue
            # Never swap from a `running` we saw (that would steal a live lease): wait, then
            # claim only an empty record again, which the lease's expiry produces.
            expected = None
            await self._sleep(self.poll_s)


class Lease:
    """The right to run one delivery's handler. Renew it at least every `renew_every_s`."""

    def __init__(self, ledger: Ledger, occurrence: str, claim: Claim) -> None:
        self.ledger = ledger
        self.occurrence = occurrence
        self.claim = claim
        self.lost = False

    async def renew(self) -> bool:
        """Extend the lease; False (and a warning) once someone else took the record over."""
        if self.lost:
            return False
        lg = self.ledger
        ok, current = await lg.store.swap_claim(lg.scope, self.occurrence, self.claim,
                                                self.claim, lg.worker, lg.lease_s)
        if not (ok or current == self.claim):
            self.lost = True
            log.warning("lease on %s (attempt %d) lost to %s while the handler still runs",
                        self.occurrence, self.claim.attempt, current)
        return not self.lost

    async def done(self) -> None:
        await self._finish(DONE)

    async def failed(self) -> None:
        """Record that this attempt failed and its retry or dead letter was produced."""
        await self._finish(FAILED)

    async def release(self) -> None:
        """Give the lease up without an outcome (the handler was cancelled): a redelivery may
        run at once instead of waiting for the lease to expire."""
        if not self.lost:
            lg = self.ledger
            await lg.store.release_claim(lg.scope, self.occurrence, self.claim.owner)

    async def _finish(self, state: str) -> None:
        lg = self.ledger
        outcome = Claim(state, self.claim.attempt, self.claim.owner)
        expected: Claim | None = self.claim
        for _ in range(8):  # each miss means the record changed: a bounded number of rivals
            ok, current = await lg.store.swap_claim(lg.scope, self.occurrence, expected,
                                                    outcome, lg.worker, lg.keep_s)
            if ok or current == outcome:
                return
            if not may_overwrite(current, outcome):
                return
            expected = current
        log.warning("could not record %s for %s after repeated contention", state,
                    self.occurrence)
