"""The Cassandra read-model store: prepared statements, executed concurrently, every write
``USING TIMESTAMP`` derived from the aggregate version (see :mod:`projections.records`), so a
replayed write never overrides a newer one and changes nothing when it repeats one.

Rows travel ``[projections] rows_per_request`` to a request: view reads as ``IN`` queries on the
key, writes as unlogged batches, each request holding keys of one replica set only (the driver's
token map decides), so no coordinator fans out. A request per row costs the Python driver about
0.2 ms of CPU; a request of 32 rows about 1 ms.

Keyspace, replication, consistency levels, authentication and TLS come from the configuration;
the keyspace and tables are created when missing.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterator, Sequence
from typing import Any

from cqrs.config import CassandraSettings, ProjectionSettings
from projections.errors import ProjectionStoreError
from projections.model import CategoryProjection, Projection, RekeyedProjection
from projections.records import (
    CategoryRow, CategoryWrite, CellsWrite, Generations, StoredView, ViewWrite,
)
from projections.store import ProjectionStore, normalize_value, table_names

__all__ = ["CassandraStore"]

_CQL_TYPES = {str: "text", int: "bigint", float: "double", bool: "boolean",
              _dt.datetime: "timestamp", _dt.date: "date", bytes: "blob"}
_META = ("cqrs_version", "cqrs_deleted")


def _q(name: str) -> str:
    return f'"{name}"'


def _rekeyed(projection: Projection) -> bool:
    return isinstance(projection, RekeyedProjection)


def _sources_text(sources: dict[str, int] | None) -> str:
    return json.dumps(sources or {}, sort_keys=True, separators=(",", ":"))


class CassandraStore(ProjectionStore):
    """Projection tables in a Cassandra keyspace."""

    def __init__(self, cassandra: CassandraSettings, settings: ProjectionSettings,
                 keyspace: str | None = None) -> None:
        from cqrs.cassandra_io import CassandraSession

        self._cassandra = CassandraSession(
            cassandra, keyspace=keyspace, read_consistency=settings.read_consistency,
            write_consistency=settings.write_consistency, concurrency=settings.concurrency,
            rows_per_request=settings.rows_per_request,
            error=lambda msg: ProjectionStoreError(f"[projections] {msg}"))
        self.keyspace = self._cassandra.keyspace
        for ddl in ("CREATE TABLE IF NOT EXISTS cqrs_generations (base text PRIMARY KEY, "
                    "current int, building int)",
                    "CREATE TABLE IF NOT EXISTS cqrs_positions (base text, generation int, "
                    "partition int, next_offset bigint, PRIMARY KEY ((base, generation), "
                    "partition))"):
            self._execute(ddl)

    # --- helpers --------------------------------------------------------------------------------

    def _prepare(self, cql: str, write: bool = False) -> Any:
        return self._cassandra.prepare(cql, write)

    def _concurrent(self, stmt: Any, params: Sequence[Sequence[Any]]) -> list[Any]:
        return self._cassandra.concurrent(stmt, params)

    def _write_rows(self, stmt: Any, keys: Sequence[str], params: Sequence[Sequence[Any]]) -> None:
        self._cassandra.write_rows(stmt, keys, params)

    def _execute(self, cql: str, params: Sequence[Any] = ()) -> Any:
        return self._cassandra.execute(cql, params)

    @staticmethod
    def _values(projection: Projection, values: dict[str, Any] | None) -> list[Any]:
        v = values or {}
        return [v.get(c) for c in projection.columns]

    # --- generations and schema --------------------------------------------------------------

    def ensure_generation(self, projection: Projection, base: str, generation: int) -> None:
        views, cat = table_names(base, generation)
        cols = "".join(f", {_q(c)} {_CQL_TYPES[t]}" for c, t in projection.columns.items())
        self._execute(f"CREATE TABLE IF NOT EXISTS {views} ({_q(projection.key)} text PRIMARY "
                      f"KEY{cols}, cqrs_version bigint, cqrs_deleted boolean, cqrs_parked_at bigint"
                      f"{', cqrs_sources text' if _rekeyed(projection) else ''})")
        if isinstance(projection, CategoryProjection):
            sort_type = _CQL_TYPES[projection.columns[projection.order_by]]
            self._execute(f"CREATE TABLE IF NOT EXISTS {cat} (grp text, sort {sort_type}, "
                          f"aggregate_id text{cols}, cqrs_version bigint, cqrs_deleted boolean, "
                          "PRIMARY KEY ((grp), sort, aggregate_id)) "
                          "WITH CLUSTERING ORDER BY (sort DESC, aggregate_id ASC)")

    def drop_generation(self, projection: Projection, base: str, generation: int) -> None:
        for table in table_names(base, generation):
            self._execute(f"DROP TABLE IF EXISTS {table}")
        self._execute("DELETE FROM cqrs_positions WHERE base = %s AND generation = %s",
                      (base, generation))

    def generations(self, base: str) -> Generations:
        row = self._execute("SELECT current, building FROM cqrs_generations WHERE base = %s",
                            (base,)).one()
        return Generations(row[0], row[1]) if row else Generations(None, None)

    def set_generations(self, base: str, generations: Generations) -> None:
        self._execute("INSERT INTO cqrs_generations (base, current, building) VALUES (%s, %s, %s)",
                      (base, generations.current, generations.building))

    # --- the projector's side ----------------------------------------------------------------

    def _select_views(self, projection: Projection, table: str) -> str:
        cols = ", ".join([_q(projection.key), *map(_q, projection.columns), *_META,
                          "cqrs_parked_at", *(["cqrs_sources"] if _rekeyed(projection) else [])])
        return f"SELECT {cols} FROM {table}"

    @staticmethod
    def _stored(projection: Projection, row: Sequence[Any]) -> StoredView:
        n = len(projection.columns)
        version, deleted, parked = row[1 + n] or 0, bool(row[2 + n]), row[3 + n]
        values = None
        if version > 0 and not deleted:
            values = {c: normalize_value(t, v)
                      for (c, t), v in zip(projection.columns.items(), row[1:1 + n], strict=True)}
        sources = json.loads(row[4 + n] or "{}") if _rekeyed(projection) else None
        return StoredView(values, version, deleted, parked, sources)

    def read_views(self, projection: Projection, base: str, generation: int,
                   keys: Sequence[str]) -> dict[str, StoredView]:
        views, _ = table_names(base, generation)
        rows = self._cassandra.read_in(self._select_views(projection, views), projection.key, keys)
        return {row[0]: self._stored(projection, row) for row in rows}

    def write(self, projection: Projection, base: str, generation: int,
              category: Sequence[CategoryWrite], views: Sequence[ViewWrite]) -> None:
        vt, ct = table_names(base, generation)
        names = [*map(_q, projection.columns), *_META]
        cat_names = list(names)
        if _rekeyed(projection):
            names.append("cqrs_sources")

        def meta(v: ViewWrite) -> tuple[Any, ...]:
            return ((v.version, v.deleted, _sources_text(v.sources)) if _rekeyed(projection)
                    else (v.version, v.deleted))
        if category:
            cols = ", ".join(["grp", "sort", "aggregate_id", *cat_names])
            marks = ", ".join("?" * (len(cat_names) + 3))
            stmt = self._prepare(f"INSERT INTO {ct} ({cols}) VALUES ({marks}) USING TIMESTAMP ?",
                                 write=True)
            self._write_rows(stmt, [c.group for c in category],
                             [(c.group, c.sort, c.aggregate_id, *self._values(projection, c.values),
                               c.version, c.deleted, c.timestamp) for c in category])
        plain = [v for v in views if v.mode == "normal"]
        marked = [v for v in views if v.mode != "normal"]
        if plain:
            cols = ", ".join([_q(projection.key), *names])
            marks = ", ".join("?" * (len(names) + 1))
            stmt = self._prepare(f"INSERT INTO {vt} ({cols}) VALUES ({marks}) USING TIMESTAMP ?",
                                 write=True)
            self._write_rows(stmt, [v.key for v in plain],
                             [(v.key, *self._values(projection, v.values), *meta(v), v.timestamp)
                              for v in plain])
        if marked:
            cols = ", ".join([_q(projection.key), *names, "cqrs_parked_at"])
            marks = ", ".join("?" * (len(names) + 2))
            stmt = self._prepare(f"INSERT INTO {vt} ({cols}) VALUES ({marks}) USING TIMESTAMP ?",
                                 write=True)
            self._write_rows(stmt, [v.key for v in marked],
                             [(v.key, *self._values(projection, v.values), *meta(v),
                               v.parked_at if v.mode == "park" else None, v.timestamp)
                              for v in marked])

    def rewrite_cells(self, projection: Projection, base: str, generation: int,
                      rows: Sequence[CellsWrite]) -> None:
        # UPDATE, not INSERT: the row's other cells (and its row marker) keep their timestamps
        vt, ct = table_names(base, generation)
        for row in rows:
            sets = ", ".join(f"{_q(c)} = ?" for c in row.values)
            values = list(row.values.values())
            if row.group is None:
                stmt = self._prepare(f"UPDATE {vt} USING TIMESTAMP ? SET {sets} WHERE "
                                     f"{_q(projection.key)} = ?", write=True)
                self._write_rows(stmt, [row.key], [(row.timestamp, *values, row.key)])
            else:
                stmt = self._prepare(f"UPDATE {ct} USING TIMESTAMP ? SET {sets} WHERE grp = ? "
                                     "AND sort = ? AND aggregate_id = ?", write=True)
                self._write_rows(stmt, [row.group],
                                 [(row.timestamp, *values, row.group, row.sort, row.key)])

    def trim(self, projection: CategoryProjection, base: str, generation: int,
             groups: Sequence[str]) -> None:
        _, ct = table_names(base, generation)
        select = self._prepare(f"SELECT sort, aggregate_id, cqrs_version FROM {ct} WHERE grp = ?")
        delete = self._prepare(f"DELETE FROM {ct} USING TIMESTAMP ? WHERE grp = ? AND sort = ? "
                               "AND aggregate_id = ?", write=True)
        doomed = []
        for group, rows in zip(groups, self._concurrent(select, [(g,) for g in groups]), strict=True):
            for row in list(rows)[projection.keep:]:
                doomed.append((4 * (row[2] or 0), group, row[0], row[1]))
        self._write_rows(delete, [d[1] for d in doomed], doomed)

    def save_positions(self, base: str, generation: int, positions: dict[int, int]) -> None:
        stmt = self._prepare("INSERT INTO cqrs_positions (base, generation, partition, next_offset) "
                             "VALUES (?, ?, ?, ?)", write=True)
        self._concurrent(stmt, [(base, generation, p, o) for p, o in positions.items()])

    def positions(self, base: str, generation: int) -> dict[int, int]:
        rows = self._execute("SELECT partition, next_offset FROM cqrs_positions WHERE base = %s "
                             "AND generation = %s", (base, generation))
        return {partition: offset for partition, offset in rows}

    # --- the readers' side -------------------------------------------------------------------

    def _category_row(self, projection: CategoryProjection, row: Sequence[Any]) -> CategoryRow:
        n = len(projection.columns)
        version, deleted = row[3 + n] or 0, bool(row[4 + n])
        values = None if deleted else {
            c: normalize_value(t, v)
            for (c, t), v in zip(projection.columns.items(), row[3:3 + n], strict=True)}
        sort = normalize_value(projection.columns[projection.order_by], row[1])
        return CategoryRow(sort, row[2], values, version, deleted)

    def _select_category(self, projection: CategoryProjection, table: str) -> str:
        cols = ", ".join(["grp", "sort", "aggregate_id", *map(_q, projection.columns), *_META])
        return f"SELECT {cols} FROM {table}"

    def category_rows(self, projection: CategoryProjection, base: str, generation: int,
                      group: str, limit: int) -> list[CategoryRow]:
        _, ct = table_names(base, generation)
        stmt = self._prepare(self._select_category(projection, ct) + " WHERE grp = ? LIMIT ?")
        rows = self._cassandra.execute(stmt, (group, limit))
        return [self._category_row(projection, r) for r in rows]

    def scan_views(self, projection: Projection, base: str,
                   generation: int) -> Iterator[tuple[str, StoredView]]:
        views, _ = table_names(base, generation)
        rows = sorted(self._execute(self._select_views(projection, views)), key=lambda r: r[0])
        for row in rows:
            yield row[0], self._stored(projection, row)

    def scan_category(self, projection: CategoryProjection, base: str,
                      generation: int) -> Iterator[tuple[str, CategoryRow]]:
        _, ct = table_names(base, generation)
        rows = [(r[0], self._category_row(projection, r))
                for r in self._execute(self._select_category(projection, ct))]
        rows.sort(key=lambda gr: gr[0])  # groups in name order, each newest first already
        yield from rows

    def drop_keyspace(self) -> None:
        """Drop this store's keyspace with every generation in it (for throw-away keyspaces:
        tests, the demo), then close the store."""
        try:
            self._execute(f"DROP KEYSPACE IF EXISTS {_q(self.keyspace)}")
        finally:
            self.close()

    def close(self) -> None:
        self._cassandra.close()
