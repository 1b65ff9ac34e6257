"""Run `python -m chronowheel ...` with timestamps taken at each stage of an occurrence's way
from the wheel to the handler, for `trace_latency.py`. Nothing of this is in the package: the
probes wrap a few methods of the running process from the outside, so the code measured is the
code shipped (plus a few microseconds per occurrence for the probes themselves).

    python loadtest/bench/trace_shim.py PYTHON -m chronowheel node ...
    python loadtest/bench/trace_shim.py PYTHON -m chronowheel worker ...

(the form `NodeProcess.args_prefix` gives: the shim, then the command it wraps.) The stages go
to CHRONOWHEEL_TRACE_OUT as CSV lines, wall-clock milliseconds:

node, one line per fired occurrence when its transaction is over:
    `node,job_id,scheduled,take,hand,queued,begin,begun,sent,offsets,offsets_done,acked,
    endtxn,committed,done,txn_seq,txn_parts,txn_offsets`
  take: dispatch took it out of the wheel; hand: its shard's publisher began its part;
  queued: the part was queued for the node transaction; begin .. done: that transaction's
  BeginTxn, batches handed to the producer, AddOffsetsToTxn/TxnOffsetCommit (empty when the
  transaction carried no submit offsets), every batch acknowledged, EndTxn sent and answered,
  the coordinator done with it.
  `retry,handler,backoff_ms,t` when the broker answered a transactional request of the node's
  producer with a retriable error (CONCURRENT_TRANSACTIONS, mostly) and it is asked again.
  `txn,seq,parts,offsets,messages,begin=t,...,done=t` for every node transaction, whether
  a traced occurrence is in it or not (an ingest step's offsets alone, say): its parts, how
  many carried submit offsets, its messages, and the stamps above that it reached.
  With CHRONOWHEEL_TRACE_APPLIED=TEXT also `applied,job_id,t` when a command's change reached
  its shard's wheel, for jobs whose id contains TEXT (`urgent_bench.py --trace`).
worker: `fetch,job_id,t` when the consumer's fetch returned the record, `slot,job_id,t` when
  a handler slot took it.
  `marks,n,rows,t` for each round of outcome marks written (idempotency on): its marks and
  rows (a row per partition).
both: `gc,generation,start,ms` for each garbage collection of STALL_MS or more, and
  `stall,start,ms` when the event loop came back STALL_MS or more late to a 1 ms timer (the
  loop was blocked: a long callback, a collection, the GIL held by another thread).
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from collections.abc import Callable
from typing import Any

STALL_MS = 5.0


def wall_ms() -> float:
    return time.time_ns() / 1e6


class Out:
    def __init__(self, path: str) -> None:
        # Line-buffered appends: a killed process loses at most its last line.
        self._f = open(path, "a", buffering=1 << 16)  # noqa: SIM115 - lives as the process
        self._n = 0

    def write(self, line: str) -> None:
        self._f.write(line)
        self._n += 1
        if self._n % 256 == 0:
            self._f.flush()

    def flush(self) -> None:
        self._f.flush()


def _wrap_async(cls: Any, name: str, before: Callable[..., Any] | None = None,
                after: Callable[..., Any] | None = None) -> None:
    orig = getattr(cls, name)

    async def wrapper(self: Any, *args: Any, **kw: Any) -> Any:
        if before is not None:
            before(self, *args, **kw)
        result = await orig(self, *args, **kw)
        if after is not None:
            after(self, result, *args, **kw)
        return result

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    setattr(cls, name, wrapper)


def install_node(out: Out) -> None:
    from chronowheel.bus import kafka as bus_kafka
    from chronowheel.bus import kafka_node
    from chronowheel.node import dispatch, publisher, transactions

    take: dict[int, float] = {}      # shard -> when its last step took entries
    queued: dict[int, float] = {}    # shard -> when its part was queued
    txn_of: dict[int, dict[str, Any]] = {}  # shard -> the transaction its part is in
    current: dict[str, Any] = {}     # the transaction being run (one at a time)
    seq = [0]

    def stamp(key: str) -> Callable[..., None]:
        def f(*_a: Any, **_k: Any) -> None:
            if current:
                current.setdefault(key, wall_ms())
        return f

    _wrap_async(dispatch.Dispatcher, "_take_due",
                before=lambda self, *a, **k: take.__setitem__(self.shard, wall_ms()))
    _wrap_async(transactions.NodeTransactions, "commit",
                before=lambda self, shard, *a, **k: queued.__setitem__(shard, wall_ms()))

    orig_txn = transactions.NodeTransactions._transaction

    async def _transaction(self: Any, parts: list[Any]) -> None:
        seq[0] += 1
        current.clear()
        current.update(seq=seq[0], begin=wall_ms(), parts=len(parts),
                       offsets=sum(1 for p in parts if p.submit_offset is not None))
        for p in parts:
            txn_of[p.shard] = current
        try:
            await orig_txn(self, parts)
        finally:
            current["done"] = wall_ms()
            snapshot = dict(current)
            # Every transaction, with or without an occurrence of the trace in it:
            # `txn,seq,parts,offsets,messages` then its stage stamps (`key=ms`).
            out.write(f"txn,{snapshot['seq']},{snapshot['parts']},{snapshot['offsets']},"
                      f"{sum(p.messages for p in parts)},"
                      + ",".join(f"{k}={v:.3f}" for k, v in snapshot.items()
                                 if isinstance(v, float)) + "\n")
            for p in parts:
                txn_of[p.shard] = snapshot
            current.clear()

    transactions.NodeTransactions._transaction = _transaction  # type: ignore[method-assign]
    _wrap_async(kafka_node.KafkaTxnProducer, "begin", after=stamp("begun"))
    _wrap_async(kafka_node.KafkaTransaction, "send", after=lambda *a, **k: current.__setitem__(
        "sent", wall_ms()) if current else None)
    _wrap_async(bus_kafka.Producer, "send_offsets_to_transaction", before=stamp("offsets"),
                after=stamp("offsets_done"))
    _wrap_async(kafka_node.KafkaTransaction, "_check_sent", after=stamp("acked"))
    _wrap_async(bus_kafka.Producer, "commit_transaction", before=stamp("endtxn"),
                after=stamp("committed"))

    # Transactional requests the broker answered with a retriable error (CONCURRENT_TRANSACTIONS
    # while it still writes the previous transaction's markers, mostly): asked again after
    # the backoff the handler returned.
    from aiokafka.producer import sender as aiokafka_sender

    for name in ("AddPartitionsToTxnHandler", "AddOffsetsToTxnHandler",
                 "TxnOffsetCommitHandler", "EndTxnHandler"):
        handler = getattr(aiokafka_sender, name)

        def handle_response(self: Any, resp: Any, _orig: Any = handler.handle_response,
                            _name: str = name) -> Any:
            backoff = _orig(self, resp)
            if backoff is not None:
                out.write(f"retry,{_name},{backoff * 1000:.1f},{wall_ms():.3f}\n")
            return backoff

        handler.handle_response = handle_response

    match = os.environ.get("CHRONOWHEEL_TRACE_APPLIED")
    if match:  # when a command's job entered (or left) its shard's wheel: `applied,job,t`
        from chronowheel.node import state as node_state

        orig_apply = node_state.ShardState.apply_job_change

        def apply_job_change(self: Any, job_id: str, old_key: Any, new: Any) -> None:
            orig_apply(self, job_id, old_key, new)
            if match in job_id:
                out.write(f"applied,{job_id},{wall_ms():.3f}\n")

        node_state.ShardState.apply_job_change = apply_job_change  # type: ignore[method-assign]

    orig_commit = publisher.Publisher.commit

    async def commit(self: Any, fired: list[Any], *, release: bool = False) -> None:
        hand = wall_ms()
        taken = take.get(self.shard, hand)
        await orig_commit(self, fired, release=release)
        if not fired:
            return
        t = txn_of.get(self.shard, {})
        q = queued.get(self.shard, hand)

        def g(k: str) -> str:
            v = t.get(k)
            return "" if v is None else f"{v:.3f}"

        tail = (f"{g('begin')},{g('begun')},{g('sent')},{g('offsets')},{g('offsets_done')},"
                f"{g('acked')},{g('endtxn')},{g('committed')},{g('done')},{t.get('seq', '')},"
                f"{t.get('parts', '')},{t.get('offsets', '')}\n")
        for p in fired:
            out.write(f"node,{p.job_id},{p.scheduled_ms},{taken:.3f},{hand:.3f},{q:.3f},{tail}")

    publisher.Publisher.commit = commit  # type: ignore[method-assign]


def install_worker(out: Out) -> None:
    from chronowheel.bus import kafka_worker
    from chronowheel.worker import intake


    def fetched(_self: Any, batches: dict[Any, list[Any]], *_a: Any, **_k: Any) -> None:
        if not batches:
            return
        t = wall_ms()
        for records in batches.values():
            for r in records:
                out.write(f"fetch,{(r.key or b'').decode()},{t:.3f}\n")

    _wrap_async(kafka_worker.KafkaWorkerConsumer, "fetch", after=fetched)

    def slot(_self: Any, item: Any) -> None:
        if item is not None:
            out.write(f"slot,{(item.record.key or b'').decode()},{wall_ms():.3f}\n")

    _wrap_async(intake.Intake, "next", after=slot)

    from chronowheel.store import cassandra_marks

    def marks(_self: Any, _scope: str, rows: list[Any], *_a: Any, **_k: Any) -> None:
        out.write(f"marks,{sum(len(r.marks) for r in rows)},{len(rows)},{wall_ms():.3f}\n")

    _wrap_async(cassandra_marks.CassandraMarks, "write_marks", before=marks)


def install_common(out: Out) -> None:
    import asyncio
    import gc

    started: dict[int, float] = {}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        gen = info.get("generation", -1)
        if phase == "start":
            started[gen] = wall_ms()
            return
        t0 = started.pop(gen, None)
        if t0 is not None and (took := wall_ms() - t0) >= STALL_MS:
            out.write(f"gc,{gen},{t0:.3f},{took:.3f}\n")

    gc.callbacks.append(on_gc)

    async def watch_loop() -> None:
        while True:
            t0 = wall_ms()
            await asyncio.sleep(0.001)
            late = wall_ms() - t0 - 1.0
            if late >= STALL_MS:
                out.write(f"stall,{t0:.3f},{late:.3f}\n")

    orig_run = asyncio.run

    def run(main: Any, **kw: Any) -> Any:
        async def with_watch() -> Any:
            watcher = asyncio.ensure_future(watch_loop())
            try:
                return await main
            finally:
                watcher.cancel()
        return orig_run(with_watch(), **kw)

    asyncio.run = run  # type: ignore[assignment]


def main() -> None:
    # argv: [shim, PYTHON, -m, chronowheel, COMMAND, ...]
    args = sys.argv[1:]
    if len(args) < 4 or args[1:3] != ["-m", "chronowheel"]:
        raise SystemExit("usage: trace_shim.py PYTHON -m chronowheel COMMAND [ARGS...]")
    rest = args[3:]
    out = Out(os.environ["CHRONOWHEEL_TRACE_OUT"])
    install_common(out)
    if rest[0] == "node":
        install_node(out)
    elif rest[0] == "worker":
        install_worker(out)
    import atexit
    atexit.register(out.flush)
    sys.argv = ["chronowheel", *rest]
    runpy.run_module("chronowheel", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
