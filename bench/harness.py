"""What every Kafka-driven run of ``bench/processor.py`` shares: commands encoded ahead of time,
a producer that only produces, a consumer that notes when each answer arrived, the round-trip
statistics and the state of the machine before a run.

Not a test and not part of the framework: imported by the bench scripts only.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs

from cqrs.app import App
from cqrs.client import encode_command
from cqrs.codec.registry import Codec
from cqrs.envelope import read_command
from cqrs.config import CqrsConfig
from cqrs.kafka_io import make_consumer, make_producer, take
from cqrs.processor.state_table import open_state_table
from cqrs.topics import AppTopics, delete_topics, ensure_topics, list_topics, topics_for

__all__ = [
    "Encoded", "ResultWatcher", "announce", "command_id_header", "encode_all", "fresh_topics",
    "latency_summary", "produce", "remove_fresh", "served_http", "settle", "timeout_for",
]

COMMAND_ID_HEADER = "cqrs.command_id"

# Every process a bench starts (Spark's Python workers, `cqrs run ...` apps) loads its modules as
# an installed app does, from bytecode: an environment that sets PYTHONDONTWRITEBYTECODE (this
# workplace's does; uv compiles nothing at install) made each of them compile pyspark and the
# framework from source as it started (~1.6 s of imports against ~0.6), which a rebuild waits
# for: 200,000 events rebuilt in 6.3-6.9 s that way against 5.4-5.9 s with bytecode (2026-12-03).
# They inherit this process's environment: each script that starts them imports this module before.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@attrs.frozen
class Encoded:
    """One command as it goes on the wire; ``cid`` is how its answer is recognised."""

    cid: bytes
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


def encode_all(app: App, commands: Iterable[tuple[str, object]],
               codec: Codec | None = None) -> list[Encoded]:
    """Every command encoded by the client's own function, before any clock starts (with
    ``codec``: the app's by default; an app with personal fields needs one with a key store)."""
    commands = list(commands)
    if codec is not None and codec.personal and codec.key_store is not None:
        # the data subjects' keys made at once (one request per group of rows), not one
        # lightweight transaction per command as each encode would: minutes at 100,000 subjects
        subjects = {s for _, command in commands if (s := codec.subject_of(command)) is not None}
        for chunk in _chunks(sorted(subjects), 5000):
            codec.key_store.prefetch(chunk, create=True)
    out = []
    for aggregate_id, command in commands:
        cid, key, value, headers = encode_command(app, aggregate_id, command, codec=codec)
        out.append(Encoded(cid.encode(), key, value, list(headers)))
    return out


def _chunks(items: list[str], n: int) -> list[list[str]]:
    return [items[i:i + n] for i in range(0, len(items), n)]


def fresh_topics(cfg: CqrsConfig, app_name: str, label: str) -> AppTopics:
    """The app's topics under a new prefix (created with the framework's settings)."""
    prefix = f"bench-{label}-{uuid.uuid4().hex[:8]}-"
    topics = topics_for(app_name, prefix)
    ensure_topics(cfg, topics)
    _FRESH.append((topics, prefix))
    return topics


_FRESH: list[tuple[AppTopics, str]] = []


def remove_fresh(cfg: CqrsConfig) -> None:
    """Delete the topics and aggregate-state tables of every :func:`fresh_topics` of this run;
    a bench calls this on its way out. Left behind, they pile up on the dev stack (a broker
    holding ~20,000 partitions from old runs ran out of file handles)."""
    while _FRESH:
        topics, prefix = _FRESH.pop()
        with contextlib.suppress(Exception):
            delete_topics(cfg, list_topics(cfg, prefix))
        with contextlib.suppress(Exception):
            table = open_state_table(cfg, topics)
            try:
                for generation in range((table.current_generation() or 0) + 1):
                    table.drop(generation)
            finally:
                table.close()


def timeout_for(count: int, floor_s: float = 900.0, per_s: float = 200.0) -> float:
    """How long to wait for ``count`` answers: generous, growing with the count (1M aggregates
    take tens of minutes at a few hundred commands/s)."""
    return max(floor_s, count / per_s)


