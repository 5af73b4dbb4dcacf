"""``HistoryReader``: one aggregate's events in version order, and its state at a version or a
time, read from the history table (kept by the history job: ``cqrs run history`` or ``cqrs run
app``). A page is one or two single-partition Cassandra queries and a decode with the app's
codec (upcasters included): milliseconds, no Spark.

>>> with HistoryReader(app, cfg) as history:                         # doctest: +SKIP
...     page = history.events("acc-1", from_version=1, limit=50)
...     [(e.version, e.event_type, e.recorded_at) for e in page.events]
...     history.state_at("acc-1", version=2).state
"""

from __future__ import annotations

import datetime as _dt
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from cqrs.collector import paused
from cqrs.config import CqrsConfig
from cqrs.history.rows import (
    HistoricState, HistoryEvent, HistoryPage, HistoryRangeError, HistoryRequestError, HistoryRow,
    HistoryTimeError, decode_row, fold, utc_time,
)
from cqrs.history.table import HistoryTable
from cqrs.topics import AppTopics, topics_for

if TYPE_CHECKING:
    from cqrs.app import App

__all__ = ["MAX_PAGE", "HistoryReader", "HistoryRequestError", "parse_page_token"]

MAX_PAGE: Final = 10_000  # events per page at most
_CHUNK: Final = 1_000  # rows read at a time when folding


def parse_page_token(token: str) -> int:
    """The version a page token (``HistoryPage.next_page_token``) starts at."""
    try:
        version = int(token)
    except ValueError:
        version = 0
    if version < 1:
        raise HistoryRequestError(
            f"page token {token!r} is not one this service gave: pass the next_page_token of "
            "the previous page, or from_version")
    return version


