"""The event log as Spark DataFrames: every event of an app (or of some event types, or of a time
range) with its envelope as columns and its fields as typed columns, decoded by the app's codec
with the schemas of the schemas topic and upcast to today's classes; the same as a streaming
DataFrame; temporary views for Spark SQL (``cqrs sql``); and the state of every aggregate of a
type as of a time, folded by the aggregates' own appliers.

The log is read in batch from the start of each partition of the events topic to its end at
the call (the DataFrame is that snapshot: acting on it again reads the same records), by tasks
that read a partition each with librdkafka (:mod:`cqrs.history.log_source`), or from an archive
that :func:`cqrs.history.archive.write_archive` wrote (``source=PATH``); the stream
(:func:`log_stream`) by Spark's Kafka source.
Each record goes through the history job's own functions (:mod:`cqrs.history.rows`: record ->
history row -> :func:`~cqrs.history.rows.decode_row`), in the executors, so a row of the
DataFrame is what :class:`~cqrs.history.HistoryReader` answers for that event; columns as
:mod:`cqrs.history.columns` says.

>>> deposits = log_table(spark, app, event_types=["example.bank.Deposited"])   # doctest: +SKIP
>>> deposits.groupBy("aggregate_id").sum("amount").show()                      # doctest: +SKIP
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

import attrs

from cqrs.config import CqrsConfig, cache_key, load_config
from cqrs.domain.messages import type_name
from cqrs.history.columns import (
    ENVELOPE_COLUMNS, EVENTS_VIEW, ROW_COLUMNS, EventLayout, LogTableError, StateLayout,
    aware_time, check_range, event_type_names, row_schema, rows_from_arrow,
    type_names, view_names, written_type_names,
)
from cqrs.history.rows import HistoricState, HistoryRow, decode_row, fold
from cqrs.topics import AppTopics, topics_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cqrs.app import App
    from cqrs.codec.registry import Codec

__all__ = ["RECORD_COLUMNS", "LogSource", "LogSpec", "decode_records", "decode_rows",
           "decode_record_batch", "log_events", "log_stream", "log_table", "log_views", "spec_codec",
           "state_of", "states_as_of"]

RECORD_COLUMNS: Final = ("key", "value", "headers", "partition", "offset", "timestamp")
"""The columns of the events topic's records as Spark's Kafka source reads them that the log
is made of."""


# ---- where the log is, and what the executors need --------------------------------------------


@attrs.frozen
class LogSpec:
    """What an executor needs to decode an app's log (pickled into Spark's tasks): the app by
    reference, the configuration, and the writer schemas: their JSON (read by the driver from
    the schemas topic when it opened a snapshot of the log, or kept by an archive), or ``None``:
    each executor reads the schemas topic (a stream, which may meet schemas written later)."""

    cfg: CqrsConfig
    app_ref: str
    schemas_topic: str
    schemas: tuple[str, ...] | None = None


_CODECS: dict[str, Any] = {}
_CODECS_LOCK = threading.Lock()


def spec_codec(spec: LogSpec) -> Codec:
    """The app's codec bound to the spec's schemas and the app's key store, built once per
    Python worker."""
    key = cache_key(spec)
    with _CODECS_LOCK:
        codec = _CODECS.get(key)
        if codec is None:
            from cqrs.loading import load_app
            from cqrs.personal.stack import key_store_for

            app = load_app(spec.app_ref)
            codec = _CODECS[key] = app.codec_for(_store(spec),
                                                 key_store=key_store_for(spec.cfg, app))
        return codec


def _store(spec: LogSpec) -> Any:
    from cqrs.codec.schema_store import InMemorySchemaStore

    if spec.schemas is not None:
        return InMemorySchemaStore({str(i).encode(): json.loads(s)
                                    for i, s in enumerate(spec.schemas)})
    from cqrs.codec.kafka_schema_store import KafkaSchemaStore

    cfg = spec.cfg
    return KafkaSchemaStore(cfg.kafka.bootstrap_servers, spec.schemas_topic,
                            cfg.kafka.client_options())


@attrs.frozen
class LogSource:
    """An app's log as the driver sees it: the events topic (with its offsets at the time the
    source was opened) or an archive's folder."""

    app: Any  # the App
    spec: LogSpec
    topic: str | None = None
    marks: dict[int, tuple[int, int]] | None = None  # partition -> (low, high) of the topic
    path: str | None = None  # an archive instead of the topic

    @classmethod
    def open(cls, spark: SparkSession, app: App | str, *, cfg: CqrsConfig | None = None,
             topics: AppTopics | None = None, source: str | None = None,
             live: bool = False) -> LogSource:
        """The log of ``app`` (an App or its ``module:attribute``): its events topic, or the
        archive at ``source``. Checks the app's classes read every stored schema
        (:class:`~cqrs.codec.IncompatibleSchemaError` names what does not). ``live``: for a
        stream, whose executors read the schemas topic themselves (schemas written later)."""
        from cqrs.codec.registry import check_compatibility
        from cqrs.loading import app_reference, load_app

        ref = app_reference(app)
        the_app = load_app(ref)
        cfg = cfg or load_config()
        topics = topics or topics_for(the_app.name, cfg.kafka.topic_prefix)
        if source is not None:
            from cqrs.history.archive import read_archive_meta

            from cqrs.codec.schema import canonical_json

            meta = read_archive_meta(spark, source)
            spec = LogSpec(cfg, ref, topics.schemas,
                           tuple(canonical_json(s) for s in meta["schemas"].values()))
            opened = cls(the_app, spec, path=source)
        else:
            from cqrs.kafka_io import watermarks

            marks = watermarks(cfg, topics.events)  # TopicNotFoundError names a missing topic
            opened = cls(the_app, LogSpec(cfg, ref, topics.schemas), topic=topics.events,
                         marks=marks)
        from cqrs.personal.stack import key_store_for

        key_store = key_store_for(cfg, the_app)  # a missing master key: said here, not in a task
        store = _store(opened.spec)
        try:
            check_compatibility(store, the_app.codec_for(store, key_store=key_store))
            if opened.spec.schemas is None and not live:
                # the records of the snapshot were written after their schemas: the executors
                # take these along, and open no schemas topic (a consumer each, seconds)
                from cqrs.codec.schema import canonical_json

                opened = attrs.evolve(opened, spec=attrs.evolve(
                    opened.spec, schemas=tuple(canonical_json(s) for s in store.all().values())))
        finally:
            if hasattr(store, "close"):
                store.close()
        return opened

    def rows(self, spark: SparkSession, *, written_types: Iterable[str] | None = None,
             aggregate_type: str | None = None, since: _dt.datetime | None = None,
             until: _dt.datetime | None = None, until_inclusive: bool = False) -> DataFrame:
        """History rows (:data:`~cqrs.history.columns.ROW_COLUMNS`) of the events written under
        ``written_types`` (all: ``None``) of ``aggregate_type`` (all: ``None``), recorded at or
        after ``since`` and before ``until`` (at or before, ``until_inclusive``)."""
        if self.path is not None:
            return _archive_rows(spark, self.path, written_types, aggregate_type, since, until,
                                 until_inclusive)
        from cqrs.history.log_source import log_read_frame

        assert self.topic is not None and self.marks is not None
        return log_read_frame(spark, self.spec, self.topic, self.marks, (), flat=False,
                              payload=False, written_types=written_types,
                              aggregate_type=aggregate_type, since=since, until=until,
                              until_inclusive=until_inclusive, rows=True)


