"""The Spark adapter of a process manager: a streaming query over the app's events topic.

Kafka source (official connector), checkpointed -> ``foreachBatch``: Spark SQL keeps only the
events the process manager reads (by the ``cqrs.message_type`` header), the driver takes them in
log order (partition, offset) and runs the :class:`~cqrs.process.reactor.Reactor`, then:

1. writes the commands (to the commands topic, derived ids), the conversation outcomes and
   the dead letters of failed reactions, and waits until Kafka acknowledged every one;
2. only then writes the changed instances (stateful process managers).

A crash anywhere re-runs the batch: the same commands again, with the same ids, which the
processor recognises (per process manager and source aggregate, forever), and instances that
skip the events they applied. One driver does the work of a process manager, so one instance
is never written by two tasks at once; a process manager reads only its events, and reacting
is cheap next to the processor's work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.envelope import Headers, from_kafka, to_kafka
from cqrs.errors import CqrsError
from cqrs.process.reactor import Reactor, ReactorOutput, SourceEvent, process_manager_of
from cqrs.processor.job import header_expr, publish_app_schemas
from cqrs.processor.step import DLQ_PREFIX
from cqrs.spark_session import with_trigger
from cqrs.topics import AppTopics, ensure_topics, topics_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from cqrs.app import App

__all__ = ["BatchReport", "ProcessManagerOptions", "ReactorRun", "checkpoint_for",
           "start_process_manager"]


class DeliveryError(CqrsError, RuntimeError):
    """Kafka did not acknowledge a batch's commands (the batch fails and is re-run)."""


@attrs.frozen
class ProcessManagerOptions:
    app_ref: str  # "module:attribute" of the App
    name: str  # the process manager's name
    checkpoint: str | None = None  # default: <checkpoint_dir>/<app>/process-managers/<name>
    max_events_per_trigger: int = 10_000
    trigger_interval: str | None = None


@attrs.frozen
class BatchReport:
    events: int  # events read (the process manager's types only)
    reacted: int
    skipped: int  # applied by their instance before
    commands: int
    outcomes: int
    failures: int
    seconds: float


def checkpoint_for(cfg: CqrsConfig, app_name: str, name: str) -> str:
    return cfg.spark.checkpoint_location(app_name, "process-managers", name)


