"""Rebuilding the command processor's aggregate state from the event log into a new generation.

For lost or damaged state, changed fold logic (appliers) or a lost checkpoint. The processor
of the app must be stopped while this runs. Steps:

1. snapshot the end offsets of the events and results topics (what is read is fixed up front);
2. batch-read both topics and fold, per (aggregate type, aggregate id), in one grouped Spark job:
   events (ordered by version, re-written duplicates dropped, gaps refused) through the shared
   :func:`~cqrs.domain.decision.replay` into version, deleted and snapshot; results (their first
   copy per command id, in command-offset order) into the de-duplication memory ``seen``, bounded
   by the same :class:`~cqrs.processor.step.DedupPolicy` window and count as the processor;
3. the commands-topic starting offsets: per partition, the highest ``source_offset`` of any result
   plus one (partitions with no result start at the earliest offset), so commands answered
   already do not run again;
4. write the folded rows into a new generation of the aggregate-state table (each row fenced
   at the last command it answered), in the executors;
5. run the processor on the new checkpoint and the new generation from those starting offsets,
   trigger availableNow (commands not answered yet are processed), then make the new
   generation current. Afterwards run the processor with ``--checkpoint <new checkpoint>``.

Assumes the old processor's last micro-batch finished writing (a normal stop): a batch cut off
half-way through its writes, with its checkpoint lost, can leave events without results.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError, ReplayError
from cqrs.processor.changelog import reset_changelog, uses_changelog, write_rebuilt
from cqrs.processor.job import checkpoint_for, header_expr, publish_app_schemas, start_processor
from cqrs.processor.workers import ProcessorOptions, step_for
from cqrs.kafka_io import watermarks
from cqrs.results import FAILED, AggregateRecord, SeenCommand, result_head, seen_command
from cqrs.topics import AppTopics, topics_for

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "CheckpointExistsError",
    "RebuildError",
    "RebuildReport",
    "default_rebuild_checkpoint",
    "fold_aggregates",
    "rebuild_state",
    "starting_offsets_json",
]

Progress = Callable[[str], None]


class CheckpointExistsError(CqrsError, FileExistsError):
    """The checkpoint to rebuild into already holds a query's progress."""


class RebuildError(CqrsError, RuntimeError):
    """The state cannot be rebuilt (topic missing, events not replayable, query failed)."""


@attrs.frozen
class RebuildReport:
    """What :func:`rebuild_state` did."""

    app: str
    checkpoint: str
    events_read: int
    results_read: int
    generation: int  # the aggregate-state table generation written (current now)
    aggregates: int  # aggregate rows written into it
    deleted: int  # of which deleted by a terminal event
    starting_offsets: dict[int, int]  # commands topic partition -> first offset to process (-2: earliest)
    commands_processed: int  # commands not answered before, processed by the first run
    fold_seconds: float
    seconds: float


def default_rebuild_checkpoint(cfg: CqrsConfig, app_name: str) -> str:
    """The processor's default checkpoint (used when it was lost)."""
    return checkpoint_for(cfg, app_name)


# ---- file system helpers (any Hadoop file system: local, HDFS, S3...) ------------------------


def _fs_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark._jvm  # noqa: SLF001 - the Hadoop FileSystem API is only reachable this way
    assert jvm is not None, "a classic (non Spark Connect) session is needed"
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(spark._jsc.hadoopConfiguration()), hpath  # noqa: SLF001


def path_exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists (any file system Spark can reach)."""
    fs, hpath = _fs_path(spark, path)
    return bool(fs.exists(hpath))


def checkpoint_has_commits(spark: SparkSession, checkpoint: str) -> bool:
    """Whether the checkpoint holds at least one committed micro-batch."""
    fs, hpath = _fs_path(spark, checkpoint.rstrip("/") + "/commits")
    if not fs.exists(hpath):
        return False
    return any(not st.getPath().getName().startswith(".") for st in fs.listStatus(hpath))


# ---- Kafka metadata --------------------------------------------------------------------------


def starting_offsets_json(topic: str, partitions: list[int], answered: dict[int, int]) -> str:
    """Spark's ``startingOffsets`` JSON: ``answered[p] + 1`` per partition, else earliest (-2)."""
    return json.dumps({topic: {str(p): (answered[p] + 1 if p in answered else -2)
                               for p in partitions}})


