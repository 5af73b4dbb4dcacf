"""Where pending deadlines live: two Cassandra tables (names computed here and nowhere else).

- ``cqrs_deadlines``: one row per deadline, ``PRIMARY KEY ((app, owner), name)``: when it is
  due, where its command goes and the command's record, ready to produce. Scheduling the same
  deadline again overwrites it (a move), cancelling deletes it. Rows expire a day after their
  due time (a fired deadline's row stays until then; it reads as fired once the timer's cursor
  passed it).
- ``cqrs_deadline_due`` (and its cursor ``cqrs_deadline_cursor``): a
  :class:`~cqrs.scheduler.due.DueTable` of ``(due_ms, owner, name)``, what the timer reads. A
  move or a cancellation leaves the old entry there: the timer finds it stale (the deadline's
  row says another time, or nothing) and deletes it without firing.

Writers place an entry at its due time, or a little ahead of their clock when that time has
passed (a deadline decided in the past, a replay), so it always lands after the timer's
cursor: it then fires at once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs

from cqrs.cassandra_io import CassandraSession
from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.scheduler.due import DueTable
from cqrs.scheduler.records import StoredDeadline

__all__ = ["CURSOR", "DEADLINES", "DUE", "DeadlineStore", "DeadlineStoreError", "StoredDeadline",
           "open_deadline_store", "pending_deadlines"]

DEADLINES, DUE, CURSOR = "cqrs_deadlines", "cqrs_deadline_due", "cqrs_deadline_cursor"
BUCKETS = "cqrs_deadline_buckets"  # entries per due-time bucket (counters), for the waiting gauge
SAFETY_MS = 2000  # how far ahead of its writer's clock an entry already due is placed
KEEP_FIRED_S = 86_400  # a deadline's row lives this long after its due time
MAX_TTL_S = 630_720_000  # Cassandra's limit (20 years)
_DUE_KEY = [("owner", "text"), ("name", "text")]
_COLUMNS = ("owner", "name", "due_ms", "target_type", "target_id", "command_id", "key", "value",
            "correlation_id", "command_type", "placed_ms")


class DeadlineStoreError(CqrsError, RuntimeError):
    """The deadline tables cannot be read or written."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class DeadlineStore:
    """The deadline tables of one app (``app``: its topic base, prefix included)."""

    def __init__(self, db: CassandraSession, app: str, bucket_s: int, *, owns_session: bool = False) -> None:
        self.db = db
        self.app = app
        self.owns_session = owns_session
        self.due_table = DueTable(db, DUE, CURSOR, app, bucket_s, _DUE_KEY)
        for cql in self.due_table.schema():
            db.execute(cql)
        db.execute(f"CREATE TABLE IF NOT EXISTS {DEADLINES} (app text, owner text, name text, "
                   "due_ms bigint, target_type text, target_id text, command_id text, key blob, "
                   "value blob, correlation_id text, command_type text, placed_ms bigint, "
                   "PRIMARY KEY ((app, owner), name))")
        db.execute(f"CREATE TABLE IF NOT EXISTS {BUCKETS} (app text, bucket bigint, placed counter, "
                   "PRIMARY KEY ((app), bucket))")
        self._count = db.prepare(f"UPDATE {BUCKETS} SET placed = placed + ? WHERE app = ? AND "
                                 "bucket = ?", write=True)
        # the timer reads from its cursor: make sure there is one before any entry is written
        # (every writer places entries after its own clock, so after this one)
        db.execute(db.prepare(f"INSERT INTO {CURSOR} (app, cursor_ms) VALUES (?, ?) IF NOT EXISTS",
                              write=True), (app, _now_ms()))
        self._put = db.prepare(
            f"INSERT INTO {DEADLINES} (app, {', '.join(_COLUMNS)}) VALUES "
            f"({', '.join('?' * (len(_COLUMNS) + 1))}) USING TTL ?", write=True)
        self._delete = db.prepare(f"DELETE FROM {DEADLINES} WHERE app = ? AND owner = ? AND name = ?",
                                  write=True)
        self._get = db.prepare(f"SELECT {', '.join(_COLUMNS)} FROM {DEADLINES} WHERE app = ? AND "
                               "owner = ? AND name = ?")
        self._of_owner = db.prepare(f"SELECT {', '.join(_COLUMNS)} FROM {DEADLINES} WHERE app = ? "
                                    "AND owner = ?")

    def close(self) -> None:
        if self.owns_session:
            self.db.close()

    # ---- writers (the processor, process managers) --------------------------------------------

    def apply(self, changes: Sequence[StoredDeadline]) -> tuple[int, int]:
        """Write schedules and cancellations (in order: the last change of a deadline wins);
        returns ``(scheduled, cancelled)``. Idempotent: written again, nothing changes."""
        last: dict[tuple[str, str], StoredDeadline] = {}
        for c in changes:
            last.pop((c.owner, c.name), None)
            last[(c.owner, c.name)] = c
        now = _now_ms()
        statements: list[tuple[Any, Sequence[Any]]] = []
        entries: list[tuple[Any, ...]] = []
        scheduled = cancelled = 0
        for c in last.values():
            if c.due_ms is None:
                statements.append((self._delete, (self.app, c.owner, c.name)))
                cancelled += 1
                continue
            ttl = min(MAX_TTL_S, max(0, c.due_ms - now) // 1000 + KEEP_FIRED_S)
            placed = max(c.due_ms, now + SAFETY_MS)
            statements.append((self._put, (self.app, *attrs.astuple(attrs.evolve(c, placed_ms=placed)),
                                           ttl)))
            entries.append((placed, c.owner, c.name))
            scheduled += 1
        # the rows first: an entry whose row is missing is stale and would be dropped
        self.db.concurrent_statements(statements, f"writes of {DEADLINES}")
        self.due_table.add(entries)
        self._counted(entries, 1)
        return scheduled, cancelled

    def _counted(self, entries: Sequence[tuple[Any, ...]], sign: int) -> None:
        """Add (or take off) entries to the per-bucket counts: one counter update per bucket.
        Approximate: a re-run adds its entries again (the count is a gauge, nothing decides on it)."""
        per: dict[int, int] = {}
        for e in entries:
            b = self.due_table.bucket(e[0])
            per[b] = per.get(b, 0) + 1
        if per:
            self.db.concurrent(self._count, [(sign * n, self.app, b) for b, n in per.items()])

    def waiting(self, cursor: int) -> int:
        """Due entries not reached yet (cancelled or moved deadlines' entries included until
        their time), from the per-bucket counts: one small partition read."""
        rows = self.db.execute(self.db.prepare(
            f"SELECT placed FROM {BUCKETS} WHERE app = ? AND bucket >= ?"),
            (self.app, self.due_table.bucket(cursor)))
        return max(0, sum(r[0] or 0 for r in rows))

    # ---- the timer ------------------------------------------------------------------------------

    def due(self, cursor: int, now_ms: int, limit: int,
            ) -> tuple[list[StoredDeadline], list[tuple[Any, ...]], int]:
        """What is due in ``[cursor, now_ms]``: the deadlines to fire (their rows still say that
        time), every entry read (to delete once fired) and the cursor after them."""
        entries, after, _ = self.due_table.read_due(cursor, now_ms, limit)
        if not entries:
            return [], [], after
        results = self.db.concurrent(self._get, [(self.app, owner, name) for _, owner, name in entries])
        fire = []
        for (placed, _, _), rows in zip(entries, results, strict=True):
            found = next((StoredDeadline(*r) for r in rows), None)
            if found is not None and found.placed_ms == placed:  # else moved or cancelled since
                fire.append(found)
        return fire, entries, after

    def forget(self, entries: Sequence[tuple[Any, ...]]) -> None:
        """Delete due entries (fired or stale)."""
        self.due_table.delete(entries)
        self._counted(entries, -1)

    def cursor(self) -> int | None:
        return self.due_table.cursor()

    def save_cursor(self, cursor_ms: int) -> None:
        self.due_table.save_cursor(cursor_ms)

    # ---- readers --------------------------------------------------------------------------------

    def of_owner(self, owner: str) -> list[StoredDeadline]:
        """The deadlines an aggregate (``<type>:<id>``) or a process-manager instance scheduled
        and the timer has not fired yet, by due time."""
        cursor = self.cursor() or 0
        rows = [StoredDeadline(*r) for r in self.db.execute(self._of_owner, (self.app, owner))]
        return sorted((r for r in rows if (r.placed_ms or 0) >= cursor),  # before: fired
                      key=lambda r: (r.due_ms or 0, r.name))


def open_deadline_store(cfg: CqrsConfig, app_base: str) -> DeadlineStore:
    """A store on a Cassandra session of its own (closed with the store)."""
    db = CassandraSession(cfg.cassandra, rows_per_request=1,
                          error=lambda m: DeadlineStoreError(m))
    try:
        return DeadlineStore(db, app_base, cfg.scheduler.bucket_s, owns_session=True)
    except Exception:
        db.close()
        raise


def pending_deadlines(cfg: CqrsConfig, app: Any, aggregate_id: str, aggregate_type: str | None = None,
                      store: DeadlineStore | None = None) -> list[StoredDeadline]:
    """What an aggregate scheduled and the timer has not fired, earliest first (every aggregate
    type of the app unless ``aggregate_type`` names one); on ``store`` or a store of its own."""
    from cqrs.topics import topics_for

    types = [aggregate_type] if aggregate_type else list(app.model.aggregates)
    own = store is None
    store = store or open_deadline_store(cfg, topics_for(app.name, cfg.kafka.topic_prefix).base)
    try:
        found = [d for t in types for d in store.of_owner(f"{t}:{aggregate_id}")]
    finally:
        if own:
            store.close()
    return sorted(found, key=lambda d: (d.due_ms or 0, d.name))
