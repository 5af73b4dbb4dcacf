"""The retry job's Cassandra tables (names computed here and nowhere else).

- ``cqrs_retry_due``: one row per retry to deliver, ``PRIMARY KEY ((app, bucket), due_ms,
  command_id, attempt)``, with its cursor in ``cqrs_retry_cursor``: a
  :class:`~cqrs.scheduler.due.DueTable`, the due-time store the deadlines' scheduler uses too
  ("what is due now" is a slice of one or two partitions, never a scan).
- ``cqrs_retry_attempts``: a letter's history, ``PRIMARY KEY ((app, command_id), attempt)``:
  one row per failed attempt (when, stage, error, the record) and the fate of its retry
  (``state``: waiting, delivering, delivered, parked, retried; ``outcome``). Its ``state`` is
  changed with lightweight transactions only: that is what makes a delivery happen once.
- ``cqrs_retry_letters``: one row per letter for operators, ``PRIMARY KEY ((app), command_id)``:
  its state (waiting / parked / done), attempts, last error. Written with write timestamps
  taken from the letters' own times, so a replayed old letter never overwrites a newer state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs

from cqrs.cassandra_io import CassandraSession
from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.retrier.plan import bucket_of
from cqrs.scheduler.due import DueTable

__all__ = ["AttemptRow", "DueEntry", "LetterRow", "RetryStore", "RetryStoreError", "TABLES"]

DUE, ATTEMPTS, LETTERS, CURSOR = ("cqrs_retry_due", "cqrs_retry_attempts", "cqrs_retry_letters",
                                  "cqrs_retry_cursor")
TABLES = (DUE, ATTEMPTS, LETTERS, CURSOR)

_SCHEMA = [
    f"""CREATE TABLE IF NOT EXISTS {ATTEMPTS} (app text, command_id text, attempt int,
        letter text, failed_ms bigint, stage text, error_type text, error text,
        command_type text, aggregate_id text, final boolean, state text, due_ms bigint,
        delivering_ms bigint, delivered_ms bigint, outcome text, note text, key blob,
        value blob, headers list<frozen<tuple<text, blob>>>, offsets text,
        PRIMARY KEY ((app, command_id), attempt))""",
    f"""CREATE TABLE IF NOT EXISTS {LETTERS} (app text, command_id text, state text,
        attempts int, command_type text, error_type text, error text, aggregate_id text,
        first_ms bigint, last_ms bigint, due_ms bigint, PRIMARY KEY ((app), command_id))""",
]
_DUE_KEY = [("command_id", "text"), ("attempt", "int")]  # of DUE, a DueTable

_ATTEMPT_COLUMNS = ("command_id", "attempt", "letter", "failed_ms", "stage", "error_type", "error",
                    "command_type", "aggregate_id", "final", "state", "due_ms", "delivering_ms",
                    "delivered_ms", "outcome", "note", "key", "value", "headers", "offsets")
_LETTER_COLUMNS = ("command_id", "state", "attempts", "command_type", "error_type", "error",
                   "aggregate_id", "first_ms", "last_ms", "due_ms")


class RetryStoreError(CqrsError, RuntimeError):
    """The retry tables cannot be read or written."""


@attrs.frozen
class DueEntry:
    """A row of the due table: deliver attempt ``attempt + 1`` of ``command_id`` at ``due_ms``
    (``attempt`` is the failed one, as in the history)."""

    bucket: int
    due_ms: int
    command_id: str
    attempt: int


@attrs.frozen
class AttemptRow:
    """One failed attempt of a letter and what became of its retry."""

    command_id: str
    attempt: int
    letter: str | None  # partition:offset in the dead-letters topic
    failed_ms: int | None
    stage: str | None
    error_type: str | None
    error: str | None
    command_type: str | None
    aggregate_id: str | None
    final: bool | None
    state: str | None  # waiting | delivering | delivered | parked | retried
    due_ms: int | None
    delivering_ms: int | None
    delivered_ms: int | None
    outcome: str | None  # of the retry: failed again | accepted | rejected | failed
    note: str | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    offsets: str | None  # JSON: the commands and results topics' ends before the delivery


@attrs.frozen
class LetterRow:
    """A letter as operators see it."""

    command_id: str
    state: str
    attempts: int | None
    command_type: str | None
    error_type: str | None
    error: str | None
    aggregate_id: str | None
    first_ms: int | None
    last_ms: int | None
    due_ms: int | None


def now_ms() -> int:
    return int(time.time() * 1000)


class RetryStore:
    """The retry tables of one app (``app``: the app's topic base, prefix included)."""

    def __init__(self, cfg: CqrsConfig, app: str) -> None:
        self.app = app
        self.bucket_s = cfg.retrier.bucket_s
        self.db = CassandraSession(cfg.cassandra, rows_per_request=1,
                                   error=lambda m: RetryStoreError(m))
        self.due_table = DueTable(self.db, DUE, CURSOR, app, self.bucket_s, _DUE_KEY)
        for cql in [*self.due_table.schema(), *_SCHEMA]:
            self.db.execute(cql)
        self.cluster_wait()

    def cluster_wait(self) -> None:
        self.db.cluster.control_connection.wait_for_schema_agreement(wait_time=30)

    def close(self) -> None:
        self.db.close()

    # ---- due entries ---------------------------------------------------------------------

    def add_due(self, entries: Sequence[DueEntry]) -> None:
        self.due_table.add([(e.due_ms, e.command_id, e.attempt) for e in entries])

    def due(self, cursor: int, now: int, limit: int) -> tuple[list[DueEntry], int, int]:
        """Entries due in ``[cursor, now]`` (at most ``limit``), the cursor once they are
        delivered and the buckets read (see :meth:`~cqrs.scheduler.due.DueTable.read_due`)."""
        rows, after, buckets = self.due_table.read_due(cursor, now, limit)
        return [DueEntry(self.due_table.bucket(d), d, c, a) for d, c, a in rows], after, buckets

    def delete_due(self, entries: Sequence[DueEntry]) -> None:
        self.due_table.delete([(e.due_ms, e.command_id, e.attempt) for e in entries])

    def cursor(self) -> int | None:
        return self.due_table.cursor()

    def save_cursor(self, cursor_ms: int) -> None:
        self.due_table.save_cursor(cursor_ms)

    # ---- history -------------------------------------------------------------------------

    def insert_attempts(self, rows: Sequence[AttemptRow]) -> list[tuple[bool, str | None, int | None]]:
        """Insert each row unless its (command id, attempt) exists: ``(inserted, state,
        due_ms)`` per row, the stored state and due time when it existed already."""
        cols = ", ".join(("app", *_ATTEMPT_COLUMNS))
        marks = ", ".join("?" * (len(_ATTEMPT_COLUMNS) + 1))
        stmt = self.db.prepare(f"INSERT INTO {ATTEMPTS} ({cols}) VALUES ({marks}) IF NOT EXISTS",
                               write=True)
        results = self.db.concurrent(stmt, [(self.app, *attrs.astuple(r, recurse=False))
                                            for r in rows])
        out: list[tuple[bool, str | None, int | None]] = []
        for row, res in zip(rows, results, strict=True):
            if list(res)[0][0]:
                out.append((True, row.state, row.due_ms))
            else:
                stored = self.attempt(row.command_id, row.attempt)
                out.append((False, stored.state if stored else None,
                            stored.due_ms if stored else None))
        return out

    def attempt(self, command_id: str, attempt: int) -> AttemptRow | None:
        rows = list(self.db.execute(self.db.prepare(
            f"SELECT {', '.join(_ATTEMPT_COLUMNS)} FROM {ATTEMPTS} WHERE app = ? AND "
            "command_id = ? AND attempt = ?"), (self.app, command_id, attempt)))
        return _attempt(rows[0]) if rows else None

    def attempts_of(self, keys: Sequence[tuple[str, int]]) -> list[AttemptRow | None]:
        """The attempts ``(command_id, attempt)``, read concurrently, in order."""
        stmt = self.db.prepare(f"SELECT {', '.join(_ATTEMPT_COLUMNS)} FROM {ATTEMPTS} WHERE "
                               "app = ? AND command_id = ? AND attempt = ?")
        results = self.db.concurrent(stmt, [(self.app, c, a) for c, a in keys])
        return [next((_attempt(r) for r in rows), None) for rows in results]

    def finish_deliveries(self, done: Sequence[tuple[DueEntry, int]], at_ms: int) -> None:
        """Mark delivered the retries of these entries (delivered at ``at_ms``, state ``done``
        for their letters, written at ``at_us``), and delete the entries, concurrently."""
        mark = self.db.prepare(f"UPDATE {ATTEMPTS} SET state = 'delivered', delivered_ms = ? "
                               "WHERE app = ? AND command_id = ? AND attempt = ?", write=True)
        letter = self.db.prepare(f"INSERT INTO {LETTERS} (app, command_id, state) VALUES "
                                 "(?, ?, 'done') USING TIMESTAMP ?", write=True)
        statements: list[tuple[Any, Sequence[Any]]] = []
        for e, at_us in done:
            statements += [(mark, (at_ms, self.app, e.command_id, e.attempt)),
                           (letter, (self.app, e.command_id, at_us))]
        self.db.concurrent_statements(statements, "marking retries delivered")
        self.delete_due([e for e, _ in done])

    def attempts(self, command_id: str) -> list[AttemptRow]:
        rows = self.db.execute(self.db.prepare(
            f"SELECT {', '.join(_ATTEMPT_COLUMNS)} FROM {ATTEMPTS} WHERE app = ? AND "
            "command_id = ?"), (self.app, command_id))
        return [_attempt(r) for r in rows]

    def change_state(self, command_id: str, attempt: int, old: str, new: str,
                     **columns: Any) -> tuple[bool, str | None]:
        """Set the attempt's state from ``old`` to ``new`` (and ``columns``) if it is still
        ``old`` (a lightweight transaction): ``(applied, the state found)``."""
        sets = ", ".join(["state = ?", *(f"{c} = ?" for c in columns)])
        stmt = self.db.prepare(f"UPDATE {ATTEMPTS} SET {sets} WHERE app = ? AND command_id = ? "
                               "AND attempt = ? IF state = ?", write=True)
        row = list(self.db.execute(stmt, (new, *columns.values(), self.app, command_id, attempt,
                                          old)))[0]
        return bool(row[0]), (new if row[0] else row[1])

    def set_attempt(self, command_id: str, attempt: int, *, if_exists: bool = False,
                    **columns: Any) -> None:
        """Plain update of some columns of an attempt; ``if_exists``: only if the row exists
        (a lightweight transaction), never creating a row of those columns alone."""
        sets = ", ".join(f"{c} = ?" for c in columns)
        stmt = self.db.prepare(f"UPDATE {ATTEMPTS} SET {sets} WHERE app = ? AND command_id = ? "
                               f"AND attempt = ?{' IF EXISTS' if if_exists else ''}", write=True)
        self.db.execute(stmt, (*columns.values(), self.app, command_id, attempt))

    # ---- letters -------------------------------------------------------------------------

    def put_letter(self, command_id: str, at_us: int, **columns: Any) -> None:
        """Upsert a letter's columns with write timestamp ``at_us``: a later letter (or an
        operator, now) wins over an earlier one whatever the order of the writes."""
        cols = ", ".join(("app", "command_id", *columns))
        marks = ", ".join("?" * (len(columns) + 2))
        stmt = self.db.prepare(f"INSERT INTO {LETTERS} ({cols}) VALUES ({marks}) USING TIMESTAMP ?",
                               write=True)
        self.db.execute(stmt, (self.app, command_id, *columns.values(), at_us))

    def put_letters(self, writes: Sequence[tuple[str, int, dict[str, Any]]]) -> None:
        """Several :meth:`put_letter` calls ``(command_id, at_us, columns)``, concurrently
        (their order does not matter: the write timestamps decide)."""
        statements = []
        for command_id, at_us, columns in writes:
            cols = ", ".join(("app", "command_id", *columns))
            marks = ", ".join("?" * (len(columns) + 2))
            stmt = self.db.prepare(f"INSERT INTO {LETTERS} ({cols}) VALUES ({marks}) USING "
                                   "TIMESTAMP ?", write=True)
            statements.append((stmt, (self.app, command_id, *columns.values(), at_us)))
        self.db.concurrent_statements(statements, f"writes of {LETTERS}")

    def set_outcomes(self, outcomes: Sequence[tuple[str, int, str]]) -> None:
        """``(command_id, attempt, outcome)`` set on attempts that exist, concurrently."""
        stmt = self.db.prepare(f"UPDATE {ATTEMPTS} SET outcome = ? WHERE app = ? AND "
                               "command_id = ? AND attempt = ? IF EXISTS", write=True)
        self.db.concurrent(stmt, [(o, self.app, c, a) for c, a, o in outcomes])

    def letters(self) -> list[LetterRow]:
        rows = self.db.execute(self.db.prepare(
            f"SELECT {', '.join(_LETTER_COLUMNS)} FROM {LETTERS} WHERE app = ?"), (self.app,))
        return [LetterRow(*r) for r in rows if r[1] is not None]

    def letter(self, command_id: str) -> LetterRow | None:
        rows = list(self.db.execute(self.db.prepare(
            f"SELECT {', '.join(_LETTER_COLUMNS)} FROM {LETTERS} WHERE app = ? AND command_id = ?"),
            (self.app, command_id)))
        return LetterRow(*rows[0]) if rows and rows[0][1] is not None else None

    def purge(self, command_id: str) -> None:
        """Forget a letter: its row, its history and any due entry of it (deleted at a time
        after every write of it: letters' writes carry their own times)."""
        rows = self.attempts(command_id)
        at_us = max([now_ms(), *((r.failed_ms or 0) + 2 for r in rows)]) * 1000
        for row in rows:
            if row.state in ("waiting", "delivering") and row.due_ms is not None:
                self.delete_due([DueEntry(self.bucket_hint(row.due_ms), row.due_ms, command_id,
                                          row.attempt)])
        for table in (ATTEMPTS, LETTERS):
            self.db.execute(self.db.prepare(f"DELETE FROM {table} USING TIMESTAMP ? WHERE app = ? "
                                            "AND command_id = ?", write=True),
                            (at_us, self.app, command_id))

    def bucket_hint(self, due: int) -> int:
        return bucket_of(due, self.bucket_s)


def _attempt(row: Sequence[Any]) -> AttemptRow:
    values = list(row)
    headers = values[_ATTEMPT_COLUMNS.index("headers")]
    values[_ATTEMPT_COLUMNS.index("headers")] = [(k, bytes(v or b"")) for k, v in headers or []]
    return AttemptRow(*values)
