"""An aggregate's history, the pure part: one row per event, from the events topic's record,
and back to an event with its envelope; the fold of a prefix of the history (state at a
version or a time). No Kafka, Cassandra or Spark here: the history job, the reader and the
tests share these functions.

A row keeps the event's payload as the processor wrote it (the Avro single-object encoding):
the reader decodes it with the app's codec and upcasters, so an old event shows in its
current shape, and a row never has to be rewritten when a class changes.

Rows live in partitions of :data:`BUCKET_SIZE` versions (``bucket = version //
BUCKET_SIZE``): an aggregate with millions of events spreads over partitions of 10,000 rows.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs

from cqrs.domain.decision import replay
from cqrs.envelope import Headers, from_kafka
from cqrs.errors import CqrsError

__all__ = [
    "BUCKET_SIZE",
    "HistoricState",
    "HistoryEvent",
    "HistoryPage",
    "HistoryRangeError",
    "HistoryRequestError",
    "HistoryRow",
    "HistoryTimeError",
    "bucket_of",
    "decode_row",
    "fold",
    "row_from_record",
    "rows_from_records",
    "utc_time",
]

BUCKET_SIZE: Final = 10_000
"""Versions per Cassandra partition of the history table."""

_UTC: Final = _dt.timezone.utc


def bucket_of(version: int, bucket_size: int = BUCKET_SIZE) -> int:
    """The partition bucket of ``version``."""
    return version // bucket_size


class HistoryRangeError(CqrsError, LookupError):
    """A version or a time outside an aggregate's history (the message names the range)."""


class HistoryRequestError(CqrsError, ValueError):
    """A history request that cannot be answered as asked (a bad limit, page token or type)."""


class HistoryTimeError(HistoryRequestError):
    """A time that is not one: malformed, a date alone, or without a UTC offset (the message
    says how to write it)."""


@attrs.frozen(slots=True)
class HistoryRow:
    """One event as the history table keeps it."""

    aggregate_type: str
    aggregate_id: str
    version: int
    event_id: str
    event_type: str
    timestamp_us: int  # the domain time (the command's), microseconds since the epoch, UTC
    recorded_ms: int  # when Kafka recorded it (the record's timestamp), ms since the epoch
    command_id: str | None
    correlation_id: str | None
    causation_id: str | None
    payload: bytes  # the event, Avro single-object encoded, as written
    partition: int  # where it is in the events topic
    offset: int

    @property
    def bucket(self) -> int:
        return bucket_of(self.version)


_EPOCH: Final = _dt.datetime(1970, 1, 1, tzinfo=_UTC)


