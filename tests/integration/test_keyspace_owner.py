"""A keyspace named apart from its namespace (`cassandra_keyspace`) holds that namespace alone:
init and a node's start refuse a second one, before making anything for it."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from chronowheel.admin import init_namespace
from chronowheel.bus.kafka import open_admin
from chronowheel.errors import ConfigError
from chronowheel.store.cassandra import CassandraStore, read_shard_count

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
    # On the command line: one clear line, a failing exit status.
    code, _out, err = await run_cli(capsys, other, "init", "--shards", "2")
    assert code != 0
    assert f"holds namespace {namespace!r}" in err, err

    # Nothing was made for the other namespace, and the first one is untouched.
    admin = await open_admin(settings)
    try:
        topics = await admin.list_topics()
    finally:
        await admin.close()
    assert not [t for t in topics if t.startswith(other.namespace + ".")]
    assert await asyncio.to_thread(read_shard_count, settings) == 2
    await init_namespace(settings)  # its own init again: accepted
