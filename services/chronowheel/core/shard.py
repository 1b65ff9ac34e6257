"""Job id -> shard, bit-for-bit the Java Kafka client's default partitioner.

The shard number is the `<ns>.submit` partition a stock producer (Java client, aiokafka,
kafka-python, librdkafka with murmur2_random) picks for the job id as key, so a job's commands
land directly on the partition of the node that owns its shard.
"""

from __future__ import annotations

import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF
_SIGN32 = 0x80000000
_WORDS = struct.Struct("<I")


def murmur2(data: bytes) -> int:
    """MurmurHash2 (32 bit, Kafka's seed), returned as a Java `int`: signed, in [-2**31, 2**31).

    All arithmetic is done on unsigned 32-bit values; `>>` on them is Java's `>>>`.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    body = length & ~3
    # Little-endian 32-bit words, as the Java code assembles them byte by byte.
    for (k,) in _WORDS.iter_unpack(memoryview(data)[:body]):
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    tail = length & 3
    if tail == 3:
        h ^= data[body + 2] << 16
    if tail >= 2:
        h ^= data[body + 1] << 8
    if tail >= 1:
        h ^= data[body]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - 0x1_0000_0000 if h & _SIGN32 else h


def to_positive(x: int) -> int:
    """Kafka's `Utils.toPositive`: clear the sign bit (not abs(), which differs on MIN_VALUE)."""
    return x & 0x7FFFFFFF


def shard_of(job_id: str, shards: int) -> int:
    """The shard (= submit partition) of a job id among `shards` shards."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    return to_positive(murmur2(job_id.encode("utf-8"))) % shards
