"""The worker's storage contract (`chronowheel.store.base`: MarkStore, ClaimStore, RunStore),
once for every implementation.

A test module subclasses `WorkerStoreContract` and provides two fixtures: `stores` (a
`WorkerStores` with run leases) and `pass_time` (an async function that lets that many seconds
pass for the store's TTLs). The unit tests run it in memory, the integration tests against
Cassandra. Each test uses its own scope, so one store may serve the tests of a module.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

import pytest
from chronowheel.store.base import (
    BLOCK_BITS,
    MARK_WRITE_PARTITIONS,
    Claim,
    Mark,
    MarkRow,
    RunLease,
    WorkerStores,
)

PassTime = Callable[[float], Awaitable[None]]
TOPIC = "ns.fired"


class WorkerStoreContract:
    @pytest.fixture
    def scope(self) -> str:
        return "scope-" + secrets.token_hex(4)

    # --- partition leases --------------------------------------------------------------
    async def test_a_partition_lease_has_one_holder_until_it_is_released(
            self, stores: WorkerStores, scope: str) -> None:
        m = stores.marks
        assert await m.acquire_lease(scope, TOPIC, 0, "a/1", 30) is None
        assert await m.acquire_lease(scope, TOPIC, 0, "b/1", 30) == "a/1"
        assert await m.renew_lease(scope, TOPIC, 0, "a/1", 30) is None
        assert await m.renew_lease(scope, TOPIC, 0, "b/1", 30) == "a/1"
        # Another partition, topic or scope is another lease.
        assert await m.acquire_lease(scope, TOPIC, 1, "b/1", 30) is None
        assert await m.acquire_lease(scope, "ns.other", 0, "b/1", 30) is None
        assert await m.acquire_lease(scope + "x", TOPIC, 0, "b/1", 30) is None
        await m.release_lease(scope, TOPIC, 0, "b/1")  # not the holder: nothing happens
        assert await m.acquire_lease(scope, TOPIC, 0, "b/2", 30) == "a/1"
        await m.release_lease(scope, TOPIC, 0, "a/1")
        assert await m.renew_lease(scope, TOPIC, 0, "a/1", 30) == ""  # nobody holds it
        assert await m.acquire_lease(scope, TOPIC, 0, "b/2", 30) is None

    async def test_a_partition_lease_expires_after_its_ttl(
            self, stores: WorkerStores, scope: str, pass_time: PassTime) -> None:
        m = stores.marks
        # Cassandra counts a TTL from the write's whole second: a lease of 1 s can be gone a
        # moment after its write (the second acquire then found it gone on a loaded machine).
        # Of 3 s it lives 2 s at least, and is gone 3 s after it.
        assert await m.acquire_lease(scope, TOPIC, 0, "a/1", 3) is None
        assert await m.acquire_lease(scope, TOPIC, 0, "b/1", 3) == "a/1"
        await pass_time(3.5)
        assert await m.renew_lease(scope, TOPIC, 0, "a/1", 1) == ""
        assert await m.acquire_lease(scope, TOPIC, 0, "b/1", 30) is None

    # --- marks -------------------------------------------------------------------------
    async def test_marks_read_back_from_an_offset_also_past_the_known_end(
            self, stores: WorkerStores, scope: str) -> None:
        m = stores.marks
        block = 1 << BLOCK_BITS
        first = [Mark(10, "done", "j@1"), Mark(11, "failed", "k@1"), Mark(13, "skipped", "l@1")]
        await m.write_marks(scope, [MarkRow(TOPIC, 2, first)], 3600)
        await m.write_marks(scope, [MarkRow(TOPIC, 2, [Mark(20, "dead", f"{TOPIC}:2@20")])], 3600)
        later = [Mark(block + 5, "done", "m@1")]  # the next block, past the end the reader knows
        await m.write_marks(scope, [MarkRow(TOPIC, 2, later)], 3600)
        got = await m.read_marks(scope, TOPIC, 2, 11, 20)
        assert sorted(got) == [*first[1:], Mark(20, "dead", f"{TOPIC}:2@20"), *later]
        assert sorted(await m.read_marks(scope, TOPIC, 2, 0, 0)) == sorted(
            [*first, Mark(20, "dead", f"{TOPIC}:2@20"), *later])
        assert await m.read_marks(scope, TOPIC, 3, 0, 100) == []
        assert await m.read_marks(scope + "x", TOPIC, 2, 0, 100) == []

    async def test_a_round_of_many_partitions_and_a_large_row_is_stored_whole(
            self, stores: WorkerStores, scope: str) -> None:
        m = stores.marks
        partitions = 2 * MARK_WRITE_PARTITIONS + 3  # more rows than one request carries
        rows = [MarkRow(TOPIC, p, [Mark(100 + i, "done", f"j{p}-{i}@1") for i in range(3)])
                for p in range(partitions)]
        # a row far over the bytes of one request (its occurrences are long), and an empty one
        big = [Mark(i, "done", f"{'x' * 200}-{i}@1") for i in range(40)]
        rows += [MarkRow(TOPIC, partitions, big), MarkRow(TOPIC, partitions + 1, [])]
        requests = await m.write_marks(scope, rows, 3600)
        assert requests >= 1
        for p in range(partitions):
            assert sorted(await m.read_marks(scope, TOPIC, p, 0, 200)) == list(rows[p].marks)
        assert sorted(await m.read_marks(scope, TOPIC, partitions, 0, 50)) == big
        assert await m.read_marks(scope, TOPIC, partitions + 1, 0, 50) == []

    # --- claims ------------------------------------------------------------------------
    async def test_a_claim_is_a_compare_and_set_register_released_only_by_its_runner(
            self, stores: WorkerStores, scope: str) -> None:
        c = stores.claims
        running = Claim("running", 2, "owner-1")
        assert await c.swap_claim(scope, "job@1", None, running, "w1", 60) == (True, None)
        assert await c.swap_claim(scope, "job@1", None, running, "w2", 60) == (False, running)
        await c.release_claim(scope, "job@1", "owner-2")
        failed = Claim("failed", 2, "owner-1")
        assert await c.swap_claim(scope, "job@1", running, failed, "w1", 600) == (True, None)
        await c.release_claim(scope, "job@1", "owner-1")  # not running: kept
        assert await c.swap_claim(scope, "job@1", running, running, "w1", 60) == (False, failed)
        assert await c.swap_claim(scope + "x", "job@1", None, running, "w1", 60) == (True, None)
        await c.release_claim(scope + "x", "job@1", "owner-1")
        assert await c.swap_claim(scope + "x", "job@1", None, running, "w1", 60) == (True, None)

    # --- run leases --------------------------------------------------------------------
    async def test_a_run_lease_is_a_compare_and_set_register_ended_by_its_owner(
            self, stores: WorkerStores, scope: str) -> None:
        runs = stores.runs
        assert runs is not None
        first = RunLease("job@1", "owner-1", "w1")
        assert await runs.swap_run(scope, "job", None, first, 60) == (True, None)
        second = RunLease("job@2", "owner-2", "w2")
        assert await runs.swap_run(scope, "job", None, second, 60) == (False, first)
        asked = RunLease("job@1", "owner-1", "w1", cancel=True)
        assert await runs.swap_run(scope, "job", first, asked, 60) == (True, None)
        await runs.end_run(scope, "job", "owner-2")
        assert await runs.swap_run(scope, "job", None, second, 60) == (False, asked)
        await runs.end_run(scope, "job", "owner-1")
        assert await runs.swap_run(scope, "job", None, second, 60) == (True, None)

    async def test_a_run_lease_expires_after_its_ttl(
            self, stores: WorkerStores, scope: str, pass_time: PassTime) -> None:
        runs = stores.runs
        assert runs is not None
        first = RunLease("job@1", "owner-1", "w1")
        assert await runs.swap_run(scope, "job", None, first, 1) == (True, None)
        await pass_time(1.5)
        second = RunLease("job@2", "owner-2", "w2")
        assert await runs.swap_run(scope, "job", None, second, 60) == (True, None)
