"""The embedded read-model store: one SQLite file, for single-machine use and tests.

Same behaviour as the Cassandra store: rows carry the write timestamp of :mod:`records` and an
upsert only lands when its timestamp is higher, so replays change nothing. WAL mode lets the
readers read while the projector writes (from several processes).
"""

from __future__ import annotations

import datetime as _dt
import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from projections.errors import ProjectionStoreError
from projections.model import CategoryProjection, Projection, RekeyedProjection
from projections.records import (
    CategoryRow, CategoryWrite, CellsWrite, Generations, StoredView, ViewWrite,
)
from projections.store import ProjectionStore, normalize_value, table_names

__all__ = ["SqliteStore"]

_SQL_TYPES = {str: "TEXT", int: "INTEGER", float: "REAL", bool: "INTEGER",
              _dt.datetime: "TEXT", _dt.date: "TEXT", bytes: "BLOB"}


def _encode(kind: type, value: Any) -> Any:
    if value is None:
        return None
    if kind is _dt.datetime:
        v = normalize_value(kind, value)
        return v.strftime("%Y-%m-%dT%H:%M:%S.") + f"{v.microsecond // 1000:03d}+00:00"
    if kind is _dt.date:
        return normalize_value(kind, value).isoformat()
    if kind is bool:
        return int(value)
    return value


def _decode(kind: type, value: Any) -> Any:
    if value is None:
        return None
    if kind is _dt.datetime:
        return _dt.datetime.fromisoformat(value)
    if kind is _dt.date:
        return _dt.date.fromisoformat(value)
    return normalize_value(kind, value)


def _q(name: str) -> str:
    return f'"{name}"'


def _sources_column(projection: Projection) -> list[str]:
    """The extra column of re-keyed views: the last applied version per source aggregate."""
    return ["_sources"] if isinstance(projection, RekeyedProjection) else []


def _sources_text(sources: dict[str, int] | None) -> str:
    return json.dumps(sources or {}, sort_keys=True, separators=(",", ":"))