def _micros(ts: _dt.datetime) -> int:
    delta = ts.astimezone(_UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_micros(us: int) -> _dt.datetime:
    return _EPOCH + _dt.timedelta(microseconds=us)


def row_from_record(key: bytes | None, value: bytes | None, headers: Headers | Iterable[Any] | None,
                    partition: int, offset: int, timestamp_ms: int) -> HistoryRow | None:
    """The history row of an events-topic record, or ``None`` for a record that is not an
    event with a version (raises :class:`~cqrs.errors.CqrsError` for an unreadable one)."""
    env, payload = from_kafka(key, value, headers)
    if env.kind != "event" or env.version is None:
        return None
    return HistoryRow(env.aggregate_type, env.aggregate_id, env.version, env.message_id,
                      env.message_type, _micros(env.timestamp), int(timestamp_ms),
                      env.command_id, env.correlation_id, env.causation_id, payload,
                      partition, offset)


def rows_from_records(records: Iterable[Any]) -> list[HistoryRow]:
    """The history rows of events-topic records (objects with ``key``, ``value``, ``headers``,
    ``partition``, ``offset`` and ``timestamp_ms``, such as :class:`cqrs.kafka_io.KafkaRecord`);
    records that are not events are left out."""
    rows = []
    for r in records:
        row = row_from_record(r.key, r.value, r.headers, r.partition, r.offset, r.timestamp_ms)
        if row is not None:
            rows.append(row)
    return rows


@attrs.frozen(slots=True)
class HistoryEvent:
    """One event of an aggregate's history: the decoded event (in its current shape, upcast
    when it was written by an older class) and its envelope.

    ``timestamp`` is the domain time (the time of the command that caused it, inherited by
    every event of a conversation); ``recorded_at`` is when Kafka recorded the event.
    ``schema_type`` and ``schema_version`` name the class version it was written with."""

    aggregate_type: str
    aggregate_id: str
    version: int
    event_id: str
    event_type: str
    event: Any
    timestamp: _dt.datetime
    recorded_at: _dt.datetime
    command_id: str | None
    correlation_id: str | None
    causation_id: str | None
    schema_type: str | None = None
    schema_version: int | None = None
    partition: int = -1
    offset: int = -1


def decode_row(codec: Any, row: HistoryRow) -> HistoryEvent:
    """The :class:`HistoryEvent` of a row, decoded (and upcast) by ``codec``."""
    payload = bytes(row.payload)
    event = codec.decode(payload)
    schema_type: str | None
    schema_version: int | None
    try:
        schema_type, schema_version = codec.writer_of(payload)
    except Exception:  # noqa: BLE001 - a codec without writer_of: the envelope still reads
        schema_type = schema_version = None
    return HistoryEvent(row.aggregate_type, row.aggregate_id, row.version, row.event_id,
                        row.event_type, event, _from_micros(row.timestamp_us),
                        _dt.datetime.fromtimestamp(row.recorded_ms / 1000, _UTC),
                        row.command_id, row.correlation_id, row.causation_id, schema_type,
                        schema_version, row.partition, row.offset)


@attrs.frozen
class HistoryPage:
    """A page of an aggregate's history: ``next_version`` (and ``next_page_token``, the same
    as text) is where the next page starts, ``None`` on the last page."""

    events: tuple[HistoryEvent, ...]
    next_version: int | None

    @property
    def next_page_token(self) -> str | None:
        return None if self.next_version is None else str(self.next_version)


@attrs.frozen
class HistoricState:
    """An aggregate as it was: after the event at ``version`` (``state`` ``None`` and
    ``deleted`` true after a terminal event). ``timestamp`` and ``recorded_at`` are those of
    that event."""

    aggregate_type: str
    aggregate_id: str
    version: int
    deleted: bool
    state: Any
    timestamp: _dt.datetime
    recorded_at: _dt.datetime


def utc_time(at: _dt.datetime) -> _dt.datetime:
    """``at`` in UTC; :class:`HistoryTimeError` for a time without a UTC offset."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise HistoryTimeError(
            f"time {at.isoformat()} has no UTC offset: give a timezone-aware time, e.g. "
            "2026-03-01T12:00:00+00:00")
    return at.astimezone(_UTC)


def fold(aggregate_cls: type, events: Sequence[HistoryEvent], *, last_version: int | None = None,
         version: int | None = None, at: _dt.datetime | None = None) -> HistoricState:
    """The aggregate after the first events of its history: up to ``version``, or up to the last
    event recorded at or before ``at``, folded by the aggregate's appliers
    (:func:`cqrs.domain.decision.replay`). ``events`` starts at version 1, in order, and holds
    at least what is needed (when it ends before ``version``, it is the whole history). :class:`HistoryRangeError` names the range when ``version`` or ``at`` is outside."""
    if (version is None) == (at is None):
        raise HistoryRangeError("give one of version or at (a time), not both or neither")
    if not events:
        raise HistoryRangeError("the aggregate has no events in history")
    ident = f"{events[0].aggregate_type} {events[0].aggregate_id!r}"
    last = events[-1].version if last_version is None else last_version
    if version is not None:
        if version < 1:
            raise HistoryRangeError(
                f"version {version} is before the history of {ident}: its versions start at 1 "
                "(version 1 is the state after its first event)")
        if version > events[-1].version:
            raise HistoryRangeError(
                f"version {version} is outside the history of {ident}: its versions are 1 to "
                f"{last}")
        chosen = [e for e in events if e.version <= version]
    else:
        assert at is not None
        when = utc_time(at)
        first = events[0].recorded_at
        if when < first:
            raise HistoryRangeError(
                f"time {when.isoformat()} is before the history of {ident}: its first event was "
                f"recorded at {first.isoformat()} (version 1): ask for a time at or after it")
        chosen = []
        for e in events:
            if e.recorded_at > when:
                break
            chosen.append(e)
    if [e.version for e in chosen] != list(range(1, len(chosen) + 1)):
        raise HistoryRangeError(
            f"the history of {ident} has a gap before version {len(chosen) + 1}: the history job "
            "has not written every event yet (is `cqrs run history` running?)")
    state, folded = replay(aggregate_cls, [e.event for e in chosen])
    end = chosen[-1]
    return HistoricState(end.aggregate_type, end.aggregate_id, folded, state is None, state,
                         end.timestamp, end.recorded_at)
