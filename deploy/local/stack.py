#!/usr/bin/env python3
"""The local stack: a real Apache Cassandra and a real Apache Kafka on 127.0.0.1.

Both servers run from pinned Maven Central artifacts (cassandra/pom.xml, kafka/pom.xml beside
this file) on the machine's Java 17, with 2 GiB of heap for Cassandra and 1 GiB for Kafka.
Nothing is mocked.

    stack.py install                 resolve the Maven artifacts (no server is started)
    stack.py up [SERVER...]          start what is not running, wait until it answers
    stack.py down [SERVER...]        stop gracefully (SIGTERM), kill after a grace period
    stack.py status                  exit 0 when every server answers, 3 otherwise
    stack.py logs [SERVER] [-n N] [-f]

SERVER is `cassandra` or `kafka` (default: both). `up` and `down` are idempotent. Data and
logs live under one state folder ($CHRONOWHEEL_STATE_DIR, default ~/.cache/chronowheel/stack);
the Maven repository, resolved classpaths and each server kind's class-data sharing archive (a
faster JVM start, written at the first graceful stop; CHRONOWHEEL_STACK_CDS=0 for none) under
$CHRONOWHEEL_CACHE_DIR (default ~/.cache/chronowheel).

`--profile secured` (or CHRONOWHEEL_STACK_PROFILE=secured) runs a second, secured pair beside
the plain one, on other ports and in its own state folder (default: the plain one's name +
`-secured`): Kafka on 127.0.0.1:9094 with SASL_SSL only (SCRAM users admin, node, worker,
submitter; StandardAuthorizer, so nothing is allowed without an ACL) and Cassandra on
127.0.0.1:9142 with client TLS and PasswordAuthenticator (roles admin, node, worker, ops). A
throwaway CA, the servers' certificate and random passwords are made at the first start under
`<state>/secrets/` (see secured.py); `up --json` names the files.

Progress goes to stderr; `--json` puts a machine-readable summary on stdout. The readiness
checks use the project's drivers (cassandra-driver, aiokafka), so run this with the project's
virtualenv Python.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.1"
CQL_PORT = 9042
CASSANDRA_STORAGE_PORT = 7000
KAFKA_PORT = 9092
KAFKA_CONTROLLER_PORT = 9093
HEAP = os.environ.get("CHRONOWHEEL_STACK_HEAP", "1g")  # Kafka's heap
# Cassandra gets more: a test run creates a keyspace of five tables per test, and under load
# 1 GiB ran out (OutOfMemoryError) once a few hundred tables existed.
CASSANDRA_HEAP = os.environ.get("CHRONOWHEEL_CASSANDRA_HEAP", "2g")
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
DEFAULT_TIMEOUT_S = 180.0
STOP_GRACE_S = 45.0
SECURED_CQL_PORT = 9142
SECURED_CASSANDRA_STORAGE_PORT = 7100
SECURED_KAFKA_PORT = 9094
SECURED_KAFKA_CONTROLLER_PORT = 9095
SECURED_KAFKA_MTLS_PORT = 9096  # SSL with a required client certificate
# The secured pair holds a few test keyspaces only: smaller heaps leave room for the plain one.
SECURED_HEAP = os.environ.get("CHRONOWHEEL_SECURED_STACK_HEAP", "512m")
SECURED_CASSANDRA_HEAP = os.environ.get("CHRONOWHEEL_SECURED_CASSANDRA_HEAP", "1g")
# The cluster profile: three Cassandra nodes and three Kafka nodes beside the plain pair.
# Cassandra node i listens on loopback alias 127.0.0.(i+1) with the standard ports (the plain
# node holds 127.0.0.1:9042 and :7000), so the driver finds the peers on the port it was given.
# Kafka node i (broker and KRaft controller in one JVM) listens on 127.0.0.1:9191+i, its
# controller on 9291+i.
CLUSTER_NODES = 3
CLUSTER_CASSANDRA_HOSTS = tuple(f"127.0.0.{i + 2}" for i in range(CLUSTER_NODES))
CLUSTER_KAFKA_PORT = 9192
CLUSTER_KAFKA_CONTROLLER_PORT = 9292
# Sized so that the six JVMs stay under about 7 GiB of RSS on a 24 GiB, 2-core machine.
CLUSTER_HEAP = os.environ.get("CHRONOWHEEL_CLUSTER_STACK_HEAP", "512m")
CLUSTER_CASSANDRA_HEAP = os.environ.get("CHRONOWHEEL_CLUSTER_CASSANDRA_HEAP", "1g")
# Timer slack for Cassandra's threads, in microseconds (Linux only; 0 keeps the kernel's 50 µs).
# Cassandra's request threads (its shared executor pool) do not park when their work is done:
# for about 10 ms they sleep in steps of 10 µs to 1 ms in case more comes, each step a timer.
# With the default slack an even trickle of requests keeps them waking thousands of times a
# second: 10 single-row writes a second cost Cassandra 0.08 cores of this two-core
# machine and 50 a second 0.29, against 0.02 and 0.04 with 1 ms of slack, which lets the kernel
# fold those wake-ups together (loadtest/RESULTS.md, "Cassandra's idle spin"). A request that
# arrives while only a spinner is awake may wait up to the slack for it.
CASSANDRA_TIMER_SLACK_ENV = "CHRONOWHEEL_CASSANDRA_TIMER_SLACK_US"
CASSANDRA_TIMER_SLACK_US_DEFAULT = 1000
# Sets the timer slack of the process's one thread (every thread the JVM starts inherits it),
# then becomes the server in the same process, so the pid file and the marker check hold.
# PR_SET_TIMERSLACK is 29; a refusal leaves the default slack and still starts the server.
EXEC_WITH_TIMER_SLACK = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(29, ctypes.c_ulong(int(sys.argv[1])), 0, 0, 0)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def cassandra_timer_slack_us() -> int:
    """The timer slack for Cassandra's threads, from CHRONOWHEEL_CASSANDRA_TIMER_SLACK_US."""
    raw = os.environ.get(CASSANDRA_TIMER_SLACK_ENV, "").strip()
    if not raw:
        return CASSANDRA_TIMER_SLACK_US_DEFAULT
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 1_000_000:
        raise StackError(f"{CASSANDRA_TIMER_SLACK_ENV}={raw!r}: expected whole microseconds "
                         f"from 0 (the kernel's default) to 1000000")
    return value


@dataclass(frozen=True)
class Profile:
    """Ports, heaps and security of one pair of servers."""

    name: str
    cql_port: int
    storage_port: int
    kafka_port: int
    controller_port: int
    kafka_heap: str
    cassandra_heap: str
    secured: bool = False
    nodes: int = 1
    """servers of each kind; more than one makes a replicated cluster (`cassandra-1`, ...)"""
    cassandra_hosts: tuple[str, ...] = (HOST,)
    """the address of each Cassandra node (all on cql_port and storage_port)"""

    @property
    def clustered(self) -> bool:
        return self.nodes > 1

    def kafka_ports(self) -> list[tuple[int, int]]:
        """(broker port, controller port) of each Kafka node."""
        return [(self.kafka_port + i, self.controller_port + i) for i in range(self.nodes)]

    def cassandra_address(self) -> str:
        return ",".join(f"{h}:{self.cql_port}" for h in self.cassandra_hosts)

    def kafka_address(self) -> str:
        return ",".join(f"{HOST}:{broker}" for broker, _ in self.kafka_ports())


