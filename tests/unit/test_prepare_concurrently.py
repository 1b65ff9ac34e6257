"""A store's statements are prepared several at a time (the driver's `prepare` blocks for round
trips to every host), each still handed to the attribute that declared it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from cassandra import InvalidRequest
from chronowheel.errors import ConfigError
from chronowheel.store.cassandra import prepare_concurrently, prepare_tables

BARRIER_S = 10.0
"""A bound on the wait for the second prepare (never reached when they overlap)."""


class Prepared:
    def __init__(self, cql: str) -> None:
        self.cql = cql


class Session:
    """`prepare` waits until another prepare is in flight too: prepared one after another,
    they would break the barrier."""

    def __init__(self, refuse: str = "") -> None:
        self.barrier = threading.Barrier(2, timeout=BARRIER_S)
        self.refuse = refuse
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def prepare(self, cql: str) -> Prepared:
        with self._lock:
            self.calls.append(cql)
            first_two = len(self.calls) <= 2
        if first_two:
            self.barrier.wait()
        if cql == self.refuse:
            raise InvalidRequest("unconfigured table nope")
        return Prepared(cql)


class Statements:
    def declare(self, p: Any) -> None:
        self.one = p("SELECT 1")
        self.two = p("SELECT 2")
        self.each = {name: p(f"SELECT {name}") for name in ("a", "b", "c")}


def test_every_statement_is_prepared_once_and_handed_to_its_attribute() -> None:
    session, statements = Session(), Statements()
    prepare_concurrently(session, statements.declare)
    assert sorted(session.calls) == ["SELECT 1", "SELECT 2", "SELECT a", "SELECT b",
                                     "SELECT c"]
    assert statements.one.cql == "SELECT 1" and statements.two.cql == "SELECT 2"
    assert {k: v.cql for k, v in statements.each.items()} == {
        "a": "SELECT a", "b": "SELECT b", "c": "SELECT c"}


def test_a_statement_the_server_refuses_raises_its_error() -> None:
    session = Session(refuse="SELECT b")
    with pytest.raises(InvalidRequest, match="unconfigured table"):
        prepare_concurrently(session, Statements().declare)


def test_a_table_the_keyspace_lacks_asks_for_init_naming_the_keyspace_and_the_tables() -> None:
    session = Session(refuse="SELECT a")
    with pytest.raises(ConfigError) as caught:
        prepare_tables(session, Statements().declare, "acme", "worker lease")
    text = str(caught.value)
    assert text.startswith("keyspace acme has no worker lease tables (")
    assert "unconfigured table nope" in text and "run `chronowheel init`" in text