def _filtered_records(frame: DataFrame, written_types: Iterable[str] | None,
                      aggregate_type: str | None, since: _dt.datetime | None,
                      until: _dt.datetime | None, until_inclusive: bool) -> DataFrame:
    """Kafka records (batch or stream) of the types, aggregate type and time range asked for,
    in :data:`RECORD_COLUMNS`. The filters run in the JVM, on the records' headers and Kafka
    timestamp, so what is not asked for never reaches Python."""
    from pyspark.sql import functions as F

    from cqrs.processor.job import header_expr

    if written_types is not None:
        frame = frame.where(F.expr(header_expr("cqrs.message_type")).cast("string")
                            .isin(sorted(written_types)))
    if aggregate_type is not None:
        frame = frame.where(F.expr(header_expr("cqrs.aggregate_type")).cast("string")
                            == aggregate_type)
    if since is not None:
        frame = frame.where(F.col("timestamp") >= F.lit(since))
    if until is not None:
        frame = frame.where(F.col("timestamp") <= F.lit(until) if until_inclusive
                            else F.col("timestamp") < F.lit(until))
    return frame.select(*RECORD_COLUMNS)


def _history_rows(batch: Any) -> list[HistoryRow]:
    """The history rows of a record batch of Kafka records, by the history job's own function
    (records that are not events, or not readable, are passed over as the history job passes
    them over). The headers are read from the batch's flat key and value arrays: a dict per
    header (``to_pylist``) cost more than the rest of the row."""
    import pyarrow as pa

    from cqrs.history.job import HistoryRun

    column = batch.column("headers")
    bounds = column.offsets.to_pylist()
    flat = column.values
    names, values = flat.field("key").to_pylist(), flat.field("value").to_pylist()
    pairs = list(zip(names, values, strict=True))
    valid = column.is_valid().to_pylist() if column.null_count else None
    headers = [pairs[bounds[i]:bounds[i + 1]] if valid is None or valid[i] else None
               for i in range(len(column))]
    recorded_ms = [None if us is None else us // 1000
                   for us in batch.column("timestamp").cast(pa.int64()).to_pylist()]
    records = list(zip(batch.column("key").to_pylist(), batch.column("value").to_pylist(),
                       headers, batch.column("partition").to_pylist(),
                       batch.column("offset").to_pylist(), recorded_ms, strict=True))
    return HistoryRun.rows(records)[0]


