"""The limits the node runs on, measured before it starts (so nothing else of ours competes):
raw transactional produce shaped like the node's commits, a transaction's commit-to-visible
latency, the probe's own consume rate, raw Cassandra inserts of `due` rows, heapq."""

from __future__ import annotations

import asyncio
import gc
import heapq
import random
import threading
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import NewTopic
from chronowheel.bus.kafka import open_admin, transactional_producer
from chronowheel.node.pending import encode_headers
from chronowheel.settings import Settings
from chronowheel.store.cassandra import connect
from chronowheel.testing import Collector, Fired, LatenessTally, summarize, wall_ms
from chronowheel.worker.occurrence import DEFAULT_BACKOFF_MS, DEFAULT_MAX_ATTEMPTS
from common import Config, fmt, job_id, node_ingest_concurrency, payload, say


def fired_like_message(run: str, i: int, now: int) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    jid = job_id(run, "raw", i)
    headers = encode_headers(jid, now, 1, DEFAULT_MAX_ATTEMPTS, DEFAULT_BACKOFF_MS, ())
    headers.append(("cw-fired-at", str(now).encode()))
    return jid.encode(), orjson.dumps(payload("raw", i)), headers


async def raw_kafka_rate(settings: Settings, topic: str, partitions: int, producers: int,
                         batch: int, seconds: float, run: str) -> dict[str, Any]:
    """Transactional produce like the node's commit: per transaction up to `batch` fired-like
    messages appended per partition with create_batch/send_batch, one state-like record, commit.
    `producers` transactional producers run at once (one per shard in the node)."""
    prods = [transactional_producer(settings, f"{settings.namespace}-rawbench-{p}")
             for p in range(producers)]
    await asyncio.gather(*(p.start() for p in prods))
    counts = [0] * producers
    txns = [0] * producers
    now = int(wall_ms())
    template = [fired_like_message(run, i, now) for i in range(min(batch, 5000))]

    async def one(idx: int, producer: AIOKafkaProducer, deadline: float) -> None:
        seq = 0
        while time.monotonic() < deadline:
            await producer.begin_transaction()
            batches: dict[int, Any] = {}
            for j in range(batch):
                key, value, headers = template[j % len(template)]
                part = (seq + j) % partitions
                b = batches.get(part)
                if b is None:
                    b = batches[part] = producer.create_batch()
                if b.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    await producer.send_batch(b, topic, partition=part)
                    b = batches[part] = producer.create_batch()
                    b.append(key=key, value=value, timestamp=None, headers=headers)
            state = orjson.dumps({"shard": idx, "watermark": now, "node": "rawbench"})
            sb = batches.get(idx % partitions)
            if sb is None:
                sb = batches[idx % partitions] = producer.create_batch()
            if sb.append(key=f"shard-{idx}".encode(), value=state, timestamp=None,
                         headers=[]) is None:
                await producer.send_batch(sb, topic, partition=idx % partitions)
                sb = batches[idx % partitions] = producer.create_batch()
                sb.append(key=f"shard-{idx}".encode(), value=state, timestamp=None, headers=[])
            for part, b in batches.items():
                await producer.send_batch(b, topic, partition=part)
            await producer.commit_transaction()
            seq += batch
            counts[idx] += batch
            txns[idx] += 1

    try:
        # warm-up transaction per producer (metadata, coordinator lookup)
        await asyncio.gather(*(one(i, p, time.monotonic() + 0.01) for i, p in enumerate(prods)))
        counts[:] = [0] * producers
        txns[:] = [0] * producers
        t0 = time.monotonic()
        await asyncio.gather(*(one(i, p, t0 + seconds) for i, p in enumerate(prods)))
        elapsed = time.monotonic() - t0
    finally:
        await asyncio.gather(*(p.stop() for p in prods), return_exceptions=True)
    total = sum(counts)
    return {"producers": producers, "batch": batch, "messages": total,
            "transactions": sum(txns), "seconds": round(elapsed, 3),
            "msgs_per_s": total / elapsed if elapsed else None,
            "txn_ms": 1000 * elapsed * producers / sum(txns) if sum(txns) else None}


