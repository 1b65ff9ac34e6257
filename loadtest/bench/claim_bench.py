"""How long a takeover's claim takes on aiokafka and on librdkafka, with the event loop idle or
busy.

A takeover starts a transactional producer for the shard's claimer id and commits its claim
as one record alone in a transaction (`node/takeover.py`), while the node's loop is busy with
the shards it is taking over and those it still fires. This times, `--rounds` times each and
alternating: a claimer's start (InitProducerId and what precedes it) and one claim, through
`KafkaNodeBus.producer` (aiokafka, as takeovers did before) and `KafkaNodeBus.claimer`
(librdkafka), with the loop busy `--busy-ms` at every turn (0: idle) by a task that spins
and yields, as a loaded node's callbacks do.

    .venv/bin/python loadtest/bench/claim_bench.py --busy-ms 0
    .venv/bin/python loadtest/bench/claim_bench.py --busy-ms 20
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


async def run(args: argparse.Namespace) -> None:
    settings = await scratch_namespace("cb")
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
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
