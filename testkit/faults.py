"""Faults for chaos tests and failover measurements: node processes paused and resumed (a
`testkit.fleet.Fleet` starts, kills and restarts them), a TCP proxy whose connections can be
cut and restored, a node in a network namespace of its own, a stepped clock, a held event loop,
a full disk, a run of jobs submitted and checked (lost, early, duplicate, lateness) and the
takeover phases a node logs.

Everything here works against whatever Cassandra and Kafka the settings name: the single-node
local stack or a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from chronowheel.bus.kafka import plain_producer
from chronowheel.core.model import encode_upsert
from chronowheel.core.shard import shard_of
from chronowheel.settings import Settings
from chronowheel.testing.collect import Collector, Fired, wall_ms
from chronowheel.testing.lateness import percentile
from chronowheel.testing.node_process import NodeProcess

from testkit import REPO
from testkit.verdict import Verdict

# --- node processes (testkit.fleet.Fleet runs them) -------------------------------------


def pause(node: NodeProcess) -> None:
    node.signal(signal.SIGSTOP)


def resume(node: NodeProcess) -> None:
    node.signal(signal.SIGCONT)


# --- a TCP proxy -----------------------------------------------------------------------------


class TcpProxy:
    """Forwards connections made to it (on 127.0.0.1:<port>, or on a unix socket) to a TCP
    server. `cut()` resets every open connection and refuses new ones (a network partition as
    the client sees it); `restore()` accepts again."""

    def __init__(self, target_host: str, target_port: int, *, unix_path: Path | None = None,
                 listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.unix_path = unix_path
        self._listen_port = listen_port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._conns: set[asyncio.Task[None]] = set()
        self.is_cut = False
        self.connections = 0

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> TcpProxy:
        if self.unix_path is not None:
            self._server = await asyncio.start_unix_server(self._accept, str(self.unix_path))
        else:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1",
                                                      self._listen_port)
        return self

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    def cut(self) -> None:
        self.is_cut = True
        for w in list(self._writers):
            w.transport.abort()  # a reset, not a polite close
        self._writers.clear()

    def restore(self) -> None:
        self.is_cut = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            if self.is_cut:
                writer.transport.abort()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                writer.transport.abort()
                return
            self.connections += 1
            await splice(reader, writer, up_reader, up_writer, self._writers)
        finally:
            self._conns.discard(task)


async def splice(a_reader: asyncio.StreamReader, a_writer: asyncio.StreamWriter,
                 b_reader: asyncio.StreamReader, b_writer: asyncio.StreamWriter,
                 registry: set[asyncio.StreamWriter] | None = None) -> None:
    """Copy both ways until either side ends; then reset both."""
    writers = {a_writer, b_writer}
    if registry is not None:
        registry |= writers
    both = [asyncio.ensure_future(_pipe(a_reader, b_writer)),
            asyncio.ensure_future(_pipe(b_reader, a_writer))]
    try:
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in both:
            t.cancel()
        for w in writers:
            w.transport.abort()
            if registry is not None:
                registry.discard(w)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()


# --- a node in a network namespace of its own ------------------------------------------------
#
# Kafka clients connect to the addresses the brokers advertise, not to the bootstrap address,
# so a proxy on another port would be bypassed. Instead the node runs in a network namespace of
# its own (`unshare --net`), where nothing but a relay listens: on the very host:port of each
# server, forwarding through a unix socket (those cross namespaces) to a TcpProxy outside. The
# node sees the usual addresses; the test cuts and restores each server's proxy. The node's
# HTTP endpoint is relayed out the same way.


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    return host.strip("[]"), int(port)


class IsolatedNode(NodeProcess):
    """A node process in its own network namespace: it reaches Cassandra and Kafka only through
    `proxies` (one per server address of the settings), and its /healthz and /metrics through
    a forwarder here. Needs `unshare` and the right to create a network namespace."""

    HTTP_PORT = 8080  # inside the namespace nothing else listens

    def __init__(self, settings: Settings, log_path: Path, sockets: Path, *, name: str,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        super().__init__(settings, log_path, name=name, env=env, cwd=cwd)
        self.sockets = sockets
        servers = [*settings.cassandra.split(","), *settings.kafka.split(",")]
        self.addresses = [_host_port(a) for a in servers if a.strip()]
        self.proxies: dict[str, TcpProxy] = {}
        self._http: asyncio.Server | None = None

    def proxy_for(self, what: str) -> list[TcpProxy]:
        """The proxies of "cassandra" or "kafka"."""
        wanted = getattr(self.settings, what).split(",")
        return [self.proxies[f"{h}:{p}"] for h, p in map(_host_port, wanted)]

    async def open(self) -> None:
        self.sockets.mkdir(parents=True, exist_ok=True)
        for host, port in self.addresses:
            key = f"{host}:{port}"
            if key not in self.proxies:
                self.proxies[key] = await TcpProxy(
                    host, port, unix_path=self.sockets / f"{host}_{port}.sock").start()
        http_sock = self.sockets / "http.sock"

        async def to_node(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                r, w = await asyncio.open_unix_connection(str(http_sock))
            except OSError:
                writer.transport.abort()
                return
            await splice(reader, writer, r, w)

        self._http = await asyncio.start_server(to_node, "127.0.0.1", 0)

    async def close(self) -> None:
        for p in self.proxies.values():
            await p.stop()
        if self._http is not None:
            self._http.close()

    def http_port(self) -> int | None:
        if self._http is None or super().http_port() is None:
            return None  # not listening inside yet
        return int(self._http.sockets[0].getsockname()[1])

    def start(self, **env_overrides: str) -> None:
        forwards = [f"{h}:{p}={self.sockets / f'{h}_{p}.sock'}" for h, p in self.addresses]
        wrapper = ["unshare", "--net", sys.executable, "-m", "testkit.faults",
                   *(a for f in forwards for a in ("--forward", f)),
                   "--expose", f"127.0.0.1:{self.HTTP_PORT}={self.sockets / 'http.sock'}",
                   "--"]
        self.args_prefix = wrapper
        # The wrapper is this module: the checkout's root goes on its path.
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        env_overrides.setdefault("PYTHONPATH", path)
        super().start(CHRONOWHEEL_HTTP_PORT=str(self.HTTP_PORT), **env_overrides)


async def _relay_main(forwards: list[str], exposes: list[str], parent: int) -> None:
    """Inside the namespace: listen on each server address, forward to its unix socket; listen
    on each exposed unix socket, forward to the address inside. Ends with `parent`."""
    async def to_unix(path: str, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        try:
            r, w = await asyncio.open_unix_connection(path)
        except OSError:
            writer.transport.abort()
            return
        await splice(reader, writer, r, w)

    async def to_tcp(host: str, port: int, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            r, w = await asyncio.open_connection(host, port)
        except OSError:
            writer.transport.abort()
            return
        await splice(reader, writer, r, w)

    servers = []
    for spec in forwards:
        address, _, path = spec.partition("=")
        host, port = _host_port(address)
        servers.append(await asyncio.start_server(
            functools.partial(to_unix, path), host, port))
    for spec in exposes:
        address, _, path = spec.partition("=")
        host, port = _host_port(address)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        servers.append(await asyncio.start_unix_server(
            functools.partial(to_tcp, host, port), path))
    while os.getppid() == parent:
        await asyncio.sleep(0.5)


def _isolate(argv: list[str]) -> None:
    """`python -m testkit.faults --forward H:P=SOCK... --expose H:P=SOCK... --
    COMMAND...`, run by `unshare --net`: bring up loopback, fork the relay, exec COMMAND (so
    the process keeps its pid: signals reach the node itself)."""
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    forwards = [options[i + 1] for i, a in enumerate(options) if a == "--forward"]
    exposes = [options[i + 1] for i, a in enumerate(options) if a == "--expose"]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    me = os.getpid()
    if os.fork() == 0:
        try:
            asyncio.run(_relay_main(forwards, exposes, me))
        finally:
            os._exit(0)
    time.sleep(0.3)  # the relay listens before the node connects
    os.execvp(command[0], command)


# --- a clock that steps ----------------------------------------------------------------------


class SteppingClock:
    """The system clock plus an offset a test steps forward or back (an NTP step, a resumed
    VM, `date -s`), for a node run in-process; its monotonic time never steps."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms

    def elapsed_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    async def sleep_until(self, deadline_ms: int) -> None:
        delay = (deadline_ms - self.now_ms()) / 1000
        if delay > 0:
            await asyncio.sleep(delay)

    def step(self, delta_ms: int) -> None:
        self.offset_ms += delta_ms