async def raw_kafka_visibility(settings: Settings, topic: str, partitions: int,
                               seconds: float, run: str, batch: int = 20,
                               every_ms: float = 20) -> dict[str, Any]:
    """The floor under lateness: a transactional producer stamps the wall clock, sends `batch`
    fired-like messages and commits, every `every_ms`; the probe's read_committed reader
    measures receive time - stamp. Also reports stamp -> commit_transaction() return."""
    producer = transactional_producer(settings, f"{settings.namespace}-rawlatency")
    seen: list[float] = []
    commits: list[float] = []
    marker = f"{run}.lat".encode()

    def visible(m: Fired) -> None:  # cw-fired-at holds the stamp in microseconds here
        seen.append(m.received_ms - int(m.headers["cw-fired-at"]) / 1000)

    reader = Collector(settings, (topic,), keep_messages=False, from_end=True,
                       key_prefix=marker, on_fired=visible)
    await asyncio.gather(producer.start(), reader.start())
    sent = 0
    try:
        deadline = time.monotonic() + seconds
        value = orjson.dumps(payload("raw", 0))
        while time.monotonic() < deadline:
            stamp_us = time.time_ns() // 1000
            headers = encode_headers(marker.decode(), stamp_us // 1000, 1, DEFAULT_MAX_ATTEMPTS,
                                     DEFAULT_BACKOFF_MS, ())
            headers.append(("cw-fired-at", str(stamp_us).encode()))
            await producer.begin_transaction()
            for j in range(batch):
                await producer.send(topic, value, key=marker, partition=j % partitions,
                                    headers=headers)
            await producer.commit_transaction()
            commits.append(wall_ms() - stamp_us / 1000)
            sent += batch
            await asyncio.sleep(every_ms / 1000)
        end = time.monotonic() + 10
        while len(seen) < sent and time.monotonic() < end:
            await asyncio.sleep(0.05)
    finally:
        await asyncio.gather(producer.stop(), reader.stop(), return_exceptions=True)
    return {"transactions": len(commits), "batch": batch, "every_ms": every_ms,
            "messages": sent, "received": len(seen),
            "commit_ms": summarize(commits), "visible_ms": summarize(seen)}


async def probe_consume_rate(settings: Settings, topic: str, seconds: float) -> dict[str, Any]:
    """How fast the phases' read_committed probe (the same Collector and tally) reads fired-like
    messages: the ceiling of any receive-side rate it reports. Reads the topic from the start
    until it has been quiet for half a second, or `seconds` passed."""
    tally = LatenessTally()

    def observe(m: Fired) -> None:
        if "cw-occurrence" in m.headers:  # the state-like records carry none
            tally.observe(m.occurrence, m.scheduled_ms, m.received_ms, fired_ms=m.fired_ms,
                          group="raw")

    collector = Collector(settings, (topic,), keep_messages=False, on_fired=observe)
    await collector.start()
    try:
        t0 = time.monotonic()
        last_count, last_change = 0, t0
        while time.monotonic() - t0 < seconds and time.monotonic() - last_change < 0.5:
            await asyncio.sleep(0.01)
            collector.check_alive()
            if collector.received != last_count:
                last_count, last_change = collector.received, time.monotonic()
        elapsed = max(last_change - t0, 1e-3)
    finally:
        await collector.stop()
    return {"messages": last_count, "seconds": round(elapsed, 3),
            "msgs_per_s": last_count / elapsed}


def raw_cassandra_rate(settings: Settings, concurrency: int, seconds: float, run: str,
                       shards: int) -> dict[str, Any]:
    """Prepared inserts of `due` rows shaped like the node's, `concurrency` in flight, driven
    by the driver's own callbacks. Rows go to shard numbers no node owns and expire soon."""
    cluster, session = connect(settings)
    try:
        ks = settings.keyspace
        stmt = session.prepare(
            f"INSERT INTO {ks}.due (minute, shard, slot_ms, job_id, attempt, scheduled_ms, "
            f"version, topic, payload, headers, spec, max_attempts, backoff_ms) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?")
        base = int(wall_ms()) + 3_600_000
        body = orjson.dumps(payload("raw", 0))
        topic = settings.fired_topic
        lock = threading.Lock()
        slots = threading.Semaphore(concurrency)
        state = {"done": 0, "errors": 0}
        first_error: list[BaseException] = []

        def params(i: int) -> tuple[Any, ...]:
            slot = base + i
            return (slot - slot % 60_000, 100_000 + shards + i % shards, slot,
                    job_id(run, "raw", i), 1, slot, 1, topic, body, [], None, 5, 10_000, 600)

        def ok(_rows: object) -> None:
            with lock:
                state["done"] += 1
            slots.release()

        def err(exc: BaseException) -> None:
            with lock:
                state["errors"] += 1
                if not first_error:
                    first_error.append(exc)
            slots.release()

        def drive(deadline: float) -> int:
            i = 0
            while time.monotonic() < deadline:
                slots.acquire()
                f = session.execute_async(stmt, params(i))
                f.add_callbacks(ok, err)
                i += 1
            for _ in range(concurrency):  # wait for what is in flight
                slots.acquire()
            for _ in range(concurrency):
                slots.release()
            return i

        drive(time.monotonic() + 0.3)  # warm-up
        state.update(done=0, errors=0)
        t0 = time.monotonic()
        sent = drive(t0 + seconds)
        elapsed = time.monotonic() - t0
    finally:
        cluster.shutdown()
    if first_error:
        say(f"raw cassandra: {state['errors']} errors, first: {first_error[0]!r}")
    return {"concurrency": concurrency, "inserts": sent, "errors": state["errors"],
            "seconds": round(elapsed, 3), "inserts_per_s": state["done"] / elapsed}


