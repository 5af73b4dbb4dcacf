"""The Spark adapter of the command processor: Kafka source -> transformWithState -> Kafka sink.

One streaming query per app. Records are grouped by (aggregate type, aggregate id); Spark's
keyed state (RocksDB provider, checkpointed) holds one :class:`~cqrs.results.AggregateRecord`
per aggregate as Avro bytes, so a single state read and write per aggregate per micro-batch.
All logic lives in :class:`~cqrs.processor.step.AggregateStep`; this module only moves rows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.kafka_io import watermarks
from cqrs.processor.step import AggregateStep, DedupPolicy, InputRecord
from cqrs.spark_session import with_trigger
from cqrs.topics import AppTopics, ensure_topics, topics_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cqrs.app import App
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "ProcessorOptions", "build_processor_stream", "checkpoint_for", "header_expr", "publish_app_schemas",
    "start_processor",
]

STATE_NAME = "aggregate"


@attrs.frozen
class ProcessorOptions:
    """What one processor query needs besides the configuration."""

    app_ref: str  # "module:attribute" of the App, importable on every executor
    topics: AppTopics | None = None  # default: topics_for(app.name, kafka.topic_prefix)
    checkpoint: str | None = None  # default: <checkpoint_dir>/<app>/processor
    dedup: DedupPolicy = DedupPolicy()
    max_offsets_per_trigger: int | None = None
    trigger_interval: str | None = None  # e.g. "500 milliseconds"; None: as fast as possible
    # partitions of the results topic, so a command's reply partition can be honoured; filled
    # in by start_processor from the topic's metadata
    results_partitions: int | None = None


def checkpoint_for(cfg: CqrsConfig, app_name: str) -> str:
    return cfg.spark.checkpoint_location(app_name, "processor")


# Executors build the step once per Python worker process and reuse it across batches.
_STEPS: dict[tuple[str, str], AggregateStep] = {}
_STEPS_LOCK = threading.Lock()


def _step_for(cfg: CqrsConfig, opts: ProcessorOptions) -> AggregateStep:
    cache_key = (repr(cfg), repr(opts))
    with _STEPS_LOCK:
        step = _STEPS.get(cache_key)
        if step is None:
            from cqrs.codec.kafka_schema_store import KafkaSchemaStore
            from cqrs.loading import load_app

            app = load_app(opts.app_ref)
            topics = opts.topics or topics_for(app.name, cfg.kafka.topic_prefix)
            store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, topics.schemas,
                                     cfg.kafka.client_options())
            step = AggregateStep(app, app.codec_for(store), topics, opts.dedup,
                                 results_partitions=opts.results_partitions)
            _STEPS[cache_key] = step
        return step


def _processor_class() -> type:
    """The StatefulProcessor subclass (built lazily: pyspark is imported only when used)."""
    from pyspark.sql import Row
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
    from pyspark.sql.types import BinaryType, StructField, StructType

    state_schema = StructType([StructField("record", BinaryType(), False)])

    class CommandProcessor(StatefulProcessor):  # type: ignore[misc]
        def __init__(self, cfg: CqrsConfig, opts: ProcessorOptions) -> None:
            self.cfg = cfg
            self.opts = opts

        def init(self, handle: StatefulProcessorHandle) -> None:
            self.state = handle.getValueState(STATE_NAME, state_schema)
            self.step = _step_for(self.cfg, self.opts)

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            aggregate_type, aggregate_id = key
            records = [
                InputRecord(r.key, r.value, [_header(h) for h in (r.headers or ())],
                            r.partition, r.offset, r.topic)
                for r in rows
            ]
            has_state = aggregate_type is not None and aggregate_id is not None
            current = None
            if has_state:
                stored = self.state.get()  # None when absent: one round trip, not two
                if stored is not None:
                    current = self.step.load_state(stored[0])
            new_state, out = self.step.run(aggregate_type, aggregate_id, current, records)
            if new_state is not None and has_state:
                self.state.update((self.step.dump_state(new_state),))
            for rec in out:
                yield Row(topic=rec.topic, key=rec.key, value=rec.value, headers=rec.headers,
                          partition=rec.partition)

        def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:  # noqa: N802, N803
            """Seed an aggregate's record (only when started with an initial state: rebuilds)."""
            self.state.update((bytes(initialState["record"]),))

        def close(self) -> None:
            pass

    return CommandProcessor


HEADER_POSITIONS = 16


