"""Benchmark of the command processor, end to end on the real stack. Prints figures.

    python bench/processor.py                       # both throughput runs and the latency run
    python bench/processor.py --aggregates 1000 --commands 100000 --no-latency

Throughput: the processor runs as a streaming query (micro-batches back to back); every
aggregate is opened first (warm-up, not timed); then ``--commands`` deposits spread evenly over
the aggregates are produced as fast as possible; the figure is commands / (time from the first
command produced to the last result readable in the results topic).

Latency: commands offered at a fixed rate (``--rate``, default 500/s) for ``--seconds``; the
round trip of each is the time from its produce call to its result being consumed.

Needs the local stack (``cqrs dev up``) or CQRS_* settings naming one. Uses fresh topics.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cqrs.client import encode_command  # noqa: E402
from cqrs.config import CqrsConfig, load_config  # noqa: E402
from cqrs.kafka_io import make_consumer, make_producer  # noqa: E402
from cqrs.processor.job import ProcessorOptions, start_processor  # noqa: E402
from cqrs.spark_session import spark_session  # noqa: E402
from cqrs.testing.example import Deposit, OpenAccount  # noqa: E402
from cqrs.testing.example_app import app  # noqa: E402
from cqrs.topics import AppTopics, ensure_topics, topics_for  # noqa: E402

APP_REF = "cqrs.testing.example_app:app"


class ResultWatcher(threading.Thread):
    """Consumes the results topic and records when each command id's result arrived."""

    def __init__(self, cfg: CqrsConfig, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = make_consumer(cfg)
        self.consumer.subscribe([topic])
        self.arrived: dict[bytes, float] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            for msg in self.consumer.consume(num_messages=5000, timeout=0.2):
                if msg.error() is None:
                    now = time.monotonic()
                    with self.lock:
                        self.arrived.setdefault(msg.key(), now)
        self.consumer.close()

    def wait_for(self, ids: list[bytes], timeout_s: float, label: str) -> float:
        deadline = time.monotonic() + timeout_s
        last_report = 0.0
        while time.monotonic() < deadline:
            with self.lock:
                missing = sum(1 for i in ids if i not in self.arrived)
                if missing == 0:
                    return max(self.arrived[i] for i in ids)
            if time.monotonic() - last_report > 10:
                print(f"  {label}: {len(ids) - missing}/{len(ids)} results", flush=True)
                last_report = time.monotonic()
            time.sleep(0.2)
        raise SystemExit(f"{label}: {missing} of {len(ids)} results missing after {timeout_s:.0f} s")


def produce(cfg: CqrsConfig, topics: AppTopics, commands: list[tuple[str, object]],
            sent_at: dict[bytes, float] | None = None, rate: float | None = None) -> list[bytes]:
    producer = make_producer(cfg, **{"linger.ms": 20, "batch.size": 1_000_000})
    ids: list[bytes] = []
    started = time.monotonic()
    for n, (aggregate_id, command) in enumerate(commands):
        if rate is not None:
            pause = started + n / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        cid, key, value, headers = encode_command(app, aggregate_id, command)
        while True:
            try:
                producer.produce(topics.commands, key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
        if sent_at is not None:
            sent_at[cid.encode()] = time.monotonic()
        ids.append(cid.encode())
        if n % 1000 == 0:
            producer.poll(0)
    producer.flush(60)
    return ids


@contextlib.contextmanager
def running_processor(cfg: CqrsConfig, spark: object, aggregates: int) -> Iterator[tuple[AppTopics, ResultWatcher, object]]:
    """Fresh topics, a results watcher and a running processor with every account opened."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}-"
    topics = topics_for(app.name, prefix)
    ensure_topics(cfg, topics)
    watcher = ResultWatcher(cfg, topics.results)
    watcher.start()
    opts = ProcessorOptions(APP_REF, topics=topics,
                            checkpoint=cfg.spark.checkpoint_location("bench", prefix + "processor"))
    query = start_processor(spark, cfg, opts)
    try:
        print(f"warm-up: opening {aggregates:,} accounts", flush=True)
        opened = produce(cfg, topics, [(f"acc-{a}", OpenAccount(f"owner {a}")) for a in range(aggregates)])
        watcher.wait_for(opened, 900, "warm-up")
        yield topics, watcher, query
    finally:
        query.stop()
        watcher.stopped.set()


def throughput(cfg: CqrsConfig, spark: object, aggregates: int, commands: int) -> float:
    with running_processor(cfg, spark, aggregates) as (topics, watcher, query):
        work = [(f"acc-{n % aggregates}", Deposit(1 + n % 100)) for n in range(commands)]
        print(f"timed: {commands:,} deposits over {aggregates:,} aggregates", flush=True)
        started = time.monotonic()
        ids = produce(cfg, topics, work)
        produced = time.monotonic() - started
        last = watcher.wait_for(ids, 1800, "timed")
        elapsed = last - started
        rate = commands / elapsed
        print(f"RESULT throughput aggregates={aggregates} commands={commands} "
              f"seconds={elapsed:.1f} commands_per_s={rate:,.0f} (producing took {produced:.1f} s)",
              flush=True)
        report_batches(query)
        return rate


def report_batches(query: object) -> None:
    """Where the micro-batches spent their time (Spark's own progress reports)."""
    batches = [p for p in query.recentProgress if p.get("numInputRows")]  # type: ignore[attr-defined]
    if not batches:
        return
    phases: dict[str, float] = {}
    for p in batches:
        for phase, ms in p.get("durationMs", {}).items():
            phases[phase] = phases.get(phase, 0.0) + ms
    rows = sum(p["numInputRows"] for p in batches)
    print(f"  {len(batches)} batches, {rows / len(batches):,.0f} commands per batch; total ms by phase: "
          + ", ".join(f"{k}={v:,.0f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1])),
          flush=True)


def latency(cfg: CqrsConfig, spark: object, rate: float, seconds: float, aggregates: int) -> tuple[float, float]:
    with running_processor(cfg, spark, aggregates) as (topics, watcher, _):
        total = int(rate * seconds)
        print(f"offering {rate:.0f} commands/s for {seconds:.0f} s ({total:,} commands)", flush=True)
        sent_at: dict[bytes, float] = {}
        ids = produce(cfg, topics, [(f"acc-{n % aggregates}", Deposit(1)) for n in range(total)],
                      sent_at=sent_at, rate=rate)
        watcher.wait_for(ids, 600, "latency")
        rtt = sorted(watcher.arrived[i] - sent_at[i] for i in ids)
        p50 = statistics.median(rtt)
        p99 = rtt[int(len(rtt) * 0.99) - 1]
        print(f"RESULT latency rate={rate:.0f}/s commands={total} p50_s={p50:.3f} p99_s={p99:.3f} "
              f"max_s={rtt[-1]:.3f}", flush=True)
        return p50, p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aggregates", type=int, nargs="*", default=[1000, 100_000])
    parser.add_argument("--commands", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--no-throughput", action="store_true")
    args = parser.parse_args()

    cfg = load_config()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"Spark master {cfg.spark.master}, {cfg.spark.shuffle_partitions} state partitions, "
          f"{cfg.kafka.default_partitions} topic partitions", flush=True)
    spark = spark_session(cfg, "cqrs-bench-processor")
    if not args.no_throughput:
        for aggregates in args.aggregates:
            throughput(cfg, spark, aggregates, args.commands)
    if not args.no_latency:
        latency(cfg, spark, args.rate, args.seconds, aggregates=1000)


if __name__ == "__main__":
    main()