def decode_records(records: DataFrame, spec: LogSpec, names: tuple[str, ...], *, flat: bool,
                   payload: bool = False) -> DataFrame:
    """Kafka records (:data:`RECORD_COLUMNS`, as Spark's Kafka source reads them: the stream)
    -> events of ``names`` in the columns of an :class:`~cqrs.history.columns.EventLayout`, in
    one pass in the executors (:func:`decode_record_batch`)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from cqrs.loading import load_app

    layout = EventLayout(load_app(spec.app_ref), names, flat=flat, payload=payload)
    return records.mapInArrow(_decoder(spec, names, flat, payload, decode_record_batch),
                              from_arrow_schema(layout.schema()))


def decode_record_batch(batch: Any, codec: Codec, layout: EventLayout, wanted: set[str], *,
                        derive_ids: bool = True) -> Any:
    """A batch of Kafka records -> the layout's batch of the events of ``wanted`` types
    (``derive_ids``: see :func:`~cqrs.history.batches.lean_event_columns`)."""
    import pyarrow as pa

    from cqrs.history.batches import lean_event_columns, writer_columns

    columns = lean_event_columns(batch, derive_ids=derive_ids)
    if columns is None:  # not all lean events: record by record
        return _decode_row_list(_history_rows(batch), codec, layout, wanted)
    payloads = columns["payload"].to_pylist()
    decoded = [codec.decode(p) for p in payloads]
    types = type_names(decoded)
    keep = [i for i, t in enumerate(types) if t in wanted]
    kinds, versions = writer_columns(payloads, codec.writer_of)
    if len(keep) < len(decoded):
        taken = pa.array(keep, pa.int64())
        columns = {k: v.take(taken) for k, v in columns.items()}
        decoded = [decoded[i] for i in keep]
        types = [types[i] for i in keep]
        kinds, versions = [kinds[i] for i in keep], [versions[i] for i in keep]
    columns["schema_type"], columns["schema_version"] = kinds, versions
    return layout.batch_of(columns, decoded, columns["payload"] if layout.payload else None,
                           types)


def _archive_rows(spark: SparkSession, path: str, written_types: Iterable[str] | None,
                  aggregate_type: str | None, since: _dt.datetime | None,
                  until: _dt.datetime | None, until_inclusive: bool) -> DataFrame:
    """An archive's history rows: its folders of the event types asked for, its days of the
    range (Spark reads no other file)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import DateType, StructField

    schema = from_arrow_schema(row_schema()).add(StructField("day", DateType()))
    frame = spark.read.schema(schema).option("basePath", path).parquet(path)
    if written_types is not None:
        frame = frame.where(F.col("event_type").isin(sorted(written_types)))
    if aggregate_type is not None:
        frame = frame.where(F.col("aggregate_type") == aggregate_type)
    if since is not None:
        frame = frame.where((F.col("day") >= F.lit(since.date())) &
                            (F.col("recorded_at") >= F.lit(since)))
    if until is not None:
        frame = frame.where((F.col("day") <= F.lit(until.date())) &
                            (F.col("recorded_at") <= F.lit(until) if until_inclusive
                             else F.col("recorded_at") < F.lit(until)))
    return frame.select(*ROW_COLUMNS)