def command_id_header(msg: Any) -> bytes | None:
    """The command id of a copied command (the floor's copy topic): from its command record,
    or from its headers for a command in the older header form."""
    key, value = msg.key(), msg.value()
    if key and value:
        found = read_command(key.decode("utf-8", "replace"), value)
        if found is not None:
            return (found[0].command_id or found[0].message_id).encode()
    for name, header in msg.headers() or ():
        if name == COMMAND_ID_HEADER:
            return header
    return None


def result_key(msg: Any) -> bytes | None:
    """The command id of a result: the results topic's key."""
    return msg.key()


class ResultWatcher(threading.Thread):
    """Consumes one topic and notes when the answer to each command id first arrived.

    ``key_of`` finds the command id in a record (the key for results, a header for copies).
    """

    def __init__(self, cfg: CqrsConfig, topic: str,
                 key_of: Callable[[Any], bytes | None] = result_key) -> None:
        super().__init__(daemon=True)
        self.consumer = make_consumer(cfg)
        self.consumer.subscribe([topic])
        self.key_of = key_of
        self.arrived: dict[bytes, float] = {}
        self.pending: set[bytes] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            for msg in take(self.consumer, 5000, 0.2):
                if msg.error() is not None:
                    continue
                now = time.monotonic()
                key = self.key_of(msg)
                if key is None:
                    continue
                with self.lock:
                    if key not in self.arrived:
                        self.arrived[key] = now
                        self.pending.discard(key)
        self.consumer.close()

    def expect(self, ids: Iterable[bytes]) -> None:
        """Note ids to wait for (those already arrived are not): waiting then only counts the
        pending set, never scans every id."""
        with self.lock:
            self.pending.update(i for i in ids if i not in self.arrived)

    def wait_for(self, ids: Sequence[bytes], timeout_s: float, label: str,
                 query: Any | None = None) -> float:
        """Wait until every id's answer arrived; the arrival time of the last one. With a
        streaming ``query``, fail as soon as it has stopped (instead of waiting out the timeout)."""
        self.expect(ids)
        deadline = time.monotonic() + timeout_s
        last_report = time.monotonic()
        while True:
            with self.lock:
                missing = len(self.pending)
            if missing == 0:
                break
            if query is not None and not query.isActive:
                raise RuntimeError(f"{label}: the streaming query stopped with {missing:,} results "
                                   f"missing: {query.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{label}: {missing:,} of {len(ids):,} results missing after {timeout_s:.0f} s")
            if time.monotonic() - last_report > 10:
                print(f"  {label}: {len(ids) - missing:,}/{len(ids):,} results", flush=True)
                last_report = time.monotonic()
            time.sleep(0.1)
        with self.lock:
            return max(self.arrived[i] for i in ids)

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


_PRODUCERS: dict[str, Any] = {}


def _producer(cfg: CqrsConfig) -> Any:
    """The bench process's producer for ``cfg``'s brokers, made once: a run's timed part reuses
    the connection, metadata and producer id its warm-up set up, as the Kafka Streams peer's
    load generator does with its one producer (a fresh producer made inside the timed window
    put its start, ~0.3 s, on the first commands' round trips)."""
    found = _PRODUCERS.get(cfg.kafka.bootstrap_servers)
    if found is None:
        found = _PRODUCERS[cfg.kafka.bootstrap_servers] = make_producer(
            cfg, **{"linger.ms": 20, "batch.size": 1_000_000})
    return found


def produce(cfg: CqrsConfig, topic: str, records: Sequence[Encoded],
            sent_at: dict[bytes, float] | None = None, rate: float | None = None) -> None:
    """Produce already-encoded records: only ``produce()`` calls (and the pacing of a fixed
    rate) happen here; every one is delivered when this returns. ``sent_at`` gets each command
    id's produce-call time."""
    producer = _producer(cfg)
    started = time.monotonic()
    for n, rec in enumerate(records):
        if rate is not None:
            pause = started + n / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        if sent_at is not None:
            sent_at[rec.cid] = time.monotonic()
        while True:
            try:
                producer.produce(topic, key=rec.key, value=rec.value, headers=rec.headers)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 1000 == 0:
            producer.poll(0)
    producer.flush(60)