class HistoryReader:
    """Reads the history of aggregates of ``app``. Thread-safe; opens its Cassandra session and
    schema store on first use (or uses ``table`` and ``codec`` when given: tests, offline
    examples). Close it (or use ``with``) when done."""

    def __init__(self, app: App, cfg: CqrsConfig | None = None, *, topics: AppTopics | None = None,
                 table: HistoryTable | None = None, codec: Any = None,
                 clock: Callable[[], _dt.datetime] | None = None) -> None:
        self.app = app
        self.cfg = cfg
        self.topics = topics
        self._table = table
        self._codec = codec
        self._owned: list[Any] = []
        self._opened_table = self._opened_codec = False
        self._clock = clock or (lambda: _dt.datetime.now(_dt.timezone.utc))
        self._lock = threading.Lock()

    def __enter__(self) -> HistoryReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _open(self) -> tuple[HistoryTable, Any]:
        with self._lock:
            if self._table is None or self._codec is None:
                if self.cfg is None:
                    raise HistoryRequestError(
                        "HistoryReader needs a configuration (cfg) to reach Cassandra and the "
                        "schemas topic, or a table and a codec")
                topics = self.topics or topics_for(self.app.name, self.cfg.kafka.topic_prefix)
                if self._table is None:
                    from cqrs.history.table import open_history_table

                    self._table = open_history_table(self.cfg, topics.base)
                    self._owned.append(self._table)
                    self._opened_table = True
                if self._codec is None:
                    from cqrs.processor.state import state_codec

                    self._codec, store = state_codec(self.cfg, self.app, topics)
                    self._owned.append(store)
                    self._opened_codec = True
            return self._table, self._codec

    # ---- which aggregate ----------------------------------------------------------------------

    def _type_of(self, table: HistoryTable, aggregate_id: str, aggregate_type: str | None) -> str | None:
        types = list(self.app.model.aggregates)
        if aggregate_type is not None:
            if aggregate_type not in self.app.model.aggregates:
                raise HistoryRequestError(
                    f"aggregate type {aggregate_type!r} is not in app {self.app.name!r} (types: "
                    f"{sorted(types)}): pass one of these")
            return aggregate_type
        if len(types) == 1:
            return types[0]
        found = [t for t in types if table.read(t, aggregate_id, 0, 1, 1)]
        if len(found) > 1:
            from cqrs.processor.state import AmbiguousAggregateError

            raise AmbiguousAggregateError(
                f"aggregate id {aggregate_id!r} has a history under several types "
                f"{sorted(found)}: pass the type (aggregate_type=... / --type)")
        return found[0] if found else None

    # ---- reading ------------------------------------------------------------------------------

    def _rows(self, table: HistoryTable, aggregate_type: str, aggregate_id: str,
              from_version: int, limit: int) -> list[HistoryRow]:
        """Up to ``limit`` rows from ``from_version`` on, bucket after bucket (versions are
        dense: a bucket that does not reach its last version is the last one)."""
        out: list[HistoryRow] = []
        version = from_version
        size = table.bucket_size
        while len(out) < limit:
            bucket = version // size
            got = table.read(aggregate_type, aggregate_id, bucket, version, limit - len(out))
            out += got
            if not got or got[-1].version != (bucket + 1) * size - 1:
                break
            version = got[-1].version + 1
        return out

    def events(self, aggregate_id: str, aggregate_type: str | None = None, *,
               from_version: int | None = None, limit: int = 100,
               page_token: str | None = None) -> HistoryPage:
        """A page of the aggregate's events in version order, from ``from_version`` (default 1)
        or from ``page_token`` (the previous page's ``next_page_token``; not both), at most
        ``limit``. An unknown aggregate has an empty page."""
        if page_token is not None:
            if from_version is not None:
                raise HistoryRequestError(
                    f"give page_token ({page_token!r}) or from_version ({from_version}), not "
                    "both: the token is where the next page starts")
            from_version = parse_page_token(page_token)
        elif from_version is None:
            from_version = 1
        if not 1 <= limit <= MAX_PAGE:
            raise HistoryRequestError(f"limit {limit} is not between 1 and {MAX_PAGE}")
        if from_version < 1:
            raise HistoryRequestError(
                f"from_version {from_version}: versions start at 1 (the first event)")
        table, codec = self._open()
        found_type = self._type_of(table, aggregate_id, aggregate_type)
        if found_type is None:
            return HistoryPage((), None)
        with paused():  # thousands of objects, no cycles: see cqrs.collector
            rows = self._rows(table, found_type, aggregate_id, from_version, limit + 1)
            more = len(rows) > limit
            rows = rows[:limit]
            return HistoryPage(tuple(decode_row(codec, r) for r in rows),
                               rows[-1].version + 1 if more else None)

    def iter_events(self, aggregate_id: str, aggregate_type: str | None = None, *,
                    from_version: int = 1) -> Iterator[HistoryEvent]:
        """Every event of the aggregate from ``from_version``, read a chunk at a time."""
        table, codec = self._open()
        found_type = self._type_of(table, aggregate_id, aggregate_type)
        if found_type is None:
            return
        version = from_version
        while True:
            with paused():
                rows = self._rows(table, found_type, aggregate_id, version, _CHUNK)
                events = [decode_row(codec, r) for r in rows]
            yield from events
            if len(rows) < _CHUNK:
                return
            version = rows[-1].version + 1

    def state_at(self, aggregate_id: str, aggregate_type: str | None = None, *,
                 version: int | None = None, at: _dt.datetime | None = None) -> HistoricState | None:
        """The aggregate as it was after the event at ``version``, or after the last event
        recorded (by Kafka) at or before ``at`` (a timezone-aware time), folded by the app's
        appliers; ``None`` for an aggregate without history. Raises
        :class:`~cqrs.history.rows.HistoryRangeError`, naming the range, when ``version`` or
        ``at`` is outside the aggregate's history (or ``at`` is in the future)."""
        if (version is None) == (at is None):
            raise HistoryRequestError("give one of version=N or at=TIME, not both or neither")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            raise HistoryRequestError(f"version {version!r} is not a whole number: pass e.g. version=2")
        if at is not None and not isinstance(at, _dt.datetime):
            raise HistoryTimeError(
                f"at={at!r} is not a datetime: pass a timezone-aware datetime (parse text with "
                "datetime.fromisoformat, e.g. '2026-03-01T12:00:00+00:00')")
        if at is not None:
            at = utc_time(at)  # before any read: a time without an offset is refused
        table, _ = self._open()
        found_type = self._type_of(table, aggregate_id, aggregate_type)
        if found_type is None:
            return None
        cls = self.app.model.entry(found_type).aggregate_class
        with paused():
            return self._fold(cls, self.iter_events(aggregate_id, found_type), version, at)

    def _fold(self, cls: type, events: Iterator[HistoryEvent], version: int | None,
              at: _dt.datetime | None) -> HistoricState | None:
        if version is not None:
            wanted = list(itertools.islice(events, max(version, 0) + 1))
        else:
            assert at is not None
            if at > self._clock():
                raise HistoryRangeError(
                    f"time {at.isoformat()} is in the future (it is {self._clock().isoformat()} "
                    "now): the history knows the past only")
            wanted = []
            for e in events:
                wanted.append(e)
                if e.recorded_at > at:
                    break
        if not wanted:
            return None
        return fold(cls, wanted, version=version, at=at)

    def close(self) -> None:
        with self._lock:
            for owned in self._owned:
                owned.close()
            self._owned = []
            if self._opened_table:
                self._table = None
            if self._opened_codec:
                self._codec = None
