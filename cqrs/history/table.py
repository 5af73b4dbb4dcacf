"""The history table in Cassandra (its name and schema are written here and nowhere else).

``cqrs_history``: one row per event, ``PRIMARY KEY ((app, aggregate_type, aggregate_id,
bucket), version)`` with ``bucket = version // 10_000`` (:data:`~cqrs.history.rows.BUCKET_SIZE`),
so no partition holds more than 10,000 events of one aggregate; ``app`` is the app's topic base
(topic prefix included), so apps and test runs sharing a keyspace never mix. An aggregate whose
id is too long for that key (Cassandra's 65,535 bytes for the four parts with their framing; the
client allows ids up to the state row's limit, which is looser) is stored under the SHA-256 of its
id and negative buckets (``-1 - bucket``), which no id of a fitting length uses
(:func:`partition_of`); the reader asks by the id and never sees the difference. A row is written by
its key with values taken from the event's Kafka record only: writing it again (a restart, a
``--replay``) writes the same row.

Besides its key a row has two cells: ``envelope``, the rest of the envelope as a JSON array
(:data:`ENVELOPE`; readable in ``cqlsh``), and ``payload``, the event as the processor wrote it.
Three cells a row rather than one per envelope field: Cassandra reads, and the driver parses, a
page of 1,000 events in about two thirds of the time, and Cassandra allocates less per read (its
young collections, the history reads' stray pauses, come less often).

:class:`MemoryHistoryTable` keeps the same rows in a dict, for tests and the docs' offline
examples.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Final, Protocol

import orjson

from cqrs.cassandra_io import MAX_BATCH_BYTES, CassandraSession, identifier
from cqrs.config import CqrsConfig
from cqrs.envelope import MAX_STATE_KEY_BYTES
from cqrs.errors import CqrsError
from cqrs.history.rows import BUCKET_SIZE, HistoryRow

__all__ = ["ENVELOPE", "HISTORY_TABLE", "CassandraHistoryTable", "HistoryStoreError", "HistoryTable",
           "MemoryHistoryTable", "envelope_text", "open_history_table", "partition_of",
           "row_from_cells"]

HISTORY_TABLE = "cqrs_history"

ENVELOPE: Final = ("event_id", "event_type", "timestamp_us", "recorded_ms", "command_id",
                   "correlation_id", "causation_id", "kafka_partition", "kafka_offset")
"""The fields of a row's ``envelope`` cell, in their order in its JSON array (ids text or null,
times in microseconds (domain) and milliseconds (recorded) since the epoch, the event's place in
the events topic)."""


class HistoryStoreError(CqrsError, RuntimeError):
    """The history table cannot be read or written."""


_BUCKET_BYTES = 8  # a bigint
_FRAME_BYTES = 3  # each part of a composite partition key: a 2-byte length and an end byte


def partition_of(app: str, aggregate_type: str, aggregate_id: str, bucket: int) -> tuple[str, int]:
    """The ``(aggregate_id, bucket)`` columns of a history partition: the id and bucket
    themselves, or when the partition key would not fit in Cassandra's 65,535 bytes, the id's
    SHA-256 (hex, prefixed ``sha256:``) and ``-1 - bucket`` (negative: never a fitting id's)."""
    size = (4 * _FRAME_BYTES + _BUCKET_BYTES + len(app.encode()) + len(aggregate_type.encode())
            + len(aggregate_id.encode()))
    if size <= MAX_STATE_KEY_BYTES:
        return aggregate_id, bucket
    import hashlib

    return "sha256:" + hashlib.sha256(aggregate_id.encode()).hexdigest(), -1 - bucket


class HistoryTable(Protocol):
    """What the history job writes to and the reader reads from."""

    app: str
    bucket_size: int

    def write(self, rows: Sequence[HistoryRow]) -> None: ...

    def read(self, aggregate_type: str, aggregate_id: str, bucket: int, from_version: int,
             limit: int) -> list[HistoryRow]: ...

    def close(self) -> None: ...


def envelope_text(row: HistoryRow) -> str:
    """A row's ``envelope`` cell: the fields of :data:`ENVELOPE` as a JSON array."""
    return orjson.dumps([row.event_id, row.event_type, row.timestamp_us, row.recorded_ms,
                         row.command_id, row.correlation_id, row.causation_id, row.partition,
                         row.offset]).decode()


def row_from_cells(aggregate_type: str, aggregate_id: str, version: int, envelope: str | bytes,
                   payload: bytes) -> HistoryRow:
    """The :class:`HistoryRow` of a row's cells (the inverse of :func:`envelope_text`)."""
    eid, et, ts, rec, cid, corr, cause, part, off = orjson.loads(envelope)
    return HistoryRow(aggregate_type, aggregate_id, version, eid, et, ts, rec, cid, corr, cause,
                      payload, part, off)


class CassandraHistoryTable:
    """The history rows of one app (``app``: its topic base) in table ``table`` of the
    configured keyspace."""

    def __init__(self, db: CassandraSession, app: str, *, table: str = HISTORY_TABLE,
                 owns_session: bool = False) -> None:
        self.db = db
        self.app = app
        self.table = identifier(table, "history table name")
        self.bucket_size = BUCKET_SIZE
        self.owns_session = owns_session
        db.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (app text, aggregate_type text, "
                   "aggregate_id text, bucket bigint, version bigint, envelope text, payload blob, "
                   "PRIMARY KEY ((app, aggregate_type, aggregate_id, bucket), version)) "
                   "WITH CLUSTERING ORDER BY (version ASC)")
        self._check_shape(db)
        self._put = db.prepare(
            f"INSERT INTO {self.table} (app, aggregate_type, aggregate_id, bucket, version, "
            "envelope, payload) VALUES (?, ?, ?, ?, ?, ?, ?)", write=True)
        self._get = db.prepare(  # the partition's own columns are known: not read back
            f"SELECT version, envelope, payload FROM {self.table} WHERE app = ? AND "
            "aggregate_type = ? AND aggregate_id = ? AND bucket = ? AND version >= ? LIMIT ?")

    def _check_shape(self, db: CassandraSession) -> None:
        """Refuse a table of the same name written by an earlier version of the framework (a
        column per envelope field), naming the way out."""
        found = {r[0] for r in db.execute(
            "SELECT column_name FROM system_schema.columns WHERE keyspace_name = %s AND "
            "table_name = %s", (db.keyspace, self.table))}
        if found and "envelope" not in found:
            raise HistoryStoreError(
                f"table {db.keyspace}.{self.table} has the columns of an earlier version of the "
                f"framework ({', '.join(sorted(found))}): the history table is rebuilt from the "
                f"log, so drop it (DROP TABLE {db.keyspace}.{self.table}) and write it again with "
                "`cqrs run history APP --replay`")

    def write(self, rows: Sequence[HistoryRow]) -> None:
        """Write ``rows``: an unlogged batch per partition (split under Cassandra's batch size
        limit), the batches concurrently; returns once all are written."""
        from cassandra.query import BatchStatement, BatchType

        parts: dict[tuple[str, str, int], list[HistoryRow]] = {}
        for r in rows:
            parts.setdefault((r.aggregate_type, r.aggregate_id, r.version // self.bucket_size),
                             []).append(r)
        batches: list[tuple[Any, Sequence[Any]]] = []
        for (aggregate_type, aggregate_id, bucket), part in parts.items():
            stored_id, stored_bucket = partition_of(self.app, aggregate_type, aggregate_id, bucket)
            batch, size = None, 0
            for r in part:
                row_size = len(r.payload) + len(r.aggregate_id) + 200
                if batch is None or (size + row_size > MAX_BATCH_BYTES and len(batch) > 0):
                    batch, size = BatchStatement(BatchType.UNLOGGED,
                                                 consistency_level=self.db.write_cl), 0
                    batches.append((batch, ()))
                batch.add(self._put, (self.app, r.aggregate_type, stored_id, stored_bucket,
                                      r.version, envelope_text(r), r.payload))
                size += row_size
        self.db.concurrent_statements(batches, f"writes of {self.table}")

    def read(self, aggregate_type: str, aggregate_id: str, bucket: int, from_version: int,
             limit: int) -> list[HistoryRow]:
        """Rows of one bucket of an aggregate from ``from_version`` on, at most ``limit``."""
        stored_id, stored_bucket = partition_of(self.app, aggregate_type, aggregate_id, bucket)
        found = self.db.execute(self._get, (self.app, aggregate_type, stored_id, stored_bucket,
                                            from_version, limit))
        return [row_from_cells(aggregate_type, aggregate_id, version, envelope, payload)
                for version, envelope, payload in found]

    def close(self) -> None:
        if self.owns_session:
            self.db.close()


class MemoryHistoryTable:
    """The history table's rows in memory (tests, offline examples); ``bucket_size`` may be
    small to exercise paging across partitions."""

    def __init__(self, app: str = "memory", bucket_size: int = BUCKET_SIZE) -> None:
        self.app = app
        self.bucket_size = bucket_size
        self.rows: dict[tuple[str, str], dict[int, HistoryRow]] = {}
        self._lock = threading.Lock()

    def write(self, rows: Sequence[HistoryRow]) -> None:
        with self._lock:
            for r in rows:
                self.rows.setdefault((r.aggregate_type, r.aggregate_id), {})[r.version] = r

    def read(self, aggregate_type: str, aggregate_id: str, bucket: int, from_version: int,
             limit: int) -> list[HistoryRow]:
        with self._lock:
            found = self.rows.get((aggregate_type, aggregate_id), {})
            versions = sorted(v for v in found if v // self.bucket_size == bucket
                              and v >= from_version)
            return [found[v] for v in versions[:limit]]

    def close(self) -> None:
        pass


def open_history_table(cfg: CqrsConfig, app_base: str, *,
                       table: str = HISTORY_TABLE) -> CassandraHistoryTable:
    """The history table of an app on a Cassandra session of its own (closed with it)."""
    db = CassandraSession(cfg.cassandra, rows_per_request=1, error=lambda m: HistoryStoreError(m))
    try:
        return CassandraHistoryTable(db, app_base, table=table, owns_session=True)
    except Exception:
        db.close()
        raise
