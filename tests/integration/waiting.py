"""Waiting in integration tests for something the jobs do asynchronously."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["micro_batches_begun", "table_exists", "topic_from_start", "wait_for"]


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0,
             log: Callable[[], str] = str, every: float = 0.3) -> Any:
    """``check()``'s first truthy value, polled every ``every`` seconds; after ``timeout`` an
    AssertionError naming ``what`` (with ``log()``, e.g. a job's output)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{log()}")


def topic_from_start(cfg: Any, topic: str) -> Any:
    """A consumer assigned to every partition of ``topic`` from its start, to hear records as
    the broker has them (``cqrs.kafka_io.take``) instead of reading the topic to its end again
    and again; the caller closes it."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from cqrs.kafka_io import make_consumer

    consumer = make_consumer(cfg)
    found = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in found.partitions])
    return consumer


def table_exists(cfg: Any, table: str) -> bool:
    """Whether ``table`` is in the schema of ``cfg``'s keyspace (read from ``system_schema``,
    so without preparing a statement on a table another process may be creating)."""
    from cqrs.cassandra_io import cql_cluster

    cluster = cql_cluster(cfg.cassandra.contact_points(), cfg.cassandra.port)
    try:
        rows = cluster.connect().execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s AND "
            "table_name = %s", (cfg.cassandra.keyspace, table))
        return bool(list(rows))
    finally:
        cluster.shutdown()


def micro_batches_begun(checkpoints: Path) -> int:
    """How many micro-batches the streaming queries checkpointed under ``checkpoints`` have
    begun: Spark writes ``<query checkpoint>/offsets/<batch>`` as a batch starts (a restarted
    query re-runs its unfinished batch under the same file). With it a test waits until a job it
    started has begun work, where a fixed sleep would guess how long its start takes."""
    return sum(1 for path in checkpoints.glob("**/offsets/*") if path.name.isdigit())
