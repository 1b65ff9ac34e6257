"""How a state read on librdkafka (`bus/kafka_state_reads.py`) follows its position, with a
scripted stand-in for the consumer: the read's end is reached by records or by a
partition-EOF event past transaction markers; passing errors are waited out, a refusal of the
node's access ends the read; a read that cannot reach its end fails at its deadline. The reads
against the brokers are in `tests/integration/test_node_bus_reads.py`."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from chronowheel.bus.kafka_state_reads import RdKafkaStateReads
from chronowheel.bus.ports import BusError
from chronowheel.settings import Settings
from confluent_kafka import KafkaError

TOPIC = "ns.state"


class Event:
    def __init__(self, offset: int, key: bytes | None = None, value: bytes | None = None,
                 error: KafkaError | None = None) -> None:
        self._offset, self._key, self._value, self._error = offset, key, value, error

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> KafkaError | None:
        return self._error


def eof(offset: int) -> Event:
    return Event(offset, error=KafkaError(KafkaError._PARTITION_EOF))


class Scripted:
    """A consumer whose polls hand over one scripted batch each (then nothing). A batch may
    come with the high watermark of the fetch that brought it (`(events, high)`); the cached
    watermarks are then that one, else the query's."""

    def __init__(self, watermarks: tuple[int, int],
                 *batches: list[Event] | tuple[list[Event], int]) -> None:
        self.watermarks = watermarks
        self.high = watermarks[1]
        self.batches = deque(b if isinstance(b, tuple) else (b, None) for b in batches)
        self.assigned: list[Any] = []
        self.closed = False
        self._rest: list[Event] = []

    def get_watermark_offsets(self, tp: Any, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        return (self.watermarks[0], self.high) if cached else self.watermarks

    def assign(self, tps: list[Any]) -> None:
        self.assigned = [(tp.topic, tp.partition, tp.offset) for tp in tps]

    def unassign(self) -> None:
        self.assigned = []

    def poll(self, timeout: float) -> Event | None:
        if not self.batches:
            return None
        events, high = self.batches.popleft()
        if high is not None:
            self.high = high
        first, *self._rest = events
        return first

    def consume(self, n: int, timeout: float) -> list[Event]:
        rest, self._rest = self._rest, []
        return rest

    def close(self) -> None:
        self.closed = True


class Ticking:
    """A monotonic clock that moves `step` seconds at every look."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 100.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def reads_with(consumer: Scripted, step: float = 0.001) -> RdKafkaStateReads:
    reads = RdKafkaStateReads(Settings(namespace="ns"), monotonic=Ticking(step))
    reads._take = lambda: consumer  # type: ignore[method-assign]
    reads._querier = lambda: consumer  # type: ignore[method-assign]
    return reads


def test_an_eof_past_the_markers_ends_the_read_with_the_last_record() -> None:
    # Offsets 10 and 12 are records of transactions, 11 and 13 their markers: the last record
    # is handed at 12, the end (14) is reached only by the EOF event.
    consumer = Scripted((0, 14), [Event(10, b"k", b"old"), Event(12, b"k", b"new")], [eof(14)])
    reads = reads_with(consumer)
    assert reads.read_last_blocking(TOPIC, 3, b"k", 1_000, False) == b"new"
    assert not consumer.batches
    assert reads.idle == 1 and consumer.assigned == []  # kept, fetching nothing


def test_a_settled_read_goes_on_to_the_high_watermark_of_its_fetches() -> None:
    # The query gives the last stable offset, 2; offsets 2-3 are a transaction still open
    # (the fetches' high watermark, 4). Its record counts once it committed: read to 4.
    consumer = Scripted((0, 2), ([Event(1, b"k", b"old"), eof(2)], 4),
                        ([Event(2, b"k", b"new"), eof(4)], 4))
    assert reads_with(consumer).read_last_blocking(TOPIC, 0, b"k", 1_000, True) == b"new"
    # Not settled, the same read ends at the last stable offset.
    consumer = Scripted((0, 2), ([Event(1, b"k", b"old"), eof(2)], 4),
                        ([Event(2, b"k", b"new"), eof(4)], 4))
    assert reads_with(consumer).read_last_blocking(TOPIC, 0, b"k", 1_000, False) == b"old"


def test_a_settled_read_waits_to_hear_from_its_fetches_even_with_nothing_below_the_end() -> None:
    # Nothing committed yet (last stable offset 0), a transaction open at offset 0: the read
    # begins at its end, but only its fetches can tell whether something is open above it.
    consumer = Scripted((0, 0), ([eof(0)], 1), ([Event(0, b"k", b"v"), eof(2)], 2))
    assert reads_with(consumer).read_last_blocking(TOPIC, 0, b"k", 1_000, True) == b"v"


def test_records_of_other_keys_and_empty_values_are_not_the_last_record() -> None:
    consumer = Scripted((0, 3), [Event(0, b"k", b"v"), Event(1, b"k", b""),
                                 Event(2, b"other", b"x")])
    assert reads_with(consumer).read_last_blocking(TOPIC, 0, b"k", 1_000, True) == b"v"


def test_a_passing_error_is_waited_out() -> None:
    down = Event(-1, error=KafkaError(KafkaError._TRANSPORT))
    consumer = Scripted((0, 2), [down], [Event(1, b"k", b"v")])
    assert reads_with(consumer).read_last_blocking(TOPIC, 0, b"k", 1_000, False) == b"v"


def test_a_refusal_of_the_nodes_access_ends_the_read_and_the_consumer_is_closed() -> None:
    refused = Event(-1, error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    consumer = Scripted((0, 2), [refused], [Event(1, b"k", b"v")])
    reads = reads_with(consumer)
    with pytest.raises(BusError, match=r"state read of ns.state\[0\]"):
        reads.read_last_blocking(TOPIC, 0, b"k", 1_000, False)
    assert consumer.closed and reads.idle == 0


def test_a_read_that_cannot_reach_its_end_fails_at_its_deadline() -> None:
    consumer = Scripted((0, 5), [Event(3, b"k", b"v")], [eof(4)])  # stuck below 5
    reads = reads_with(consumer, step=0.1)  # each look at the clock: 100 ms later
    with pytest.raises(BusError, match=r"timed out reading ns.state\[0\] to its high watermark "
                                       r"5 \(1000 ms, at 4\)"):
        reads.read_last_blocking(TOPIC, 0, b"k", 1_000, True)
    assert consumer.closed


def test_the_tail_first_then_further_back_to_the_log_start() -> None:
    # 1,000 offsets; the key is only at offset 5: the tail (744-999) holds none of it.
    consumer = Scripted((0, 1_000), [eof(1_000)], [Event(5, b"k", b"v"), eof(1_000)])
    starts: list[int] = []
    assign = consumer.assign

    def recorded(tps: list[Any]) -> None:
        starts.append(tps[0].offset)
        assign(tps)

    consumer.assign = recorded  # type: ignore[method-assign]
    assert reads_with(consumer).read_last_blocking(TOPIC, 0, b"k", 1_000, False) == b"v"
    assert starts == [1_000 - 256, 0]


def test_a_closed_reader_keeps_no_consumer() -> None:
    consumer = Scripted((0, 0))
    reads = reads_with(consumer)
    reads.close()
    assert reads.read_last_blocking(TOPIC, 0, b"k", 1_000, False) is None
    assert consumer.closed and reads.idle == 0
