"""Run history writes and the worker's outcome marks batch only partitions with the same replicas
(`store.base.by_replicas`): a batch
over partitions of different replicas would make its coordinator do the other nodes' work,
which the project avoids everywhere (multi-partition batches of bucket counts were split for
it)."""

from __future__ import annotations

import pytest
from chronowheel.store.base import MARK_WRITE_BYTES, MARK_WRITE_PARTITIONS
from chronowheel.store.cassandra_history import same_replicas
from chronowheel.store.cassandra_marks import mark_chunks


class _Host:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint


RING = {b"a": ("n1", "n2", "n3"), b"b": ("n2", "n3", "n4"), b"c": ("n3", "n1", "n2"),
        b"d": ("n2", "n4", "n3")}


def _replicas(key: bytes) -> list[_Host]:
    return [_Host(e) for e in RING[key]]


def test_jobs_go_together_only_with_the_same_replica_set_whatever_the_order() -> None:
    assert same_replicas(["a", "b", "c", "d"], _replicas) == [["a", "c"], ["b", "d"]]


def test_one_node_puts_the_whole_flush_in_one_group() -> None:
    assert same_replicas(["x", "y", "z"], lambda _key: [_Host("only")]) == [["x", "y", "z"]]


@pytest.mark.parametrize("replicas_of", [lambda _key: [], lambda _key: None])
def test_jobs_whose_replicas_are_unknown_go_alone(replicas_of: object) -> None:
    assert same_replicas(["x", "y"], replicas_of) == [["x"], ["y"]]  # type: ignore[arg-type]


def test_a_failing_token_map_sends_each_job_alone() -> None:
    def broken(_key: bytes) -> list[_Host]:
        raise RuntimeError("no token map")

    assert same_replicas(["x", "y"], broken) == [["x"], ["y"]]


# The worker's outcome marks use the same grouping for their rounds (`mark_chunks`), keyed by
# each statement's partition, then cut by the per-request caps.

def _marks_replicas(stmt: tuple[bytes, int]) -> list[_Host]:
    return _replicas(stmt[0])


def test_mark_statements_go_together_only_with_the_same_replica_set() -> None:
    rows = [((key, i), 100) for i, key in enumerate([b"a", b"b", b"c", b"d", b"a"])]
    chunks = mark_chunks(rows, _marks_replicas)
    assert chunks == [[(b"a", 0), (b"c", 2), (b"a", 4)], [(b"b", 1), (b"d", 3)]]


def test_a_mark_request_holds_at_most_its_partitions_and_about_its_bytes() -> None:
    many = [((b"a", i), 10) for i in range(MARK_WRITE_PARTITIONS + 3)]
    assert [len(c) for c in mark_chunks(many, _marks_replicas)] == [MARK_WRITE_PARTITIONS, 3]
    big = MARK_WRITE_BYTES // 2 + 1  # two of them are over a request's bytes
    sized = [((b"a", i), big) for i in range(3)]
    assert [len(c) for c in mark_chunks(sized, _marks_replicas)] == [1, 1, 1]
    # A row over the bytes of a request on its own still goes, alone.
    assert mark_chunks([((b"a", 0), 10 * MARK_WRITE_BYTES)], _marks_replicas) == [[(b"a", 0)]]


def test_mark_statements_whose_replicas_are_unknown_go_alone() -> None:
    rows = [((b"x", i), 10) for i in range(3)]
    assert mark_chunks(rows, lambda _stmt: None) == [[(b"x", 0)], [(b"x", 1)], [(b"x", 2)]]
