"""The idempotency ledger's state machine and races, over an in-memory compare-and-set store
that models Cassandra's LWT semantics: whole-record conditions, TTL expiry, lost acks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from chronowheel.store.base import Claim
from chronowheel.worker.ledger import (
    DONE,
    FAILED,
    RUNNING,
    Ledger,
    Verdict,
    may_overwrite,
    verdict,
)

OCC = "job-1@1000"


class FakeClaims:
    """Rows of `processed` with their expiry on a manual clock (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.rows: dict[tuple[str, str], tuple[Claim, float]] = {}
        self.lose_next_ack = False  # the write applies, but the caller sees a timeout + retry
        self.writes = 0
        self.yield_each_call = False

    def get(self, consumer: str, occurrence: str) -> Claim | None:
        hit = self.rows.get((consumer, occurrence))
        if hit is None or hit[1] <= self.now:
            self.rows.pop((consumer, occurrence), None)
            return None
        return hit[0]

    async def swap_claim(self, consumer: str, occurrence: str, expected: Claim | None,
                         new: Claim, worker: str, ttl_s: int) -> tuple[bool, Claim | None]:
        if self.yield_each_call:
            await asyncio.sleep(0)  # let other coroutines interleave, as a network call would
        current = self.get(consumer, occurrence)
        if current != expected:
            return False, current
        self.rows[(consumer, occurrence)] = (new, self.now + ttl_s)
        self.writes += 1
        if self.lose_next_ack:
            self.lose_next_ack = False
            return False, new  # what the retried compare-and-set then reports
        return True, None

    async def release_claim(self, consumer: str, occurrence: str, owner: str) -> None:
        current = self.get(consumer, occurrence)
        if current is not None and current.state == RUNNING and current.owner == owner:
            del self.rows[(consumer, occurrence)]


def ledger(store: FakeClaims, *, scope: str = "group-a", lease_s: int = 30,
           on_sleep: Callable[[int], Awaitable[None]] | None = None) -> Ledger:
    calls = 0

    async def sleep(seconds: float) -> None:
        nonlocal calls
        calls += 1
        store.now += seconds
        await asyncio.sleep(0)
        if on_sleep is not None:
            await on_sleep(calls)
        if calls > 10_000:
            raise AssertionError("waited forever")

    return Ledger(store, scope, "w1", lease_s=lease_s, keep_s=7 * 86_400, poll_s=1.0,
                  sleep=sleep)


@pytest.mark.parametrize("current, attempt, expected", [
    (None, 1, Verdict.CLAIM),
    (Claim(DONE, 1, "o"), 1, Verdict.SKIP),
    (Claim(DONE, 1, "o"), 2, Verdict.SKIP),
    (Claim(FAILED, 1, "o"), 1, Verdict.SKIP),   # this attempt's failure is already handled
    (Claim(FAILED, 1, "o"), 2, Verdict.CLAIM),  # the retry it asked for
    (Claim(FAILED, 3, "o"), 2, Verdict.SKIP),   # a stale copy of an older attempt
    (Claim(RUNNING, 1, "o"), 1, Verdict.WAIT),  # a duplicate is running right now
    (Claim(RUNNING, 1, "o"), 2, Verdict.WAIT),  # an older attempt's lease is still held
    (Claim(RUNNING, 3, "o"), 2, Verdict.SKIP),  # a later attempt exists: ours was handled
])
def test_verdicts(current: Claim | None, attempt: int, expected: Verdict) -> None:
    assert verdict(current, attempt) is expected


@pytest.mark.parametrize("current, outcome, expected", [
    (None, Claim(DONE, 1, "me"), True),
    (None, Claim(FAILED, 1, "me"), True),
    (Claim(RUNNING, 1, "other"), Claim(DONE, 1, "me"), True),
    (Claim(DONE, 1, "other"), Claim(DONE, 1, "me"), False),
    (Claim(DONE, 1, "other"), Claim(FAILED, 2, "me"), False),
    (Claim(RUNNING, 1, "other"), Claim(FAILED, 1, "me"), False),  # the duplicate records it
    (Claim(FAILED, 1, "other"), Claim(FAILED, 1, "me"), False),
    (Claim(RUNNING, 1, "other"), Claim(FAILED, 2, "me"), True),
])
def test_may_overwrite(current: Claim | None, outcome: Claim, expected: bool) -> None:
    assert may_overwrite(current, outcome) is expected


async def test_claim_then_done_skips_every_later_delivery() -> None:
    store = FakeClaims()
    lg = ledger(store)
    lease = await lg.acquire(OCC, 1)
    assert lease is not None
    assert store.get("group-a", OCC) == Claim(RUNNING, 1, lease.claim.owner)
    assert store.rows[("group-a", OCC)][1] == 30  # the lease TTL
    await lease.done()
    assert store.get("group-a", OCC) == Claim(DONE, 1, lease.claim.owner)
    assert store.rows[("group-a", OCC)][1] == 7 * 86_400
    assert await lg.acquire(OCC, 1) is None
    assert await lg.acquire(OCC, 2) is None  # even a (duplicate) retry of a done occurrence


async def test_another_scope_processes_the_same_occurrence() -> None:
    store = FakeClaims()
    a = await ledger(store, scope="group-a").acquire(OCC, 1)
    assert a is not None
    await a.done()
    b = await ledger(store, scope="group-b").acquire(OCC, 1)
    assert b is not None


async def test_a_failed_attempt_lets_only_the_next_attempt_run() -> None:
    store = FakeClaims()
    lg = ledger(store)
    first = await lg.acquire(OCC, 1)
    assert first is not None
    await first.failed()
    assert await lg.acquire(OCC, 1) is None  # a duplicate of the failed delivery
    second = await lg.acquire(OCC, 2)
    assert second is not None
    assert store.get("group-a", OCC) == Claim(RUNNING, 2, second.claim.owner)
    assert await lg.acquire(OCC, 1) is None  # stale copy of attempt 1 while 2 runs
    await second.done()
    assert await lg.acquire(OCC, 3) is None


async def test_a_duplicate_waits_for_the_running_handling_and_then_skips() -> None:
    store = FakeClaims()
    holder = await ledger(store).acquire(OCC, 1)
    assert holder is not None

    async def on_sleep(n: int) -> None:
        assert holder is not None
        if n == 2:
            await holder.renew()
        if n == 3:
            await holder.done()

    dup = ledger(store, on_sleep=on_sleep)
    assert await dup.acquire(OCC, 1) is None
    assert store.now == 3.0  # it polled until the holder finished, no longer


async def test_a_crashed_claim_expires_and_the_redelivery_runs() -> None:
    store = FakeClaims()
    crashed = await ledger(store, lease_s=5).acquire(OCC, 1)
    assert crashed is not None  # ... and its worker dies: no renew, no outcome
    lease = await ledger(store, lease_s=5).acquire(OCC, 1)
    assert lease is not None
    assert lease.claim.owner != crashed.claim.owner
    assert store.now >= 5.0  # not before the lease expired


async def test_renewal_keeps_a_long_handler_exclusive() -> None:
    store = FakeClaims()
    holder = await ledger(store, lease_s=3).acquire(OCC, 1)
    assert holder is not None

    async def on_sleep(n: int) -> None:
        assert holder is not None
        if n < 10:
            assert await holder.renew()  # every second, well within the 3 s lease
        else:
            await holder.done()

    assert await ledger(store, lease_s=3, on_sleep=on_sleep).acquire(OCC, 1) is None
    assert store.now == 10.0


async def test_release_lets_a_redelivery_run_without_waiting_for_expiry() -> None:
    store = FakeClaims()
    cancelled = await ledger(store).acquire(OCC, 1)
    assert cancelled is not None
    await cancelled.release()
    lease = await ledger(store).acquire(OCC, 1)
    assert lease is not None and store.now == 0.0


async def test_release_never_drops_someone_elses_lease() -> None:
    store = FakeClaims()
    old = await ledger(store, lease_s=2).acquire(OCC, 1)
    assert old is not None
    store.now = 3.0  # old lease expired without renewal
    new = await ledger(store, lease_s=2).acquire(OCC, 1)
    assert new is not None
    await old.release()
    assert store.get("group-a", OCC) == new.claim


async def test_success_after_losing_the_lease_is_still_recorded() -> None:
    store = FakeClaims()
    slow = await ledger(store, lease_s=2).acquire(OCC, 1)
    assert slow is not None
    store.now = 3.0  # e.g. a long GC pause: no renewal in time
    rival = await ledger(store, lease_s=2).acquire(OCC, 1)
    assert rival is not None
    assert not await slow.renew()
    assert slow.lost
    await slow.done()
    assert store.get("group-a", OCC) == Claim(DONE, 1, slow.claim.owner)
    assert not await rival.renew()
    await rival.done()  # finds `done`: leaves it
    assert store.get("group-a", OCC) == Claim(DONE, 1, slow.claim.owner)
    assert await ledger(store).acquire(OCC, 1) is None


async def test_failure_after_losing_the_lease_leaves_a_running_duplicate_alone() -> None:
    store = FakeClaims()
    slow = await ledger(store, lease_s=2).acquire(OCC, 1)
    assert slow is not None
    store.now = 3.0
    dup = await ledger(store, lease_s=2).acquire(OCC, 1)
    assert dup is not None
    await slow.failed()
    assert store.get("group-a", OCC) == dup.claim  # the running duplicate records its own
    await dup.failed()
    assert store.get("group-a", OCC) == Claim(FAILED, 1, dup.claim.owner)


async def test_failure_after_the_record_expired_is_written_again() -> None:
    store = FakeClaims()
    lease = await ledger(store, lease_s=2).acquire(OCC, 1)
    assert lease is not None
    store.now = 3.0
    await lease.failed()
    assert store.get("group-a", OCC) == Claim(FAILED, 1, lease.claim.owner)


async def test_a_write_whose_ack_was_lost_is_recognised_as_ours() -> None:
    store = FakeClaims()
    lg = ledger(store)
    store.lose_next_ack = True
    lease = await lg.acquire(OCC, 1)
    assert lease is not None and store.writes == 1
    store.lose_next_ack = True
    await lease.done()
    assert store.get("group-a", OCC) == Claim(DONE, 1, lease.claim.owner)
    assert store.writes == 2


async def test_interleaved_deliveries_of_one_attempt_run_the_handler_once() -> None:
    store = FakeClaims()
    store.yield_each_call = True
    running: set[str] = set()
    ran: list[str] = []

    async def deliver() -> None:
        lease = await ledger(store).acquire(OCC, 1)
        if lease is None:
            return
        assert not running, "two handlings at once"
        running.add(lease.claim.owner)
        ran.append(lease.claim.owner)
        for _ in range(5):
            await asyncio.sleep(0)  # the others get to poll meanwhile
        running.discard(lease.claim.owner)
        await lease.done()

    await asyncio.gather(*(deliver() for _ in range(5)))
    assert len(ran) == 1