def decode_rows(rows: DataFrame, spec: LogSpec, names: tuple[str, ...], *, flat: bool,
                payload: bool = False) -> DataFrame:
    """History rows -> events of ``names`` in the columns of an
    :class:`~cqrs.history.columns.EventLayout` (decoded in the executors)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from cqrs.loading import load_app

    layout = EventLayout(load_app(spec.app_ref), names, flat=flat, payload=payload)
    return rows.mapInArrow(_decoder(spec, names, flat, payload, _decode_rows),
                           from_arrow_schema(layout.schema()))


def _decode_rows(batch: Any, codec: Codec, layout: EventLayout, wanted: set[str]) -> Any:
    """A batch of history rows -> the layout's batch of the events of ``wanted`` types."""
    return _decode_row_list(rows_from_arrow(batch), codec, layout, wanted)


def _decode_row_list(rows: list[HistoryRow], codec: Codec, layout: EventLayout,
                     wanted: set[str]) -> Any:
    """History rows, decoded by :func:`~cqrs.history.rows.decode_row` (the reader's function),
    -> the layout's batch of the events of ``wanted`` types."""
    events = [decode_row(codec, r) for r in rows]
    keep = [i for i, e in enumerate(events) if type_name(e.event) in wanted]
    return layout.batch([events[i] for i in keep],
                        [rows[i].payload for i in keep] if layout.payload else None)