PLAIN = Profile("plain", CQL_PORT, CASSANDRA_STORAGE_PORT, KAFKA_PORT, KAFKA_CONTROLLER_PORT,
                HEAP, CASSANDRA_HEAP)
SECURED = Profile("secured", SECURED_CQL_PORT, SECURED_CASSANDRA_STORAGE_PORT,
                  SECURED_KAFKA_PORT, SECURED_KAFKA_CONTROLLER_PORT, SECURED_HEAP,
                  SECURED_CASSANDRA_HEAP, secured=True)
CLUSTER = Profile("cluster", CQL_PORT, CASSANDRA_STORAGE_PORT, CLUSTER_KAFKA_PORT,
                  CLUSTER_KAFKA_CONTROLLER_PORT, CLUSTER_HEAP, CLUSTER_CASSANDRA_HEAP,
                  nodes=CLUSTER_NODES, cassandra_hosts=CLUSTER_CASSANDRA_HOSTS)
PROFILES = {p.name: p for p in (PLAIN, SECURED, CLUSTER)}

# --add-exports/--add-opens that Cassandra 5.0 needs on Java 17 (its conf/jvm17-server.options).
CASSANDRA_JAVA17_MODULE_FLAGS = [
    *(
        f"--add-exports={m}=ALL-UNNAMED"
        for m in (
            "java.base/jdk.internal.misc",
            "java.management.rmi/com.sun.jmx.remote.internal.rmi",
            "java.rmi/sun.rmi.registry",
            "java.rmi/sun.rmi.server",
            "java.sql/java.sql",
            "java.base/java.lang.ref",
            "jdk.unsupported/sun.misc",
            "jdk.compiler/com.sun.tools.javac.file",
            "jdk.attach/sun.tools.attach",
        )
    ),
    *(
        f"--add-opens={m}=ALL-UNNAMED"
        for m in (
            "java.base/java.lang.module",
            "java.base/jdk.internal.loader",
            "java.base/jdk.internal.ref",
            "java.base/jdk.internal.reflect",
            "java.base/jdk.internal.math",
            "java.base/jdk.internal.module",
            "java.base/jdk.internal.util.jar",
            "jdk.management/com.sun.management.internal",
            "java.base/sun.nio.ch",
            "java.base/java.io",
            "java.base/java.lang.reflect",
            "jdk.compiler/com.sun.tools.javac",
            "java.base/java.lang",
            "java.base/java.util",
        )
    ),
]


CLUSTER_ID_LOCK = threading.Lock()


class StackError(Exception):
    """A problem the user has to look at; the message says what and where."""


# --- output ----------------------------------------------------------------------------------


def say(message: str) -> None:
    print(f"[stack] {message}", file=sys.stderr, flush=True)


class Ticker:
    """Prints `label ... Ns` every `every` seconds while a long step runs."""

    def __init__(self, label: str, every: float = 5.0) -> None:
        self.label = label
        self.every = every
        self.start = time.monotonic()
        self._last = self.start

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def tick(self, detail: str = "") -> None:
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            extra = f" {detail}" if detail else ""
            say(f"{self.label}{extra} ... {self.elapsed():.0f}s")


def tail(path: Path, lines: int, since: int = 0) -> list[str]:
    """The last `lines` lines of a file, reading only what was written after offset `since`."""
    if not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(since if since <= size else 0, size - 256 * 1024))
        data = f.read().decode("utf-8", errors="replace")
    return data.splitlines()[-lines:]


# --- class-data sharing ----------------------------------------------------------------------

# A JVM's start spends much of its CPU loading and verifying classes: about 10,000 for
# Cassandra, 7,000 for Kafka. A class-data sharing archive (JDK 13+'s dynamic archive, one per
# server kind, in the cache folder) holds them already parsed and verified; a server started
# with it used a fifth less CPU until Cassandra answered and a third less until Kafka did
# (loadtest/RESULTS.md, "A server's start from a class archive"). That counts most where CPU is
# short: the fault suite restarts killed servers while the cluster is under load. The first
# start of a kind (no archive yet) writes one when it is stopped gracefully; a server killed,
# or stopped past its grace period, leaves none, and the next start tries again. The JVM checks
# an archive against itself and the classpath and starts without it (a warning in the console
# log) when it does not match; the archive's name covers both, so a new JDK or new jars make
# a new one. CHRONOWHEEL_STACK_CDS=0 starts every JVM without one.
CLASS_SHARING_ENV = "CHRONOWHEEL_STACK_CDS"
PENDING_ARCHIVE_FILE = "class-archive.pending"


