"""The Spark adapter of the command processor: one streaming query per app, one task per Kafka
partition slice, the aggregate state in a Cassandra table.

Each micro-batch, the query's source (:mod:`cqrs.processor.source`) plans one task per commands
partition with new records (every command of an aggregate shares a partition, so a task sees all
of its aggregates' commands, in offset order). The task reads its slice in the Python worker and
:func:`~cqrs.processor.partition.process_slice` reads the slice's aggregate states in batches,
runs the shared :class:`~cqrs.processor.step.AggregateStep`, writes the records to Kafka and
then the states to the aggregate-state table (:mod:`cqrs.processor.state_table`). No shuffle,
no Spark state: the checkpoint holds only the source offsets, so the number of Spark partitions
is free to change, and the state is readable by anyone without Spark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from cqrs.config import CqrsConfig
from cqrs.kafka_io import watermarks
from cqrs.processor.changelog import check_state_store
from cqrs.processor.partition import STATS_FIELDS, SliceStats
# the options and workers live with neither the job nor its source, which both need them;
# re-exported: ``from cqrs.processor.job import ProcessorOptions`` is how apps start a processor
from cqrs.processor.workers import ProcessorOptions, step_for, worker_for
from cqrs.spark_session import with_trigger
from cqrs.topics import AppTopics, ensure_topics, topics_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from cqrs.app import App

__all__ = [
    "ProcessorOptions", "check_app_schemas", "checkpoint_for", "header_expr", "prepare_processor",
    "publish_app_schemas", "start_processor", "step_for", "worker_for",
]


def checkpoint_for(cfg: CqrsConfig, app_name: str) -> str:
    """The processor's default checkpoint: ``<checkpoint_dir>/<topic prefix><app>/processor``
    (the prefix in it: processors of one app under two prefixes read different topics, and
    one's offsets would skip the other's commands)."""
    return cfg.spark.checkpoint_location(f"{cfg.kafka.topic_prefix}{app_name}", "processor")


HEADER_POSITIONS = 16


def header_expr(name: str) -> str:
    """Spark SQL for the value of the Kafka header ``name`` of a record (NULL when absent; the
    first one when repeated).

    The first :data:`HEADER_POSITIONS` headers are looked at by position in a ``CASE`` that
    Spark compiles; only a record whose header is further back falls back to ``filter`` over
    the array (a header missing from a shorter array is NULL without it). The fallback alone
    would do, but Spark evaluates a lambda without code generation and, in Spark 4.2, re-reads
    the SQL configuration for every array element it touches: that made header parsing most of
    the projector's JVM time.
    """
    cases = " ".join(f"WHEN get(headers, {i}).key = '{name}' THEN get(headers, {i}).value"
                     for i in range(HEADER_POSITIONS))
    # a header missing from a short array is NULL at once: the filter would be the slow path
    # for every record that lacks an optional header
    return (f"CASE {cases} WHEN size(headers) <= {HEADER_POSITIONS} THEN NULL "
            f"ELSE try_element_at(filter(headers, h -> h.key = '{name}'), 1).value END")


def publish_app_schemas(cfg: CqrsConfig, topics: AppTopics, app: App) -> None:
    """Check the app's classes against every stored schema, then publish theirs."""
    check_app_schemas(cfg, topics, app, publish=True)


def check_app_schemas(cfg: CqrsConfig, topics: AppTopics, app: App, *,
                      publish: bool = False) -> None:
    """Refuse an app whose classes cannot read the messages its schemas topic describes
    (:class:`~cqrs.errors.IncompatibleSchemaError`, naming each type and field): the check every
    job runs before it starts, the processor, the projectors and a rebuild alike. An app with
    personal fields also opens its key store here (:func:`~cqrs.personal.stack.key_store_for`),
    so a missing master key stops the job now, not in a task, and the key table exists before
    executors use it. ``publish``: then publish the app's schemas (a job that writes messages:
    executors find them there)."""
    from cqrs.codec.kafka_schema_store import KafkaSchemaStore
    from cqrs.codec.registry import check_compatibility
    from cqrs.personal.stack import key_store_for

    key_store = key_store_for(cfg, app)  # before Kafka: a missing master key is said first
    store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, topics.schemas, cfg.kafka.client_options())
    try:
        codec = app.codec_for(store, key_store=key_store)
        check_compatibility(store, codec)  # refuse code that cannot read the stored messages
        if publish:
            codec.publish_schemas()  # executors then find every schema they write
    finally:
        store.close()


def _tasks(cfg: CqrsConfig, spark: SparkSession) -> int:
    """Tasks per micro-batch: the setting, else the cores of local[N], else Spark's default."""
    import os
    import re

    if cfg.processor.tasks > 0:
        return cfg.processor.tasks
    local = re.fullmatch(r"local\[(\d+|\*)\]", spark.sparkContext.master)
    if local is not None:
        return os.cpu_count() or 1 if local.group(1) == "*" else int(local.group(1))
    return int(spark.sparkContext.defaultParallelism)


