"""What the console reads, and how it keeps the cheap parts warm.

The shard owners, the state records and the shard count come from the read model of the
namespace (`ops/cluster.py`), a shard's row of the overview from `ops/status.py`, the decoding
of a message from `ops/tail.py`: one reading of each source for the CLI and the console.

Two things run in the background so that the overview costs no Kafka round trip per request:
a read_committed reader that follows `<ns>.state` (the newest record of every shard, as the
nodes commit them) and a clock-skew probe against Cassandra.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import TopicPartition

from chronowheel.bus.kafka import open_admin, partition_counts, reader
from chronowheel.core import wire
from chronowheel.core.buckets import MINUTE_MS, minute_of
from chronowheel.core.model import ValidationPolicy, decode_stored_job, parse_command
from chronowheel.core.recurrence import compile_schedule, latest_at_or_before, occurrences
from chronowheel.core.runs import JobHistory
from chronowheel.core.shard import shard_of
from chronowheel.core.wire import StateRecord
from chronowheel.errors import ChronowheelError
from chronowheel.ops.cluster import (
    Group,
    describe_group,
    nodes_group,
    read_state_positions,
)
from chronowheel.ops.runs import open_history, read_job_history
from chronowheel.ops.status import BEHIND_MS_DEFAULT, ShardStatus, shard_status
from chronowheel.ops.tail import TailMessage, decimal, message_json
from chronowheel.settings import Settings
from chronowheel.store.base import DueRow, JobRow, JobStore, RunHistoryStore
from chronowheel.store.cassandra import HOUR_MS, CassandraStore
from chronowheel.timeouts import wait_event

log = logging.getLogger(__name__)

# The owners change only on a rebalance: describing the group once per this interval is enough.
GROUP_CACHE_MS = 2_000
# The console's own clock against Cassandra's, measured this often.
SKEW_PROBE_MS = 5_000
# Bucket count windows of the overview ("due in the next N minutes") and of the heat map.
OVERVIEW_DUE_MINUTES = 10
HEAT_MINUTES = 24 * 60
# Messages read back per partition for the rejected / dead-letter tails and for a job's last
# fired occurrences (its partition of the target topic).
TAIL_PER_PARTITION = 50
FIRED_SCAN = 5_000
# The heat map of the upcoming load is served from memory: one read of bucket_counts per
# HEAT_FRESH_MS at most, however many people reload the page. A request finding it older starts
# a read in the background and is answered with what is there; one finding it older than
# HEAT_STALE_MS (or none) waits for the read.
HEAT_FRESH_MS = 5_000
HEAT_STALE_MS = 60_000
# A read of Kafka the page waits for at most this long.
KAFKA_READ_TIMEOUT_S = 10.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class NodeView:
    """A member of the `<ns>-nodes` group: the shards it holds and its newest commit."""

    label: str
    node_id: str
    shards: tuple[int, ...]
    last_commit_ms: int | None
    skew_ms: int | None         # as of its newest state record
    blocked: bool | None        # dispatch stopped by the skew


@dataclass(frozen=True)
class ClusterView:
    now_ms: int
    shards: int
    group_state: str
    nodes: tuple[NodeView, ...]
    rows: tuple[ShardStatus, ...]
    records: dict[int, StateRecord]
    behind_ms: int
    console_skew_ms: int | None
    console_skew_uncertainty_ms: int | None
    max_clock_skew_ms: int

    @property
    def last_commit_ms(self) -> int | None:
        ats = [r.at for r in self.records.values() if r.at is not None]
        return max(ats) if ats else None


@dataclass(frozen=True)
class HeatMap:
    """Bucket counts of the next `minutes` minutes from `first_minute`, per shard."""

    first_minute: int
    minutes: int
    counts: tuple[tuple[int, ...], ...]  # [shard][minute index]

    @property
    def total(self) -> int:
        return sum(sum(row) for row in self.counts)

    def minute_totals(self) -> list[int]:
        return [sum(col) for col in zip(*self.counts, strict=True)] if self.counts else []

    def hour_totals(self) -> list[tuple[int, int]]:
        """(hour start, rows) of every hour the window touches, in order."""
        out: dict[int, int] = {}
        for i, n in enumerate(self.minute_totals()):
            minute = self.first_minute + i * MINUTE_MS
            hour = minute - minute % HOUR_MS
            out[hour] = out.get(hour, 0) + n
        return sorted(out.items())

    def busiest(self, n: int) -> list[tuple[int, int]]:
        """The n minutes with the most rows: (minute, rows), busiest first, empty ones left out."""
        totals = self.minute_totals()
        # Busiest first; among equals the earlier minute first.
        ranked = sorted((i for i, rows in enumerate(totals) if rows),
                        key=lambda i: (-totals[i], i))[:n]
        return [(self.first_minute + i * MINUTE_MS, totals[i]) for i in ranked]


@dataclass(frozen=True)
class UpcomingLoad:
    """A heat map, when it was read and how long the read took."""

    heat: HeatMap
    read_at_ms: int
    read_ms: float


@dataclass(frozen=True)
class DuePage:
    minute: int
    shard: int | None
    rows: tuple[DueRow, ...]
    next_cursor: str | None


@dataclass(frozen=True)
class FiredOccurrence:
    scheduled_ms: int | None
    fired_ms: int | None
    attempt: str | None
    partition: int
    offset: int


@dataclass(frozen=True)
class JobView:
    row: JobRow
    spec: Any                       # the stored spec, decoded (None when it does not parse)
    tz: str
    next_occurrences: tuple[int, ...]
    previous_occurrence: int | None
    preview_problem: str | None     # why no preview could be computed
    watermark_ms: int | None
    fired: tuple[FiredOccurrence, ...]
    fired_scanned: int              # messages looked at for `fired`
    target_topic: str
    history: JobHistory | None = None  # its last runs and counters (None: not read)


@dataclass
class StateFollower:
    """The newest committed state record of every shard, kept current by a background reader."""

    settings: Settings
    shards: int
    records: dict[int, StateRecord] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)  # of each shard's record in `records`
    _task: asyncio.Task[None] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="console-state-follower")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        tps = [TopicPartition(self.settings.state_topic, k) for k in range(self.shards)]
        while True:
            consumer = reader(self.settings)
            try:
                await consumer.start()
                consumer.assign(tps)
                # Where the snapshot ends: follow from there (a record read twice is harmless).
                ends = await consumer.end_offsets(tps)
                self._merge(await read_state_positions(self.settings, self.shards))
                for tp in tps:
                    consumer.seek(tp, ends[tp])
                self.ready.set()
                while True:
                    batches = await consumer.getmany(timeout_ms=1_000)
                    for tp, msgs in batches.items():
                        for m in msgs:
                            if m.key == StateRecord.key(tp.partition) and m.value:
                                self._merge({tp.partition: (m.offset, StateRecord.parse(
                                    m.value, shard=tp.partition))})
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Kafka away for a while: show stale data, retry
                log.warning("following %s failed, retrying in 2 s: %s",
                            self.settings.state_topic, exc)
                self.ready.set()
                await asyncio.sleep(2)
            finally:
                with contextlib.suppress(Exception):
                    await consumer.stop()

    def _merge(self, found: dict[int, tuple[int, StateRecord]]) -> None:
        for shard, (offset, rec) in found.items():
            old = self.offsets.get(shard)
            if old is None or offset >= old:
                self.records[shard], self.offsets[shard] = rec, offset


RedriveState = tuple[str, str | None]
"""What a redrive would do with a dead letter: ("ready", None) send it again, ("redriven",
None) nothing, it was redriven before, or ("refused", why)."""


async def redrive_states(letters: Sequence[TailMessage], store: JobStore, *, shards: int,
                         policy: ValidationPolicy, retention_s: int,
                         now_ms: int) -> dict[str, RedriveState]:
    """By `<partition>@<offset>`: what a redrive of `letters` would do with each, found by a
    dry run of the redrive's own code (`client.dead.Redrive`: the same refusals, the request
    row of a letter redriven before, the checks of its retry). Nothing is sent or recorded."""
    from chronowheel.client.dead import DeadSelector, Redrive, memory_reader

    async def send(job_id: str, value: bytes) -> asyncio.Future[Any]:
        raise AssertionError("a dry run sends nothing")

    def check(value: bytes) -> object:
        return parse_command(value, key=None, policy=policy, now_ms=now_ms)

    summary = await Redrive(selector=DeadSelector(), read=memory_reader(letters), store=store,
                            send=send, shards=shards, retention_s=retention_s, dry_run=True,
                            now_ms=lambda: now_ms, check=check).run()
    states: dict[str, RedriveState] = {p: ("ready", None) for p in summary.redriven}
    states.update((p, ("redriven", None)) for p in summary.already)
    states.update((p, ("refused", why)) for p, why in summary.refused)
    return states


class Sources:
    """Everything the pages read, over one Cassandra session and one Kafka admin client."""

    def __init__(self, settings: Settings, store: CassandraStore, shards: int, *,
                 behind_ms: int = BEHIND_MS_DEFAULT) -> None:
        self.settings = settings
        self.store = store
        self.shards = shards
        self.behind_ms = behind_ms
        self.state = StateFollower(settings, shards)
        self.policy = ValidationPolicy.from_settings(settings)
        self._admin: Any = None
        self._group: tuple[int, Group] | None = None
        self._group_lock = asyncio.Lock()
        self._partitions: dict[str, int] = {}
        self._skew: tuple[int, int] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._upcoming: UpcomingLoad | None = None
        self._upcoming_read: asyncio.Task[UpcomingLoad] | None = None
        self._history: RunHistoryStore | None = None

    async def start(self) -> None:
        self._admin = await open_admin(self.settings)
        await self.state.start()
        self._probe = asyncio.create_task(self._probe_skew(), name="console-skew-probe")
        self._refresh_upcoming()  # warm: the first visit of the page need not wait for it
        # The first overview should show records, not an empty table: wait a little for them.
        await wait_event(self.state.ready, KAFKA_READ_TIMEOUT_S)

    async def stop(self) -> None:
        if self._upcoming_read is not None:
            self._upcoming_read.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._upcoming_read
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await self.state.stop()
        if self._admin is not None:
            await self._admin.close()

    # --- cluster ------------------------------------------------------------------------
    async def group(self) -> Group:
        async with self._group_lock:
            now = now_ms()
            if self._group is None or now - self._group[0] > GROUP_CACHE_MS:
                self._group = (now, await describe_group(
                    self._admin, nodes_group(self.settings), self.settings.submit_topic,
                    settings=self.settings))
            return self._group[1]

    async def cluster(self) -> ClusterView:
        now = now_ms()
        first = minute_of(now)
        last = first + (OVERVIEW_DUE_MINUTES - 1) * MINUTE_MS
        group, counts = await asyncio.gather(
            self.group(),
            asyncio.gather(*(self.store.bucket_counts(k, first, last)
                             for k in range(self.shards))))
        records = dict(self.state.records)
        rows = tuple(
            shard_status(k, group.owners[k].label if k in group.owners else None,
                         records.get(k), sum(counts[k].values()), now, self.behind_ms)
            for k in range(self.shards))
        nodes = []
        for member in group.members:
            owned = tuple(sorted(k for k, m in group.owners.items() if m == member))
            mine = [r for r in records.values()
                    if r.node == member.client_id and r.at is not None]
            newest = max(mine, key=lambda r: r.at or 0, default=None)
            nodes.append(NodeView(
                member.label, member.client_id, owned,
                None if newest is None else newest.at,
                None if newest is None else newest.skew_ms,
                None if newest is None else newest.blocked))
        skew = self._skew
        return ClusterView(
            now_ms=now, shards=self.shards, group_state=group.state, nodes=tuple(nodes),
            rows=rows, records=records, behind_ms=self.behind_ms,
            console_skew_ms=None if skew is None else skew[0],
            console_skew_uncertainty_ms=None if skew is None else skew[1],
            max_clock_skew_ms=self.settings.max_clock_skew_ms)

    async def _probe_skew(self) -> None:
        while True:
            try:
                server, sent, received = await self.store.clock_sample()
                half = (received - sent) // 2
                self._skew = ((sent + received) // 2 - server, half)
            except Exception as exc:
                log.warning("clock skew probe failed: %s", exc)
            await asyncio.sleep(SKEW_PROBE_MS / 1000)

    # --- upcoming load ------------------------------------------------------------------
    async def upcoming(self) -> UpcomingLoad:
        """The heat map of the next 24 hours, from memory when it is recent enough."""
        held = self._upcoming
        age = None if held is None else now_ms() - held.read_at_ms
        if held is not None and age is not None and age <= HEAT_STALE_MS:
            if age > HEAT_FRESH_MS:
                self._refresh_upcoming()
            return held
        return await asyncio.shield(self._refresh_upcoming())

    def _refresh_upcoming(self) -> asyncio.Task[UpcomingLoad]:
        """The running read of the heat map, or a new one (one at a time)."""
        if self._upcoming_read is None or self._upcoming_read.done():
            self._upcoming_read = asyncio.create_task(self._read_upcoming(),
                                                      name="console-heat-map")
        return self._upcoming_read

    async def _read_upcoming(self) -> UpcomingLoad:
        started = time.perf_counter()
        at = now_ms()
        heat = await self.heat_map(at)
        load = UpcomingLoad(heat, at, (time.perf_counter() - started) * 1000)
        self._upcoming = load
        return load

    async def heat_map(self, from_ms: int | None = None,
                       minutes: int = HEAT_MINUTES) -> HeatMap:
        """Counts per (minute, shard) from `bucket_counts`, the table the nodes maintain on
        every write: one request per shard (naming its 25 hour partitions), all shards in
        parallel. Never reads a `due` row."""
        first = minute_of(now_ms() if from_ms is None else from_ms)
        last = first + (minutes - 1) * MINUTE_MS
        results = await asyncio.gather(*(self.store.bucket_counts_wide(k, first, last)
                                         for k in range(self.shards)))
        grid = [[0] * minutes for _ in range(self.shards)]
        for k, found in enumerate(results):
            row = grid[k]
            for minute, rows in found.items():
                row[(minute - first) // MINUTE_MS] = rows
        return HeatMap(first, minutes, tuple(tuple(r) for r in grid))

    async def due_rows(self, minute: int, shard: int | None, cursor: str | None,
                       limit: int) -> DuePage:
        """One page of the due rows of a minute, of one shard or of all of them (in shard
        order); `cursor` is the `next_cursor` of the previous page."""
        after = parse_cursor(cursor) if cursor else None
        shards = [shard] if shard is not None else list(range(self.shards))
        start = 0 if after is None else shards.index(after[0]) if after[0] in shards else 0
        out: list[DueRow] = []
        for k in shards[start:]:
            key = after[1:] if after is not None and after[0] == k else None
            rows = await self.store.due_page(minute, k, key, limit + 1 - len(out))
            out.extend(rows)
            if len(out) > limit:
                break
        more = len(out) > limit
        out = out[:limit]
        nxt = make_cursor(out[-1]) if more else None
        return DuePage(minute, shard, tuple(out), nxt)

    # --- jobs ---------------------------------------------------------------------------
    async def job(self, job_id: str, *, preview: int = 10,
                  fired_scan: int = FIRED_SCAN) -> JobView | None:
        row = await self.store.get_job(job_id)
        if row is None:
            return None
        now = now_ms()
        try:
            spec: Any = orjson.loads(row.spec) if row.spec else None
        except orjson.JSONDecodeError:
            spec = None
        tz, prev, problem = "UTC", None, None
        nexts: tuple[int, ...] = ()
        target = self.settings.fired_topic
        try:
            job = decode_stored_job(row.spec, policy=self.policy, now_ms=now)
            tz, target = job.tz, job.topic
            if row.status != "scheduled":
                pass  # cancelled or finished: nothing further fires, whatever the spec says
            elif job.recurring:
                schedule = compile_schedule(cron=job.cron, every_ms=job.every_ms, tz=job.tz,
                                            start_ms=job.start_ms, end_ms=job.end_ms,
                                            dst=job.dst)
                nexts = tuple(occurrences(schedule, now, preview))
                prev = latest_at_or_before(schedule, now)
            elif job.at_ms is not None and job.at_ms > now:
                nexts = (job.at_ms,)
        except ChronowheelError as exc:
            problem = str(exc)
        rec = self.state.records.get(row.shard)
        fired, scanned = await self.last_fired(job_id, target, fired_scan)
        if self._history is None:
            self._history = await open_history(self.store, self.settings)
        history = await read_job_history(self._history, job_id, self.settings.history_limit)
        return JobView(row, spec, tz, nexts, prev, problem,
                       None if rec is None else rec.watermark, tuple(fired), scanned, target,
                       history)

    async def partition_count(self, topic: str) -> int | None:
        n = self._partitions.get(topic)
        if n is None:
            n = (await partition_counts(self._admin, [topic])).get(topic)
            if n is not None:
                self._partitions[topic] = n
        return n

    async def last_fired(self, job_id: str, topic: str,
                         scan: int) -> tuple[list[FiredOccurrence], int]:
        """The job's occurrences among the last `scan` messages of its partition of `topic`
        (fired messages go to partition shard_of(job id, partitions)), newest first."""
        parts = await self.partition_count(topic)
        if parts is None:
            return [], 0
        partition = shard_of(job_id, parts)
        key = job_id.encode()
        found: list[FiredOccurrence] = []
        msgs = await self.read_back(topic, [partition], scan)
        for m in msgs:
            if m.key != key:
                continue
            headers = {k: v.decode("utf-8", "replace") for k, v in m.headers}
            found.append(FiredOccurrence(decimal(headers.get(wire.SCHEDULED_AT)),
                                         decimal(headers.get(wire.FIRED_AT)),
                                         headers.get(wire.ATTEMPT), m.partition, m.offset))
        found.sort(key=lambda f: f.offset, reverse=True)
        return found[:20], len(msgs)

    async def tail(self, topic: str, per_partition: int = TAIL_PER_PARTITION,
                   limit: int = 200) -> list[dict[str, Any]]:
        """The last messages of every partition of `topic`, decoded as `chronowheel tail
        --json` prints them, newest first."""
        return [message_json(m) for m in await self.tail_messages(topic, per_partition, limit)]

    async def tail_messages(self, topic: str, per_partition: int = TAIL_PER_PARTITION,
                            limit: int = 200) -> list[TailMessage]:
        """The last messages of every partition of `topic`, newest first."""
        parts = await self.partition_count(topic)
        if parts is None:
            return []
        msgs = await self.read_back(topic, list(range(parts)), per_partition)
        msgs.sort(key=lambda m: (m.timestamp_ms or 0, m.partition, m.offset), reverse=True)
        return msgs[:limit]

    async def redrive_states(self, letters: Sequence[TailMessage]) -> dict[str, RedriveState]:
        """What `chronowheel dead redrive` would do with each of `letters` (`redrive_states`)."""
        return await redrive_states(letters, self.store, shards=self.shards,
                                    policy=self.policy,
                                    retention_s=max(1, self.settings.retention_ms // 1000),
                                    now_ms=now_ms())

    async def read_back(self, topic: str, partitions: Sequence[int],
                        per_partition: int) -> list[TailMessage]:
        """The committed messages among the last `per_partition` offsets of each partition."""
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer = reader(self.settings, max_partition_fetch_bytes=4 << 20)
        await consumer.start()
        out: list[TailMessage] = []
        try:
            consumer.assign(tps)
            begins = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
            todo = {tp for tp in tps if ends[tp] > begins[tp]}
            for tp in todo:
                consumer.seek(tp, max(begins[tp], ends[tp] - per_partition))
            deadline = time.monotonic() + KAFKA_READ_TIMEOUT_S
            while todo:
                if time.monotonic() > deadline:
                    raise ChronowheelError(f"timed out reading {topic} after "
                                           f"{KAFKA_READ_TIMEOUT_S:.0f}s")
                batches = await consumer.getmany(*todo, timeout_ms=200)
                for tp, records in batches.items():
                    out.extend(TailMessage(tp.topic, tp.partition, r.offset, r.timestamp,
                                           r.key, r.value, tuple(r.headers or ()))
                               for r in records if r.offset < ends[tp])
                for tp in list(todo):
                    # Commit markers and aborted records take offsets too: the position, not
                    # the last record seen, says when the end is reached.
                    if await consumer.position(tp) >= ends[tp]:
                        todo.discard(tp)
        finally:
            await consumer.stop()
        return out


def make_cursor(row: DueRow) -> str:
    return f"{row.shard}:{row.slot_ms}:{row.attempt}:{row.job_id}"


def parse_cursor(text: str) -> tuple[int, int, str, int]:
    """(shard, slot_ms, job_id, attempt) of a cursor; ValueError when it is not one."""
    shard, slot, attempt, job_id = text.split(":", 3)
    return int(shard), int(slot), job_id, int(attempt)