def latency_summary(rtt_s: Sequence[float]) -> dict[str, float]:
    """p50, p99 (``sorted[int(n * 0.99) - 1]``, as every bench here and the Kafka Streams
    peer compute it) and max of round trips in seconds."""
    ordered = sorted(rtt_s)
    return {"p50_s": statistics.median(ordered), "p99_s": ordered[max(0, int(len(ordered) * 0.99) - 1)],
            "max_s": ordered[-1]}


def settle(busy_below: float = 0.25, window_s: float = 3.0, timeout_s: float = 180.0) -> float:
    """Wait until the machine is quiet: the CPUs busy less than ``busy_below`` of a
    ``window_s`` window (what the work before left running, such as Cassandra compacting a
    million rows just written, would otherwise be measured with the next figure); at most
    ``timeout_s``. Returns the seconds waited (printed when any)."""
    def ticks() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all, idle + iowait

    started = time.monotonic()
    while True:
        total0, idle0 = ticks()
        time.sleep(window_s)
        total1, idle1 = ticks()
        busy = 1 - (idle1 - idle0) / max(1, total1 - total0)
        waited = time.monotonic() - started
        if busy < busy_below or waited >= timeout_s:
            if waited > window_s + 1:
                print(f"(waited {waited:.0f}s for the machine to settle: {busy:.0%} busy)",
                      flush=True)
            return waited


def stack_pids(cfg: CqrsConfig) -> dict[str, int]:
    """The dev stack's service processes (kafka, cassandra), for the CPU split."""
    from cqrs.devstack.stack import DevStack

    return {s.name: s.pid for s in DevStack(cfg).status() if s.pid is not None}


def settled(cfg: CqrsConfig, busy_core: float = 0.25, timeout_s: float = 30.0,
            after: str = "warm-up") -> None:
    """Flush Cassandra's memtables and wait for its compactions (``nodetool``), then until
    Kafka and Cassandra each use less than ``busy_core`` of a core over a second (at most
    ``timeout_s``): what was written ``after`` (a warm-up; with personal fields, also every
    account's first key, its Paxos rounds and its copy) would otherwise be flushed and
    compacted inside the timed window of whichever run comes next. Each timed run starts with
    empty memtables; its own writes are flushed in its window or not, as they would be."""
    from cqrs.devstack.nodetool import flush_and_compact
    from procmem import ComponentCpu

    took = flush_and_compact(cfg)
    services = stack_pids(cfg)
    started = time.monotonic()
    used: dict[str, float] = {}
    while time.monotonic() - started < timeout_s:
        cpu = ComponentCpu(services)
        time.sleep(1.0)
        used = {k: v for k, v in cpu.seconds().items() if k in services}
        if all(v < busy_core for v in used.values()):
            break
    print(f"{after}: Cassandra flushed and compacted in {took:.1f} s, the stack settled in "
          f"{time.monotonic() - started:.1f} s "
          f"({', '.join(f'{k} {v:.2f}' for k, v in used.items())} of a core last second)",
          flush=True)


def announce(label: str) -> list[float]:
    """Print the load average before a run; returns it (1, 5, 15 min) for the run's row."""
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"\n== {label} (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})", flush=True)
    return load


@contextlib.contextmanager
def served_http(app_ref: str, topic_prefix: str, timeout_s: float = 30.0) -> Iterator[Any]:
    """``cqrs serve APP`` in a subprocess on a free port (topics under ``topic_prefix``), and an
    ``httpx.Client`` on it once ``/health`` answers; the server is stopped on the way out."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "CQRS_KAFKA_TOPIC_PREFIX": topic_prefix,
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    server = subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", "serve", app_ref, "--port",
                               str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.3)
            yield http
    finally:
        server.terminate()
        server.wait(30)