class ReactorRun:
    """What one process manager's driver keeps between batches: the reactor, the codec bound
    to the schema store, the producer and the instance table. Also usable without Spark (the
    batch is a list of Kafka records), which is what :meth:`records` is for."""

    def __init__(self, cfg: CqrsConfig, app: App, name: str, topics: AppTopics) -> None:
        from cqrs.codec.kafka_schema_store import KafkaSchemaStore
        from cqrs.kafka_io import make_producer

        self.cfg = cfg
        self.app = app
        self.topics = topics
        self.reactor = Reactor(app, process_manager_of(app, name))
        self._schemas = KafkaSchemaStore(cfg.kafka.bootstrap_servers, topics.schemas,
                                         cfg.kafka.client_options())
        self.codec = app.codec_for(self._schemas)
        self.producer = make_producer(cfg)
        self.table: Any = None
        if self.reactor.stateful:
            from cqrs.process.instances import open_instance_table

            self.table = open_instance_table(cfg, self.codec, topics, name)

    def run(self, records: list[tuple[bytes | None, bytes | None, Headers, int, int]]) -> BatchReport:
        """React to a batch of event records ``(key, value, headers, partition, offset)``."""
        started = time.monotonic()
        records.sort(key=lambda r: (r[3], r[4]))
        sources: list[SourceEvent] = []
        unreadable: list[tuple[tuple[Any, ...], Exception]] = []
        wanted = set(self.reactor.event_types)
        for rec in records:
            key, value, headers, partition, offset = rec
            try:
                env, payload = from_kafka(key, value, headers)
                if env.message_type not in wanted:
                    continue
                sources.append(SourceEvent(env, self.codec.decode(payload), payload, partition, offset))
            except CqrsError as exc:
                unreadable.append((rec, exc))
        instances = self.table.read(self.reactor.keys(sources)) if self.table is not None else {}
        out = self.reactor.run(sources, instances)
        self._deliver(out, unreadable)
        if self.table is not None:
            self.table.write(out.instances)
        return BatchReport(len(sources), out.reacted, out.skipped, len(out.commands),
                           len(out.outcomes), len(out.failures) + len(unreadable),
                           time.monotonic() - started)

    def _deliver(self, out: ReactorOutput, unreadable: list[tuple[tuple[Any, ...], Exception]]) -> None:
        produce = self.producer.produce
        for c in out.commands:
            key, value, headers = to_kafka(c.envelope, self.codec.encode(c.command))
            produce(self.topics.commands, key=key, value=value, headers=headers or None)
        for o in out.outcomes:
            produce(self.topics.outcomes, key=o.correlation_id.encode(), value=self.codec.encode(o))
        name = self.reactor.pm.name
        for f in out.failures:
            src = f.source
            self._dead_letter(src.envelope.aggregate_id.encode(), None, src.partition, src.offset,
                              f.error_type, f"{name}: {f.message}", src)
        for rec, exc in unreadable:
            self._dead_letter(rec[0], rec[1], rec[3], rec[4], type(exc).__name__,
                              f"{name}: {exc}", None, rec[2])
        left = self.producer.flush(60)
        if left:
            raise DeliveryError(
                f"process manager {name!r}: Kafka did not acknowledge {left} records in 60 s "
                f"(is it reachable at {self.cfg.kafka.bootstrap_servers}?); the batch is re-run")

    def _dead_letter(self, key: bytes | None, value: bytes | None, partition: int, offset: int,
                     error_type: str, message: str, src: SourceEvent | None,
                     headers: Headers | None = None) -> None:
        if src is not None:
            key, value, headers = to_kafka(src.envelope, src.payload)
        dlq: Headers = [(k, v if v is not None else b"") for k, v in (headers or [])]
        dlq += [(f"{DLQ_PREFIX}stage", b"process_manager"),
                (f"{DLQ_PREFIX}error_type", error_type.encode()),
                (f"{DLQ_PREFIX}error", message.encode(errors="replace")[:4000]),
                (f"{DLQ_PREFIX}topic", self.topics.events.encode()),
                (f"{DLQ_PREFIX}partition", str(partition).encode()),
                (f"{DLQ_PREFIX}offset", str(offset).encode())]
        self.producer.produce(self.topics.dead_letters, key=key, value=value, headers=dlq)

    def close(self) -> None:
        self.producer.flush(30)
        self._schemas.close()
        if self.table is not None:
            self.table.close()


def start_process_manager(spark: SparkSession, cfg: CqrsConfig, opts: ProcessManagerOptions, *,
                          available_now: bool = False, starting_offsets: str = "earliest",
                          on_batch: Callable[[int, BatchReport], None] | None = None,
                          ) -> StreamingQuery:
    """Start the streaming query of one process manager."""
    from pyspark.sql import functions as F

    from cqrs.loading import load_app

    app = load_app(opts.app_ref)
    topics = topics_for(app.name, cfg.kafka.topic_prefix)
    ensure_topics(cfg, topics)
    publish_app_schemas(cfg, topics, app)
    run = ReactorRun(cfg, app, opts.name, topics)
    types = run.reactor.event_types
    source = (spark.readStream.format("kafka").options(**cfg.kafka.spark_options())
              .option("subscribe", topics.events)
              .option("startingOffsets", starting_offsets)
              .option("includeHeaders", "true")
              .option("failOnDataLoss", "true")
              .option("maxOffsetsPerTrigger", str(opts.max_events_per_trigger))
              .load())
    wanted = source.where(F.expr(header_expr("cqrs.message_type")).cast("string").isin(types))

    def batch(frame: DataFrame, batch_id: int) -> None:
        rows = frame.select("key", "value", "headers", "partition", "offset").collect()
        report = run.run([(r.key, r.value, [(h.key, h.value) for h in (r.headers or [])],
                           r.partition, r.offset) for r in rows])
        if on_batch is not None:
            on_batch(batch_id, report)

    writer = (wanted.writeStream.foreachBatch(batch)
              .option("checkpointLocation",
                      opts.checkpoint or checkpoint_for(cfg, app.name, opts.name))
              .queryName(f"cqrs-process-manager-{app.name}-{opts.name}"))
    return with_trigger(writer, available_now=available_now, interval=opts.trigger_interval).start()
