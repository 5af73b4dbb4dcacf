"""Smoke checks that prove each real piece end to end; used by ``cqrs smoke`` and the tests.

Each check returns what it measured so the caller (CLI or test) can show or assert it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import attrs

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.kafka_io import make_admin, make_producer, read_to_end
from cqrs.topics import delete_topics

__all__ = ["SmokeResult", "cassandra_roundtrip", "kafka_roundtrip", "run_all", "spark_kafka_pipeline"]


@attrs.frozen
class SmokeResult:
    name: str
    records: int
    seconds: float
    detail: str


def _create_topics(cfg: CqrsConfig, *names: str, partitions: int = 2) -> None:
    from confluent_kafka.admin import NewTopic

    admin = make_admin(cfg)  # must outlive its futures
    futures = admin.create_topics(
        [NewTopic(n, partitions, cfg.kafka.replication_factor) for n in names]
    )
    for f in futures.values():
        f.result(timeout=30)


def kafka_roundtrip(cfg: CqrsConfig, n: int = 1000) -> SmokeResult:
    """Produce ``n`` keyed records with confluent-kafka and consume them back."""
    topic = f"cqrs-smoke-kafka-{uuid.uuid4().hex[:8]}"
    _create_topics(cfg, topic)
    try:
        started = time.monotonic()
        producer = make_producer(cfg)
        sent = {(f"k{i % 50}".encode(), f"v{i}".encode()) for i in range(n)}
        for key, value in sent:
            producer.produce(topic, key=key, value=value)
        if producer.flush(30) != 0:
            raise CqrsError(f"{topic}: records still unsent after 30 s")
        got = [(r.key, r.value) for r in read_to_end(cfg, [topic], timeout_s=60)]
        if set(got) != sent:
            raise CqrsError(f"{topic}: sent {n} records, read back {len(got)} (or different ones)")
        return SmokeResult("kafka produce/consume", n, time.monotonic() - started, topic)
    finally:
        delete_topics(cfg, [topic])


def spark_kafka_pipeline(cfg: CqrsConfig, n: int = 1000) -> SmokeResult:
    """A Spark streaming query: Kafka source -> transform -> Kafka sink, run to completion."""
    from pyspark.sql import functions as F

    from cqrs.spark_session import spark_session

    src = f"cqrs-smoke-in-{uuid.uuid4().hex[:8]}"
    dst = f"cqrs-smoke-out-{uuid.uuid4().hex[:8]}"
    _create_topics(cfg, src, dst)
    try:
        producer = make_producer(cfg)
        for i in range(n):
            producer.produce(src, key=f"k{i % 50}".encode(), value=f"v{i}".encode())
        producer.flush(30)
        started = time.monotonic()
        spark = spark_session(cfg, "cqrs-smoke")
        source = (spark.readStream.format("kafka").options(**cfg.kafka.spark_options())
                  .option("subscribe", src).option("startingOffsets", "earliest").load())
        upper = source.select("key", F.upper(F.col("value").cast("string")).cast("binary").alias("value"))
        checkpoint = cfg.spark.checkpoint_location("smoke", dst)
        query = (upper.writeStream.format("kafka").options(**cfg.kafka.spark_options())
                 .option("topic", dst).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        got = [(r.key, r.value) for r in read_to_end(cfg, [dst], timeout_s=60)]
        expected = {(f"k{i % 50}".encode(), f"V{i}".encode()) for i in range(n)}
        if set(got) != expected:
            raise CqrsError(f"spark pipeline {src} -> {dst}: expected {n} upper-cased records, got {len(got)}")
        return SmokeResult("spark kafka source -> kafka sink", n, time.monotonic() - started, f"{src} -> {dst}")
    finally:
        delete_topics(cfg, [src, dst])


def cassandra_roundtrip(cfg: CqrsConfig, n: int = 1000) -> SmokeResult:
    """Create a keyspace and table, write ``n`` rows concurrently with a prepared statement, read them."""
    from cassandra.concurrent import execute_concurrent_with_args

    from cqrs.cassandra_io import cql_cluster

    keyspace = f"cqrs_smoke_{uuid.uuid4().hex[:8]}"
    cluster = cql_cluster(cfg.cassandra.contact_points(), cfg.cassandra.port)
    session = cluster.connect()
    started = time.monotonic()
    try:
        session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = {cfg.cassandra.replication}")
        session.execute(f"CREATE TABLE {keyspace}.kv (k text PRIMARY KEY, v bigint)")
        insert = session.prepare(f"INSERT INTO {keyspace}.kv (k, v) VALUES (?, ?)")
        results = execute_concurrent_with_args(session, insert, [(f"k{i}", i) for i in range(n)],
                                               concurrency=64)
        if not all(ok for ok, _ in results):
            raise CqrsError(f"{keyspace}.kv: some of the {n} inserts failed")
        rows = {r.k: r.v for r in session.execute(f"SELECT k, v FROM {keyspace}.kv")}
        if rows != {f"k{i}": i for i in range(n)}:
            raise CqrsError(f"{keyspace}.kv: wrote {n} rows, read back {len(rows)} (or different ones)")
        return SmokeResult("cassandra write/read", n, time.monotonic() - started, keyspace)
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        cluster.shutdown()


def run_all(cfg: CqrsConfig, say: Callable[[str], None] = print) -> list[SmokeResult]:
    results = []
    for check in (kafka_roundtrip, cassandra_roundtrip, spark_kafka_pipeline):
        result = check(cfg)
        say(f"ok  {result.name}: {result.records} records in {result.seconds:.1f} s ({result.detail})")
        results.append(result)
    return results
