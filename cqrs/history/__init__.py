"""An aggregate's history: its events in version order with their envelopes, and its state at
a version or a time, from a table the history job keeps in Cassandra (see docs/history.md).

- :mod:`cqrs.history.rows`: the pure part (record -> row -> event, the fold of a prefix);
- :mod:`cqrs.history.table`: the Cassandra table (and an in-memory one for tests);
- :mod:`cqrs.history.reader`: :class:`HistoryReader`, what clients, the CLI and HTTP use;
- :mod:`cqrs.history.job`: the job that keeps the table (``cqrs run history``, ``cqrs run app``).
"""

from __future__ import annotations

from cqrs.history.reader import MAX_PAGE, HistoryReader, HistoryRequestError, parse_page_token
from cqrs.history.rows import (
    BUCKET_SIZE, HistoricState, HistoryEvent, HistoryPage, HistoryRangeError, HistoryRow,
    decode_row, fold, row_from_record, rows_from_records,
)
from cqrs.history.table import HISTORY_TABLE, HistoryStoreError, MemoryHistoryTable

__all__ = [
    "BUCKET_SIZE",
    "HISTORY_TABLE",
    "MAX_PAGE",
    "HistoricState",
    "HistoryEvent",
    "HistoryPage",
    "HistoryRangeError",
    "HistoryReader",
    "HistoryRequestError",
    "HistoryRow",
    "HistoryStoreError",
    "MemoryHistoryTable",
    "decode_row",
    "fold",
    "parse_page_token",
    "row_from_record",
    "rows_from_records",
]
