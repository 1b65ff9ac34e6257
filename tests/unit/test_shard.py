from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from chronowheel.core.shard import murmur2, shard_of, to_positive
from hypothesis import given
from hypothesis import strategies as st

# Vectors from Kafka's UtilsTest (expected values are Java ints, i.e. signed).
KAFKA_VECTORS: list[tuple[bytes, int]] = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS)
def test_kafka_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_empty_input_and_every_tail_length() -> None:
    # Lengths 0..7 exercise the body loop and all three tail branches.
    for n in range(8):
        data = bytes(range(200, 200 + n))
        assert murmur2(data) == _signed(aiokafka_murmur2(data))


def test_result_is_java_int() -> None:
    for data, _ in KAFKA_VECTORS:
        assert -(2**31) <= murmur2(data) < 2**31


def test_to_positive_matches_kafka() -> None:
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0
    assert to_positive(0) == 0
    assert to_positive(2**31 - 1) == 2**31 - 1
    assert to_positive(-973932308) == -973932308 & 0x7FFFFFFF


def test_shard_of_rejects_no_shards() -> None:
    with pytest.raises(ValueError):
        shard_of("x", 0)


def test_shard_of_known_keys() -> None:
    # Derived from the vectors above: (h & 0x7fffffff) % n.
    assert shard_of("21", 16) == (-973932308 & 0x7FFFFFFF) % 16
    assert shard_of("abc", 7) == 479470107 % 7


def test_non_ascii_ids_hash_their_utf8_bytes() -> None:
    job_id = "réminder-ß-😀"
    assert murmur2(job_id.encode("utf-8")) == _signed(aiokafka_murmur2(job_id.encode("utf-8")))


def _signed(u: int) -> int:
    return u - 2**32 if u >= 2**31 else u


@given(st.binary(max_size=300))
def test_murmur2_matches_aiokafka(data: bytes) -> None:
    # aiokafka returns the same 32 bits as an unsigned number.
    assert murmur2(data) & 0xFFFFFFFF == aiokafka_murmur2(data)


@given(st.text(min_size=1, max_size=256), st.integers(min_value=1, max_value=10_000))
def test_shard_of_matches_aiokafka_default_partitioner(job_id: str, n: int) -> None:
    partitions = list(range(n))
    expected = DefaultPartitioner()(job_id.encode("utf-8"), partitions, partitions)
    assert shard_of(job_id, n) == expected
