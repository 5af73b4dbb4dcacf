"""An aggregate's history: its events in version order with their envelopes, and its state at
a version or a time, from a table the history job keeps in Cassandra (see docs/history.md).

- :mod:`cqrs.history.rows`: the pure part (record -> row -> event, the fold of a prefix);
- :mod:`cqrs.history.table`: the Cassandra table (and an in-memory one for tests);
- :mod:`cqrs.history.reader`: :class:`HistoryReader`, what clients, the CLI and HTTP use;
- :mod:`cqrs.history.job`: the job that keeps the table (``cqrs run history``, ``cqrs run app``);
- :mod:`cqrs.history.columns`: the log as columns, the pure part (events and states to Arrow);
- :mod:`cqrs.history.frames`: the log as Spark DataFrames (:func:`log_table`, :func:`log_stream`,
  :func:`log_views` for ``cqrs sql``, :func:`states_as_of`);
- :mod:`cqrs.history.archive`: the log as Parquet files (:func:`write_archive`, ``cqrs archive``).

Spark, Kafka and Cassandra are imported by the functions that use them, not by this package.
"""

from __future__ import annotations

from cqrs.history.archive import (
    ARCHIVE_META, ArchiveError, ArchiveExistsError, ArchiveReport, read_archive_meta, write_archive,
)
from cqrs.history.columns import (
    ENVELOPE_COLUMNS, EVENTS_VIEW, STATE_COLUMNS, LogTableError, view_names,
)
from cqrs.history.frames import log_stream, log_table, log_views, states_as_of
from cqrs.history.reader import MAX_PAGE, HistoryReader, HistoryRequestError, parse_page_token
from cqrs.history.rows import (
    BUCKET_SIZE, HistoricState, HistoryEvent, HistoryPage, HistoryRangeError, HistoryRow,
    HistoryTimeError, decode_row, fold, row_from_record, rows_from_records,
)
from cqrs.history.table import HISTORY_TABLE, HistoryStoreError, MemoryHistoryTable, partition_of

__all__ = [
    "ARCHIVE_META",
    "BUCKET_SIZE",
    "ENVELOPE_COLUMNS",
    "EVENTS_VIEW",
    "HISTORY_TABLE",
    "MAX_PAGE",
    "STATE_COLUMNS",
    "ArchiveError",
    "ArchiveExistsError",
    "ArchiveReport",
    "HistoricState",
    "HistoryEvent",
    "HistoryPage",
    "HistoryRangeError",
    "HistoryReader",
    "HistoryRequestError",
    "HistoryRow",
    "HistoryStoreError",
    "HistoryTimeError",
    "LogTableError",
    "MemoryHistoryTable",
    "decode_row",
    "fold",
    "log_stream",
    "log_table",
    "log_views",
    "parse_page_token",
    "partition_of",
    "read_archive_meta",
    "row_from_record",
    "rows_from_records",
    "states_as_of",
    "view_names",
    "write_archive",
]
