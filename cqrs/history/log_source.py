"""The events topic as the log table reads it in batch: tasks that read a partition each with
librdkafka and decode it in the same pass.

Spark's Kafka connector hands the records to Python through the JVM (a consumer, rows, header
expressions, a sort for the copies, Arrow); on the 2-core box that path cost more than the
decoding itself. Here the JVM only runs one task per partition of the topic and takes the
decoded Arrow batches, as the command processor reads its commands (:mod:`cqrs.processor.source`).
The tasks are a ``mapInArrow`` over one row per partition rather than a Python data source: a
data source plans in a Python process of its own, which cost a session's first query seconds.

A task reads its partition's range (the offsets the driver saw when it opened the log) in
chunks, from the end backwards, and makes each chunk a batch of Kafka records in
:data:`~cqrs.history.frames.RECORD_COLUMNS` (what Spark's connector gives), decoded by the
functions the other paths call (:func:`cqrs.history.frames.decode_record_batch`). Reading
backwards keeps the last written of each aggregate type, aggregate id and version (a re-run
batch writes its events again: the copies are in one partition, which one task reads) with a
memory of the versions seen per aggregate of the partition (:class:`Seen`), not of the records.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import numpy as np

from cqrs.envelope import HEADER_PREFIX
from cqrs.history.columns import LogTableError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from cqrs.history.frames import LogSpec

__all__ = ["LogRead", "Seen", "log_read_frame", "read_partition", "record_batch"]

CHUNK: Final = 100_000  # records read forward at a time (the partition is taken backwards)
_TAKE: Final = 20_000  # messages asked of librdkafka at a time
_MESSAGE_TYPE, _AGGREGATE_TYPE, _VERSION = (HEADER_PREFIX + n for n in
                                            ("message_type", "aggregate_type", "version"))


@attrs.frozen
class LogRead:
    """What the tasks of a log read need (pickled into each): the log, its partitions' offset
    ranges, the types wanted and the layout of the columns, and the filters."""

    spec: LogSpec
    topic: str
    names: tuple[str, ...]  # the event types of the layout (today's names)
    flat: bool
    payload: bool
    written_types: tuple[str, ...] | None = None  # the names the records carry; None: all
    aggregate_type: str | None = None
    since_us: int | None = None  # Kafka's record time (microseconds since 1970), at or after
    until_us: int | None = None  # before (at or before: until_inclusive)
    until_inclusive: bool = False
    dedupe: bool = True
    rows: bool = False  # history rows (ROW_COLUMNS) instead of the layout's decoded events
    chunk: int = CHUNK


def _us(at: _dt.datetime | None) -> int | None:
    return None if at is None else (at - _EPOCH) // _dt.timedelta(microseconds=1)


_EPOCH: Final = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def log_read_frame(spark: SparkSession, spec: LogSpec, topic: str,
                   marks: dict[int, tuple[int, int]], names: tuple[str, ...], *, flat: bool,
                   payload: bool, written_types: Iterable[str] | None = None,
                   aggregate_type: str | None = None, since: _dt.datetime | None = None,
                   until: _dt.datetime | None = None, until_inclusive: bool = False,
                   dedupe: bool = True, rows: bool = False) -> DataFrame:
    """The events of ``names`` in the columns of an :class:`~cqrs.history.columns.EventLayout`
    read from ``topic`` between ``marks``, or (``rows``) their history rows (see
    :class:`LogRead` for the rest)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from cqrs.history.columns import EventLayout, event_id_sql, row_schema
    from cqrs.loading import load_app

    read = LogRead(spec, topic, tuple(names), flat, payload,
                   None if written_types is None else tuple(sorted(written_types)),
                   aggregate_type, _us(since), _us(until), until_inclusive, dedupe, rows)
    schema = from_arrow_schema(row_schema() if rows else EventLayout(
        load_app(spec.app_ref), read.names, flat=flat, payload=payload).schema())
    parts = [(p, low, high) for p, (low, high) in sorted(marks.items()) if high > low]
    if not parts:
        return spark.createDataFrame([], schema)
    # one row per partition of the topic (its index in ``parts``), each in a Spark partition of
    # its own: a task reads its partition of the topic and yields the decoded batches (a Python
    # data source would do the same, but plans in a Python process of its own: seconds for a
    # session's first query)
    frame = spark.range(len(parts), numPartitions=len(parts)).mapInArrow(
        _reader(read, parts), schema)
    if rows:
        return frame
    # the ids lean events do not carry, derived by Spark: only when a query reads them
    return frame.withColumn("event_id", F.coalesce(F.col("event_id"), F.expr(event_id_sql())))


