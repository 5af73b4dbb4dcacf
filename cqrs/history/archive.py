"""The event log archived to Parquet, partitioned by event type and day, readable by Spark,
pandas or DuckDB without this framework, and by :func:`~cqrs.history.frames.log_table`
(``source=PATH``) as if it were the events topic.

Layout::

    PATH/_cqrs_archive.json                      what is archived, and every schema it needs
    PATH/event_type=<type name>/day=<YYYY-MM-DD>/part-*.parquet

A file holds one event type's events of one day (the day Kafka recorded them, UTC) in plain
Parquet columns: the envelope (:data:`~cqrs.history.columns.ENVELOPE_COLUMNS` but
``event_type``, which the folder names), ``payload`` (the event's bytes as written: Avro
single-object encoding, whose writer schemas the JSON file keeps, so the framework decodes them
again, with the upcasters of the day it reads them) and the event's fields as typed columns of
today's class (:mod:`cqrs.history.columns`). Times are ``TIMESTAMP_MICROS`` in UTC.

The archive is written once (``overwrite`` replaces an archive, never another folder), one
deduplicated read of the topic for every event type.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import attrs

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.history.columns import (
    ENVELOPE_COLUMNS, aware_time, check_range, event_type_names, view_names,
)
from cqrs.history.frames import LogSource, log_events
from cqrs.topics import AppTopics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cqrs.app import App

__all__ = [
    "ARCHIVE_FORMAT",
    "ARCHIVE_META",
    "ArchiveError",
    "ArchiveExistsError",
    "ArchiveReport",
    "read_archive_meta",
    "write_archive",
]

ARCHIVE_META: Final = "_cqrs_archive.json"
"""The archive's description, at its root (a name Spark, pyarrow and DuckDB globs pass over)."""
ARCHIVE_FORMAT: Final = 1

Progress = Callable[[str], None]


class ArchiveError(CqrsError, RuntimeError):
    """A folder that is not an archive, or an archive that cannot be written."""


class ArchiveExistsError(ArchiveError, FileExistsError):
    """The archive's folder exists already (pass ``overwrite`` to replace an archive)."""


@attrs.frozen
class ArchiveReport:
    """What :func:`write_archive` wrote."""

    path: str
    app: str
    events: int
    event_types: dict[str, int]  # type name -> events archived
    first_day: str | None  # ISO dates of the first and last day folders
    last_day: str | None
    seconds: float


# ---- files on any file system Spark reaches ------------------------------------------------------


def _fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark._jvm  # noqa: SLF001 - Hadoop's FileSystem API is only reachable this way
    assert jvm is not None, "a classic (non Spark Connect) session is needed"
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(spark._jsc.hadoopConfiguration()), hpath  # noqa: SLF001


def _meta_path(path: str) -> str:
    return path.rstrip("/") + "/" + ARCHIVE_META


def read_archive_meta(spark: SparkSession, path: str) -> dict[str, Any]:
    """The description of the archive at ``path`` (:class:`ArchiveError` when it is none)."""
    fs, meta = _fs(spark, _meta_path(path))
    if not fs.exists(meta):
        raise ArchiveError(
            f"{path!r} is not an archive of the event log: it has no {ARCHIVE_META} (write one "
            "with `cqrs archive APP PATH`, or check the path)")
    meta_json: dict[str, Any] = json.loads(_read_text(spark, _meta_path(path)))
    if meta_json.get("format") != ARCHIVE_FORMAT:
        raise ArchiveError(
            f"archive {path!r} has format {meta_json.get('format')!r}; this release reads format "
            f"{ARCHIVE_FORMAT}: read it with the release that wrote it")
    return meta_json


def _prepare(spark: SparkSession, path: str, overwrite: bool) -> None:
    fs, root = _fs(spark, path)
    if not fs.exists(root):
        return
    is_archive = fs.exists(_fs(spark, _meta_path(path))[1])
    empty = fs.getFileStatus(root).isDirectory() and len(fs.listStatus(root)) == 0
    if empty:
        return
    if not overwrite:
        raise ArchiveExistsError(
            f"{path!r} exists: archive into a new folder, or pass overwrite (--overwrite) to "
            "replace the archive there")
    if not is_archive:
        raise ArchiveExistsError(
            f"{path!r} exists and is not an archive (no {ARCHIVE_META}): overwrite replaces an "
            "archive only; archive into a new folder")
    fs.delete(root, True)


def _read_text(spark: SparkSession, path: str) -> str:
    fs, hpath = _fs(spark, path)
    stream = fs.open(hpath)
    try:
        return str(spark._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))  # noqa: SLF001
    finally:
        stream.close()


def _write_text(spark: SparkSession, path: str, text: str) -> None:
    fs, hpath = _fs(spark, path)
    out = fs.create(hpath, True)
    try:
        out.write(bytearray(text.encode()))
    finally:
        out.close()


