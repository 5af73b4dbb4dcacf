"""The due-time store of every timer of the framework (the retry job's retries and the
scheduler's deadlines): entries bucketed by due time, read as slices, never scanned.

A :class:`DueTable` is a Cassandra table ``PRIMARY KEY ((app, bucket), due_ms, <key columns>)``
with the bucket = ``due_ms // (bucket_s * 1000)``, and a cursor (in a table of its own, one row
per app): every entry due before the cursor has been handled. :meth:`DueTable.read_due` walks
the buckets from the cursor to now, reading each as one slice of one partition sorted by due
time, so "what is due now" costs one or two partition reads however many entries wait for
later: an idle app with a million pending entries costs a read per round of the timer. Entries
are deleted once handled; reads start past the cursor, so their tombstones are not read again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cqrs.errors import ConfigError

if TYPE_CHECKING:
    from cqrs.cassandra_io import CassandraSession

__all__ = ["DueTable", "bucket_of"]


def bucket_of(due_ms: int, bucket_s: int) -> int:
    """The due-time bucket (a Cassandra partition) of an entry due at ``due_ms``."""
    if bucket_s < 1:
        raise ConfigError(f"a due table's bucket_s = {bucket_s!r}: use a whole number of "
                          "seconds >= 1 ([retrier] bucket_s, [scheduler] bucket_s)")
    return due_ms // (bucket_s * 1000)


class DueTable:
    """One due table of one app: entries ``(due_ms, *key)``, ``key`` typed by ``key_columns``
    (``[("command_id", "text"), ("attempt", "int")]``), and the app's cursor in ``cursor_table``."""

    def __init__(self, db: CassandraSession, table: str, cursor_table: str, app: str,
                 bucket_s: int, key_columns: Sequence[tuple[str, str]]) -> None:
        self.db = db
        self.table = table
        self.cursor_table = cursor_table
        self.app = app
        self.bucket_s = bucket_s
        self.keys = [name for name, _ in key_columns]
        self._key_types = list(key_columns)
        self._cursor_cache: int | None = None

    def schema(self) -> list[str]:
        """The CQL that creates the two tables (if missing)."""
        cols = ", ".join(f"{n} {t}" for n, t in self._key_types)
        return [f"CREATE TABLE IF NOT EXISTS {self.table} (app text, bucket bigint, due_ms bigint, "
                f"{cols}, PRIMARY KEY ((app, bucket), due_ms, {', '.join(self.keys)})) "
                "WITH gc_grace_seconds = 3600",
                f"CREATE TABLE IF NOT EXISTS {self.cursor_table} (app text PRIMARY KEY, "
                "cursor_ms bigint)"]

    def create(self) -> None:
        for cql in self.schema():
            self.db.execute(cql)

    def bucket(self, due_ms: int) -> int:
        return bucket_of(due_ms, self.bucket_s)

    def add(self, entries: Sequence[tuple[Any, ...]]) -> None:
        """Insert entries ``(due_ms, *key)``."""
        if not entries:
            return
        marks = ", ".join("?" * (len(self.keys) + 3))
        stmt = self.db.prepare(f"INSERT INTO {self.table} (app, bucket, due_ms, "
                               f"{', '.join(self.keys)}) VALUES ({marks})", write=True)
        self.db.concurrent(stmt, [(self.app, self.bucket(e[0]), *e) for e in entries])

    def slice(self, bucket: int, from_ms: int, to_ms: int, limit: int) -> list[tuple[Any, ...]]:
        """Entries ``(due_ms, *key)`` of one bucket due in ``[from_ms, to_ms]``, by due time."""
        stmt = self.db.prepare(f"SELECT due_ms, {', '.join(self.keys)} FROM {self.table} WHERE "
                               "app = ? AND bucket = ? AND due_ms >= ? AND due_ms <= ? LIMIT ?")
        return [tuple(r) for r in self.db.execute(stmt, (self.app, bucket, from_ms, to_ms, limit))]

    def delete(self, entries: Sequence[tuple[Any, ...]]) -> None:
        """Delete entries ``(due_ms, *key)``."""
        if not entries:
            return
        where = " AND ".join(f"{k} = ?" for k in self.keys)
        stmt = self.db.prepare(f"DELETE FROM {self.table} WHERE app = ? AND bucket = ? AND "
                               f"due_ms = ? AND {where}", write=True)
        self.db.concurrent(stmt, [(self.app, self.bucket(e[0]), *e) for e in entries])

    def read_due(self, cursor: int, now_ms: int, limit: int) -> tuple[list[tuple[Any, ...]], int, int]:
        """Entries due in ``[cursor, now_ms]`` (at most ``limit``, earliest first), the cursor
        once they are handled (every entry before it read), and the buckets read."""
        entries: list[tuple[Any, ...]] = []
        buckets = 0
        for bucket in range(self.bucket(cursor), self.bucket(now_ms) + 1):
            buckets += 1
            entries += self.slice(bucket, cursor, now_ms, limit - len(entries))
            if len(entries) >= limit:
                return entries, entries[-1][0], buckets
        return entries, now_ms + 1, buckets

    def cursor(self) -> int | None:
        rows = list(self.db.execute(self.db.prepare(
            f"SELECT cursor_ms FROM {self.cursor_table} WHERE app = ?"), (self.app,)))
        return rows[0][0] if rows else None

    def save_cursor(self, cursor_ms: int) -> None:
        if cursor_ms == self._cursor_cache:
            return
        self.db.execute(self.db.prepare(f"INSERT INTO {self.cursor_table} (app, cursor_ms) "
                                        "VALUES (?, ?)", write=True), (self.app, cursor_ms))
        self._cursor_cache = cursor_ms
