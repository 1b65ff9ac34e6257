"""How long a takeover's claim and its state reads take, with the event loop idle or busy.

A takeover starts a transactional producer for the shard's claimer id and commits its claim
as one record alone in a transaction (`node/takeover.py`), while the node's loop is busy with
the shards it is taking over and those it still fires. This times, `--rounds` times each and
alternating: a claimer's start (InitProducerId and what precedes it) and one claim, through
`KafkaNodeBus.producer` (aiokafka, as takeovers did before) and `KafkaNodeBus.claimer`
(librdkafka), with the loop busy `--busy-ms` at every turn (0: idle) by a task that spins
and yields, as a loaded node's callbacks do.

    .venv/bin/python loadtest/bench/claim_bench.py --busy-ms 0
    .venv/bin/python loadtest/bench/claim_bench.py --busy-ms 20

`--reads` times a takeover's two state reads instead (`KafkaNodeBus.read_last`, the first one
read_committed, then the settled one), alternating a bus that has a reader kept from its last
read (a node's later takeovers) with a new bus, which starts one (a node's first takeover).

    .venv/bin/python loadtest/bench/claim_bench.py --reads --busy-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from chronowheel.bus.kafka_node import KafkaNodeBus
from chronowheel.core.wire import StateRecord, claimer_transactional_id
from chronowheel.node.takeover import commit_alone
from chronowheel.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chronowheel.testing import drop_namespace
from common import scratch_namespace


async def busy(ms: float) -> None:
    while True:
        began = time.perf_counter()
        while time.perf_counter() - began < ms / 1000:
            pass
        await asyncio.sleep(0)


async def claim_once(claimer: Any, settings: Settings, shard: int) -> tuple[float, float]:
    began = time.perf_counter()
    await claimer.start()
    started = time.perf_counter()
    await commit_alone(claimer, settings, StateRecord(shard=shard, watermark=1, owner="bench",
                                                      node="bench", claim=True))
    done = time.perf_counter()
    await claimer.stop()
    return (started - began) * 1000, (done - started) * 1000


async def read_once(bus: KafkaNodeBus, settings: Settings, key: bytes) -> tuple[float, float]:
    began = time.perf_counter()
    first = await bus.read_last(settings.state_topic, 0, key, 30_000)
    read = time.perf_counter()
    settled = await bus.read_last(settings.state_topic, 0, key, 30_000, settled=True)
    done = time.perf_counter()
    assert first is not None and first == settled
    return (read - began) * 1000, (done - read) * 1000


async def run_reads(args: argparse.Namespace, settings: Settings) -> None:
    kept = KafkaNodeBus(settings)
    claimer = kept.claimer(claimer_transactional_id(settings.namespace, 0), "bench")
    await claim_once(claimer, settings, 0)  # a record to read
    key = StateRecord.key(0)
    await read_once(kept, settings, key)  # the kept bus's reader started
    spinner = asyncio.create_task(busy(args.busy_ms)) if args.busy_ms > 0 else None
    times: dict[str, list[tuple[float, float]]] = {"reader kept": [], "reader started": []}
    try:
        for _ in range(args.rounds):
            times["reader kept"].append(await read_once(kept, settings, key))
            new = KafkaNodeBus(settings)
            try:
                times["reader started"].append(await read_once(new, settings, key))
            finally:
                await new.close()
    finally:
        if spinner is not None:
            spinner.cancel()
        await kept.close()
    for kind, runs in times.items():
        firsts, settleds = sorted(f for f, _ in runs), sorted(s for _, s in runs)
        print(f"loop busy {args.busy_ms:g} ms a turn, {kind}: first read median "
              f"{statistics.median(firsts):.0f} ms ({firsts[0]:.0f}-{firsts[-1]:.0f}), settled "
              f"read median {statistics.median(settleds):.0f} ms "
              f"({settleds[0]:.0f}-{settleds[-1]:.0f}), {len(runs)} rounds")


async def run(args: argparse.Namespace) -> None:
    settings = await scratch_namespace("cb")
    if args.reads:
        try:
            await run_reads(args, settings)
        finally:
            await drop_namespace(settings)
        return
    bus = KafkaNodeBus(settings)
    spinner = asyncio.create_task(busy(args.busy_ms)) if args.busy_ms > 0 else None
    kinds = {"aiokafka": bus.producer, "librdkafka": bus.claimer}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    try:
        for _ in range(args.rounds):
            for kind, make in kinds.items():
                claimer = make(claimer_transactional_id(settings.namespace, 0),
                               f"{settings.namespace}-nodes")
                times[kind].append(await claim_once(claimer, settings, 0))
    finally:
        if spinner is not None:
            spinner.cancel()
        await bus.close()
        await drop_namespace(settings)
    for kind, runs in times.items():
        starts, claims = sorted(s for s, _ in runs), sorted(c for _, c in runs)
        print(f"loop busy {args.busy_ms:g} ms a turn, {kind}: start median "
              f"{statistics.median(starts):.0f} ms ({starts[0]:.0f}-{starts[-1]:.0f}), claim "
              f"median {statistics.median(claims):.0f} ms ({claims[0]:.0f}-{claims[-1]:.0f}), "
              f"{len(runs)} rounds; starts over 5x the median: "
              f"{sum(s > 5 * statistics.median(starts) for s in starts)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--busy-ms", type=float, default=0,
                   help="keep the event loop busy this long at every turn (0: idle)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--reads", action="store_true",
                   help="time a takeover's two state reads instead of a claim")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
