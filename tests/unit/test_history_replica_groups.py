"""Run history writes batch only partitions with the same replicas (`same_replicas`): a batch
over partitions of different replicas would make its coordinator do the other nodes' work,
which the project avoids everywhere (multi-partition batches of bucket counts were split for
it)."""

from __future__ import annotations

import pytest
from chronowheel.store.cassandra_history import same_replicas


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
