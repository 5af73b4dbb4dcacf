"""The history job: it serves the app's events topic and writes one history row per event.

A thread, not a Spark query, shaped as a streaming query (:class:`~cqrs.loops.LoopQuery`) as the
process managers are, and built on their serving loop
(:class:`~cqrs.process.job.ProcessManagerQuery`): librdkafka reads every partition of the events
topic; for each chunk of records the rows are written to the history table (an unlogged batch
per aggregate partition, concurrently) and only then are the offsets committed to Kafka under
the group ``cqrs-history-<topic prefix><app>`` (Kafka's tools show its lag). A crash re-reads
from the last committed offsets and writes the same rows again: a row is keyed by its
aggregate and version and holds only what the Kafka record holds.

It runs inside ``cqrs run app`` (unless ``--no-history``) and alone as ``cqrs run history APP``;
``--replay`` reads the log from its start and writes every row again (a rebuild of the table, or
of a table that was dropped; ``table=`` writes another table, to compare).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.history.rows import HistoryRow, row_from_record
from cqrs.history.table import HISTORY_TABLE, HistoryTable
from cqrs.loops import LoopQuery
from cqrs.process.job import BatchReport, ProcessManagerQuery
from cqrs.topics import AppTopics, ensure_topics, topics_for

if TYPE_CHECKING:
    from cqrs.app import App

__all__ = ["HistoryOptions", "HistoryQuery", "HistoryRun", "group_id_for", "start_history"]


@attrs.frozen
class HistoryOptions:
    app_ref: str  # "module:attribute" of the App
    replay: bool = False  # write the whole log again, from its start
    max_events_per_chunk: int = 10_000  # records written at once at most
    table: str = HISTORY_TABLE  # the Cassandra table (another one: a rebuild beside the live one)
    topics: AppTopics | None = None  # default: topics_for(app.name, kafka.topic_prefix)
    group_id: str | None = None  # default: group_id_for(topics) (+ the table when not the default)


def group_id_for(topics: AppTopics, table: str = HISTORY_TABLE) -> str:
    """The Kafka consumer group the history job commits its offsets under."""
    suffix = "" if table == HISTORY_TABLE else f"-{table}"
    return f"cqrs-history-{topics.base}{suffix}"


class HistoryRun:
    """Writes chunks of event records ``(key, value, headers, partition, offset, timestamp_ms)``
    as history rows; records that are not events, or not readable, are counted and passed over
    (the processor dead-letters what it cannot read; the history shows what was written)."""

    def __init__(self, table: HistoryTable) -> None:
        self.table = table

    @staticmethod
    def rows(records: list[tuple[Any, ...]]) -> tuple[list[HistoryRow], int]:
        """The rows of ``records`` and how many records were passed over."""
        rows: list[HistoryRow] = []
        skipped = 0
        for key, value, headers, partition, offset, timestamp_ms in records:
            try:
                row = row_from_record(key, value, headers, partition, offset, timestamp_ms)
            except CqrsError:
                row = None
            if row is None:
                skipped += 1
            else:
                rows.append(row)
        return rows, skipped

    def run(self, records: list[tuple[Any, ...]]) -> BatchReport:
        started, cpu_started = time.monotonic(), time.thread_time()
        rows, skipped = self.rows(records)
        if rows:
            self.table.write(rows)
        return BatchReport(len(rows), len(rows), skipped, 0, 0, 0,
                           time.monotonic() - started, time.thread_time() - cpu_started)

    def close(self) -> None:
        self.table.close()


class HistoryQuery(ProcessManagerQuery):
    """The running history job (the process managers' serving loop, writing history rows)."""

    def __init__(self, cfg: CqrsConfig, app: App, opts: HistoryOptions, topics: AppTopics, *,
                 available_now: bool,
                 on_batch: Callable[[int, BatchReport], None] | None,
                 on_progress: Callable[[str, Mapping[str, Any]], None] | None,
                 table: Callable[[], HistoryTable] | None = None) -> None:
        LoopQuery.__init__(self, f"cqrs-history-{app.name}", on_progress)
        import threading

        self.cfg = cfg
        self.app = app
        self.opts = opts  # type: ignore[assignment]
        self.topics = topics
        self.group_id = opts.group_id or group_id_for(topics, opts.table)
        self._available_now = available_now
        self._on_batch = on_batch
        self._positions: dict[int, int] = {}
        self._lock = threading.Lock()
        self._chunks = 0
        self._table_factory = table

    def _open_run(self) -> HistoryRun:
        if self._table_factory is not None:
            return HistoryRun(self._table_factory())
        from cqrs.history.table import open_history_table

        return HistoryRun(open_history_table(self.cfg, self.topics.base, table=self.opts.table))  # type: ignore[attr-defined]

    def _record(self, m: Any) -> tuple[Any, ...]:
        _, timestamp_ms = m.timestamp()
        return (m.key(), m.value(), m.headers() or [], m.partition(), m.offset(), timestamp_ms)

    def _start_offsets(self, consumer: Any, partitions: Any) -> dict[int, int]:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        topic = self.topics.events
        if self.opts.replay:
            return dict.fromkeys(partitions, OFFSET_BEGINNING)
        committed = {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(topic, p) for p in partitions], timeout=30)}
        return {p: (o if o >= 0 else OFFSET_BEGINNING) for p, o in committed.items()}

    def _progress(self, period: Any, now: float) -> None:
        self._report_period(period, now, period.records, historyRows=period.events,
                            cpuSeconds=period.cpu_s)


def start_history(cfg: CqrsConfig, opts: HistoryOptions, *, available_now: bool = False,
                  on_batch: Callable[[int, BatchReport], None] | None = None,
                  on_progress: Callable[[str, Mapping[str, Any]], None] | None = None,
                  table: Callable[[], HistoryTable] | None = None) -> HistoryQuery:
    """Start the history job of an app (see the module doc); ``available_now``: write what
    the events topic holds now, then stop. ``table``: a factory of the table to write (default:
    the Cassandra table of ``opts.table``)."""
    from cqrs.loading import load_app

    app = load_app(opts.app_ref)
    topics = opts.topics or topics_for(app.name, cfg.kafka.topic_prefix)
    ensure_topics(cfg, topics)
    query = HistoryQuery(cfg, app, opts, topics, available_now=available_now,
                         on_batch=on_batch, on_progress=on_progress, table=table)
    query.start()
    return query
