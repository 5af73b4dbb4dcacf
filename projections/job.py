"""The projector: a Spark Structured Streaming query per projection over the events topic.

Kafka source (official connector) -> ``foreachBatch``: the batch is handed, one Spark partition
(= one Kafka partition's slice, in offset order) at a time, to :func:`projections.apply.apply_batch`
inside the executors via ``mapInArrow``; each Python worker keeps one store session (Cassandra:
prepared statements executed concurrently) and one dead-letter producer. Only a small stats row
per partition comes back to the driver, which records the positions.

Each projection has its own checkpoint per generation: ``<checkpoint_dir>/<app>/projections/
<projection>/g<generation>``.

The driver also records the views a batch parked, and (unless ``available_now``) a timer of the
same driver replays their dead letters after the app's backoff, between two micro-batches
(:mod:`projections.dlq_retry`): :func:`start_projector` then returns the query and the timer as
one :class:`cqrs.retrier.job.RetrierQuery`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from cqrs.budget import BudgetedThread
from cqrs.config import CqrsConfig, cache_key
from cqrs.errors import IncompatibleSchemaError
from cqrs.processor.job import check_app_schemas, header_expr
from cqrs.spark_session import with_trigger
from cqrs.topics import AppTopics, topics_for
from projections.apply import BatchStats, Target, apply_within_budget
from projections.dlq import dead_letter_topic, ensure_dead_letter_topic, to_dlq_record
from projections.dlq_retry import Parking, ProjectionRetrier, RoundStats, parkings_of
from projections.errors import ProjectionStoreError
from projections.positions import topic_offsets
from projections.records import EventRecord
from projections.personal import stack_store
from projections.stores import cached_store
from projections.store import table_base

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from cqrs.app import App

__all__ = [
    "ProjectorOptions",
    "apply_frame",
    "apply_frame_parking",
    "apply_ranges",
    "balanced_shares",
    "check_schemas",
    "checkpoint_for",
    "event_frame",
    "offsets_json",
    "start_projector",
    "start_warming",
]


@attrs.frozen
class ProjectorOptions:
    """One projector query: which app and projection, where, how much per batch."""

    app_ref: str  # "module:attribute", importable on every executor
    projection: str
    topic_prefix: str | None = None  # default: kafka.topic_prefix
    max_events_per_trigger: int | None = None  # default: projections.max_events_per_trigger
    trigger_interval: str | None = None


def checkpoint_for(cfg: CqrsConfig, app_name: str, projection: str, generation: int) -> str:
    return cfg.spark.checkpoint_location(app_name, "projections", projection, f"g{generation}")


# --- executor side ----------------------------------------------------------------------------

_CONTEXTS: dict[str, Any] = {}
_CONTEXTS_LOCK = threading.Lock()


class _WorkerContext:
    """What a Python worker builds once: app, decoding codec, store, dead-letter producer."""

    def __init__(self, cfg: CqrsConfig, opts: ProjectorOptions) -> None:
        from cqrs.codec.kafka_schema_store import KafkaSchemaStore
        from cqrs.loading import load_app
        from cqrs.personal.stack import key_store_for
        from projections.model import find_projection

        self.cfg = cfg
        self.app = load_app(opts.app_ref)
        prefix = cfg.kafka.topic_prefix if opts.topic_prefix is None else opts.topic_prefix
        topics = topics_for(self.app.name, prefix)
        key_store = key_store_for(cfg, self.app)  # once per worker process, on first use
        schemas = KafkaSchemaStore(cfg.kafka.bootstrap_servers, topics.schemas,
                                   cfg.kafka.client_options())
        self.codec = self.app.codec_for(schemas, key_store=key_store)
        self.decode = self.codec.decode
        self.projection = find_projection(self.app, opts.projection)
        self.dlq_topic = dead_letter_topic(self.app.name, prefix)
        self.store = stack_store(cached_store(cfg), cfg, self.app)  # personal columns sealed
        self._producer: Any = None
        # the handlers run in a thread of their own, under [processor] decision_budget_s
        self.applying = BudgetedThread(f"cqrs-projecting-{opts.projection}")

    def apply(self, target: Target, records: Sequence[EventRecord],
              dead_letter: Callable[[Any], None]) -> BatchStats:
        """:func:`apply_batch` under the decision budget (:func:`apply_within_budget`)."""
        return apply_within_budget(self.applying, self.cfg.processor.decision_budget_s,
                                   self.store, target, records, self.decode, dead_letter)

    def send_dead_letters(self, letters: Any) -> None:
        from cqrs.kafka_io import make_producer

        if self._producer is None:
            self._producer = make_producer(self.cfg)
        failed: list[Any] = []  # a failed delivery leaves flush nothing to wait for

        def delivered(error: Any, _: Any) -> None:
            if error is not None:
                failed.append(error)

        for dl in letters:
            key, value, headers = to_dlq_record(self.projection.name, dl)
            self._producer.produce(self.dlq_topic, key=key, value=value, headers=headers,
                                   on_delivery=delivered)
        left = self._producer.flush(60)
        if left or failed:
            why = f"Kafka refused {len(failed)}: {failed[0]}" if failed else f"{left} not sent in 60 s"
            raise ProjectionStoreError(
                f"could not write {len(letters)} dead letters to {self.dlq_topic!r} ({why}): the "
                "batch fails rather than park views without their letters; check the topic and "
                "the brokers")


def _context(cfg: CqrsConfig, opts: ProjectorOptions) -> _WorkerContext:
    key = cache_key(cfg, opts)
    with _CONTEXTS_LOCK:
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            ctx = _CONTEXTS[key] = _WorkerContext(cfg, opts)
        return ctx


STATS_FIELDS = ("events", "applied", "aggregates", "dead_letters")
EVENT_COLUMNS = ("aggregate_id", "aggregate_type", "message_type", "version", "value", "timestamp",
                 "partition", "offset")
EVENT_SCHEMA = ("aggregate_id string, aggregate_type string, message_type string, version long, "
                "value binary, timestamp string, partition int, offset long")


def _records(batches: Iterator[Any]) -> Iterator[tuple[Any, list[EventRecord]]]:
    for batch in batches:
        c = batch.to_pydict()
        yield batch, list(map(EventRecord, *(c[name] for name in EVENT_COLUMNS)))


def _view_key_fn(cfg: CqrsConfig, opts: ProjectorOptions) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Adds ``view_key`` (a re-keyed projection's ``key_of``; null when ignored) to each event,
    so that the frame can be partitioned by it."""
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from projections.model import RekeyedProjection
        from projections.rekeyed import group_by_view

        ctx = _context(cfg, opts)
        projection = ctx.projection
        assert isinstance(projection, RekeyedProjection)
        for batch, records in _records(batches):
            wanted = [r for r in records if r.aggregate_type == projection.aggregate_type]
            ctx.codec.prefetch_keys(r.value for r in wanted  # personal data: keys at once
                                    if projection.handler_for(r.message_type) is not None)
            key_at = {(r.partition, r.offset): key
                      for key, items in group_by_view(projection, wanted, ctx.decode).items()
                      for r, _ in items}
            keys = pa.array([key_at.get((r.partition, r.offset)) for r in records], pa.string())
            yield pa.RecordBatch.from_arrays([*batch.columns, keys],
                                             names=[*batch.schema.names, "view_key"])
    return run