SCHEDULER_POOL = "spark.scheduler.pool"
PROCESSOR_POOL = "cqrs-processor"


def prepare_processor(cfg: CqrsConfig, opts: ProcessorOptions) -> ProcessorOptions:
    """What :func:`start_processor` does before it starts the query: the app's topics and state
    table created if missing (the state generation made current when there is none) and its
    schemas published; returns ``opts`` with the topics, the state generation and the results
    topic's partitions filled in. It takes ~2 s of round trips to Kafka and Cassandra and no
    Spark, so a driver starting several processors prepares them at once in threads, then
    starts each with what this returned (``start_processor`` does not prepare again options
    whose ``results_partitions`` is set)."""
    from cqrs.loading import load_app
    from cqrs.processor.state_table import open_state_table

    app = load_app(opts.app_ref)
    topics = opts.topics or topics_for(app.name, cfg.kafka.topic_prefix)
    ensure_topics(cfg, topics)
    table = open_state_table(cfg, topics)
    try:
        generation = opts.state_generation or table.ensure_current()
        table.ensure(generation)
        check_state_store(cfg, table, topics, generation)
    finally:
        table.close()
    publish_app_schemas(cfg, topics, app)
    return attrs.evolve(opts, topics=topics, results_partitions=len(watermarks(cfg, topics.results)),
                        state_generation=generation,
                        max_offsets_per_trigger=(opts.max_offsets_per_trigger
                                                 or cfg.processor.max_commands_per_batch or None))


def start_processor(spark: SparkSession, cfg: CqrsConfig, opts: ProcessorOptions,
                    *, available_now: bool = False, starting_offsets: str = "earliest",
                    name_suffix: str = "", continuous: bool = False, stop_file: str | None = None,
                    on_batch: Callable[[int, SliceStats], None] | None = None) -> StreamingQuery:
    """Create the topics and the state table if missing, publish the app's schemas
    (:func:`prepare_processor`, unless ``opts`` came from it) and start the query (on the
    current state generation unless ``opts`` names one).

    ``continuous``: for a driver that runs the processor alone (``cqrs run processor``): its
    serving tasks run back to back also when nothing arrives, one per core unless ``[processor]
    quiet_tasks`` says otherwise, so a burst is taken at once. Otherwise micro-batches follow
    commands as they arrive, a quiet stream is served by one task and the other cores stay free
    for the driver's other queries (and ``processAllAvailable`` returns).

    ``stop_file`` (from :func:`~cqrs.processor.source.new_stop_file`): touching it makes the
    source plan no more micro-batches, so the query can be stopped between two of them
    (:func:`~cqrs.spark_session.stop_between_batches`) instead of in the middle of one."""
    from cqrs.loading import load_app
    from cqrs.processor.source import (
        SOURCE_NAME, SourceSettings, command_source_options, register_source,
    )

    app = load_app(opts.app_ref)
    if opts.results_partitions is None:
        opts = prepare_processor(cfg, opts)
    topics = opts.topics
    assert topics is not None
    register_source(spark)
    tasks = _tasks(cfg, spark)
    quiet = cfg.processor.quiet_tasks or (tasks if continuous else 1)
    settings = SourceSettings(cfg, opts, topics.commands, starting_offsets, tasks=tasks,
                              serve_s=0.0 if available_now else cfg.processor.serve_seconds,
                              quiet_tasks=min(tasks, quiet), continuous=continuous and not available_now,
                              stop_file=stop_file)
    source = (spark.readStream.format(SOURCE_NAME).options(**command_source_options(settings))
              .load())

    def batch(frame: DataFrame, batch_id: int) -> None:
        total = SliceStats()
        for r in frame.collect():
            total.add(SliceStats(**{f: r[f] for f in STATS_FIELDS}))
        if on_batch is not None:
            on_batch(batch_id, total)

    writer = (source.writeStream.foreachBatch(batch)
              .option("checkpointLocation", opts.checkpoint or checkpoint_for(cfg, app.name))
              .queryName(f"cqrs-processor-{app.name}{name_suffix}"))
    # The query's jobs run in a scheduler pool of their own (its thread inherits this thread's
    # local properties as it starts): when a serving task ends, the next one gets the first
    # core that frees up, instead of queueing behind every task of a projector's batch that
    # was submitted meanwhile (in `cqrs run app` that wait was up to a projector batch, ~1.5 s
    # on 2 cores, during which no command was answered).
    context = spark.sparkContext
    pool = context.getLocalProperty(SCHEDULER_POOL)
    context.setLocalProperty(SCHEDULER_POOL, PROCESSOR_POOL)
    try:
        return with_trigger(writer, available_now=available_now,
                            interval=opts.trigger_interval).start()
    finally:
        context.setLocalProperty(SCHEDULER_POOL, pool)  # type: ignore[arg-type]