def class_sharing_enabled() -> bool:
    """Whether the servers start from (and write) class-data sharing archives."""
    raw = os.environ.get(CLASS_SHARING_ENV, "").strip().lower()
    if raw in ("", "1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise StackError(f"{CLASS_SHARING_ENV}={raw!r}: expected 1 (the default) or 0")


def class_archive_path(cache: Path, kind: str, java: str, classpath: str) -> Path:
    """Where the archive of `kind` on this JDK and classpath lives: the name digests what the
    JVM checks an archive against (its own build, each classpath entry's size and time)."""
    digest = hashlib.sha256()
    jdk = Path(os.path.realpath(java)).parent.parent
    jvm = [str(jdk / "lib" / "server" / name) for name in ("libjvm.so", "classes.jsa")]
    for entry in (os.path.realpath(java), *jvm, *classpath.split(os.pathsep)):
        try:
            st = os.stat(entry)
            digest.update(f"{entry}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            digest.update(f"{entry}\0missing\n".encode())
    return cache / "cds" / f"{kind}-{digest.hexdigest()[:20]}.jsa"


STALE_PENDING_ARCHIVE_S = 3600.0
"""A JVM writes its archive in the seconds of its exit: a pending file older than this was
left by a run whose stop never came (an aborted CI, a state folder deleted meanwhile)."""


def archive_refusal(java: str, classpath: str, archive: Path) -> str | None:
    """Why a JVM would not start from `archive` (None: it would): a JVM told to use it or
    fail (`-Xshare:on`) starts on it. An archive cut short can crash a JVM that maps it, and
    one it rejects quietly costs it the JDK's own archive too, so none is kept unchecked."""
    # In a folder of its own: a JVM that crashes on the archive leaves its crash report in
    # its working folder.
    with tempfile.TemporaryDirectory(prefix="cds-check-") as scratch:
        try:
            out = subprocess.run(
                [java, "-Xshare:on", f"-XX:SharedArchiveFile={archive}",
                 f"-XX:ErrorFile={scratch}/hs_err_%p.log", "-version"],
                env=dict(os.environ, CLASSPATH=classpath), cwd=scratch, capture_output=True,
                text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{type(exc).__name__}: {exc}"
    if out.returncode == 0:
        return None
    # A crash's banner is framed by lines of `#`; its first lines say what happened.
    lines = [ln.strip("# ").strip() for ln in (out.stdout + out.stderr).splitlines()]
    return f"exit {out.returncode}: {' | '.join(ln for ln in lines if ln)[:300]}"


def fsynced(path: Path) -> None:
    """Written to the disk, so that a rename of it cannot outlive its contents."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- locations -------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    raw = os.environ.get("CHRONOWHEEL_CACHE_DIR")
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "chronowheel"


def default_state_dir(profile: Profile | None = None) -> Path:
    raw = os.environ.get("CHRONOWHEEL_STATE_DIR")
    plain = Path(raw).expanduser() if raw else Path.home() / ".cache" / "chronowheel" / "stack"
    if profile is not None and profile is not PLAIN and profile.name != PLAIN.name:
        return plain.with_name(f"{plain.name}-{profile.name}")
    return plain


@dataclass
class Paths:
    state: Path
    cache: Path
    profile: Profile = PLAIN

    @property
    def secrets(self) -> Path:
        return self.state / "secrets"

    @property
    def m2(self) -> Path:
        return self.cache / "m2"

    @property
    def classpaths(self) -> Path:
        return self.cache / "classpath"

    def server(self, name: str) -> Path:
        return self.state / name


# --- Java and Maven --------------------------------------------------------------------------


def java_candidates() -> list[tuple[str, str]]:
    """(where it came from, java binary) in order of preference."""
    found: list[tuple[str, str]] = []
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        found.append(("JAVA_HOME", str(Path(home) / "bin" / "java")))
    on_path = shutil.which("java")
    if on_path:
        found.append(("PATH", on_path))
    for jvm in sorted(Path("/usr/lib/jvm").glob("*17*")):
        if (jvm / "bin" / "java").exists():
            found.append((str(jvm), str(jvm / "bin" / "java")))
    return found


def java_major(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    text = out.stderr + out.stdout
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        raise StackError(f"cannot tell the version of {java}: {text.strip()[:200]}")
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check_java() -> str:
    """A Java 17 binary: CHRONOWHEEL_JAVA_HOME if set, else the first Java 17 among JAVA_HOME,
    `java` on PATH and /usr/lib/jvm/*17*."""
    explicit = os.environ.get("CHRONOWHEEL_JAVA_HOME")
    if explicit:
        java = str(Path(explicit).expanduser() / "bin" / "java")
        if not Path(java).exists():
            raise StackError(f"CHRONOWHEEL_JAVA_HOME={explicit} has no bin/java")
        candidates = [("CHRONOWHEEL_JAVA_HOME", java)]
    else:
        candidates = java_candidates()
    seen: list[str] = []
    for origin, java in candidates:
        major = java_major(java)
        if major == 17:
            return java
        seen.append(f"{java} ({origin}) is Java {major}")
    raise StackError(
        "Cassandra 5.0 and Kafka 4 are run here on Java 17, and none was found"
        + (": " + "; ".join(seen) if seen else "")
        + ". Install a Java 17 JDK or set CHRONOWHEEL_JAVA_HOME to one."
    )


@dataclass
class Artifact:
    """One server's pinned POM and where its resolved classpath is cached."""

    name: str

    @property
    def pom(self) -> Path:
        return HERE / self.name / "pom.xml"

    def classpath_file(self, paths: Paths) -> Path:
        digest = hashlib.sha256(self.pom.read_bytes()).hexdigest()[:12]
        return paths.classpaths / f"{self.name}-{digest}.txt"

    def cached_classpath(self, paths: Paths) -> str | None:
        f = self.classpath_file(paths)
        if not f.exists():
            return None
        cp = f.read_text().strip()
        jars = [j for j in cp.split(os.pathsep) if j]
        if not jars or not all(Path(j).exists() for j in jars):
            return None
        return cp

    def resolve(self, paths: Paths) -> str:
        cached = self.cached_classpath(paths)
        if cached is not None:
            return cached
        mvn = os.environ.get("CHRONOWHEEL_MVN") or shutil.which("mvn")
        if not mvn:
            raise StackError("no `mvn` on PATH: install Apache Maven 3.8+ (or set CHRONOWHEEL_MVN)")
        paths.classpaths.mkdir(parents=True, exist_ok=True)
        out_file = self.classpath_file(paths)
        tmp = out_file.with_suffix(".tmp")
        log = paths.classpaths / f"mvn-{self.name}.log"
        cmd = [
            mvn,
            "-B",
            "-ntp",
            "-f",
            str(self.pom),
            f"-Dmaven.repo.local={paths.m2}",
            f"{MAVEN_DEPENDENCY_PLUGIN}:build-classpath",
            "-Dmdep.includeScope=runtime",
            f"-Dmdep.outputFile={tmp}",
        ]
        ticker = Ticker(f"resolving {self.name} artifacts with Maven")
        say(f"resolving {self.name} artifacts with Maven into {paths.m2} (log: {log})")
        with log.open("wb") as logf:
            proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(self.pom.parent),
            )
            while proc.poll() is None:
                time.sleep(0.5)
                ticker.tick()
        if proc.returncode != 0 or not tmp.exists():
            lines = "\n".join(tail(log, 30))
            raise StackError(f"Maven could not resolve {self.name} (log: {log}):\n{lines}")
        tmp.replace(out_file)
        say(f"resolved {self.name} in {ticker.elapsed():.1f}s")
        cp = self.cached_classpath(paths)
        if cp is None:
            raise StackError(f"Maven wrote a classpath for {self.name} naming missing jars")
        return cp


# --- processes -------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (started by this very process) is not alive.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def port_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def quiet_driver_logs() -> None:
    for name in ("cassandra", "aiokafka", "kafka"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def cql_answers(port: int, timeout: float = 5.0, host: str = HOST, **secure: Any) -> bool:
    """True when the server at host:port answers a CQL query.

    `secure` holds extra Cluster arguments (ssl_context, auth_provider) for the secured profile.
    """
    if not port_open(port, host):
        return False
    quiet_driver_logs()
    try:
        from cassandra.cluster import Cluster
    except ImportError as exc:
        raise StackError(
            "the Cassandra readiness check needs cassandra-driver: run this script with the "
            "project's virtualenv Python (.venv/bin/python)"
        ) from exc
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, ExecutionProfile
    from cassandra.policies import WhiteListRoundRobinPolicy

    # Only this node: a cluster member counts as ready by itself, not through its peers.
    only_this = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([host]))
    cluster = Cluster([host], port=port, connect_timeout=timeout, protocol_version=5,
                      execution_profiles={EXEC_PROFILE_DEFAULT: only_this}, **secure)
    try:
        session = cluster.connect()
        row = session.execute("SELECT release_version FROM system.local", timeout=timeout).one()
        return row is not None
    except Exception:
        return False
    finally:
        cluster.shutdown()


def kafka_answers(port: int, timeout: float = 5.0, **secure: Any) -> bool:
    """True when the broker at HOST:port answers a metadata request listing a live broker."""
    if not port_open(port):
        return False
    quiet_driver_logs()
    try:
        import asyncio

        from aiokafka.admin import AIOKafkaAdminClient
    except ImportError as exc:
        raise StackError(
            "the Kafka readiness check needs aiokafka: run this script with the project's "
            "virtualenv Python (.venv/bin/python)"
        ) from exc

    async def probe() -> bool:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=f"{HOST}:{port}", request_timeout_ms=int(timeout * 1000), **secure
        )
        try:
            async with asyncio.timeout(timeout):
                await admin.start()
            async with asyncio.timeout(timeout):
                cluster = await admin.describe_cluster()
            return bool(cluster.get("brokers"))
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    try:
        return asyncio.run(probe())
    except Exception:
        return False


@dataclass
class Server:
    """One managed JVM: where its files are, how to start it and how to tell it is ready."""

    name: str
    port: int
    main_log_name: str
    paths: Paths
    ready_check: Callable[[int], bool]
    extra_ports: tuple[int, ...] = ()
    host: str = HOST
    member: int = 0
    """1, 2, 3 for the nodes of a cluster profile; 0 for the single server of a kind"""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    log_offsets: dict[Path, int] = field(default_factory=dict, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def kind(self) -> str:
        """`cassandra` or `kafka`: which artifacts it runs."""
        return self.name.rsplit("-", 1)[0] if self.member else self.name

    def ports_in_use(self) -> list[int]:
        return [p for p in (self.port, *self.extra_ports) if port_open(p, self.host)]

    @property
    def home(self) -> Path:
        return self.paths.server(self.name)

    @property
    def conf(self) -> Path:
        return self.home / "conf"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def pid_file(self) -> Path:
        return self.home / "pid"

    @property
    def main_log(self) -> Path:
        return self.logs / self.main_log_name

    @property
    def console_log(self) -> Path:
        return self.logs / "console.log"

    @property
    def marker(self) -> str:
        """A -D flag on the command line that ties a process to this state folder."""
        return f"-Dchronowheel.stack={self.home}"

    def managed_pid(self) -> int | None:
        """The pid of the server this state folder started, if it still runs."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if pid_alive(pid) and self.marker in cmdline(pid):
            return pid
        return None

    def ready(self) -> bool:
        return self.ready_check(self.port)

    def after_ready(self) -> None:
        """One-off set-up once the server answers (the secured Cassandra's roles)."""

    def render(self, template: Path, target: Path, values: dict[str, str]) -> None:
        try:
            text = string.Template(template.read_text()).substitute(values)
        except (KeyError, ValueError) as exc:
            raise StackError(f"{template}: bad or unknown placeholder {exc}") from None
        target.write_text(text)

    def prepare(self, java: str, classpath: str) -> list[str]:
        raise NotImplementedError

    def launcher(self, java: str) -> list[str]:
        """What runs the JVM: java itself, or a wrapper that execs it (the same pid)."""
        return [java]

    def class_archive(self, java: str, classpath: str) -> Path:
        return class_archive_path(self.paths.cache, self.kind, java, classpath)

    def class_sharing_flags(self, java: str, classpath: str) -> list[str]:
        """Start from this kind's archive, or write one when this server stops gracefully
        (into a file of its own, checked and moved into place by `settle_class_archive`).
        Of a cluster profile's three servers of a kind only the first writes one: the
        others' would be thrown away, after a dump of some seconds each at their stop."""
        self.settle_class_archive(graceful=False)  # a previous process's, left by a kill
        if not class_sharing_enabled():
            return []
        archive = self.class_archive(java, classpath)
        if archive.exists():
            return [f"-XX:SharedArchiveFile={archive}"]
        if self.member > 1:
            return []
        archive.parent.mkdir(parents=True, exist_ok=True)
        for stale in archive.parent.glob(f"{self.kind}-*.pending"):
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > STALE_PENDING_ARCHIVE_S:
                    stale.unlink()
        pending = archive.with_name(f"{archive.stem}.{uuid.uuid4().hex[:12]}.pending")
        (self.home / PENDING_ARCHIVE_FILE).write_text(
            "\n".join((str(pending), str(archive), java, classpath)) + "\n")
        # The dump warns of every class it leaves out (old class file versions, some not
        # linked): a hundred lines that say nothing about the server.
        return [f"-XX:ArchiveClassesAtExit={pending}", "-Xlog:cds=error"]

    def existing_class_archive_flags(self, java: str, classpath: str) -> list[str]:
        """For a short-lived tool on this kind's classpath: the archive if there is one."""
        if not class_sharing_enabled():
            return []
        archive = self.class_archive(java, classpath)
        return [f"-XX:SharedArchiveFile={archive}"] if archive.exists() else []

    def settle_class_archive(self, graceful: bool) -> None:
        """After this server's process is gone: the archive it wrote at a graceful exit
        becomes its kind's, once a JVM has started on it (unless another process's already
        did); anything else it left, perhaps cut short by a kill, is removed."""
        marker = self.home / PENDING_ARCHIVE_FILE
        try:
            pending_line, archive_line, java, classpath = marker.read_text().split("\n")[:4]
        except (OSError, ValueError):
            marker.unlink(missing_ok=True)
            return
        pending, archive = Path(pending_line), Path(archive_line)
        try:
            if graceful and pending.is_file() and pending.stat().st_size > 0 \
                    and not archive.exists():
                refusal = archive_refusal(java, classpath, pending)
                if refusal is None:
                    fsynced(pending)
                    os.replace(pending, archive)
                    fsynced(archive.parent)
                    say(f"{self.name}: class archive written ({archive})")
                else:
                    say(f"{self.name}: class archive not kept: a JVM would not start on it "
                        f"({refusal})")
            pending.unlink(missing_ok=True)
        except OSError as exc:
            say(f"{self.name}: class archive not kept ({exc})")
        marker.unlink(missing_ok=True)

    def launch(self, java: str, classpath: str) -> None:
        for d in (self.conf, self.logs, self.home / "tmp"):
            d.mkdir(parents=True, exist_ok=True)
        args = [*self.class_sharing_flags(java, classpath), *self.prepare(java, classpath)]
        for log in (self.main_log, self.console_log):
            self.log_offsets[log] = log.stat().st_size if log.exists() else 0
        env = dict(os.environ, CLASSPATH=classpath)
        env.pop("JAVA_TOOL_OPTIONS", None)
        with self.console_log.open("ab") as console:
            console.write(f"\n=== start {time.strftime('%Y-%m-%dT%H:%M:%S')} ===\n".encode())
            console.flush()
            self.proc = subprocess.Popen(
                [*self.launcher(java), self.marker, *args],
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(self.home),
                env=env,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{self.proc.pid}\n")

    def died(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is not None
        pid = self.managed_pid()
        return pid is None

    def failure_report(self, what: str) -> str:
        parts = [f"{self.name} {what}; logs: {self.main_log} and {self.console_log}"]
        for log in (self.console_log, self.main_log):
            lines = [ln for ln in tail(log, 20, self.log_offsets.get(log, 0)) if ln.strip()]
            if lines:
                parts.append(f"--- last lines of {log} ---")
                parts.extend(ln if len(ln) <= 400 else ln[:400] + " [...]" for ln in lines)
        return "\n".join(parts)


class Cassandra(Server):
    def launcher(self, java: str) -> list[str]:
        slack_us = cassandra_timer_slack_us()
        if slack_us == 0 or not sys.platform.startswith("linux"):
            return [java]
        return [sys.executable, "-c", EXEC_WITH_TIMER_SLACK, str(slack_us * 1000), java]

    def prepare(self, java: str, classpath: str) -> list[str]:
        values = {
            "listen_address": self.host,
            "storage_port": str(self.paths.profile.storage_port),
            "native_port": str(self.port),
        }
        self.render(HERE / "cassandra" / "cassandra.yaml", self.conf / "cassandra.yaml", values)
        cluster_flags: list[str] = []
        if self.paths.profile.clustered:
            self.cluster_yaml(self.conf / "cassandra.yaml")
            # A fresh ring with fixed tokens: nothing to stream, so no node waits for the
            # ring to settle before it serves. A node that missed a schema change's push
            # (a busy node, two cores for six servers) pulls the schema after 1 s instead of
            # Cassandra's 60 s: one namespace's init once took 406 s, a minute per table,
            # where it usually takes under 30.
            cluster_flags = ["-Dcassandra.ring_delay_ms=1000", "-Dcassandra.auto_bootstrap=false",
                             "-Dcassandra.migration_delay_ms=1000"]
        secured_flags: list[str] = []
        if self.paths.profile.secured:
            self.secure_yaml(self.conf / "cassandra.yaml")
            # The default superuser exists at once (instead of after 10 s), to be replaced.
            secured_flags = ["-Dcassandra.superuser_setup_delay_ms=0"]
        heap = self.paths.profile.cassandra_heap
        shutil.copyfile(HERE / "cassandra" / "logback.xml", self.conf / "logback.xml")
        storage = self.home / "data"
        triggers = self.home / "triggers"
        for d in (storage, triggers):
            d.mkdir(parents=True, exist_ok=True)
        return [
            f"-Xms{heap}",
            f"-Xmx{heap}",
            "-Xss256k",
            "-XX:+UseG1GC",
            "-XX:+ParallelRefProcEnabled",
            "-XX:MaxTenuringThreshold=1",
            "-XX:G1RSetUpdatingPauseTimePercent=5",
            "-XX:MaxGCPauseMillis=300",
            "-XX:+UseThreadPriorities",
            "-XX:+HeapDumpOnOutOfMemoryError",
            f"-XX:HeapDumpPath={self.home / 'tmp'}",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:+PerfDisableSharedMem",
            "-ea",
            "-da:net.openhft...",
            "-Djava.net.preferIPv4Stack=true",
            "-Djdk.attach.allowAttachSelf=true",
            *CASSANDRA_JAVA17_MODULE_FLAGS,
            "-Dio.netty.tryReflectionSetAccessible=true",
            "-Dio.netty.allocator.useCacheForAllThreads=true",
            "-Dio.netty.allocator.maxOrder=11",
            f"-Djna.tmpdir={self.home / 'tmp'}",
            f"-Djava.io.tmpdir={self.home / 'tmp'}",
            f"-Dcassandra.config={(self.conf / 'cassandra.yaml').as_uri()}",
            f"-Dcassandra.storagedir={storage}",
            f"-Dcassandra.logdir={self.logs}",
            f"-Dcassandra.triggers_dir={triggers}",
            f"-Dlogback.configurationFile={(self.conf / 'logback.xml').as_uri()}",
            *secured_flags,
            *cluster_flags,
            "-Dcassandra-foreground=yes",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            "org.apache.cassandra.service.CassandraDaemon",
        ]


    def cluster_yaml(self, yaml: Path) -> None:
        """One ring of the profile's nodes: every node a seed, evenly spaced fixed tokens
        (one each), no bootstrap streaming (the ring starts empty), smaller memtables."""
        profile = self.paths.profile
        token = (2**64 // profile.nodes) * (self.member - 1) - 2**63
        seeds = ",".join(f"{h}:{profile.storage_port}" for h in profile.cassandra_hosts)
        text = yaml.read_text()
        for key, value in (("cluster_name", "chronowheel-cluster"),
                           ("memtable_heap_space", "32MiB"),
                           ("memtable_offheap_space", "32MiB"),
                           ("file_cache_size", "32MiB"),
                           ("concurrent_writes", "8")):
            text, n = re.subn(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.M)
            if n != 1:
                raise StackError(f"{yaml}: expected one `{key}:` line to replace, found {n}")
        text, n = re.subn(r'^(\s*- seeds: )".*"$', rf'\g<1>"{seeds}"', text, flags=re.M)
        if n != 1:
            raise StackError(f"{yaml}: expected one `- seeds:` line to replace, found {n}")
        text += (
            "\n# --- cluster profile (stack.py --profile cluster) ---\n"
            f"initial_token: {token}\n"
            "auto_bootstrap: false\n"
        )
        yaml.write_text(text)

    def secure_yaml(self, yaml: Path) -> None:
        """PasswordAuthenticator, CassandraAuthorizer and client TLS (no plaintext port)."""
        material = secured_material(self.paths)
        text = yaml.read_text()
        for key, value in (("authenticator", "PasswordAuthenticator"),
                           ("authorizer", "CassandraAuthorizer")):
            text, n = re.subn(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.M)
            if n != 1:
                raise StackError(f"{yaml}: expected one `{key}:` line to replace, found {n}")
        store_password = material.cassandra_keystore_password.read_text().strip()
        text += (
            "\n# --- secured profile (stack.py --profile secured) ---\n"
            "client_encryption_options:\n"
            "  enabled: true\n"
            "  optional: false\n"
            f"  keystore: {material.cassandra_keystore}\n"
            f"  keystore_password: \"{store_password}\"\n"
            "  store_type: PKCS12\n"
            "  require_client_auth: false\n"
        )
        yaml.write_text(text)
        yaml.chmod(0o600)

    def secure_options(self, user: str = "admin") -> dict[str, Any]:
        from cassandra.auth import PlainTextAuthProvider

        material = secured_material(self.paths)
        return {"ssl_context": client_ssl_context(material),
                "auth_provider": PlainTextAuthProvider(user, material.password(user))}

    def after_ready(self) -> None:
        if self.paths.profile.secured:
            provision_cassandra_roles(self)


class Kafka(Server):
    def prepare(self, java: str, classpath: str) -> list[str]:
        data = self.home / "data"
        profile = self.paths.profile
        controller_port = self.extra_ports[0] if self.extra_ports else profile.controller_port
        values = {
            "host": HOST,
            "broker_port": str(self.port),
            "controller_port": str(controller_port),
            "data_dir": str(data),
        }
        props = self.conf / "server.properties"
        self.render(HERE / "kafka" / "server.properties", props, values)
        if profile.clustered:
            voters = ",".join(f"{i + 1}@{HOST}:{controller}"
                              for i, (_, controller) in enumerate(profile.kafka_ports()))
            self.render(HERE / "kafka" / "cluster.properties", self.conf / "cluster.part",
                        {"node_id": str(self.member), "voters": voters})
            with props.open("a") as f:
                f.write("\n" + (self.conf / "cluster.part").read_text())
            (self.conf / "cluster.part").unlink()
        if self.paths.profile.secured:
            material = secured_material(self.paths)
            plain_users = " ".join(f'user_{u}="{material.password(u)}"'
                                   for u in ("admin", "node", "worker", "submitter"))
            self.render(HERE / "kafka" / "secured.properties", self.conf / "secured.part", {
                **values, "admin_password": material.password("admin"),
                "mtls_port": str(SECURED_KAFKA_MTLS_PORT), "plain_users": plain_users,
                "keystore": str(material.server_pem), "truststore": str(material.ca)})
            with props.open("a") as f:
                f.write("\n" + (self.conf / "secured.part").read_text())
            (self.conf / "secured.part").unlink()
            props.chmod(0o600)
        shutil.copyfile(HERE / "kafka" / "log4j2.xml", self.conf / "log4j2.xml")
        common = [
            f"-Dkafka.logs.dir={self.logs}",
            f"-Dlog4j2.configurationFile={(self.conf / 'log4j2.xml').as_uri()}",
            f"-Djava.io.tmpdir={self.home / 'tmp'}",
        ]
        if not (data / "meta.properties").exists():
            self.format_storage(java, classpath, props, common)
        return [
            f"-Xms{self.paths.profile.kafka_heap}",
            f"-Xmx{self.paths.profile.kafka_heap}",
            "-server",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            *common,
            "kafka.Kafka",
            str(props),
        ]

    def cluster_id(self) -> str:
        """A fresh id; the nodes of a cluster profile share one, kept in the state folder."""
        fresh = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not self.paths.profile.clustered:
            return fresh
        shared = self.paths.state / "kafka-cluster-id"
        with CLUSTER_ID_LOCK:  # the nodes are launched from parallel threads
            if not shared.exists():
                shared.write_text(fresh + "\n")
            return shared.read_text().strip()

    def format_storage(self, java: str, classpath: str, props: Path, common: list[str]) -> None:
        """Format the KRaft metadata and data folder once, with a fresh cluster id."""
        cluster_id = self.cluster_id()
        say(f"formatting kafka storage (cluster id {cluster_id})")
        env = dict(os.environ, CLASSPATH=classpath)
        scram: list[str] = []
        if self.paths.profile.secured:
            # SCRAM users go into the metadata log at format time. Passed in an argument file
            # (`java @file`) so that no password appears in the process list.
            material = secured_material(self.paths)
            args_file = self.conf / "format.args"
            lines = []
            for user in ("admin", "node", "worker", "submitter"):
                for mech in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
                    lines += ["--add-scram",
                              f"{mech}=[name={user},password={material.password(user)}]"]
            fd = os.open(args_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("\n".join(lines) + "\n")
            scram = [f"@{args_file}"]
        out = subprocess.run(
            [
                java,
                "-Xmx256m",
                *self.existing_class_archive_flags(java, classpath),
                *common,
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",  # ids may start with "-"
                f"--config={props}",
                *scram,
            ],
            capture_output=True,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        (self.logs / "format.log").write_text(out.stdout + out.stderr)
        if out.returncode != 0:
            raise StackError(
                f"kafka storage format failed (log: {self.logs / 'format.log'}):\n"
                + "\n".join((out.stdout + out.stderr).strip().splitlines()[-20:])
            )


def servers(paths: Paths) -> dict[str, Server]:
    profile = paths.profile
    cql_check: Callable[[int], bool] = cql_answers
    kafka_check: Callable[[int], bool] = kafka_answers
    if profile.secured:
        def cql_check(port: int) -> bool:
            return secured_cql_answers(paths, port)

        def kafka_check(port: int) -> bool:
            return kafka_answers(port, **kafka_secure_options(paths, "admin"))

    if profile.clustered:
        return cluster_servers(paths)
    return {
        "cassandra": Cassandra(
            "cassandra",
            profile.cql_port,
            "system.log",
            paths,
            cql_check,
            extra_ports=(profile.storage_port,),
        ),
        "kafka": Kafka(
            "kafka",
            profile.kafka_port,
            "server.log",
            paths,
            kafka_check,
            extra_ports=(profile.controller_port,
                         *((SECURED_KAFKA_MTLS_PORT,) if profile.secured else ())),
        ),
    }


def cluster_servers(paths: Paths) -> dict[str, Server]:
    """cassandra-1..N on the profile's loopback aliases, then kafka-1..N (broker and KRaft
    controller each) on consecutive ports of 127.0.0.1."""
    profile = paths.profile
    out: dict[str, Server] = {}
    for i, host in enumerate(profile.cassandra_hosts, start=1):
        def cql_check(port: int, host: str = host) -> bool:
            return cql_answers(port, host=host)

        out[f"cassandra-{i}"] = Cassandra(f"cassandra-{i}", profile.cql_port, "system.log", paths,
                                          cql_check, extra_ports=(profile.storage_port,),
                                          host=host, member=i)
    for i, (broker, controller) in enumerate(profile.kafka_ports(), start=1):
        out[f"kafka-{i}"] = Kafka(f"kafka-{i}", broker, "server.log", paths, kafka_answers,
                                  extra_ports=(controller,), member=i)
    return out


# --- the secured profile ---------------------------------------------------------------------


# Servers are launched from parallel threads, and each reads the material: without the lock two
# first launches each made their own keystore and password, and a server could get the
# keystore of one and the password of the other.
SECURED_MATERIAL_LOCK = threading.Lock()


def secured_material(paths: Paths) -> Any:
    """The CA, certificates and passwords of a secured state folder (made on first use)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import secured  # deploy/local/secured.py

    try:
        with SECURED_MATERIAL_LOCK:
            return secured.ensure(paths.secrets)
    except RuntimeError as exc:
        raise StackError(str(exc)) from None


def client_ssl_context(material: Any) -> Any:
    import ssl

    ctx = ssl.create_default_context(cafile=str(material.ca))
    ctx.check_hostname = True
    return ctx


def kafka_secure_options(paths: Paths, user: str) -> dict[str, Any]:
    material = secured_material(paths)
    return {"security_protocol": "SASL_SSL", "ssl_context": client_ssl_context(material),
            "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": user,
            "sasl_plain_password": material.password(user)}


def secured_cql_answers(paths: Paths, port: int) -> bool:
    """Ready once the admin role answers, or the default superuser does (first start)."""
    srv = servers(paths)["cassandra"]
    assert isinstance(srv, Cassandra)
    if cql_answers(port, **srv.secure_options("admin")):
        return True
    from cassandra.auth import PlainTextAuthProvider

    material = secured_material(paths)
    return cql_answers(port, ssl_context=client_ssl_context(material),
                       auth_provider=PlainTextAuthProvider("cassandra", "cassandra"))


def provision_cassandra_roles(srv: Cassandra) -> None:
    """Replace the default superuser by `admin`; make login roles node, worker and ops.

    Idempotent: once `admin` can log in, only missing roles are created.
    """
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import Cluster

    material = secured_material(srv.paths)

    def session_as(user: str, password: str) -> tuple[Any, Any]:
        cluster = Cluster([HOST], port=srv.port, protocol_version=5, connect_timeout=10,
                          ssl_context=client_ssl_context(material),
                          auth_provider=PlainTextAuthProvider(user, password))
        return cluster, cluster.connect()

    quiet_driver_logs()
    admin_password = material.password("admin")
    try:
        cluster, session = session_as("admin", admin_password)
    except Exception:
        cluster, session = session_as("cassandra", "cassandra")
        try:
            session.execute("CREATE ROLE IF NOT EXISTS admin WITH SUPERUSER = true AND "
                            "LOGIN = true AND PASSWORD = %s", (admin_password,), timeout=30)
        finally:
            cluster.shutdown()
        cluster, session = session_as("admin", admin_password)
    try:
        for user in ("node", "worker", "ops"):
            session.execute(f"CREATE ROLE IF NOT EXISTS {user} WITH LOGIN = true AND "
                            "PASSWORD = %s", (material.password(user),), timeout=30)
        # The well-known default superuser must not stay usable.
        session.execute("ALTER ROLE cassandra WITH PASSWORD = %s AND LOGIN = false",
                        (base64.urlsafe_b64encode(os.urandom(18)).decode(),), timeout=30)
    finally:
        cluster.shutdown()
    say("cassandra roles ready: admin (superuser), node, worker, ops; default superuser "
        "disabled")


def secured_summary(paths: Paths) -> dict[str, Any]:
    """What a client of the secured pair needs, by file name: no secret is printed."""
    material = secured_material(paths)
    return {
        "profile": "secured",
        "kafka_security_protocol": "SASL_SSL",
        "kafka_sasl_mechanisms": ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"],
        "ca_file": str(material.ca),
        "kafka_mtls": f"{HOST}:{SECURED_KAFKA_MTLS_PORT}",
        "client_cert": str(material.client_cert),
        "client_key": str(material.client_key),
        "client_key_password_file": str(material.client_key_password),
        "secrets_dir": str(paths.secrets),
        "password_files": {u: str(material.password_file(u))
                           for u in ("admin", "node", "worker", "submitter", "ops")},
        "kafka_users": ["admin", "node", "worker", "submitter"],
        "cassandra_roles": ["admin", "node", "worker", "ops"],
    }


def pick(all_servers: dict[str, Server], names: Sequence[str]) -> list[Server]:
    """The servers named; a kind (`cassandra`, `kafka`) names every node of that kind."""
    if not names:
        return list(all_servers.values())
    chosen: dict[str, Server] = {}
    for n in names:
        matching = [s for key, s in all_servers.items()
                    if key == n or key.rsplit("-", 1)[0] == n]
        if not matching:
            kinds = sorted({key.rsplit("-", 1)[0] for key in all_servers} | set(all_servers))
            raise StackError(f"unknown server {n!r}; choose from {kinds}")
        for s in matching:
            chosen.setdefault(s.name, s)
    return list(chosen.values())


@contextlib.contextmanager
def state_lock(paths: Paths) -> Iterator[None]:
    """One `up`/`down` at a time per state folder (a second caller waits)."""
    paths.state.mkdir(parents=True, exist_ok=True)
    with (paths.state / ".lock").open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another stack command on {paths.state}")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- commands --------------------------------------------------------------------------------


def cmd_install(paths: Paths, names: Sequence[str]) -> dict[str, Any]:
    started = time.monotonic()
    chosen = pick(servers(paths), names)
    kinds = list(dict.fromkeys(srv.kind for srv in chosen))
    for kind in kinds:
        Artifact(kind).resolve(paths)
    return {"resolved": kinds, "seconds": round(time.monotonic() - started, 1)}


def cmd_up(paths: Paths, names: Sequence[str], timeout: float) -> dict[str, Any]:
    chosen = pick(servers(paths), names)
    cassandra_timer_slack_us()  # bad settings are refused before anything is started
    class_sharing_enabled()
    result: dict[str, Any] = {"started": [], "already_running": [], "seconds": {}}
    with state_lock(paths):
        to_start: list[Server] = []
        for srv in chosen:
            if srv.managed_pid() is not None:
                if srv.ready():
                    say(f"{srv.name} already up on {srv.address}")
                    result["already_running"].append(srv.name)
                    continue
                to_start.append(srv)  # started earlier, still coming up: just wait for it
                continue
            if srv.ports_in_use():
                if srv.ready():
                    say(
                        f"{srv.name} already answers on {srv.address} (not started by this "
                        f"stack's state folder {paths.state}); using it"
                    )
                    result["already_running"].append(srv.name)
                    continue
                busy = srv.ports_in_use()
                raise StackError(
                    f"cannot start {srv.name}: port(s) {busy} on {srv.host} are taken by a "
                    "process "
                    f"that is not a {srv.name} answering there"
                )
            to_start.append(srv)
        if not to_start:
            return result
        java = check_java()
        classpaths = {kind: Artifact(kind).resolve(paths)
                      for kind in dict.fromkeys(srv.kind for srv in to_start)}
        launched: list[Server] = []
        try:
            # In parallel: a cluster's Kafka nodes each format their storage first (a JVM
            # of its own), and a KRaft quorum needs a majority of its voters up anyway.
            with ThreadPoolExecutor(max_workers=max(1, len(to_start))) as pool:
                futures = []
                for srv in to_start:
                    if srv.managed_pid() is None:
                        say(f"starting {srv.name} (state: {srv.home}, log: {srv.main_log})")
                        futures.append(pool.submit(srv.launch, java, classpaths[srv.kind]))
                        launched.append(srv)
                for f in futures:
                    f.result()
            wait_ready(to_start, timeout, result)
            if paths.profile.clustered:
                wait_formed(paths, timeout, result)
        except BaseException:
            for srv in launched:
                stop_server(srv, grace=10.0)
            raise
        result["started"] = [s.name for s in to_start]
    return result


def wait_ready(pending_servers: list[Server], timeout: float, result: dict[str, Any]) -> None:
    ticker = Ticker("waiting for")
    pending = list(pending_servers)
    while pending:
        for srv in list(pending):
            if srv.died():
                raise StackError(srv.failure_report("exited during start-up"))
            if srv.ready():
                srv.after_ready()
                result["seconds"][srv.name] = round(ticker.elapsed(), 1)
                say(f"{srv.name} is up on {srv.address} after {ticker.elapsed():.1f}s")
                pending.remove(srv)
        if not pending:
            return
        if ticker.elapsed() > timeout:
            srv = pending[0]
            raise StackError(srv.failure_report(f"did not answer within {timeout:.0f}s"))
        ticker.tick(" and ".join(f"{s.name} on {s.address}" for s in pending))
        time.sleep(0.5)


def cassandra_ring(host: str, port: int) -> tuple[set[str], set[str]]:
    """(all nodes, nodes the driver sees up) of the ring, asked through `host`."""
    quiet_driver_logs()
    from cassandra.cluster import Cluster

    cluster = Cluster([host], port=port, connect_timeout=5, protocol_version=5)
    try:
        cluster.connect()
        hosts = cluster.metadata.all_hosts()
        return ({str(h.address) for h in hosts},
                {str(h.address) for h in hosts if h.is_up})
    finally:
        cluster.shutdown()


def kafka_brokers(port: int, timeout: float = 5.0) -> set[int]:
    """Ids of the brokers that the broker at HOST:port lists as registered."""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    quiet_driver_logs()

    async def probe() -> set[int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=f"{HOST}:{port}",
                                    request_timeout_ms=int(timeout * 1000))
        try:
            async with asyncio.timeout(timeout):
                await admin.start()
            async with asyncio.timeout(timeout):
                cluster = await admin.describe_cluster()
            return {int(b["node_id"]) for b in cluster.get("brokers", [])}
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    return asyncio.run(probe())


def wait_formed(paths: Paths, timeout: float, result: dict[str, Any]) -> None:
    """Until every Cassandra node sees the whole ring up and the brokers see each other:
    a member answering alone is not yet a cluster that takes QUORUM writes."""
    profile = paths.profile
    ticker = Ticker("waiting for the cluster to form")
    want_hosts = set(profile.cassandra_hosts)
    want_brokers = set(range(1, profile.nodes + 1))
    detail = ""
    while True:
        try:
            rings = [cassandra_ring(h, profile.cql_port) for h in profile.cassandra_hosts]
            brokers = kafka_brokers(profile.kafka_port)
            if all(up == want_hosts for _, up in rings) and brokers == want_brokers:
                result["seconds"]["formed"] = round(ticker.elapsed(), 1)
                say(f"cluster formed: Cassandra ring {sorted(want_hosts)} all up, Kafka "
                    f"brokers {sorted(brokers)} registered ({ticker.elapsed():.1f}s)")
                return
            detail = (f"(ring up as seen by each node: {[sorted(up) for _, up in rings]}; "
                      f"brokers {sorted(brokers)})")
        except Exception as exc:
            detail = f"({type(exc).__name__}: {exc})"
        if ticker.elapsed() > timeout:
            raise StackError(f"the cluster did not form within {timeout:.0f}s {detail}")
        ticker.tick(detail)
        time.sleep(1.0)


def stop_server(srv: Server, grace: float = STOP_GRACE_S) -> bool:
    """Stop one managed server: SIGTERM, wait up to `grace` seconds, then SIGKILL."""
    pid = srv.proc.pid if srv.proc is not None and srv.proc.poll() is None else srv.managed_pid()
    if pid is None:
        with contextlib.suppress(FileNotFoundError):
            srv.pid_file.unlink()
        return False
    say(f"stopping {srv.name} (pid {pid})")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    ticker = Ticker(f"waiting for {srv.name} to stop")
    while pid_alive(pid) and ticker.elapsed() < grace:
        if srv.proc is not None:
            srv.proc.poll()
        time.sleep(0.2)
        ticker.tick()
    killed = pid_alive(pid)
    if killed:
        say(f"{srv.name} still running after {grace:.0f}s: killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while pid_alive(pid):
            if srv.proc is not None:
                srv.proc.poll()
            time.sleep(0.1)
    srv.settle_class_archive(graceful=not killed)
    with contextlib.suppress(FileNotFoundError):
        srv.pid_file.unlink()
    say(f"{srv.name} stopped after {ticker.elapsed():.1f}s")
    return True


def cmd_down(paths: Paths, names: Sequence[str], grace: float) -> dict[str, Any]:
    chosen = pick(servers(paths), names)
    stopped: list[str] = []
    with state_lock(paths):
        threads: list[threading.Thread] = []
        for srv in chosen:
            if srv.managed_pid() is None:
                say(f"{srv.name} is not running from {paths.state}")
                if port_open(srv.port, srv.host):
                    say(f"(something else answers on {srv.address}; left alone)")
                continue

            def run(s: Server = srv) -> None:
                if stop_server(s, grace):
                    stopped.append(s.name)

            t = threading.Thread(target=run)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
    return {"stopped": stopped}


def cmd_status(paths: Paths) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for srv in servers(paths).values():
        pid = srv.managed_pid()
        out[srv.name] = {
            "address": srv.address,
            "ready": srv.ready(),
            "pid": pid,
            "managed": pid is not None,
            "log": str(srv.main_log),
            "home": str(srv.home),
            "kind": srv.kind,
            "member": srv.member,
        }
    return out


def print_status(status: dict[str, Any]) -> None:
    for name, info in status.items():
        if info["ready"]:
            how = f"pid {info['pid']}" if info["managed"] else "not started by this state folder"
            state = f"up on {info['address']} ({how})"
        elif info["managed"]:
            state = f"running (pid {info['pid']}) but not answering on {info['address']}"
        else:
            state = "down"
        print(f"{name:<12} {state}\n{'':<12} log: {info['log']}")


def cmd_logs(paths: Paths, names: Sequence[str], lines: int, follow: bool) -> int:
    chosen = pick(servers(paths), names)
    files = [s.main_log for s in chosen]
    if follow:
        existing = [str(f) for f in files]
        os.execvp("tail", ["tail", "-n", str(lines), "-F", *existing])
    for srv in chosen:
        for log in (srv.main_log, srv.console_log):
            print(f"==> {log} <==")
            if not log.exists():
                print("(no log yet)")
            for line in tail(log, lines):
                print(line)
    return 0


def emit(result: dict[str, Any], as_json: bool, out: IO[str] = sys.stdout) -> None:
    if as_json:
        json.dump(result, out)
        out.write("\n")
        out.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stack.py", description="Local Apache Cassandra + Apache Kafka on 127.0.0.1."
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="data and logs [env CHRONOWHEEL_STATE_DIR; default ~/.cache/chronowheel/stack]",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="Maven repository and classpaths [env CHRONOWHEEL_CACHE_DIR; "
        "default ~/.cache/chronowheel]",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=os.environ.get("CHRONOWHEEL_STACK_PROFILE", "plain"),
        help="plain (9042/9092, no auth), secured (9142/9094, TLS, SASL, ACLs, own state "
        "folder) or cluster (three Cassandra nodes on 127.0.0.2-4:9042, three Kafka nodes on "
        "127.0.0.1:9192-9194, own state folder) [env CHRONOWHEEL_STACK_PROFILE; default plain]",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("install", help="resolve the pinned Maven artifacts only")
    p.add_argument("servers", nargs="*", metavar="SERVER")
    p = sub.add_parser("up", help="start the servers that are not running and wait for them")
    p.add_argument("servers", nargs="*", metavar="SERVER")
    p.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get("CHRONOWHEEL_STACK_TIMEOUT", DEFAULT_TIMEOUT_S)),
        help="seconds to wait for readiness [env CHRONOWHEEL_STACK_TIMEOUT; "
        f"default {DEFAULT_TIMEOUT_S:.0f}]",
    )
    p = sub.add_parser("down", help="stop the servers this state folder started")
    p.add_argument("servers", nargs="*", metavar="SERVER")
    p.add_argument(
        "--grace",
        type=float,
        default=STOP_GRACE_S,
        help=f"seconds between SIGTERM and SIGKILL (default {STOP_GRACE_S:.0f})",
    )
    sub.add_parser("status", help="tell what runs and answers (exit 3 when not all are up)")
    p = sub.add_parser("logs", help="print (or follow) the servers' logs")
    p.add_argument("servers", nargs="*", metavar="SERVER")
    p.add_argument("-n", "--lines", type=int, default=40, help="lines per log (default 40)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    profile = PROFILES[args.profile]
    paths = Paths(
        state=(args.state_dir or default_state_dir(profile)).expanduser().resolve(),
        cache=(args.cache_dir or default_cache_dir()).expanduser().resolve(),
        profile=profile,
    )
    try:
        if args.command == "install":
            result = cmd_install(paths, args.servers)
            say(f"artifacts ready in {paths.m2}")
            emit(result, args.json)
            return 0
        if args.command == "up":
            result = cmd_up(paths, args.servers, args.timeout)
            result.update(
                {
                    "cassandra": profile.cassandra_address(),
                    "kafka": profile.kafka_address(),
                    "state_dir": str(paths.state),
                }
            )
            if profile.secured:
                result.update(secured_summary(paths))
            emit(result, args.json)
            return 0
        if args.command == "down":
            emit(cmd_down(paths, args.servers, args.grace), args.json)
            return 0
        if args.command == "status":
            status = cmd_status(paths)
            if args.json:
                emit(status, True)
            else:
                print_status(status)
            return 0 if all(info["ready"] for info in status.values()) else 3
        if args.command == "logs":
            return cmd_logs(paths, args.servers, args.lines, args.follow)
    except StackError as exc:
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