def _partition_fn(cfg: CqrsConfig, opts: ProjectorOptions, base: str,
                  generation: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from cqrs.collector import paused

        ctx = _context(cfg, opts)
        target = Target(ctx.projection, base, generation)
        letters: list[Any] = []

        def dead_letter(dead: Any) -> None:
            ctx.send_dead_letters(dead)
            letters.extend(dead)

        with paused():  # a micro-batch's records and views: many objects, no cycles
            records = [r for _, batch in _records(batches) for r in batch]
            ctx.codec.prefetch_keys(r.value for r in records  # personal data: keys at once
                                    if ctx.projection.handler_for(r.message_type) is not None)
            stats = ctx.apply(target, records, dead_letter)
        row = {f: [getattr(stats, f)] for f in STATS_FIELDS}
        row["positions"] = [json.dumps(stats.positions)]
        row["parked"] = [json.dumps([attrs.astuple(p) for p in
                                     parkings_of(ctx.projection, letters, ctx.decode)])]
        yield pa.RecordBatch.from_pydict(row)
    return run


_T = TypeVar("_T")

RANGE_TAKE = 20_000  # records taken from the consumer at once by a range task
RANGE_IDLE_S = 60.0  # a range task fails when its partition gives nothing for this long


def _range_fn(cfg: CqrsConfig, opts: ProjectorOptions, base: str, generation: int, topic: str,
              chunk: int) -> Callable[[Iterator[tuple[int, int, int]]], Iterator[str]]:
    """Reads ``(partition, start, end)`` ranges of the events topic with librdkafka, as the
    processor's tasks read their commands, and folds each ``chunk`` events with the projector's
    own :func:`apply_batch`; yields the summed stats as one JSON line."""
    def run(ranges: Iterator[tuple[int, int, int]]) -> Iterator[str]:
        from cqrs.collector import paused
        from cqrs.kafka_io import make_consumer

        total = BatchStats()
        consumer = make_consumer(cfg, **{"enable.partition.eof": False, "fetch.wait.max.ms": 10,
                                         "max.partition.fetch.bytes": 16 << 20,
                                         "fetch.max.bytes": 64 << 20})

        def chunks() -> Iterator[tuple[int, int, list[EventRecord] | None]]:
            for partition, start, end in ranges:
                for batch in _range_chunks(consumer, topic, partition, start, end, chunk,
                                           cfg.kafka.bootstrap_servers):
                    yield partition, end, batch
                yield partition, end, None  # the range is done

        try:
            # hundreds of thousands of records and views, and no cycles: with the collector
            # on, its collections of the growing chunk took ~18 % of a task (cqrs.collector)
            with paused(), closing(_read_ahead(chunks())) as ahead:
                # the first chunk is read while the worker loads the app and connects (once
                # per worker), and each next one while the one before is folded
                ctx = _context(cfg, opts)
                target = Target(ctx.projection, base, generation)
                for partition, end, batch in ahead:
                    if batch is not None:
                        stats = ctx.apply(target, batch, ctx.send_dead_letters)
                        total.add(stats)
                        done = stats.positions
                    else:
                        total.positions[partition] = max(end, total.positions.get(partition, 0))
                        done = {partition: end}
                    # how far the task got, for the driver's progress lines (apply_ranges)
                    ctx.store.save_positions(base, generation, done)
        finally:  # the reader has stopped: closing the generator joined it
            consumer.close()
        yield json.dumps({**{f: getattr(total, f) for f in STATS_FIELDS},
                          "positions": total.positions})
    return run


def _read_ahead(chunks: Iterator[_T]) -> Iterator[_T]:
    """``chunks``, each read by a thread of its own while the caller works on the one before:
    the reader starts on chunk ``k + 1`` once the caller has taken chunk ``k`` (two chunks in
    memory at most). The reader's error is raised here; a caller that stops early makes the
    reader stop before its next chunk."""
    import queue

    ready: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
    room = threading.Semaphore(1)  # taken by the reader for each chunk, given back as it is taken
    stop = threading.Event()
    done = object()

    def read() -> None:
        try:
            while True:
                room.acquire()
                if stop.is_set():
                    return
                batch = next(chunks, done)
                ready.put((True, batch))
                if batch is done:
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            ready.put((False, exc))

    reader = threading.Thread(target=read, name="cqrs-range-reader", daemon=True)
    reader.start()
    try:
        while True:
            ok, item = ready.get()
            if not ok:
                raise item
            if item is done:
                return
            room.release()
            yield item
    finally:
        stop.set()
        room.release()
        reader.join()


def _range_chunks(consumer: Any, topic: str, partition: int, start: int, end: int, chunk: int,
                  bootstrap: str) -> Iterator[list[EventRecord]]:
    """The event records of ``[start, end)`` of a partition, ``chunk`` at a time (the last
    chunk shorter); records that are not events are passed over."""
    import time

    from confluent_kafka import TopicPartition

    from cqrs.kafka_io import take
    from projections.records import event_record_or_none

    consumer.assign([TopicPartition(topic, partition, start)])
    nxt, batch, idle_since = start, [], time.monotonic()
    while nxt < end:
        got = take(consumer, RANGE_TAKE, 0.5)
        for msg in got:
            if msg.error() is not None:
                raise ProjectionStoreError(f"reading {topic}[{partition}]: {msg.error()}")
            offset = msg.offset()
            if offset >= end:
                continue
            nxt = offset + 1
            rec = event_record_or_none(msg.key(), msg.value(), msg.headers() or (), partition,
                                       offset)
            if rec is not None:
                batch.append(rec)
        if not got:  # a gap at the end of the range (e.g. a transaction marker)?
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if position >= end:
                break
            if time.monotonic() - idle_since > RANGE_IDLE_S:
                raise ProjectionStoreError(
                    f"{topic}[{partition}] gave nothing at offset {nxt} (the range ends at "
                    f"{end}) for {RANGE_IDLE_S:.0f} s: is Kafka at {bootstrap} reachable?")
            continue
        idle_since = time.monotonic()
        if len(batch) >= chunk:
            yield batch
            batch = []
    if batch:
        yield batch


# --- driver side ------------------------------------------------------------------------------


def apply_ranges(spark: SparkSession, cfg: CqrsConfig, opts: ProjectorOptions, base: str,
                 generation: int, topic: str, ranges: dict[int, tuple[int, int]],
                 chunk: int = 100_000, *, on_progress: Callable[[int], None] | None = None,
                 progress_s: float = 2.0) -> BatchStats:
    """Fold the events of ``{partition: (start, end)}`` of ``topic`` into a generation: a
    Spark task per slot (``defaultParallelism``: the cores) reads its share of the ranges, one
    partition after another, directly from Kafka (no Kafka source, no rows through the JVM) and
    folds them ``chunk`` events at a time. Fewer tasks than partitions: no task launches, and
    no core waiting for the others at the end of each wave of tasks. For a projection whose
    views are its aggregates (a re-keyed one needs :func:`apply_frame`, which brings a view's
    events from every partition together).

    ``on_progress(events)``: called every ``progress_s`` while the tasks run, with the events
    folded so far (from the positions each task saves after each chunk)."""
    todo = [(p, start, end) for p, (start, end) in sorted(ranges.items()) if end > start]
    total = BatchStats()
    if not todo:
        return total
    shares = balanced_shares(todo, spark.sparkContext.defaultParallelism)
    fold = _range_fn(cfg, opts, base, generation, topic, chunk)
    rdd = (spark.sparkContext.parallelize(shares, len(shares))
           .mapPartitions(lambda share: fold(r for ranges in share for r in ranges)))
    if on_progress is None:
        lines = rdd.collect()
    else:
        def folded() -> None:  # how far the tasks' saved positions are into their ranges
            saved = cached_store(cfg).positions(base, generation)
            on_progress(sum(min(max(saved.get(p, start), start), end) - start
                            for p, start, end in todo))

        lines = _collect_reporting(spark, rdd, progress_s, folded)
    for line in lines:
        row = json.loads(line)
        total.add(BatchStats(*(row[f] for f in STATS_FIELDS),
                             {int(p): o for p, o in row["positions"].items()}))
    return total


def _collect_reporting(spark: SparkSession, rdd: Any, every_s: float,
                       report: Callable[[], None]) -> list[Any]:
    """``rdd.collect()``, with ``report()`` called every ``every_s`` while its job runs (the job
    runs in a thread; it is cancelled when this call ends early, e.g. on Ctrl-C)."""
    import uuid

    result: list[Any] = []
    failed: list[BaseException] = []
    group = f"cqrs-rebuild-{uuid.uuid4()}"

    def collect() -> None:
        try:
            spark.sparkContext.setJobGroup(group, "a projection rebuild's batch job", True)
            result.extend(rdd.collect())
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(exc)

    job = threading.Thread(target=collect, name="cqrs-rebuild-job", daemon=True)
    job.start()
    try:
        while True:
            job.join(every_s)
            if not job.is_alive():
                break
            report()
    finally:
        if job.is_alive():  # only this job: the session may run other queries
            spark.sparkContext.cancelJobGroup(group)
            job.join()
    if failed:
        raise failed[0]
    return result


def start_warming(spark: SparkSession, cfg: CqrsConfig, opts: ProjectorOptions) -> threading.Thread:
    """Start, in a thread, a small job that makes each task slot's Python worker load the app
    and connect (what a range task does first, once per worker: ~1-2 s of Spark starting its
    Python workers, imports, the schemas and the Cassandra session), so that it happens while
    the caller does other work (a rebuild creating its tables). Join the thread before the
    first :func:`apply_ranges`; a failure here is left to that job to report."""
    slots = spark.sparkContext.defaultParallelism

    def warm(_: Iterator[int]) -> Iterator[int]:
        _context(cfg, opts)
        yield 0

    def run() -> None:
        try:
            spark.sparkContext.parallelize(range(slots), slots).mapPartitions(warm).collect()
        except Exception:  # noqa: BLE001, S110 - the real job fails the same way, and says so
            pass

    thread = threading.Thread(target=run, name="cqrs-warm-workers", daemon=True)
    thread.start()
    return thread


def balanced_shares(ranges: Sequence[tuple[int, int, int]],
                    slots: int) -> list[list[tuple[int, int, int]]]:
    """``(partition, start, end)`` ranges dealt into at most ``slots`` shares of about equal
    length (the longest range first, each to the shortest share so far)."""
    shares: list[list[tuple[int, int, int]]] = [[] for _ in range(max(1, min(slots, len(ranges))))]
    lengths = [0] * len(shares)
    for r in sorted(ranges, key=lambda r: (r[1] - r[2], r[0])):
        i = lengths.index(min(lengths))
        shares[i].append(r)
        lengths[i] += r[2] - r[1]
    return shares


def event_frame(source: DataFrame) -> DataFrame:
    """The columns the fold needs, from a Kafka source frame (headers parsed by Spark)."""
    from pyspark.sql import functions as F

    def header(name: str) -> Any:
        return F.expr(header_expr(name)).cast("string")

    return source.select(
        F.col("key").cast("string").alias("aggregate_id"),
        header("cqrs.aggregate_type").alias("aggregate_type"),
        header("cqrs.message_type").alias("message_type"),
        header("cqrs.version").cast("long").alias("version"),
        F.col("value"),
        header("cqrs.timestamp").alias("timestamp"),
        F.col("partition"), F.col("offset"),
    ).where(F.col("version").isNotNull() & F.col("aggregate_id").isNotNull())


def apply_frame(frame: DataFrame, cfg: CqrsConfig, opts: ProjectorOptions, base: str,
                generation: int) -> BatchStats:
    """Apply an event frame (batch or micro-batch) in the executors; return the summed stats.

    A re-keyed projection's frame is first partitioned by view key, so the events of one view
    are folded by one task (two tasks never read-modify-write the same view); otherwise a Spark
    partition is a Kafka partition's slice and each aggregate's events stay in one task."""
    return apply_frame_parking(frame, cfg, opts, base, generation)[0]


def apply_frame_parking(frame: DataFrame, cfg: CqrsConfig, opts: ProjectorOptions, base: str,
                        generation: int) -> tuple[BatchStats, list[Parking]]:
    """:func:`apply_frame`, and the views the frame dead-lettered events of."""
    from cqrs.loading import load_app
    from projections.model import RekeyedProjection, find_projection

    if isinstance(find_projection(load_app(opts.app_ref), opts.projection), RekeyedProjection):
        keyed = frame.select(*EVENT_COLUMNS).mapInArrow(_view_key_fn(cfg, opts),
                                                        EVENT_SCHEMA + ", view_key string")
        frame = keyed.repartition("view_key").drop("view_key")
    stats_schema = ("events long, applied long, aggregates long, dead_letters long, "
                    "positions string, parked string")
    rows = frame.mapInArrow(_partition_fn(cfg, opts, base, generation), stats_schema).collect()
    total = BatchStats()
    parked: list[Parking] = []
    for r in rows:
        total.add(BatchStats(r.events, r.applied, r.aggregates, r.dead_letters,
                             {int(p): o for p, o in json.loads(r.positions).items()}))
        parked += [Parking(*p) for p in json.loads(r.parked)]
    return total, parked


def check_schemas(cfg: CqrsConfig, topics: AppTopics, app: App, refused: str) -> None:
    """The processor's schema check (:func:`cqrs.processor.job.check_app_schemas`) before a
    projector or a rebuild starts: events the app's classes cannot read would all be
    dead-lettered. Its :class:`~cqrs.errors.IncompatibleSchemaError` says first what was
    ``refused`` (e.g. "the projector of bank/balances cannot start")."""
    try:
        check_app_schemas(cfg, topics, app)
    except IncompatibleSchemaError as exc:
        raise IncompatibleSchemaError(f"{refused}: {exc}") from exc


def offsets_json(topic: str, offsets: Mapping[int, int], partitions: Iterable[int] = ()) -> str:
    """Spark's ``startingOffsets``/``endingOffsets`` JSON for ``topic``: each partition of
    ``offsets`` at its offset, and each other one of ``partitions`` at its earliest (-2)."""
    every = sorted({*offsets, *partitions})
    return json.dumps({topic: {str(p): offsets.get(p, -2) for p in every}})


def start_projector(spark: SparkSession, cfg: CqrsConfig, opts: ProjectorOptions,
                    generation: int, *, available_now: bool = False,
                    on_batch: Callable[[int, BatchStats], None] | None = None,
                    on_retry_round: Callable[[RoundStats], None] | None = None) -> StreamingQuery:
    """Start the streaming query of one projection generation (its tables must exist); unless
    ``available_now``, with the timer that retries its parked views (``on_retry_round``: called
    after each round of it). Refused (:class:`~cqrs.errors.IncompatibleSchemaError`) when the
    app's classes cannot read the stored schemas (:func:`check_schemas`).

    It continues from the generation's checkpoint; without one (a generation a rebuild just
    made), from the positions the generation's batches saved, else from the log's start."""
    from cqrs.loading import load_app
    from projections.model import find_projection

    app = load_app(opts.app_ref)
    prefix = cfg.kafka.topic_prefix if opts.topic_prefix is None else opts.topic_prefix
    topics = topics_for(app.name, prefix)
    check_schemas(cfg, topics, app, f"the projector of {app.name}/{opts.projection} cannot start")
    dlq_topic = dead_letter_topic(app.name, prefix)
    ensure_dead_letter_topic(cfg, dlq_topic)
    base = table_base(app.name, opts.projection)
    retrier = ProjectionRetrier(cfg, app, find_projection(app, opts.projection), topics.base, base,
                                generation, dlq_topic, topics.schemas, cached_store(cfg))
    if not available_now:  # (without a mark a replay reads the whole topic: right, slower)
        retrier.mark_dead_letters()
    limit = opts.max_events_per_trigger or cfg.projections.max_events_per_trigger
    positions = cached_store(cfg).positions(base, generation)  # (a checkpoint overrides them)
    starting = (offsets_json(topics.events, positions, topic_offsets(cfg, topics.events))
                if positions else "earliest")
    source = (spark.readStream.format("kafka").options(**cfg.kafka.spark_options())
              .option("subscribe", topics.events)
              .option("startingOffsets", starting)
              .option("includeHeaders", "true")
              .option("failOnDataLoss", "true")
              .option("maxOffsetsPerTrigger", str(limit))
              .load())

    def batch(frame: DataFrame, batch_id: int) -> None:
        with retrier.lock:  # no retry round while a batch is applied
            stats, parked = apply_frame_parking(event_frame(frame), cfg, opts, base, generation)
            if stats.positions:
                cached_store(cfg).save_positions(base, generation, stats.positions)
            retrier.record(parked)
            if stats.dead_letters:
                retrier.mark_dead_letters()
            if available_now:  # no timer: nothing to keep open between batches
                retrier.close()
        if on_batch is not None:
            on_batch(batch_id, stats)

    writer = (source.writeStream.foreachBatch(batch)
              .option("checkpointLocation", checkpoint_for(cfg, app.name, opts.projection, generation))
              .queryName(f"cqrs-projector-{app.name}-{opts.projection}-g{generation}"))
    query = with_trigger(writer, available_now=available_now, interval=opts.trigger_interval).start()
    if available_now:
        return query
    from cqrs.retrier.job import RetrierQuery

    return RetrierQuery(query, retrier, cfg.retrier.interval_s, on_retry_round)  # type: ignore[arg-type, return-value]
