"""A shard's claimer (`<ns>-shard-<k>`) and a fencer, on librdkafka.

A takeover starts a transactional producer for the shard's claimer id (its `InitProducerId`
fences every earlier claimer of the shard), and one for each previous owner it fences, and
commits its claim as one record alone in a transaction (`node/takeover.py`). On aiokafka each
of those steps is a chain of awaits on the node's event loop, and a takeover happens exactly
when that loop is busiest (the node is taking shards over, reading their rows, still firing its
others): with the loop busy 20 ms a turn, an aiokafka producer's start took 0.7-0.9 s and a
claim as long, where librdkafka, whose requests run on its own threads, took 0.1 s and 0.06 s
(`loadtest/RESULTS.md`, "Claims on librdkafka"). Only these short-lived producers move; the
node's own producer stays on aiokafka.

`enable.sparse.connections` is off: with it on, librdkafka connects to the brokers it learns
from the bootstrap metadata only when a request needs one, and `init_transactions` then found
no broker up for its coordinator lookup and waited for its next try, 500 ms later, in about a
third of the starts (idle servers: 4-18 ms with it off, 56-524 ms with it on).
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from chronowheel.bus.kafka_consumer_group import (
    LIBRDKAFKA_CALLS,
    librdkafka_call,
    librdkafka_config,
)
from chronowheel.bus.ports import BusError, Fenced, Headers
from chronowheel.settings import Settings

T = TypeVar("T")

# init_transactions retries the coordinator's lookup and InitProducerId itself until this
# timeout: under a takeover's fence bound (FENCE_TIMEOUT_S, 30 s), so that a start gives up and
# closes its client on its own thread before the fence abandons it.
INIT_TIMEOUT_S = 25.0
# A claim's commit (or abort) waits at most this long for the brokers.
COMMIT_TIMEOUT_S = 30.0
# Errors that mean a newer producer with this transactional id started since.
FENCED_ERRORS = frozenset({"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"})
# close() of a producer that was fenced in the middle of a commit cannot abort that commit and
# says so as a RuntimeWarning: nothing to do about it (a fenced transaction is aborted by the
# brokers), and the takeover has already said that the claimer was fenced.
warnings.filterwarnings("ignore", message="Producer abort_transaction failed during close",
                        category=RuntimeWarning)


_CLOSING: set[asyncio.Future[None]] = set()
"""Claimers being closed (`RdKafkaClaimer.stop`)."""


def _name(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else None
    name = getattr(err, "name", None)
    return name() if callable(name) else ""


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """librdkafka's errors as the bus port's: Fenced, BusError."""
    from confluent_kafka import KafkaException

    try:
        yield
    except KafkaException as exc:
        if _name(exc) in FENCED_ERRORS:
            raise Fenced(f"{what}: fenced by a newer owner ({exc})") from exc
        raise BusError(f"{what}: {exc}") from exc
    except BufferError as exc:  # produce: the local queue is full (not with one record)
        raise BusError(f"{what}: {exc}") from exc


async def _off_loop(what: str, call: Callable[[], T]) -> T:
    """Run a blocking librdkafka call in a thread: the loop goes on meanwhile."""
    with _translated(what):
        return await librdkafka_call(call)


async def _outlast(started: asyncio.Future[Any]) -> None:
    """Wait until `started` is done, whatever cancellations come meanwhile (the caller
    re-raises its own)."""
    while not started.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([started])


class RdKafkaClaimTransaction:
    """The one transaction of a claim or a release: a record, then commit (or abort)."""

    def __init__(self, producer: Any, transactional_id: str) -> None:
        self._producer = producer
        self._id = transactional_id

    async def publish(self, topic: str, partition: int, key: bytes | None, value: bytes,
                      headers: Headers) -> None:
        with _translated(f"{self._id}: publishing to {topic}[{partition}]"):
            self._producer.produce(topic, value=value, key=key, partition=partition,
                                   headers=list(headers) or None)

    async def commit(self, submit_offsets: Mapping[int, int]) -> None:
        if submit_offsets:  # a claim or a release carries the watermark alone
            raise BusError(f"{self._id}: a claimer commits no submit offsets")
        await _off_loop(f"{self._id}: committing a transaction",
                        lambda: self._producer.commit_transaction(COMMIT_TIMEOUT_S))

    async def abort(self) -> None:
        with contextlib.suppress(Exception):
            await _off_loop(f"{self._id}: aborting a transaction",
                            lambda: self._producer.abort_transaction(COMMIT_TIMEOUT_S))


class RdKafkaClaimer:
    """A transactional producer that initialises (fencing every other producer with its id)
    and commits single records alone in transactions: a shard's claimer, or a fencer."""

    def __init__(self, settings: Settings, transactional_id: str) -> None:
        self._settings = settings
        self._id = transactional_id
        self._producer: Any = None

    @property
    def transactional_id(self) -> str:
        return self._id

    def _config(self) -> dict[str, Any]:
        return {**librdkafka_config(self._settings),
                "client.id": f"chronowheel-{self._id}",
                "transactional.id": self._id,
                "transaction.timeout.ms": 60_000,
                "enable.sparse.connections": False,
                # Requests that librdkafka retries itself (a claim's produce and transaction
                # requests) are tried again after 20-100 ms, not on its backoff growing to
                # 1 s. That does not apply to InitProducerId:
                # librdkafka asks again for a refused producer id only after a fixed 500 ms,
                # which a fence meets every time its owner had a transaction open; so a fence
                # starts more fencers meanwhile (`node/takeover.py`, FENCE_STAGGER_MS).
                "retry.backoff.ms": 20,
                "retry.backoff.max.ms": 100,
                "linger.ms": 0}

    async def start(self) -> None:
        from confluent_kafka import Producer

        def init() -> Any:
            producer = Producer(self._config())
            try:
                producer.init_transactions(INIT_TIMEOUT_S)
            except BaseException:
                producer.close()
                raise
            return producer

        starting = asyncio.ensure_future(
            _off_loop(f"{self._id}: init transactional producer", init))
        try:
            self._producer = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The init goes on in its thread whatever happens here, and its InitProducerId
            # bumps the id's epoch when it lands. Abandoned, it could land after the next
            # claimer of the same shard initialised (the node taking the shard again after a
            # rebalance or a fence recovery cancelled this takeover) and fence it: that claim
            # then failed as if another node were claiming, and the shard, still the node's in
            # the group, went unserved until the next rebalance. So a cancelled start ends only
            # once its init did (within INIT_TIMEOUT_S), and closes what it made.
            await _outlast(starting)
            if not starting.cancelled() and starting.exception() is None:
                self._producer = starting.result()
                await self.stop()
            raise

    async def stop(self) -> None:
        """Returns at once; the client is closed on a thread of `LIBRDKAFKA_CALLS` (which the
        interpreter's exit waits for). Closing a librdkafka client joins its threads: a node
        stopping or giving shards up closed its claimers one after the other, and the node's
        leave of the group (which the other nodes wait for) came up to a second after the
        SIGTERM."""
        producer, self._producer = self._producer, None
        if producer is not None:
            # Anything queued is dropped; close() aborts an open transaction (the broker would
            # at its timeout anyway, as the port says).
            def close() -> None:
                with contextlib.suppress(Exception):
                    producer.purge()
                    producer.close()

            closing = asyncio.get_running_loop().run_in_executor(LIBRDKAFKA_CALLS, close)
            _CLOSING.add(closing)
            closing.add_done_callback(_CLOSING.discard)

    async def begin(self) -> RdKafkaClaimTransaction:
        producer = self._producer
        if producer is None:
            raise BusError(f"producer {self._id} not started")
        with _translated(f"{self._id}: begin transaction"):
            producer.begin_transaction()
        return RdKafkaClaimTransaction(producer, self._id)