# --- a busy or hung event loop ----------------------------------------------------------------


def hold_event_loop(seconds: float, *, busy: bool) -> asyncio.Handle:
    """Hold the running event loop for `seconds` from its next iteration, for an in-process
    node: `busy` spins on the CPU (a herd being fired, a large page decoded: other threads
    still get the interpreter between switches), otherwise it sleeps (a hung loop: a blocking
    call that does not return). Everything else on that loop waits as long."""

    def hold() -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if not busy:
                time.sleep(left)

    return asyncio.get_running_loop().call_soon(hold)


# --- a full disk, as the store and the bus report it ----------------------------------------
#
# The shared servers' data cannot be moved onto a small filesystem without restarting them, and
# filling the disk they share with everything else would harm more than the test. So the errors
# a full disk produces are raised where the node meets them: at the project's store and bus
# interfaces, wrapped around the real ones (every other call reaches the real servers).

STORE_WRITES = frozenset({"put_job", "put_due", "put_due_and_job", "put_dues_and_jobs",
                          "retire_due", "add_bucket_count", "add_bucket_counts"})


class FullDiskStore:
    """A JobStore whose writes fail, while `full`, as Cassandra's do when a replica cannot
    write its commit log or sstables: WriteFailure (the coordinator got a failure, not a
    timeout). Reads still work, as they do on a full disk."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.full = False
        self.refused = 0

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.inner, name)
        if name not in STORE_WRITES:
            return attr

        async def write(*args: object, **kw: object) -> object:
            if self.full:
                from cassandra import ConsistencyLevel, WriteFailure

                self.refused += 1
                raise WriteFailure(
                    "Operation failed - received 0 responses and 1 failures: "
                    "FSWriteError (No space left on device)",
                    consistency=ConsistencyLevel.LOCAL_QUORUM, required_responses=1,
                    received_responses=0, failures=1)
            return await attr(*args, **kw)

        return write


class FullDiskBus:
    """A NodeBus whose transactions fail to commit, while `full`, as they do when a broker's
    log directory is full: the produce is refused (KafkaStorageError, or NOT_ENOUGH_REPLICAS
    when the replicas that hold the data went offline). The transaction is aborted first, so
    nothing of it becomes visible, as with the real failure."""

    def __init__(self, inner: object, error: str = "storage") -> None:
        self.inner = inner
        self.full = False
        self.error = error
        self.refused = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def producer(self, transactional_id: str, group_id: str) -> object:
        return _FullDiskProducer(self, self.inner.producer(  # type: ignore[attr-defined]
            transactional_id, group_id))

    def _refusal(self) -> BaseException:
        from aiokafka.errors import KafkaStorageError, NotEnoughReplicasError
        from chronowheel.bus.ports import BusError

        self.refused += 1
        exc = KafkaStorageError() if self.error == "storage" else NotEnoughReplicasError()
        return BusError(f"committing a transaction: {exc!r}")


class _FullDiskProducer:
    def __init__(self, bus: FullDiskBus, inner: object) -> None:
        self._bus = bus
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def begin(self) -> object:
        return _FullDiskTransaction(self._bus, await self._inner.begin())  # type: ignore[attr-defined]


class _FullDiskTransaction:
    def __init__(self, bus: FullDiskBus, inner: object) -> None:
        self._bus = bus
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def commit(self, submit_offsets: Mapping[int, int]) -> None:
        if self._bus.full:
            await self._inner.abort()  # type: ignore[attr-defined]
            raise self._bus._refusal()
        await self._inner.commit(submit_offsets)  # type: ignore[attr-defined]


# --- a run of jobs ---------------------------------------------------------------------------


@dataclass(kw_only=True)
class Outcome(Verdict):
    """What a read_committed reader saw of the jobs of a run; occurrences of no job of the run
    (`unexpected`) make it unclean too."""

    expected: int
    unexpected: int = 0
    lateness_ms: list[float] = field(default_factory=list)
    """per expected occurrence seen: cw-fired-at minus the scheduled instant"""

    def problems(self) -> list[str]:
        out = super().problems()
        if self.unexpected:
            out.append(f"{self.unexpected} occurrences of no job of the run")
        return out

    def p(self, q: float) -> float | None:
        return percentile(sorted(self.lateness_ms), q)

    @property
    def max_ms(self) -> float | None:
        return max(self.lateness_ms) if self.lateness_ms else None

    def summary(self) -> str:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.0f}"
        return (f"{self.expected} expected: lost {self.lost}, early {self.early}, duplicates "
                f"{self.duplicates}, unexpected {self.unexpected}; lateness p50 "
                f"{ms(self.p(50))} p99 {ms(self.p(99))} max {ms(self.max_ms)} ms")


def occurrence(job_id: str, at_ms: int) -> str:
    return f"{job_id}@{at_ms}"


async def submit_jobs(settings: Settings, jobs: Mapping[str, int]) -> None:
    """One-shot jobs (id -> due ms) sent to <ns>.submit by a stock producer."""
    producer = plain_producer(settings, linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(settings.submit_topic, encode_upsert(
            {"id": job_id, "at": at, "payload": {"n": i}}), key=job_id.encode())
            for i, (job_id, at) in enumerate(jobs.items())]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def judge(messages: Iterable[Fired], jobs: Mapping[str, int]) -> Outcome:
    """Lost, early (by cw-fired-at, record timestamp or arrival here), duplicate and lateness
    (cw-fired-at) of `jobs` among `messages`; messages of other occurrences count as
    unexpected."""
    expected = {occurrence(j, at) for j, at in jobs.items()}
    counts: Counter[str] = Counter()
    early = 0
    lateness: list[float] = []
    for m in messages:
        occ = m.occurrence
        counts[occ] += 1
        if min(m.fired_ms, m.timestamp_ms, m.received_ms) < m.scheduled_ms:
            early += 1
        if counts[occ] == 1 and occ in expected:
            lateness.append(float(m.fired_ms - m.scheduled_ms))
    return Outcome(expected=len(expected), lost=len(expected - counts.keys()), early=early,
                   duplicates=sum(c - 1 for c in counts.values()),
                   unexpected=len(counts.keys() - expected), lateness_ms=lateness)


def shards_of(jobs: Iterable[str], shards: int) -> Counter[int]:
    return Counter(shard_of(j, shards) for j in jobs)


def first_fire_after(messages: Iterable[Fired], partitions: Iterable[int],
                     after_ms: float) -> dict[int, float]:
    """Per partition, the earliest cw-fired-at after `after_ms` (partitions with none left
    out)."""
    wanted = set(partitions)
    first: dict[int, float] = {}
    for m in messages:
        if m.partition in wanted and m.fired_ms > after_ms:
            prev = first.get(m.partition)
            if prev is None or m.fired_ms < prev:
                first[m.partition] = float(m.fired_ms)
    return first


class Tally(Collector):
    """A Collector of <ns>.fired (read_committed) that keeps every message."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, (settings.fired_topic,))

    def seen(self) -> int:
        return len({m.occurrence for m in self.messages})