def _range_json(topic: str, marks: dict[int, tuple[int, int]], which: int) -> str:
    return json.dumps({topic: {str(p): lh[which] for p, lh in marks.items()}})


# ---- the fold (runs on the executors) --------------------------------------------------------

_FOLD_SCHEMA = (
    "aggregate_type string, aggregate_id string, record binary, version long, deleted boolean, "
    "events long, results long, source_partitions array<int>, source_offsets array<long>, "
    "last_partition int, last_offset long, commands long"
)
EVENT, RESULT = "e", "r"


def stream_marks(command_ids: Any) -> dict[str, tuple[int, int]]:
    """The process managers' marks (see :mod:`cqrs.domain.process`) implied by the commands an
    aggregate answered or applied: the events topic keeps their ids forever (each event names
    its command), the results topic for its retention (rejected commands leave no event, but a
    later accepted command of the same stream covers them)."""
    from cqrs.domain.process import DERIVED_PREFIX, parse_derived_id

    marks: dict[str, tuple[int, int]] = {}
    for cid in command_ids:
        if isinstance(cid, str) and cid.startswith(DERIVED_PREFIX):
            d = parse_derived_id(cid)
            if d is not None and d.position > marks.get(d.stream, (-1, -1)):
                marks[d.stream] = d.position
    return marks