def _decoder(spec: LogSpec, names: tuple[str, ...], flat: bool, payload: bool,
             decode: Callable[[Any, Codec, EventLayout, set[str]], Any]
             ) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The executors' function of a decoding ``mapInArrow``: each Arrow batch -> the layout's
    batch, by ``decode``."""
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from cqrs.collector import paused
        from cqrs.loading import load_app

        codec = spec_codec(spec)
        layout = EventLayout(load_app(spec.app_ref), names, flat=flat, payload=payload)
        wanted = set(names)
        for batch in batches:
            if batch.num_rows:
                with paused():  # tens of thousands of objects a batch, and no cycles
                    out = decode(batch, codec, layout, wanted)
                yield out
    return run


# ---- the public functions ----------------------------------------------------------------------


def log_table(spark: SparkSession, app: App | str, *,
              event_types: Iterable[str | type] | str | type | None = None,
              since: _dt.datetime | None = None, until: _dt.datetime | None = None,
              source: str | None = None, dedupe: bool = True, cfg: CqrsConfig | None = None,
              topics: AppTopics | None = None) -> DataFrame:
    """The events of ``app`` (an App defined in an importable module, or its
    ``module:attribute``) as a DataFrame: the envelope as columns
    (:data:`~cqrs.history.columns.ENVELOPE_COLUMNS`), then

    - with one event type asked for (``event_types="example.bank.Deposited"``, a class, or a
      list of one): that type's fields as columns;
    - otherwise (several types, or ``None``: every event type of the app): one struct column per
      type, named by its last name part (``Deposited``, see
      :func:`~cqrs.history.columns.view_names`), holding the fields on that type's rows and null
      on the others (``deposits.amount``, or ``select("Deposited.*")``).

    ``since`` / ``until`` (timezone-aware) keep the events Kafka recorded at or after ``since``
    and before ``until``. ``source``: the folder of an archive (:func:`~cqrs.history.archive.
    write_archive`) instead of the events topic. ``dedupe`` (default): one row per aggregate and
    version (the copies a re-run batch wrote give way to the last one, as in the history table;
    see :mod:`cqrs.history.log_source`). Events written by older classes show in today's shape
    (the app's upcasters); ``schema_type`` and ``schema_version`` say what they were written
    with. ``event_id``, which the processor's events do not carry, is derived by Spark when a
    query reads it."""
    since, until = aware_time(since, "since"), aware_time(until, "until")
    check_range(since, until)
    src = LogSource.open(spark, app, cfg=cfg, topics=topics, source=source)
    names = event_type_names(src.app, event_types)
    flat = event_types is not None and len(names) == 1
    return log_events(spark, src, names, flat=flat, since=since, until=until, dedupe=dedupe)


def log_events(spark: SparkSession, src: LogSource, names: tuple[str, ...], *, flat: bool,
               since: _dt.datetime | None = None, until: _dt.datetime | None = None,
               dedupe: bool = True, payload: bool = False) -> DataFrame:
    """The events of ``names`` of the log ``src`` in an :class:`EventLayout`'s columns: the
    topic's records deduplicated (``dedupe``) and decoded in one pass, or an archive's rows
    (written deduplicated) decoded."""
    written = written_type_names(src.app, names)
    if src.path is not None:
        return decode_rows(src.rows(spark, written_types=written, since=since, until=until),
                           src.spec, names, flat=flat, payload=payload)
    from cqrs.history.log_source import log_read_frame

    assert src.topic is not None and src.marks is not None
    return log_read_frame(spark, src.spec, src.topic, src.marks, names, flat=flat,
                          payload=payload, written_types=written, since=since, until=until,
                          dedupe=dedupe)


def log_stream(spark: SparkSession, app: App | str, *,
               event_types: Iterable[str | type] | str | type | None = None,
               starting_offsets: str = "earliest", max_offsets_per_trigger: int | None = None,
               cfg: CqrsConfig | None = None, topics: AppTopics | None = None) -> DataFrame:
    """:func:`log_table` as a streaming DataFrame over the events topic (the same columns),
    from ``starting_offsets`` ("earliest", "latest" or Spark's JSON of offsets). Not
    deduplicated: a copy written again by a re-run batch shows again (drop it by
    ``aggregate_type``, ``aggregate_id`` and ``version``, e.g. with
    ``dropDuplicatesWithinWatermark``)."""
    src = LogSource.open(spark, app, cfg=cfg, topics=topics, live=True)
    names = event_type_names(src.app, event_types)
    flat = event_types is not None and len(names) == 1
    reader = (spark.readStream.format("kafka").options(**src.spec.cfg.kafka.spark_options())
              .option("subscribe", src.topic)
              .option("startingOffsets", starting_offsets)
              .option("includeHeaders", "true")
              .option("failOnDataLoss", "true"))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    records = _filtered_records(reader.load(), written_type_names(src.app, names), None, None,
                                None, False)
    return decode_records(records, src.spec, names, flat=flat)


def log_views(spark: SparkSession, app: App | str, *, since: _dt.datetime | None = None,
              until: _dt.datetime | None = None, source: str | None = None,
              cfg: CqrsConfig | None = None, topics: AppTopics | None = None) -> dict[str, str]:
    """Register temporary views of the app's log for Spark SQL: ``events`` (every event's
    envelope) and one per event type, named by :func:`~cqrs.history.columns.view_names`
    (``Deposited``), with the envelope and that type's fields. Returns ``{view: event type}``
    (``events`` -> ``"*"``). Each query reads the log again (and decodes only the types it
    names)."""
    since, until = aware_time(since, "since"), aware_time(until, "until")
    check_range(since, until)
    src = LogSource.open(spark, app, cfg=cfg, topics=topics, source=source)
    names = event_type_names(src.app, None)

    def frame(wanted: tuple[str, ...], flat: bool) -> DataFrame:
        return log_events(spark, src, wanted, flat=flat, since=since, until=until)

    frame(names, False).select(*ENVELOPE_COLUMNS).createOrReplaceTempView(EVENTS_VIEW)
    views = {EVENTS_VIEW: "*"}
    for name, view in view_names(names).items():
        frame((name,), True).createOrReplaceTempView(view)
        views[view] = name
    return views


def states_as_of(spark: SparkSession, app: App | str, aggregate: str | type,
                 at: _dt.datetime | None = None, *, source: str | None = None,
                 cfg: CqrsConfig | None = None, topics: AppTopics | None = None) -> DataFrame:
    """The state of every aggregate of type ``aggregate`` (class or type name) as of ``at``
    (timezone-aware; ``None``: the end of the log): one row per aggregate that existed then,
    after its last event recorded at or before ``at``, folded from version 1 by the aggregate's
    own appliers (:func:`cqrs.history.rows.fold`, what ``HistoryReader.state_at`` runs), with
    :data:`~cqrs.history.columns.STATE_COLUMNS` and the state's fields as columns (null after a
    terminal event: ``deleted``)."""
    at = aware_time(at, "at")
    src = LogSource.open(spark, app, cfg=cfg, topics=topics, source=source)
    name = aggregate if isinstance(aggregate, str) else type_name(aggregate)
    if name not in src.app.model.aggregates:
        raise LogTableError(
            f"aggregate type {name!r} is not in app {src.app.name!r} (types: "
            f"{sorted(src.app.model.aggregates)}): pass one of these")
    from pyspark.sql.pandas.types import from_arrow_schema

    cls = src.app.model.entry(name).aggregate_class
    rows = src.rows(spark, aggregate_type=name, until=at, until_inclusive=True)
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 2)
    ordered = (rows.repartition(partitions, "aggregate_id")
               .sortWithinPartitions("aggregate_id", "version", "partition", "offset"))
    return ordered.mapInArrow(_folder(src.spec, name),
                              from_arrow_schema(StateLayout(cls).schema()))


def state_of(cls: type, codec: Any, rows: list[HistoryRow]) -> HistoricState | None:
    """One aggregate's state after the rows it has, in version order (copies of a version
    adjacent: the last one counts): the fold of its versions 1 to the first missing one, or
    ``None`` when it has no version 1."""
    prefix: list[HistoryRow] = []
    for r in rows:
        if prefix and r.version == prefix[-1].version:
            prefix[-1] = r  # a copy written again: the later one, as the history table keeps
            continue
        if r.version != len(prefix) + 1:
            break
        prefix.append(r)
    if not prefix:
        return None
    return fold(cls, [decode_row(codec, r) for r in prefix], version=len(prefix))


def _folder(spec: LogSpec, aggregate_type: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A partition of history rows sorted by aggregate id and version -> one state each."""
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from cqrs.loading import load_app

        codec = spec_codec(spec)
        cls = load_app(spec.app_ref).model.entry(aggregate_type).aggregate_class
        layout = StateLayout(cls)
        pending: list[HistoryRow] = []  # one aggregate's rows, possibly across batches
        for batch in batches:
            states = []
            for r in rows_from_arrow(batch):
                if pending and r.aggregate_id != pending[0].aggregate_id:
                    states.append(state_of(cls, codec, pending))
                    pending = []
                pending.append(r)
            found = [s for s in states if s is not None]
            if found:
                yield layout.batch(found)
        last = state_of(cls, codec, pending) if pending else None
        if last is not None:
            yield layout.batch([last])
    return run
