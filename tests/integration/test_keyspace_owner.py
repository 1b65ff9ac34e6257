"""A keyspace named apart from its namespace (`cassandra_keyspace`) holds that namespace alone:
init, a node's start, a worker's and every command's store refuse a second one, before making
anything for it."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from chronowheel.admin import init_namespace
from chronowheel.bus.kafka import open_admin
from chronowheel.errors import ConfigError
from chronowheel.settings import Settings
from chronowheel.store.cassandra import CassandraStore, connect, read_shard_count
from chronowheel.store.cassandra_marks import CassandraWorkerStores
from chronowheel.testing.local import drop_namespace

from tests.integration.harness import make_namespace, run_cli

pytestmark = pytest.mark.integration


async def test_a_keyspace_that_holds_a_namespace_is_refused_to_another(
        stack: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    settings = await make_namespace(stack, namespace, shards=2)
    assert settings.cassandra_keyspace, "the pool names the keyspace apart from the namespace"
    other = dataclasses.replace(settings, namespace=namespace + "b", shards=2)
    assert other.keyspace == settings.keyspace

    with pytest.raises(ConfigError, match=rf"keyspace {settings.keyspace!r} holds namespace "
                                          rf"{namespace!r}, not {other.namespace!r}"):
        await init_namespace(other)
    # A node of the other namespace does not start on it either (its first read).
    with pytest.raises(ConfigError, match=rf"holds namespace {namespace!r}"):
        await asyncio.to_thread(CassandraStore.open_counting_shards, other)
    # Nor a worker of the other namespace (claims and marks would be shared).
    with pytest.raises(ConfigError, match=rf"holds namespace {namespace!r}"):
        await asyncio.to_thread(CassandraWorkerStores, other)
    # On the command line: one clear line, a failing exit status.
    code, _out, err = await run_cli(capsys, other, "init", "--shards", "2")
    assert code != 0
    assert f"holds namespace {namespace!r}" in err, err
    # Nor a command that reads or writes the keyspace (it would list the first one's jobs).
    code, out, err = await run_cli(capsys, other, "jobs", "list")
    assert code != 0 and not out, out
    assert f"holds namespace {namespace!r}" in err, err
    # Nor the grants of `acl --apply`, refused before anything (Kafka's ACLs too) is applied;
    # and on a namespace not initialised yet, which its grants would need.
    code, out, err = await run_cli(capsys, other, "acl", "--apply")
    assert code != 0 and "applied" not in out, out
    assert f"holds namespace {namespace!r}" in err, err
    fresh = dataclasses.replace(settings, namespace=namespace + "c", cassandra_keyspace="")
    code, out, err = await run_cli(capsys, fresh, "acl", "--apply")
    assert code != 0 and "applied" not in out, out
    assert f"namespace {fresh.namespace!r} is not initialised" in err, err

    # Nothing was made for the other namespace, and the first one is untouched.
    admin = await open_admin(settings)
    try:
        topics = await admin.list_topics()
    finally:
        await admin.close()
    assert not [t for t in topics if t.startswith(other.namespace + ".")]
    assert await asyncio.to_thread(read_shard_count, settings) == 2
    await init_namespace(settings)  # its own init again: accepted


async def test_a_keyspace_from_before_the_record_is_claimed_only_by_its_own_namespace(
        stack: Any, bare_namespace: str) -> None:
    # A keyspace named after its namespace, as every keyspace was before the record: init
    # ran, and the row that names the namespace is taken away again.
    own = Settings(namespace=bare_namespace, cassandra=stack.cassandra, kafka=stack.kafka,
                   shards=2)
    await init_namespace(own)
    cluster, session = await asyncio.to_thread(connect, own)
    try:
        await asyncio.to_thread(
            session.execute, f"DELETE FROM {own.keyspace}.meta WHERE name = 'namespace'")
        other = own.replace(namespace=bare_namespace + "b", cassandra_keyspace=own.keyspace)
        with pytest.raises(ConfigError, match=r"was initialised \(with 2 shards\) before init "
                                              r"recorded which namespace it holds"):
            await init_namespace(other)
        # ... nor does a node's start, a worker's or a command's (its store) ...
        with pytest.raises(ConfigError, match=r"before init recorded which namespace"):
            await asyncio.to_thread(read_shard_count, other)
        with pytest.raises(ConfigError, match=r"before init recorded which namespace"):
            await asyncio.to_thread(CassandraStore.open, other)
        # ... and a scratch namespace's cleanup does not drop it either.
        with pytest.raises(ConfigError, match=r"does not record namespace"):
            await drop_namespace(other)
        assert await asyncio.to_thread(read_shard_count, own) == 2  # its nodes still start

        await init_namespace(own)  # the owner's init (an upgrade) records it
        row = await asyncio.to_thread(
            lambda: session.execute(
                f"SELECT value FROM {own.keyspace}.meta WHERE name = 'namespace'").one())
        assert row.value == bare_namespace
        with pytest.raises(ConfigError, match=rf"holds namespace {bare_namespace!r}"):
            await init_namespace(other)
        with pytest.raises(ConfigError, match=rf"holds namespace {bare_namespace!r}"):
            await drop_namespace(other)
    finally:
        cluster.shutdown()