def header_expr(name: str) -> str:
    """Spark SQL for the value of the Kafka header ``name`` of a record (NULL when absent; the
    first one when repeated).

    The first :data:`HEADER_POSITIONS` headers are looked at by position in a ``CASE`` that
    Spark compiles; only a record whose header is further back (or missing) falls back to
    ``filter`` over the array. The fallback alone would do, but Spark evaluates a lambda
    without code generation and, in Spark 4.2, re-reads the SQL configuration for every array
    element it touches: that made header parsing most of the projector's JVM time.
    """
    cases = " ".join(f"WHEN get(headers, {i}).key = '{name}' THEN get(headers, {i}).value"
                     for i in range(HEADER_POSITIONS))
    return f"CASE {cases} ELSE try_element_at(filter(headers, h -> h.key = '{name}'), 1).value END"


def _header(h: Any) -> tuple[str, bytes | None]:
    """A Kafka header as (name, value): Spark hands structs over as dicts (Arrow) or Rows."""
    if isinstance(h, dict):
        return h["key"], h["value"]
    return h[0], h[1]


def output_schema() -> Any:
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, StringType, StructField, StructType,
    )

    return StructType([
        StructField("topic", StringType(), False),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", ArrayType(StructType([
            StructField("key", StringType(), False),
            StructField("value", BinaryType(), True),
        ])), True),
        StructField("partition", IntegerType(), True),  # NULL: partitioned by key
    ])


def build_processor_stream(spark: SparkSession, cfg: CqrsConfig, opts: ProcessorOptions,
                           topics: AppTopics, *, starting_offsets: str = "earliest",
                           initial_state: DataFrame | None = None) -> DataFrame:
    """The processor's streaming DataFrame: one row per record to write.

    ``initial_state`` (columns aggregate_type, aggregate_id, record) seeds the state of a fresh
    checkpoint and ``starting_offsets`` (Spark's JSON form) skips commands already answered:
    both are for :mod:`cqrs.processor.rebuild`.
    """
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("kafka").options(**cfg.kafka.spark_options())
              .option("subscribe", topics.commands)
              .option("startingOffsets", starting_offsets)
              .option("includeHeaders", "true")
              .option("failOnDataLoss", "true"))
    if opts.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(opts.max_offsets_per_trigger))
    source = reader.load()
    aggregate_type = F.expr(header_expr("cqrs.aggregate_type")).cast("string")
    keyed = source.select(
        aggregate_type.alias("aggregate_type"),
        F.col("key").cast("string").alias("aggregate_id"),
        "key", "value", "headers", "topic", "partition", "offset",
    )
    return keyed.groupBy("aggregate_type", "aggregate_id").transformWithState(
        statefulProcessor=_processor_class()(cfg, opts),
        outputStructType=output_schema(),
        outputMode="Append",
        timeMode="None",
        initialState=(initial_state.groupBy("aggregate_type", "aggregate_id")
                      if initial_state is not None else None),
    )


def publish_app_schemas(cfg: CqrsConfig, topics: AppTopics, app: App) -> None:
    """Check the app's classes against every stored schema, then publish theirs."""
    from cqrs.codec.kafka_schema_store import KafkaSchemaStore
    from cqrs.codec.registry import check_compatibility

    store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, topics.schemas, cfg.kafka.client_options())
    try:
        codec = app.codec_for(store)
        check_compatibility(store, codec)  # refuse code that cannot read the stored messages
        codec.publish_schemas()  # executors then find every schema they write
    finally:
        store.close()


def start_processor(spark: SparkSession, cfg: CqrsConfig, opts: ProcessorOptions,
                    *, available_now: bool = False, starting_offsets: str = "earliest",
                    initial_state: DataFrame | None = None, name_suffix: str = "") -> StreamingQuery:
    """Create the topics if missing, publish the app's schemas and start the query."""
    from cqrs.loading import load_app

    app = load_app(opts.app_ref)
    topics = opts.topics or topics_for(app.name, cfg.kafka.topic_prefix)
    ensure_topics(cfg, topics)
    opts = attrs.evolve(opts, results_partitions=len(watermarks(cfg, topics.results)))
    publish_app_schemas(cfg, topics, app)
    stream = build_processor_stream(spark, cfg, opts, topics, starting_offsets=starting_offsets,
                                    initial_state=initial_state)
    writer = (stream.writeStream.format("kafka").options(**cfg.kafka.spark_options())
              .option("checkpointLocation", opts.checkpoint or checkpoint_for(cfg, app.name))
              .queryName(f"cqrs-processor-{app.name}{name_suffix}"))
    return with_trigger(writer, available_now=available_now, interval=opts.trigger_interval).start()
