"""The Spark floor of the command processor: what a stateless Kafka -> Kafka streaming query
costs on the same box, so the processor's figures can be read against it.

Two queries, both with Spark's own Kafka source and sink and the processor's session settings
(``cqrs.spark_session``): the commands topic copied to a second topic, key, value and headers
unchanged; and the same with a Python pass-through (``mapInArrow`` returning the Arrow batches
it is given) in the middle, the least a Python step costs. Fed with the same encoded commands
as the processor's runs; a copy is matched to its command by the ``cqrs.command_id`` header.

    floor_latency(cfg, spark, rate=500, seconds=30, aggregates=1000, arrow=False)
    floor_throughput(cfg, spark, commands=100_000, aggregates=1000, arrow=True)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cqrs.config import CqrsConfig
from cqrs.spark_session import with_trigger
from cqrs.testing.example import Deposit
from cqrs.testing.example_app import app

from harness import (
    ResultWatcher, announce, command_id_header, encode_all, fresh_topics,
    latency_summary, produce, timeout_for,
)
from procmem import MachineCpu, SparkMemorySampler

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["floor_latency", "floor_name", "floor_throughput", "start_copy_query"]


def floor_name(arrow: bool) -> str:
    return "spark floor + mapInArrow" if arrow else "spark floor"


def _pass_through(df: DataFrame) -> DataFrame:
    """``df`` through a Python worker and back, untouched: ``mapInArrow`` with the identity.

    The function is defined here, inside, so cloudpickle ships it by value: the workers need
    not import this script's folder.
    """
    def identity(batches: Iterator[Any]) -> Iterator[Any]:
        yield from batches

    return df.mapInArrow(identity, df.schema)


def start_copy_query(spark: SparkSession, cfg: CqrsConfig, source: str, target: str,
                     checkpoint: str, *, arrow: bool) -> StreamingQuery:
    """``source`` copied to ``target`` (key, value, headers), micro-batches back to back as the
    processor's query runs; with ``arrow`` the rows go through a Python identity on the way."""
    df = (spark.readStream.format("kafka").options(**cfg.kafka.spark_options())
          .option("subscribe", source)
          .option("startingOffsets", "earliest")
          .option("includeHeaders", "true")
          .option("failOnDataLoss", "true")
          .load()
          .select("key", "value", "headers"))
    if arrow:
        df = _pass_through(df)
    writer = (df.writeStream.format("kafka").options(**cfg.kafka.spark_options())
              .option("topic", target)
              .option("checkpointLocation", checkpoint)
              .queryName(f"bench-{floor_name(arrow).replace(' ', '-')}"))
    return with_trigger(writer).start()


class _CopyRun:
    """Fresh topics, a watcher on the copy topic and the copy query running (warmed up by a
    first small batch so the query's start-up is not measured)."""

    def __init__(self, cfg: CqrsConfig, spark: SparkSession, arrow: bool) -> None:
        self.cfg = cfg
        label = "floor-arrow" if arrow else "floor"
        self.topics = fresh_topics(cfg, app.name, label)
        self.watcher = ResultWatcher(cfg, self.topics.results, key_of=command_id_header)
        checkpoint = cfg.spark.checkpoint_location("bench", self.topics.commands.replace(".", "-"))
        self.query = start_copy_query(spark, cfg, self.topics.commands, self.topics.results,
                                      checkpoint, arrow=arrow)

    def __enter__(self) -> _CopyRun:
        self.watcher.start()
        warm = encode_all(app, [(f"acc-{n}", Deposit(1)) for n in range(100)])
        produce(self.cfg, self.topics.commands, warm)
        self.watcher.wait_for([r.cid for r in warm], 300, "warm-up", self.query)
        return self

    def __exit__(self, *exc: object) -> None:
        self.query.stop()
        self.watcher.stop()


def floor_latency(cfg: CqrsConfig, spark: SparkSession, *, rate: float, seconds: float,
                  aggregates: int, arrow: bool) -> dict[str, Any]:
    """Round trips (produce call -> copy consumed) at ``rate`` commands/s for ``seconds``."""
    name = floor_name(arrow)
    load = announce(f"{name}: latency, {rate:.0f}/s for {seconds:.0f} s")
    total = int(rate * seconds)
    records = encode_all(app, [(f"acc-{n % aggregates}", Deposit(1)) for n in range(total)])
    with _CopyRun(cfg, spark, arrow) as run, SparkMemorySampler() as mem:
        cpu = MachineCpu()
        sent_at: dict[bytes, float] = {}
        produce(cfg, run.topics.commands, records, sent_at=sent_at, rate=rate)
        ids = [r.cid for r in records]
        run.watcher.wait_for(ids, timeout_for(total, 600), "latency", run.query)
        rtt = [run.watcher.arrived[i] - sent_at[i] for i in ids]
        machine = cpu.percent()
    stats = latency_summary(rtt)
    print(f"RESULT {name} latency rate={rate:.0f}/s commands={total} p50_s={stats['p50_s']:.3f} "
          f"p99_s={stats['p99_s']:.3f} max_s={stats['max_s']:.3f}", flush=True)
    return {"system": name, "kind": "latency", "rate_per_s": rate, "seconds": seconds,
            "aggregates": aggregates, "commands": total, **stats, "rtt_s": [round(x, 4) for x in rtt],
            "loadavg": load, "machine_pct": machine, "memory": mem.peak().as_dict()}


def floor_throughput(cfg: CqrsConfig, spark: SparkSession, *, commands: int, aggregates: int,
                     arrow: bool) -> dict[str, Any]:
    """``commands`` copied as fast as they come: first produced -> last copy consumed."""
    name = floor_name(arrow)
    load = announce(f"{name}: throughput, {commands:,} commands")
    records = encode_all(app, [(f"acc-{n % aggregates}", Deposit(1 + n % 100)) for n in range(commands)])
    with _CopyRun(cfg, spark, arrow) as run, SparkMemorySampler() as mem:
        cpu = MachineCpu()
        started = time.monotonic()
        produce(cfg, run.topics.commands, records)
        produced = time.monotonic() - started
        last = run.watcher.wait_for([r.cid for r in records], timeout_for(commands), "timed", run.query)
        machine = cpu.percent()
    elapsed = last - started
    print(f"RESULT {name} throughput commands={commands} seconds={elapsed:.1f} "
          f"commands_per_s={commands / elapsed:,.0f} (producing took {produced:.1f} s)", flush=True)
    return {"system": name, "kind": "throughput", "aggregates": aggregates, "commands": commands,
            "seconds": round(elapsed, 3), "commands_per_s": round(commands / elapsed),
            "produce_seconds": round(produced, 3), "loadavg": load, "machine_pct": machine,
            "memory": mem.peak().as_dict()}
