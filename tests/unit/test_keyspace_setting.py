"""`cassandra_keyspace`: a namespace's keyspace named apart from it, and one namespace per
keyspace."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from cassandra import Unauthorized
from chronowheel.cli import build_parser
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings, settings_from_args
from chronowheel.store import cassandra as cassandra_store
from chronowheel.store.cassandra import (
    check_keyspace_owner,
    check_recorded_owner,
    owned_meta,
)


def test_the_keyspace_is_named_after_the_namespace_unless_the_setting_names_one() -> None:
    assert Settings(namespace="acme-prod.eu").keyspace == "acme_prod_eu"
    assert Settings(namespace="acme-prod.eu", cassandra_keyspace="scheduler_eu").keyspace \
        == "scheduler_eu"
    # The topics still follow the namespace.
    assert Settings(namespace="acme", cassandra_keyspace="other").submit_topic == "acme.submit"


def test_the_setting_comes_from_its_variable_and_the_flag_wins() -> None:
    env = {"CHRONOWHEEL_CASSANDRA_KEYSPACE": "from_env"}
    assert Settings.from_env(env).keyspace == "from_env"
    assert Settings.from_env(env, cassandra_keyspace="from_flag").keyspace == "from_flag"
    args = build_parser().parse_args(["node", "--cassandra-keyspace", "on_cli"])
    assert settings_from_args(args).cassandra_keyspace == "on_cli"


@pytest.mark.parametrize("name", ["9lives", "a-b", "a.b", "k" * 49, "ké", "a b", "_x",
                                  "system_acme", "System"])
def test_a_name_cassandra_would_refuse_is_refused_naming_the_setting_and_the_value(
        name: str) -> None:
    with pytest.raises(ConfigError, match=r"cassandra_keyspace: .* is not a valid keyspace"):
        Settings(cassandra_keyspace=name)


@pytest.mark.parametrize("name", ["k", "a_b_c", "k" * 48, "sys"])
def test_a_name_cassandra_takes_is_taken(name: str) -> None:
    assert Settings(cassandra_keyspace=name).keyspace == name


def test_the_keyspace_is_in_lower_case_as_cassandra_keeps_an_unquoted_name() -> None:
    # Looked up in system_schema by this name: "MyKs" would never be found there.
    assert Settings(cassandra_keyspace="MyKs").keyspace == "myks"
    assert Settings(namespace="Acme-EU").keyspace == "acme_eu"


def test_errors_that_suggest_init_name_a_keyspace_set_apart() -> None:
    assert Settings(namespace="acme").keyspace_flag == ""
    assert Settings(namespace="acme", cassandra_keyspace="sched").keyspace_flag \
        == " --cassandra-keyspace sched"


def _commands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[
        tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, f"{path} {name}".strip())


def test_every_command_that_reaches_cassandra_takes_the_keyspace() -> None:
    reaching = 0
    for path, parser in _commands(build_parser()):
        flags = {o for a in parser._actions for o in a.option_strings}
        if "--cassandra" in flags:
            reaching += 1
            assert "--cassandra-keyspace" in flags, path
    assert reaching >= 10  # node, init, worker, status, job ..., jobs list, console, acl, ...


def test_a_keyspace_init_recorded_for_another_namespace_is_refused() -> None:
    mine = Settings(namespace="billing", cassandra_keyspace="shared")
    check_keyspace_owner(None, mine)  # never initialised, or by a version before the record
    check_keyspace_owner("billing", mine)
    with pytest.raises(ConfigError, match=r"keyspace 'shared' holds namespace 'mail', not "
                                          r"'billing'") as caught:
        check_keyspace_owner("mail", mine)
    assert caught.value.retriable is False


class _MetaSession:
    """A session that answers `recorded_meta`'s two reads, or refuses the second."""

    def __init__(self, owner: str | None, refuse: bool = False) -> None:
        self.owner, self.refuse = owner, refuse

    def execute(self, query: str, params: Any = None) -> list[Any]:
        if "system_schema.tables" in query:
            return [SimpleNamespace(table_name="meta")]
        if self.refuse:
            raise Unauthorized("User acme_worker has no SELECT permission on <table shared.meta>")
        rows = [SimpleNamespace(name="shards", value="4")]
        if self.owner is not None:
            rows.append(SimpleNamespace(name="namespace", value=self.owner))
        return rows


def test_a_store_is_opened_only_on_its_own_namespaces_keyspace(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """`CassandraStore.open` (a worker's and every command's store) checks the owner before it
    prepares anything; a role that may not read `meta` gets its store, with a warning."""
    mine = Settings(namespace="billing", cassandra_keyspace="shared")
    assert owned_meta(_MetaSession("billing"), mine) == {  # type: ignore[arg-type]
        "shards": "4", "namespace": "billing"}
    with pytest.raises(ConfigError, match=r"before init recorded which namespace"):
        owned_meta(_MetaSession(None), mine)  # type: ignore[arg-type]
    assert owned_meta(_MetaSession("mail", refuse=True), mine) is None  # type: ignore[arg-type]
    caplog.clear()

    shut: list[str] = []
    prepared: list[str] = []

    def opened_on(session: _MetaSession) -> None:
        cluster = SimpleNamespace(shutdown=lambda: shut.append("shut"))
        monkeypatch.setattr(cassandra_store, "connect", lambda settings: (cluster, session))

    monkeypatch.setattr(cassandra_store.CassandraStore, "over",
                        classmethod(lambda cls, settings, cluster, session:
                                    prepared.append(settings.namespace) or "store"))
    opened_on(_MetaSession("mail"))
    with pytest.raises(ConfigError, match=r"keyspace 'shared' holds namespace 'mail'"):
        cassandra_store.CassandraStore.open(mine)
    assert shut == ["shut"] and prepared == []  # closed, nothing prepared

    opened_on(_MetaSession("billing"))
    assert cassandra_store.CassandraStore.open(mine) == "store"
    assert not caplog.text

    opened_on(_MetaSession("mail", refuse=True))
    with caplog.at_level(logging.WARNING, logger="chronowheel.store.cassandra"):
        assert cassandra_store.CassandraStore.open(mine) == "store"
    assert "this role may not read shared.meta" in caplog.text
    assert "chronowheel acl --apply" in caplog.text
    assert shut == ["shut"] and prepared == ["billing", "billing"]


def test_a_keyspace_from_before_the_record_belongs_to_the_namespace_it_is_named_after() -> None:
    # Before init recorded the namespace, a keyspace was always named after its namespace.
    old = {"shards": "4"}
    check_recorded_owner(old, Settings(namespace="billing"))
    check_recorded_owner(old, Settings(namespace="billing", cassandra_keyspace="billing"))
    with pytest.raises(ConfigError, match=r"keyspace 'billing' was initialised \(with 4 shards\) "
                                          r"before init recorded which namespace it holds"):
        check_recorded_owner(old, Settings(namespace="mail", cassandra_keyspace="billing"))
    check_recorded_owner({}, Settings(namespace="mail", cassandra_keyspace="billing"))  # empty
    with pytest.raises(ConfigError, match=r"holds namespace 'billing'"):
        check_recorded_owner({"shards": "4", "namespace": "billing"},
                             Settings(namespace="mail", cassandra_keyspace="billing"))