class SqliteStore(ProjectionStore):
    """Projection tables in one SQLite database file (``":memory:"`` for a private one)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(Path(path).expanduser()) if str(path) != ":memory:" else ":memory:"
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=60, check_same_thread=False,
                                       isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise ProjectionStoreError(f"cannot open SQLite store {self.path!r}: {exc}") from exc
        self._lock = threading.RLock()
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS cqrs_generations "
                             "(base TEXT PRIMARY KEY, current INTEGER, building INTEGER)")
            self._db.execute("CREATE TABLE IF NOT EXISTS cqrs_positions (base TEXT, generation "
                             "INTEGER, partition INTEGER, next_offset INTEGER, "
                             "PRIMARY KEY (base, generation, partition))")

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise ProjectionStoreError(f"SQLite store {self.path!r}: {exc} in {sql!r}") from exc

    # --- generations and schema --------------------------------------------------------------

    def ensure_generation(self, projection: Projection, base: str, generation: int) -> None:
        views, cat = table_names(base, generation)
        cols = "".join(f", {_q(c)} {_SQL_TYPES[t]}" for c, t in projection.columns.items())
        self._run(f"CREATE TABLE IF NOT EXISTS {_q(views)} ({_q(projection.key)} TEXT PRIMARY KEY"
                  f"{cols}, _version INTEGER NOT NULL, _deleted INTEGER NOT NULL, _ts INTEGER "
                  "NOT NULL, _parked_at INTEGER, _parked_ts INTEGER NOT NULL DEFAULT -1"
                  f"{''.join(f', {c} TEXT' for c in _sources_column(projection))})")
        if isinstance(projection, CategoryProjection):
            sort_type = _SQL_TYPES[projection.columns[projection.order_by]]
            self._run(f"CREATE TABLE IF NOT EXISTS {_q(cat)} (grp TEXT NOT NULL, sort {sort_type} "
                      f"NOT NULL, aggregate_id TEXT NOT NULL{cols}, _version INTEGER NOT NULL, "
                      "_deleted INTEGER NOT NULL, _ts INTEGER NOT NULL, "
                      "PRIMARY KEY (grp, sort, aggregate_id))")

    def drop_generation(self, projection: Projection, base: str, generation: int) -> None:
        for table in table_names(base, generation):
            self._run(f"DROP TABLE IF EXISTS {_q(table)}")
        self._run("DELETE FROM cqrs_positions WHERE base = ? AND generation = ?", (base, generation))

    def generations(self, base: str) -> Generations:
        rows = self._run("SELECT current, building FROM cqrs_generations WHERE base = ?", (base,))
        return Generations(*rows[0]) if rows else Generations(None, None)

    def set_generations(self, base: str, generations: Generations) -> None:
        self._run("INSERT OR REPLACE INTO cqrs_generations VALUES (?, ?, ?)",
                  (base, generations.current, generations.building))

    # --- writes --------------------------------------------------------------------------------

    def read_views(self, projection: Projection, base: str, generation: int,
                   keys: Sequence[str]) -> dict[str, StoredView]:
        views, _ = table_names(base, generation)
        cols = list(projection.columns)
        select = ", ".join([_q(projection.key), *map(_q, cols), "_version", "_deleted", "_parked_at",
                            *_sources_column(projection)])
        found: dict[str, StoredView] = {}
        keys = list(keys)
        for i in range(0, len(keys), 500):
            chunk = keys[i:i + 500]
            marks = ",".join("?" * len(chunk))
            for row in self._run(f"SELECT {select} FROM {_q(views)} WHERE {_q(projection.key)} "
                                 f"IN ({marks})", chunk):
                found[row[0]] = self._stored(projection, cols, row[1:])
        return found

    @staticmethod
    def _stored(projection: Projection, cols: list[str], row: Sequence[Any]) -> StoredView:
        version, deleted, parked = row[len(cols)], bool(row[len(cols) + 1]), row[len(cols) + 2]
        values = None
        if version > 0 and not deleted:
            values = {c: _decode(projection.columns[c], v) for c, v in zip(cols, row, strict=False)}
        sources = json.loads(row[len(cols) + 3] or "{}") if len(row) > len(cols) + 3 else None
        return StoredView(values, version, deleted, parked, sources)

    def _row(self, projection: Projection, values: dict[str, Any] | None) -> list[Any]:
        return [_encode(t, (values or {}).get(c)) for c, t in projection.columns.items()]

    def write(self, projection: Projection, base: str, generation: int,
              category: Sequence[CategoryWrite], views: Sequence[ViewWrite]) -> None:
        vt, ct = table_names(base, generation)
        cols = list(projection.columns)
        updates = ", ".join(f"{_q(c)} = excluded.{_q(c)}" for c in cols)
        if category and isinstance(projection, CategoryProjection):
            sort_kind = projection.columns[projection.order_by]
            names = ", ".join(["grp", "sort", "aggregate_id", *map(_q, cols),
                               "_version", "_deleted", "_ts"])
            marks = ",".join("?" * (len(cols) + 6))
            sql = (f"INSERT INTO {_q(ct)} ({names}) VALUES ({marks}) ON CONFLICT (grp, sort, "
                   f"aggregate_id) DO UPDATE SET {updates}{', ' if cols else ''}_version = "
                   "excluded._version, _deleted = excluded._deleted, _ts = excluded._ts "
                   f"WHERE excluded._ts > {_q(ct)}._ts")
            rows = [(c.group, _encode(sort_kind, c.sort), c.aggregate_id,
                     *self._row(projection, c.values), c.version, int(c.deleted), c.timestamp)
                    for c in category]
            self._many(sql, rows)
        if views:
            extra = _sources_column(projection)
            names = ", ".join([_q(projection.key), *map(_q, cols), "_version", "_deleted", "_ts",
                               *extra])
            marks = ",".join("?" * (len(cols) + 4 + len(extra)))
            sql = (f"INSERT INTO {_q(vt)} ({names}) VALUES ({marks}) ON CONFLICT "
                   f"({_q(projection.key)}) DO UPDATE SET {updates}{', ' if cols else ''}"
                   "_version = excluded._version, _deleted = excluded._deleted, _ts = excluded._ts"
                   f"{''.join(f', {c} = excluded.{c}' for c in extra)} "
                   f"WHERE excluded._ts > {_q(vt)}._ts")
            self._many(sql, [(v.key, *self._row(projection, v.values), v.version, int(v.deleted),
                              v.timestamp, *([_sources_text(v.sources)] if extra else []))
                             for v in views])
            marks_sql = (f"UPDATE {_q(vt)} SET _parked_at = ?, _parked_ts = ? "
                         f"WHERE {_q(projection.key)} = ? AND _parked_ts < ?")
            self._many(marks_sql, [(v.parked_at if v.mode == "park" else None, v.timestamp, v.key,
                                    v.timestamp) for v in views if v.mode != "normal"])

    def rewrite_cells(self, projection: Projection, base: str, generation: int,
                      rows: Sequence[CellsWrite]) -> None:
        vt, ct = table_names(base, generation)
        for row in rows:
            cols = list(row.values)
            sets = "".join(f"{_q(c)} = ?, " for c in cols)
            values = [_encode(projection.columns[c], row.values[c]) for c in cols]
            if row.group is None:
                self._many(f"UPDATE {_q(vt)} SET {sets}_ts = ? WHERE {_q(projection.key)} = ? "
                           "AND _ts < ?", [(*values, row.timestamp, row.key, row.timestamp)])
            elif isinstance(projection, CategoryProjection):
                sort = _encode(projection.columns[projection.order_by], row.sort)
                self._many(f"UPDATE {_q(ct)} SET {sets}_ts = ? WHERE grp = ? AND sort = ? AND "
                           "aggregate_id = ? AND _ts < ?",
                           [(*values, row.timestamp, row.group, sort, row.key, row.timestamp)])

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(sql, rows)
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._db.execute("ROLLBACK")
                raise ProjectionStoreError(f"SQLite store {self.path!r}: {exc} in {sql!r}") from exc

    def trim(self, projection: CategoryProjection, base: str, generation: int,
             groups: Sequence[str]) -> None:
        _, ct = table_names(base, generation)
        for group in groups:
            self._run(f"DELETE FROM {_q(ct)} WHERE grp = ? AND (sort, aggregate_id) IN (SELECT "
                      f"sort, aggregate_id FROM {_q(ct)} WHERE grp = ? ORDER BY sort DESC, "
                      "aggregate_id ASC LIMIT -1 OFFSET ?)", (group, group, projection.keep))

    def save_positions(self, base: str, generation: int, positions: dict[int, int]) -> None:
        self._many("INSERT OR REPLACE INTO cqrs_positions VALUES (?, ?, ?, ?)",
                   [(base, generation, p, o) for p, o in positions.items()])

    def positions(self, base: str, generation: int) -> dict[int, int]:
        return dict(self._run("SELECT partition, next_offset FROM cqrs_positions WHERE base = ? "
                              "AND generation = ?", (base, generation)))

    # --- reads -----------------------------------------------------------------------------------

    def _category(self, projection: CategoryProjection, where: str, params: Sequence[Any],
                  table: str) -> list[tuple[str, CategoryRow]]:
        cols = list(projection.columns)
        sort_kind = projection.columns[projection.order_by]
        select = ", ".join(["grp", "sort", "aggregate_id", *map(_q, cols), "_version", "_deleted"])
        out = []
        for row in self._run(f"SELECT {select} FROM {_q(table)} {where}", params):
            version, deleted = row[3 + len(cols)], bool(row[4 + len(cols)])
            values = None if deleted else {
                c: _decode(projection.columns[c], v) for c, v in zip(cols, row[3:], strict=False)}
            out.append((row[0], CategoryRow(_decode(sort_kind, row[1]), row[2], values, version,
                                            deleted)))
        return out

    def category_rows(self, projection: CategoryProjection, base: str, generation: int,
                      group: str, limit: int) -> list[CategoryRow]:
        _, ct = table_names(base, generation)
        rows = self._category(projection, "WHERE grp = ? ORDER BY sort DESC, aggregate_id ASC "
                              "LIMIT ?", (group, limit), ct)
        return [r for _, r in rows]

    def scan_views(self, projection: Projection, base: str,
                   generation: int) -> Iterator[tuple[str, StoredView]]:
        vt, _ = table_names(base, generation)
        cols = list(projection.columns)
        select = ", ".join([_q(projection.key), *map(_q, cols), "_version", "_deleted", "_parked_at",
                            *_sources_column(projection)])
        for row in self._run(f"SELECT {select} FROM {_q(vt)} ORDER BY 1"):
            yield row[0], self._stored(projection, cols, row[1:])

    def scan_category(self, projection: CategoryProjection, base: str,
                      generation: int) -> Iterator[tuple[str, CategoryRow]]:
        _, ct = table_names(base, generation)
        yield from self._category(projection, "ORDER BY grp, sort DESC, aggregate_id", (), ct)

    def close(self) -> None:
        with self._lock:
            self._db.close()