# ---- writing ------------------------------------------------------------------------------------


def write_archive(spark: SparkSession, app: App | str, path: str, *,
                  event_types: Iterable[str | type] | None = None,
                  since: _dt.datetime | None = None, until: _dt.datetime | None = None,
                  overwrite: bool = False, cfg: CqrsConfig | None = None,
                  topics: AppTopics | None = None,
                  progress: Progress | None = None) -> ArchiveReport:
    """Archive the log of ``app`` (all event types, or ``event_types``; the events recorded at
    or after ``since`` and before ``until``) into ``path`` (any file system Spark writes: a
    local folder, ``hdfs://``, ``s3a://``), as the module doc describes. The topic is read once,
    deduplicated (one row per aggregate and version) and decoded once; then each event type is
    written. ``progress`` gets a line per step and, on long steps, Spark's task counts."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from cqrs.processor.rebuild import _StageProgress

    started = time.monotonic()
    say = progress or (lambda _msg: None)
    since, until = aware_time(since, "since"), aware_time(until, "until")
    check_range(since, until)
    src = LogSource.open(spark, app, cfg=cfg, topics=topics)
    names = event_type_names(src.app, event_types)
    _prepare(spark, path, overwrite)
    assert src.marks is not None
    say(f"reading {sum(h - lo for lo, h in src.marks.values()):,} records of {src.topic!r} "
        f"({len(src.marks)} partitions) for {len(names)} event types")
    day = F.expr("date_from_unix_date(CAST(floor(unix_micros(recorded_at) / 86400000000) AS INT))")
    events = (log_events(spark, src, names, flat=False, since=since, until=until, payload=True)
              .withColumn("day", day).persist(StorageLevel.MEMORY_AND_DISK))
    timestamps = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(timestamps, None)
    try:
        with _StageProgress(spark, progress, "reading and decoding"):
            counts = {r["event_type"]: int(r["n"]) for r in
                      events.groupBy("event_type").agg(F.count("*").alias("n")).collect()}
            days = events.agg(F.min("day"), F.max("day")).first()
            fingerprints = {bytes(r[0]) for r in events.select(
                F.substring("payload", 3, 8)).distinct().collect()}
        total = sum(counts.values())
        say(f"decoded {total:,} events of {len(counts)} event types in "
            f"{time.monotonic() - started:.1f}s")
        spark.conf.set(timestamps, "TIMESTAMP_MICROS")  # the standard Parquet timestamp
        columns = view_names(names)
        envelope = [c for c in ENVELOPE_COLUMNS if c != "event_type"]
        written = [n for n in names if counts.get(n)]
        for i, name in enumerate(written, 1):
            say(f"writing {name} ({i}/{len(written)}): {counts[name]:,} events")
            with _StageProgress(spark, progress, f"writing {name}"):
                (events.where(F.col("event_type") == name)
                 .select(*envelope, "payload", f"`{columns[name]}`.*", "day")
                 .sortWithinPartitions("day", "aggregate_type", "aggregate_id", "version")
                 .write.partitionBy("day").parquet(f"{path.rstrip('/')}/event_type={name}"))
        meta = {
            "format": ARCHIVE_FORMAT, "app": src.app.name, "topic": src.topic,
            "offsets": {str(p): list(lh) for p, lh in sorted(src.marks.items())},
            "since": since and since.isoformat(), "until": until and until.isoformat(),
            "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            "events": total,
            "event_types": {n: {"folder": f"event_type={n}", "events": counts[n]}
                            for n in written},
            "schemas": _schemas(src, fingerprints),
        }
        _write_text(spark, _meta_path(path), json.dumps(meta, indent=2, sort_keys=True))
    finally:
        events.unpersist()
        if before is None:
            spark.conf.unset(timestamps)
        else:
            spark.conf.set(timestamps, before)
    report = ArchiveReport(path, src.app.name, total, {n: counts[n] for n in written},
                           None if days is None or days[0] is None else days[0].isoformat(),
                           None if days is None or days[1] is None else days[1].isoformat(),
                           round(time.monotonic() - started, 3))
    say(f"archived {total:,} events of {len(written)} event types into {path} "
        f"({report.first_day} to {report.last_day}) in {report.seconds:.1f}s")
    return report


def _schemas(src: LogSource, fingerprints: set[bytes]) -> dict[str, Any]:
    """The writer schemas of the archived payloads, by fingerprint (hex)."""
    from cqrs.codec.kafka_schema_store import KafkaSchemaStore

    cfg = src.spec.cfg
    store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, src.spec.schemas_topic,
                             cfg.kafka.client_options())
    try:
        return {fp.hex(): store.get(fp) for fp in sorted(fingerprints)}
    finally:
        store.close()