def _fold_group(cfg: CqrsConfig, opts: ProcessorOptions) -> Callable[[Any, pd.DataFrame], pd.DataFrame]:
    """The grouped function: one aggregate's events and results -> its AggregateRecord row."""

    def fold(key: Any, pdf: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        from cqrs.domain.decision import replay

        aggregate_type, aggregate_id = key
        step = step_for(cfg, opts)
        codec = step.codec
        events = pdf[pdf["kind"] == EVENT].sort_values(["version", "partition", "offset"])
        results = pdf[pdf["kind"] == RESULT]

        # results: the dedup memory and, per commands partition, the last command answered
        answered: dict[int, int] = {}
        last = (-1, -1)  # the aggregate's last command answered: its state row's fence
        firsts: dict[str, tuple[int, int, SeenCommand]] = {}
        for value in results["value"]:
            blob = bytes(value)
            res = codec.decode(blob)
            p, o = res.source_partition, res.source_offset
            answered[p] = max(answered.get(p, -1), o)
            last = max(last, (p, o))
            if res.status == FAILED and res.version < 0:
                continue  # an unreadable command: the processor does not remember those
            if res.command_id not in firsts:  # re-written copies carry the same bytes
                firsts[res.command_id] = (p, o, seen_command(res, blob))
        seen = step.window([s for _, _, s in sorted(firsts.values(), key=lambda t: t[:2])])

        record: bytes | None = None
        version = 0
        deleted = False
        if len(events) or seen:
            try:
                entry = step.app.model.entry(aggregate_type)
            except CqrsError as exc:
                if len(events):
                    raise RebuildError(
                        f"events of aggregate {aggregate_type} {aggregate_id!r} cannot be folded: "
                        f"{exc}"
                    ) from exc
                entry = None
            if entry is not None:
                versions = [int(v) for v in events["version"]]
                payloads: list[Any] = []
                expected = 1
                for v, value in zip(versions, events["value"], strict=True):
                    if v < expected:  # a re-written copy (at-least-once sink): same event
                        continue
                    if v != expected:
                        raise ReplayError(
                            f"events of {aggregate_type} {aggregate_id!r} jump from version "
                            f"{expected - 1} to {v}: the events topic lost records (retention, "
                            "compaction or deletion), so this aggregate cannot be rebuilt"
                        )
                    payloads.append(codec.decode(bytes(value)))
                    expected += 1
                state, version = replay(entry.aggregate_class, payloads)
                deleted = state is None and version > 0
                snapshot = None if state is None else codec.encode(state)
                rebuilt = AggregateRecord.of(version, deleted, snapshot, seen)
                marks = stream_marks(pdf.get("command_id", ()))
                if marks:
                    rebuilt = rebuilt.with_streams(marks, set())
                record = codec.encode(rebuilt)
        parts = sorted(answered)
        return pd.DataFrame({
            "aggregate_type": [aggregate_type], "aggregate_id": [aggregate_id],
            "record": [record], "version": [version], "deleted": [deleted],
            "events": [len(events)], "results": [len(results)],
            "source_partitions": [parts], "source_offsets": [[answered[p] for p in parts]],
            "last_partition": [last[0]], "last_offset": [last[1]],
            "commands": [max(len(firsts), 1)],
        })

    return fold


def _topic_rows(spark: SparkSession, cfg: CqrsConfig, topic: str,
                marks: dict[int, tuple[int, int]], kind: str) -> DataFrame:
    from pyspark.sql import functions as F

    df = (spark.read.format("kafka").options(**cfg.kafka.spark_options())
          .option("subscribe", topic)
          .option("startingOffsets", _range_json(topic, marks, 0))
          .option("endingOffsets", _range_json(topic, marks, 1))
          .option("includeHeaders", str(kind == EVENT).lower())  # results are read by value
          .option("failOnDataLoss", "true")
          .load())
    if kind == RESULT:  # a result record has no headers: its value starts with what is needed
        heads = df.select("value", "partition", "offset").mapInArrow(_result_heads, _HEADS_SCHEMA)
        return heads.select(F.lit(kind).alias("kind"), "aggregate_type", "aggregate_id",
                            F.lit(-1).cast("long").alias("version"), "value", "partition",
                            "offset", "command_id")
    version = F.expr(header_expr("cqrs.version")).cast("string").cast("long")
    return df.select(
        F.lit(kind).alias("kind"),
        F.expr(header_expr("cqrs.aggregate_type")).cast("string").alias("aggregate_type"),
        F.col("key").cast("string").alias("aggregate_id"),
        F.coalesce(version, F.lit(-1).cast("long")).alias("version"),
        "value", "partition", "offset",
        F.expr(header_expr("cqrs.command_id")).cast("string").alias("command_id"),
    )


_HEADS_SCHEMA = ("aggregate_type string, aggregate_id string, command_id string, value binary, "
                 "partition int, offset long")


def _result_heads(batches: Iterator[Any]) -> Iterator[Any]:
    """Result records -> their aggregate and command id (see :func:`result_head`); a value
    that is not a result gets nulls, and the fold leaves it out."""
    import pyarrow as pa

    for batch in batches:
        heads = [result_head(v) for v in batch.column("value").to_pylist()]
        yield pa.RecordBatch.from_arrays([
            pa.array([h.aggregate_type if h else None for h in heads], pa.string()),
            pa.array([h.aggregate_id if h else None for h in heads], pa.string()),
            pa.array([h.command_id if h else None for h in heads], pa.string()),
            batch.column("value"), batch.column("partition"), batch.column("offset"),
        ], names=["aggregate_type", "aggregate_id", "command_id", "value", "partition", "offset"])


def fold_aggregates(spark: SparkSession, cfg: CqrsConfig, opts: ProcessorOptions,
                    topics: AppTopics, events: dict[int, tuple[int, int]],
                    results: dict[int, tuple[int, int]]) -> DataFrame:
    """One row per aggregate (see ``_FOLD_SCHEMA``) from the given offset ranges of the events and
    results topics; ``record`` is the encoded AggregateRecord (null: nothing to keep)."""
    from pyspark.sql import functions as F

    rows = _topic_rows(spark, cfg, topics.events, events, EVENT).unionByName(
        _topic_rows(spark, cfg, topics.results, results, RESULT))
    rows = rows.where(F.col("aggregate_type").isNotNull() & F.col("aggregate_id").isNotNull())
    return rows.groupBy("aggregate_type", "aggregate_id").applyInPandas(
        _fold_group(cfg, opts), schema=_FOLD_SCHEMA)


# ---- progress --------------------------------------------------------------------------------


class _StageProgress:
    """Reports the running Spark stages' task counts every ``every`` seconds while active."""

    def __init__(self, spark: SparkSession, progress: Progress | None, label: str,
                 every: float = 2.0) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.progress, self.label, self.every = progress, label, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cqrs-rebuild-progress")

    def __enter__(self) -> _StageProgress:
        if self.progress is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        last = ""
        while not self._stop.wait(self.every):
            try:
                infos = [self.tracker.getStageInfo(s) for s in self.tracker.getActiveStageIds()]
            except Exception:  # noqa: BLE001 - the session is closing: stop reporting
                return
            text = ", ".join(f"stage {i.stageId}: {i.numCompletedTasks}/{i.numTasks} tasks"
                             for i in infos if i is not None)
            if text and text != last and self.progress is not None:
                self.progress(f"{self.label}: {text}")
                last = text


# ---- writing the rows (runs on the executors) -------------------------------------------------

_ROW_COLUMNS = ("aggregate_type", "aggregate_id", "record", "version", "deleted", "last_partition",
                "last_offset", "commands")


def _row_writer(cfg: CqrsConfig, opts: ProcessorOptions, generation: int,
                changelog: str | None, partitions: int) -> Callable[[Any], Any]:
    """Writes a partition of folded rows into the state table, or with ``changelog`` (the
    kafka state store) into that topic of ``partitions``; yields how many."""
    def run(batches: Any) -> Any:
        import pyarrow as pa

        from cqrs.processor.state_table import StoredAggregate

        def rows_of(batch: Any) -> list[StoredAggregate]:
            c = batch.to_pydict()
            return [StoredAggregate(i, t, v, bool(d), bytes(r), p, o, n) for t, i, r, v, d, p, o, n
                    in zip(*(c[name] for name in _ROW_COLUMNS), strict=True)]

        if changelog is not None:
            written = write_rebuilt(cfg, changelog, partitions,
                                    (row for batch in batches for row in rows_of(batch)))
        else:
            from cqrs.processor.workers import worker_for

            table = worker_for(cfg, opts).table
            written = 0
            for batch in batches:
                rows = rows_of(batch)
                table.write(generation, rows)
                written += len(rows)
        yield pa.RecordBatch.from_pydict({"rows": [written]})
    return run


# ---- entry point -----------------------------------------------------------------------------


def rebuild_state(
    spark: SparkSession,
    cfg: CqrsConfig,
    opts: ProcessorOptions,
    new_checkpoint: str,
    *,
    generation: int | None = None,
    progress: Progress | None = None,
) -> RebuildReport:
    """Rebuild the app's aggregate state from its events into a new state generation (default:
    the current one plus one), process what was not answered yet on ``new_checkpoint``, and make
    that generation current (see the module doc). The app's processor must be stopped; run it
    on ``new_checkpoint`` afterwards."""
    from pyspark.sql import functions as F

    from cqrs.loading import load_app
    from cqrs.processor.state_table import open_state_table

    started = time.monotonic()
    say = progress or (lambda _msg: None)
    app = load_app(opts.app_ref)
    topics = opts.topics or topics_for(app.name, cfg.kafka.topic_prefix)
    if path_exists(spark, new_checkpoint):
        if checkpoint_has_commits(spark, new_checkpoint) or path_exists(
                spark, new_checkpoint.rstrip("/") + "/offsets"):
            raise CheckpointExistsError(
                f"checkpoint {new_checkpoint!r} already holds a query's progress: rebuild into a "
                "new folder (--checkpoint NEW) and run the processor with it, or delete the old "
                "one once nothing uses it"
            )
    table = open_state_table(cfg, topics)
    try:
        current = table.current_generation()
        target = generation or (current or 0) + 1
        if target == current:
            raise RebuildError(
                f"generation {target} is the current aggregate state of {app.name!r}: rebuild into "
                "another one (default: the current one plus one)")
        table.drop(target)  # a failed earlier attempt may have left rows in it
        table.ensure(target)
    finally:
        table.close()
    command_marks = watermarks(cfg, topics.commands)
    changelog = reset_changelog(cfg, topics.base, target, len(command_marks)) \
        if uses_changelog(cfg) else None
    opts = attrs.evolve(opts, topics=topics, checkpoint=new_checkpoint, state_generation=target)
    event_marks = watermarks(cfg, topics.events)
    result_marks = watermarks(cfg, topics.results)
    publish_app_schemas(cfg, topics, app)
    to_read = sum(h - lo for lo, h in event_marks.values())
    say(f"reading {to_read} events from {topics.events!r} ({len(event_marks)} partitions) and "
        f"{sum(h - lo for lo, h in result_marks.values())} results from {topics.results!r}")

    fold_started = time.monotonic()
    folded = fold_aggregates(spark, cfg, opts, topics, event_marks, result_marks).persist()
    try:
        with _StageProgress(spark, progress, "folding events"):
            stats = folded.selectExpr(
                "coalesce(sum(events), 0) AS events", "coalesce(sum(results), 0) AS results",
                "count_if(record IS NOT NULL) AS aggregates",
                "count_if(record IS NOT NULL AND deleted) AS deleted",
            ).collect()[0]
            offsets = (folded.selectExpr("explode(arrays_zip(source_partitions, source_offsets)) AS s")
                       .selectExpr("s.source_partitions AS p", "s.source_offsets AS o")
                       .groupBy("p").agg(F.max("o")).collect())
        fold_seconds = time.monotonic() - fold_started
        answered = {int(r[0]): int(r[1]) for r in offsets}
        start_json = starting_offsets_json(topics.commands, sorted(command_marks), answered)
        say(f"folded {stats['events']} events into {stats['aggregates']} aggregates "
            f"({stats['deleted']} deleted) in {fold_seconds:.1f}s; commands start at "
            f"{json.loads(start_json)[topics.commands]}")
        with _StageProgress(spark, progress, f"writing state generation {target}"):
            written = (folded.where("record IS NOT NULL").select(*_ROW_COLUMNS)
                       .mapInArrow(_row_writer(cfg, opts, target, changelog, len(command_marks)),
                                   "rows long")
                       .agg(F.coalesce(F.sum("rows"), F.lit(0))).collect()[0][0])
        say(f"wrote {written} aggregate rows into state generation {target}")
    finally:
        folded.unpersist()

    processed = 0

    def on_batch(batch_id: int, s: Any) -> None:
        nonlocal processed
        processed += s.commands
        say(f"batch {batch_id}: {s.commands} commands not answered before")

    query = start_processor(spark, cfg, opts, available_now=True, starting_offsets=start_json,
                            name_suffix="-rebuild", on_batch=on_batch)
    query.awaitTermination()
    exc = query.exception()
    if exc is not None:
        raise RebuildError(
            f"the processor query on {new_checkpoint!r} failed while catching up on generation "
            f"{target}: {exc}; delete that folder and run rebuild-state again")
    table = open_state_table(cfg, topics)
    try:
        table.set_current(target)
    finally:
        table.close()
    report = RebuildReport(
        app=app.name, checkpoint=new_checkpoint, events_read=int(stats["events"]),
        results_read=int(stats["results"]), generation=target, aggregates=int(written),
        deleted=int(stats["deleted"]),
        starting_offsets={int(p): o for p, o in json.loads(start_json)[topics.commands].items()},
        commands_processed=processed, fold_seconds=round(fold_seconds, 3),
        seconds=round(time.monotonic() - started, 3),
    )
    say(f"rebuilt {report.aggregates} aggregates from {report.events_read} events in "
        f"{report.seconds:.1f}s into state generation {target} (current now); run the processor "
        f"with --checkpoint {new_checkpoint}")
    return report