# --- takeover phases from a node's log -------------------------------------------------------

_LINE_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_ASSIGNED = re.compile(r"group assigned shards \[([\d, ]*)\]")
_CLAIMED = re.compile(r"shard (\d+): claimed by .* in (\d+) ms \(([^)]*)\)")
_TAKEN = re.compile(r"shard (\d+): taken over")


def line_ms(line: str) -> float | None:
    """The wall-clock ms of a text-format log line (its asctime is local time)."""
    m = _LINE_TIME.match(line)
    if m is None:
        return None
    return dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000


@dataclass
class TakeoverLog:
    """What a node logged about taking over `shards` after `since_ms`."""

    assigned_ms: float | None = None
    """first group assignment naming one of the shards"""
    claimed: dict[int, tuple[float, dict[str, int]]] = field(default_factory=dict)
    """shard -> (when, the phases of its claim in ms)"""
    taken_ms: dict[int, float] = field(default_factory=dict)


def takeover_log(text: str, shards: Iterable[int], since_ms: float) -> TakeoverLog:
    wanted = set(shards)
    out = TakeoverLog()
    for line in text.splitlines():
        at = line_ms(line)
        if at is None or at < since_ms:
            continue
        if (m := _ASSIGNED.search(line)) and out.assigned_ms is None:
            got = {int(x) for x in m.group(1).replace(" ", "").split(",") if x}
            if got & wanted:
                out.assigned_ms = at
        elif (m := _CLAIMED.search(line)) and int(m.group(1)) in wanted:
            phases = {}
            for part in m.group(3).split(", "):
                name, _, value = part.rpartition(" ")
                phases[name] = int(value)
            out.claimed.setdefault(int(m.group(1)), (at, phases))
        elif (m := _TAKEN.search(line)) and int(m.group(1)) in wanted:
            out.taken_ms.setdefault(int(m.group(1)), at)
    return out


def now_ms() -> float:
    return wall_ms()


if __name__ == "__main__":
    _isolate(sys.argv[1:])