def _reader(read: LogRead, parts: list[tuple[int, int, int]]
            ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The tasks' function: each row of its batches, the index of a partition of the topic in
    ``parts`` (with its offset range) -> the decoded batches of that range."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column("id").to_pylist():
                yield from read_partition(read, *parts[index])
    return run


def read_partition(read: LogRead, partition: int, low: int, high: int
                   ) -> Iterator[pa.RecordBatch]:
    """The events of ``[low, high)`` of a partition of the topic, decoded into the layout's
    batches (a chunk each), the last chunk first."""
    from cqrs.collector import paused
    from cqrs.history.columns import EventLayout, rows_to_arrow
    from cqrs.history.frames import _history_rows, decode_record_batch, spec_codec
    from cqrs.kafka_io import make_consumer
    from cqrs.loading import load_app

    codec = spec_codec(read.spec)
    layout = EventLayout(load_app(read.spec.app_ref), read.names, flat=read.flat,
                         payload=read.payload)
    wanted = set(read.names)
    consumer = make_consumer(read.spec.cfg, **{
        "enable.partition.eof": False, "fetch.wait.max.ms": 10,
        # librdkafka waits fetch.queue.backoff.ms (1 s) whenever its queue holds
        # queued.min.messages: read flat out, that stalled every 100,000 records
        "queued.min.messages": _TAKE, "fetch.queue.backoff.ms": 1})
    seen = Seen() if read.dedupe else None
    try:
        for start, end in chunks(low, high, read.chunk):
            messages = _consume(consumer, read.topic, partition, start, end)
            with paused():  # tens of thousands of objects a chunk, and no cycles
                batch = record_batch(messages, partition, read, seen)
                if not batch.num_rows:
                    out = None
                elif read.rows:
                    out = rows_to_arrow(_history_rows(batch))
                else:
                    out = decode_record_batch(batch, codec, layout, wanted, derive_ids=False)
            if out is not None and out.num_rows:
                yield out
    finally:
        consumer.close()


def chunks(low: int, high: int, size: int) -> list[tuple[int, int]]:
    """``[low, high)`` in ranges of at most ``size`` offsets, the last range first."""
    out = []
    end = high
    while end > low:
        start = max(low, end - size)
        out.append((start, end))
        end = start
    return out


def _consume(consumer: Any, topic: str, partition: int, start: int, end: int,
             idle_s: float = 60.0) -> list[Any]:
    """The messages of ``[start, end)`` of a partition (a gap, such as an offset retention
    deleted since the driver saw it, is passed over), in offset order."""
    import time

    from confluent_kafka import KafkaException, TopicPartition

    consumer.assign([TopicPartition(topic, partition, start)])
    out: list[Any] = []
    at, idle_since = start, time.monotonic()
    while at < end:
        taken = consumer.consume(min(_TAKE, end - at), 1.0)
        for m in taken:
            if m.error() is not None:
                raise KafkaException(m.error())
        if not taken:
            if time.monotonic() - idle_since > idle_s:
                raise LogTableError(
                    f"{topic} partition {partition} gave nothing at offset {at} for {idle_s:.0f} "
                    f"s, though it held records up to {end} when the log was opened: is Kafka "
                    "reachable? Read the log again")
            continue
        idle_since = time.monotonic()
        at = taken[-1].offset() + 1
        out.extend(taken if at <= end else [m for m in taken if m.offset() < end])
    return out


class Seen:
    """The versions kept so far per aggregate (aggregate type and id) of one partition read
    backwards: a range ``(lowest, highest)`` while they run without a gap (the usual case, a
    version below the last), a set once they do not."""

    def __init__(self) -> None:
        self._versions: dict[tuple[bytes, bytes], tuple[int, int] | set[int]] = {}

    def first(self, aggregate: tuple[bytes, bytes], version: int) -> bool:
        """Whether ``version`` of ``aggregate`` is met for the first time (and remember it)."""
        got = self._versions.get(aggregate)
        if got is None:
            self._versions[aggregate] = (version, version)
            return True
        if isinstance(got, tuple):
            low, high = got
            if version == low - 1:
                self._versions[aggregate] = (version, high)
                return True
            if low <= version <= high:
                return False
            got = self._versions[aggregate] = set(range(low, high + 1))
        if version in got:
            return False
        got.add(version)
        return True


def record_batch(messages: Sequence[Any], partition: int, read: LogRead,
                 seen: Seen | None) -> pa.RecordBatch:
    """The records of ``messages`` (librdkafka's, of one chunk in offset order) that ``read``
    asks for, as a batch in :data:`~cqrs.history.frames.RECORD_COLUMNS`. With ``seen`` (a
    deduplicating read; chunks given last first), only the last written of each aggregate
    type, aggregate id and version, and none without a key or a version header, as the history
    job keeps them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from cqrs.history.batches import header_values

    bounds = [0]
    pairs: list[tuple[str, bytes | None]] = []
    extend, bound = pairs.extend, bounds.append
    for m in messages:
        h = m.headers()
        if h:
            extend(h)
        bound(len(pairs))
    names, values = (list(x) for x in zip(*pairs, strict=True)) if pairs else ([], [])
    headers = pa.ListArray.from_arrays(
        pa.array(bounds, pa.int32()),
        pa.StructArray.from_arrays([pa.array(names, pa.string()), pa.array(values, pa.binary())],
                                   ["key", "value"]))
    times = pc.multiply(pa.array([m.timestamp()[1] for m in messages], pa.int64()), 1000)
    batch = pa.RecordBatch.from_arrays(
        [pa.array([m.key() for m in messages], pa.binary()),
         pa.array([m.value() for m in messages], pa.binary()), headers,
         pa.array(np.full(len(messages), partition, dtype=np.int32)),
         pa.array([m.offset() for m in messages], pa.int64()),
         times.cast(pa.timestamp("us", tz="UTC"))],  # Kafka's milliseconds, as Spark's column
        ["key", "value", "headers", "partition", "offset", "timestamp"])
    keep = None
    if read.since_us is not None:
        keep = _and(keep, pc.greater_equal(times, read.since_us))
    if read.until_us is not None:
        keep = _and(keep, (pc.less_equal if read.until_inclusive else pc.less)(
            times, read.until_us))
    if read.written_types is not None:
        keep = _and(keep, pc.is_in(header_values(headers, _MESSAGE_TYPE),
                                   pa.array([t.encode() for t in read.written_types],
                                            pa.binary())))
    aggregate_types = None
    if read.aggregate_type is not None or seen is not None:
        aggregate_types = header_values(headers, _AGGREGATE_TYPE)
    if read.aggregate_type is not None:
        keep = _and(keep, pc.equal(aggregate_types, read.aggregate_type.encode()))
    if keep is not None:
        keep = pc.fill_null(keep, False)
    if seen is not None:  # among the records the filters kept, as the history table of them
        keep = pa.array(_last_written(
            batch.column("key").to_pylist(), aggregate_types.to_pylist(),
            _versions(header_values(headers, _VERSION)),
            None if keep is None else keep.to_pylist(), seen), pa.bool_())
    return batch if keep is None else batch.filter(keep)


def _and(a: pa.Array | None, b: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return b if a is None else pc.and_(a, b)


def _last_written(keys: list[bytes | None], aggregate_types: list[bytes | None],
                  versions: list[int | None], wanted: list[bool] | None, seen: Seen
                  ) -> list[bool]:
    """Whether each record (of those ``wanted``: all when None) is the last written of its
    aggregate and version (``seen`` holds the later chunks'); none without a key or a
    version."""
    keep = [False] * len(keys)
    first = seen.first
    for i in range(len(keys) - 1, -1, -1):  # backwards: the last written comes first
        key, version = keys[i], versions[i]
        if key is not None and version is not None and (wanted is None or wanted[i]):
            keep[i] = first((aggregate_types[i] or b"", key), version)
    return keep


def _versions(values: pa.Array) -> list[int | None]:
    """The version headers' values as integers (None where one is absent or not a number)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        return pc.cast(pc.utf8_trim_whitespace(values.cast(pa.string())), pa.int64()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return [_version(v) for v in values.to_pylist()]


def _version(value: bytes | None) -> int | None:
    """A version header's value as Spark's ``CAST(... AS LONG)`` of its text reads it (None
    when it does not)."""
    if value is None:
        return None
    try:
        text = value.decode().strip()
        return int(text) if text.lstrip("+-").isdigit() else None
    except (UnicodeDecodeError, ValueError):
        return None