def heapq_rate(n: int) -> dict[str, Any]:
    rng = random.Random(7)
    base = 1_800_000_000_000
    items = [(base + rng.randrange(3_600_000), i, f"job-{i}") for i in range(n)]
    heap: list[tuple[int, int, str]] = []
    gc.collect()
    t0 = time.perf_counter()
    push = heapq.heappush
    for it in items:
        push(heap, it)
    t1 = time.perf_counter()
    pop = heapq.heappop
    while heap:
        pop(heap)
    t2 = time.perf_counter()
    return {"n": n, "push_per_s": n / (t1 - t0), "pop_per_s": n / (t2 - t1)}


async def create_raw_topic(settings: Settings, name: str, partitions: int) -> None:
    admin = await open_admin(settings)
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)], timeout_ms=30000)
    finally:
        await admin.close()


async def measure_limits(cfg: Config, settings: Settings, run: str) -> dict[str, Any]:
    limits: dict[str, Any] = {"kafka_txn": [], "cassandra_insert": []}
    raw_topic = f"{settings.namespace}.rawbench"
    await create_raw_topic(settings, raw_topic, cfg.shards)
    for batch in cfg.raw_batches:
        for producers in (1, cfg.shards):
            say(f"limit: raw Kafka transactional produce, {producers} producer(s), "
                f"batch {batch}, {cfg.raw_s:.0f}s ...")
            r = await raw_kafka_rate(settings, raw_topic, cfg.shards, producers, batch,
                                     cfg.raw_s, run)
            say(f"  {fmt(r['msgs_per_s'])} msgs/s ({fmt(r['txn_ms'], 1)} ms per transaction)")
            limits["kafka_txn"].append(r)
    say(f"limit: transaction commit-to-visible latency (read_committed), {cfg.raw_s:.0f}s ...")
    vis = await raw_kafka_visibility(settings, raw_topic, cfg.shards, cfg.raw_s, run)
    limits["kafka_visibility"] = vis
    say(f"  commit p50 {fmt(vis['commit_ms']['p50'], 1)} p99 {fmt(vis['commit_ms']['p99'], 1)}"
        f" ms; visible p50 {fmt(vis['visible_ms']['p50'], 1)} p99 "
        f"{fmt(vis['visible_ms']['p99'], 1)} ms")
    say(f"limit: the probe's own read_committed consume rate, up to {cfg.raw_s:.0f}s ...")
    limits["probe_consume"] = await probe_consume_rate(settings, raw_topic, cfg.raw_s)
    say(f"  {fmt(limits['probe_consume']['msgs_per_s'])} msgs/s")
    # The node's per-shard ingest concurrency, and that of every shard at once.
    per_shard = node_ingest_concurrency(cfg.node_settings)
    for conc in sorted({per_shard, min(1024, per_shard * cfg.shards)}):
        say(f"limit: raw Cassandra prepared inserts of due rows, {conc} in flight, "
            f"{cfg.raw_s:.0f}s ...")
        r = await asyncio.to_thread(raw_cassandra_rate, settings, conc, cfg.raw_s, run,
                                    cfg.shards)
        say(f"  {fmt(r['inserts_per_s'])} inserts/s")
        limits["cassandra_insert"].append(r)
    say(f"limit: heapq push/pop of {cfg.heap_n:,} entries ...")
    limits["heapq"] = await asyncio.to_thread(heapq_rate, cfg.heap_n)
    say(f"  push {fmt(limits['heapq']['push_per_s'])}/s, pop {fmt(limits['heapq']['pop_per_s'])}/s")
    return limits


