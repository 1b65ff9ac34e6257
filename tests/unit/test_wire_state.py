"""The state record of `<ns>.state` (core/wire.py): its key, its encoding and its parsing."""

from __future__ import annotations

import orjson
import pytest
from chronowheel.core.wire import StateRecord, StateRecordError, claimer_transactional_id

T0 = 1_800_000_000_000


def test_key_names_the_shard_and_reads_back() -> None:
    assert StateRecord.key(7) == b"shard-7"
    assert StateRecord.shard_of_key(StateRecord.key(7)) == 7
    for other in (None, b"", b"shard-", b"shard-x", b"job-7", b"shard--1"):
        assert StateRecord.shard_of_key(other) is None


@pytest.mark.parametrize("record", [
    StateRecord(shard=3, watermark=T0, owner="ns-node-a", node="a", at=T0 + 5,
                horizon=T0 + 60_000, wheel=12, skew_ms=-4, blocked=False),
    StateRecord(shard=3, watermark=T0, owner="ns-node-a", node="a", at=T0, claim=True),
    StateRecord(shard=3, watermark=T0, owner=None, node="a", at=T0, skew_ms=None,
                blocked=True),
    StateRecord(shard=0, watermark=T0, owner=None, node="init", at=T0),
    StateRecord(shard=1, watermark=T0, node="old", at=T0, without_owner=True),
    StateRecord(shard=2, watermark=T0, owner="ns-node-a", node="a", at=T0,
                ahead=((T0 + 10, T0 + 5_000),)),
    StateRecord(shard=2, watermark=T0, owner="ns-node-a", node="a", at=T0,
                ahead=((T0 + 10, T0 + 5_000), (T0 + 6_000, T0 + 9_000))),
])
def test_round_trip(record: StateRecord) -> None:
    assert StateRecord.parse(record.encode(), shard=record.shard) == record


def test_encoding_is_the_documented_json() -> None:
    rec = StateRecord(shard=2, watermark=T0, owner="o", node="n1", at=T0 + 1, horizon=T0 + 9,
                      wheel=4, skew_ms=-7, blocked=False)
    assert orjson.loads(rec.encode()) == {
        "shard": 2, "watermark": T0, "node": "n1", "owner": "o", "at": T0 + 1,
        "horizon": T0 + 9, "wheel": 4, "skew": -7, "blocked": False}
    released = orjson.loads(StateRecord(shard=2, watermark=T0, node="n1", at=T0).encode())
    assert "owner" in released and released["owner"] is None
    assert "claim" not in released and "skew" not in released and "horizon" not in released
    claim = orjson.loads(StateRecord(shard=2, watermark=T0, owner="o", claim=True).encode())
    assert claim["claim"] is True


def test_a_record_without_owner_still_parses_and_names_the_claimer() -> None:
    """The old form (a per-shard producer of versions before node transactions): no owner
    field, so the shard's claimer id may still publish for it."""
    old = StateRecord.parse(b'{"shard":4,"watermark":5,"node":"n","at":5}', shard=4)
    assert (old.watermark, old.node, old.at, old.owner) == (5, "n", 5, None)
    assert old.without_owner
    assert old.publisher("ns") == claimer_transactional_id("ns", 4) == "ns-shard-4"
    bare = StateRecord.parse(orjson.dumps({"watermark": T0}), shard=1)
    assert (bare.horizon, bare.wheel, bare.skew_ms, bare.blocked, bare.claim) == (
        None, None, None, None, False)


def test_publisher_is_the_owner_or_nobody() -> None:
    owned = StateRecord.parse(orjson.dumps({"watermark": T0, "owner": "ns-node-a"}), shard=0)
    assert owned.publisher("ns") == "ns-node-a" and not owned.without_owner
    released = StateRecord.parse(orjson.dumps({"watermark": T0, "owner": None}), shard=0)
    assert released.publisher("ns") is None


def test_parse_reads_the_shard_from_where_it_was_read() -> None:
    rec = StateRecord.parse(orjson.dumps({"shard": 9, "watermark": T0}), shard=2)
    assert rec.shard == 2


def test_diagnostics_of_another_type_read_as_absent() -> None:
    rec = StateRecord.parse(orjson.dumps({"watermark": T0, "node": 5, "at": "x", "wheel": 1.5,
                                          "skew": "3", "blocked": "no", "claim": 1}), shard=0)
    assert (rec.node, rec.at, rec.wheel, rec.skew_ms, rec.blocked, rec.claim) == (
        None, None, None, None, None, False)


@pytest.mark.parametrize("value", [
    b"", b"not json", b"[1, 2]", b'"shard-1"', b"{}", b'{"watermark": null}',
    b'{"watermark": "soon"}', b'{"watermark": true}', b'{"watermark": {}}',
])
def test_malformed_input_raises_a_clear_error(value: bytes) -> None:
    with pytest.raises(StateRecordError, match="state record of shard 3") as err:
        StateRecord.parse(value, shard=3)
    assert isinstance(err.value, ValueError)


def test_the_ahead_range_of_a_catch_up_is_checked_not_ignored() -> None:
    # Ignoring a malformed range would make a takeover publish the range again.
    record = StateRecord(shard=2, watermark=T0, ahead=((T0, T0 + 1),)).encode()
    assert orjson.loads(record)["ahead"] == [T0, T0 + 1]  # one range: as the first version
    two = StateRecord(shard=2, watermark=T0, ahead=((T0, T0 + 1), (T0 + 3, T0 + 4))).encode()
    assert orjson.loads(two)["ahead"] == [[T0, T0 + 1], [T0 + 3, T0 + 4]]
    for bad in ([T0 - 1, T0 + 5], [T0 + 5, T0 + 5], [T0 + 5], "x", [T0 + 1, 1.5], [],
                [[T0, T0 + 5], [T0 + 5, T0 + 9]], [[T0, T0 + 5], [T0 + 2, T0 + 9]],
                [[T0 + 6, T0 + 9], [T0, T0 + 5]], [[T0, T0 + 5], "x"]):
        value = orjson.dumps({"watermark": T0, "ahead": bad})
        with pytest.raises(StateRecordError, match="ahead must be"):
            StateRecord.parse(value, shard=2)
