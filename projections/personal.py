"""Personal columns of read models (``Projection.personal_columns``): sealed in every store,
opened for every reader, rewritten when their data subject is forgotten.

One implementation for every store: :class:`PersonalColumnsStore` wraps a
:class:`~projections.store.ProjectionStore` (Cassandra, SQLite) and seals the personal columns
of each row it writes with the subject's key, exactly as the codec seals a message's
``personal()`` fields (:mod:`cqrs.personal.cipher`, the associated data naming
``view:<projection>`` and the column), and opens them in each row it reads: a value whose key is
gone reads as :data:`~cqrs.domain.FORGOTTEN`. :func:`with_personal_columns` wraps a store for an
app (the projector, the rebuild, the dead-letter replay, the readers all go through it).

:func:`forget_in_views` is the read models' part of forgetting a subject: each row of the
subject whose personal columns hold anything but a value sealed with the subject's current key
gets those columns rewritten to the replacement (not even ciphertext under the deleted key
stays); :func:`forget_in_read_models` does it for every projection and generation of an app.

:func:`check_personal_copies` is the fold's safety net: a handler that copies an event's
personal value into a column not declared personal fails with
:class:`~projections.errors.PersonalDataCopiedError` (the aggregate is parked, as for any failing
handler) instead of writing it in clear.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from cqrs.domain.messages import type_name
from cqrs.domain.personal import FORGOTTEN, personal_fields
from cqrs.errors import MissingKeyStoreError
from cqrs.personal.cipher import open_sealed, parse_sealed, seal_text, sealed_as
from cqrs.personal.keys import KeyStore
from projections.errors import PersonalColumnError, PersonalDataCopiedError
from projections.model import CategoryProjection, Projection, projections_of
from projections.records import (
    CategoryRow, CategoryWrite, CellsWrite, Generations, StoredView, ViewWrite,
)
from projections.store import ProjectionStore, table_base

if TYPE_CHECKING:
    from cqrs.config import CqrsConfig

__all__ = [
    "ForgetInViews",
    "PersonalColumnsStore",
    "check_personal_copies",
    "forget_in_read_models",
    "forget_in_views",
    "has_personal_columns",
    "sealed_type",
    "with_personal_columns",
]

REPLACEMENT = FORGOTTEN
"""What a personal column reads as once its subject is forgotten."""


def sealed_type(projection: Projection) -> str:
    """The name a projection's sealed columns are bound to (their "message type")."""
    return f"view:{projection.name}"


def has_personal_columns(app: Any) -> bool:
    """Whether any projection of ``app`` declares personal columns."""
    return any(getattr(p, "personal_columns", None) for p in getattr(app, "projections", ()))


def _subject(projection: Projection, key: str, values: Mapping[str, Any], column: str) -> Any:
    source = projection.personal_columns[column]
    return key if source == projection.key else values.get(source)


class _Columns:
    """Seals and opens one projection's personal columns of a row's values."""

    def __init__(self, projection: Projection, key_store: KeyStore | None) -> None:
        self.projection = projection
        self.columns = dict(projection.personal_columns)
        self.type_name = sealed_type(projection)
        self.key_store = key_store

    def _keys(self) -> KeyStore:
        if self.key_store is None:
            raise MissingKeyStoreError(
                f"projection {self.projection.name!r} has personal columns "
                f"({', '.join(self.columns)}) and its store was opened without a key store to "
                "seal or open them: pass key_store=key_store_for(cfg, app) (on the stack) or "
                "app.key_store (bind one with app.use_key_store(MemoryKeyStore()) in tests)")
        return self.key_store

    def seal(self, key: str, values: dict[str, Any] | None) -> dict[str, Any] | None:
        if values is None:
            return None
        changes: dict[str, str] = {}
        for column in self.columns:
            value = values.get(column)
            if not value or value == REPLACEMENT or not isinstance(value, str):
                continue
            if parse_sealed(value, f"{self.type_name}.{column}") is not None:
                continue  # sealed already (a row read back raw)
            subject = _subject(self.projection, key, values, column)
            if not isinstance(subject, str) or not subject:
                raise PersonalColumnError(
                    f"projection {self.projection.name!r}, view {key[:80]!r}: personal column "
                    f"{column!r} has a value but its subject column "
                    f"{self.columns[column]!r} is {subject!r}: set the subject's id in the same "
                    "handler that sets the personal value (there is no key to seal it with)")
            changes[column] = sealed_as(value, subject, column) or seal_text(
                self._keys().get_or_create(subject), value, subject, column)
        return {**values, **changes} if changes else values

    def open(self, key: str, values: dict[str, Any] | None) -> dict[str, Any] | None:
        if values is None:
            return None
        changes: dict[str, str] = {}
        for column in self.columns:
            value = values.get(column)
            if not isinstance(value, str):
                continue
            sealed = parse_sealed(value, f"{self.type_name}.{column}")
            if sealed is None:
                continue
            subject = _subject(self.projection, key, values, column)
            found = (self._keys().key_for(subject, sealed.key_id)
                     if isinstance(subject, str) and subject else None)
            changes[column] = (REPLACEMENT if found is None
                               else open_sealed(found, sealed, value, subject, self.type_name,
                                                 column))
        return {**values, **changes} if changes else values


class PersonalColumnsStore(ProjectionStore):
    """``inner`` with the personal columns of every projection sealed on the way in and opened
    on the way out (projections without personal columns pass through untouched)."""

    def __init__(self, inner: ProjectionStore, key_store: KeyStore | None) -> None:
        self.inner = inner
        self.key_store = key_store
        self._columns: dict[type, _Columns | None] = {}

    def _of(self, projection: Projection) -> _Columns | None:
        cls = type(projection)
        if cls not in self._columns:
            self._columns[cls] = (_Columns(projection, self.key_store)
                                  if projection.personal_columns else None)
        return self._columns[cls]

    # --- pass-through ------------------------------------------------------------------------

    def ensure_generation(self, projection: Projection, base: str, generation: int) -> None:
        self.inner.ensure_generation(projection, base, generation)

    def drop_generation(self, projection: Projection, base: str, generation: int) -> None:
        self.inner.drop_generation(projection, base, generation)

    def generations(self, base: str) -> Generations:
        return self.inner.generations(base)

    def set_generations(self, base: str, generations: Generations) -> None:
        self.inner.set_generations(base, generations)

    def trim(self, projection: CategoryProjection, base: str, generation: int,
             groups: Sequence[str]) -> None:
        self.inner.trim(projection, base, generation, groups)

    def save_positions(self, base: str, generation: int, positions: dict[int, int]) -> None:
        self.inner.save_positions(base, generation, positions)

    def positions(self, base: str, generation: int) -> dict[int, int]:
        return self.inner.positions(base, generation)

    def rewrite_cells(self, projection: Projection, base: str, generation: int,
                      rows: Sequence[CellsWrite]) -> None:
        self.inner.rewrite_cells(projection, base, generation, rows)

    def close(self) -> None:
        self.inner.close()

    # --- sealed on the way in ----------------------------------------------------------------

    def write(self, projection: Projection, base: str, generation: int,
              category: Sequence[CategoryWrite], views: Sequence[ViewWrite]) -> None:
        columns = self._of(projection)
        if columns is not None:
            category = [attrs.evolve(c, values=columns.seal(c.aggregate_id, c.values))
                        for c in category]
            views = [attrs.evolve(v, values=columns.seal(v.key, v.values)) for v in views]
        self.inner.write(projection, base, generation, category, views)

    # --- opened on the way out ---------------------------------------------------------------

    def _view(self, columns: _Columns | None, key: str, stored: StoredView) -> StoredView:
        if columns is None or stored.values is None:
            return stored
        return attrs.evolve(stored, values=columns.open(key, stored.values))

    def _row(self, columns: _Columns | None, row: CategoryRow) -> CategoryRow:
        if columns is None or row.values is None:
            return row
        return attrs.evolve(row, values=columns.open(row.aggregate_id, row.values))

    def read_views(self, projection: Projection, base: str, generation: int,
                   keys: Sequence[str]) -> dict[str, StoredView]:
        columns = self._of(projection)
        found = self.inner.read_views(projection, base, generation, keys)
        return {k: self._view(columns, k, v) for k, v in found.items()}

    def category_rows(self, projection: CategoryProjection, base: str, generation: int,
                      group: str, limit: int) -> list[CategoryRow]:
        columns = self._of(projection)
        return [self._row(columns, r)
                for r in self.inner.category_rows(projection, base, generation, group, limit)]

    def scan_views(self, projection: Projection, base: str,
                   generation: int) -> Iterator[tuple[str, StoredView]]:
        columns = self._of(projection)
        for key, stored in self.inner.scan_views(projection, base, generation):
            yield key, self._view(columns, key, stored)

    def scan_category(self, projection: CategoryProjection, base: str,
                      generation: int) -> Iterator[tuple[str, CategoryRow]]:
        columns = self._of(projection)
        for group, row in self.inner.scan_category(projection, base, generation):
            yield group, self._row(columns, row)


def with_personal_columns(store: ProjectionStore, app: Any,
                          key_store: KeyStore | None = None) -> ProjectionStore:
    """``store`` for ``app``'s projections: wrapped in a :class:`PersonalColumnsStore` with
    ``key_store`` (default: the app's own, ``app.key_store``) when a projection of the app
    declares personal columns, else ``store`` itself. Wrapping twice is wrapping once."""
    if isinstance(store, PersonalColumnsStore) or not has_personal_columns(app):
        return store
    return PersonalColumnsStore(store, key_store if key_store is not None
                                else getattr(app, "key_store", None))


# --- the fold's safety net --------------------------------------------------------------------

def _personal_values(event: Any) -> list[tuple[str, str]]:
    declared = personal_fields(type(event))
    if declared is None:
        return []
    found = []
    for name, replacement in declared.fields:
        value = getattr(event, name, None)
        if isinstance(value, str) and value and value != replacement and value != REPLACEMENT:
            found.append((name, value))
    return found


def check_personal_copies(projection: Projection, event: Any, values: Mapping[str, Any],
                          key: str | None = None) -> None:
    """Raise :class:`PersonalDataCopiedError` when a ``str`` column of ``values`` that is not
    declared personal (or the view ``key``) holds one of ``event``'s personal values (equal to
    it, or containing it when it is 4 characters or more). Costs nothing for events without
    personal values. The message names the event field and column, never the value."""
    plain = _personal_values(event)
    if not plain:
        return
    personal = projection.personal_columns
    suspects = [(c, v) for c, v in values.items() if c not in personal and isinstance(v, str) and v]
    if key:
        suspects.append((f"{projection.key} (the view key)", key))
    for column, value in suspects:
        for field, secret in plain:
            if value == secret or (len(secret) >= 4 and secret in value):
                raise PersonalDataCopiedError(
                    f"{type(projection).__qualname__}: the personal field "
                    f"{type_name(type(event))}.{field} was copied into column {column!r}, which "
                    "is not declared personal, so it would be stored in clear and outlive "
                    "forgetting the data subject: declare it in personal_columns = "
                    f"{{{column!r}: '<column holding the subject id>'}} or do not copy it "
                    "(the value is not shown here)")


# --- forgetting --------------------------------------------------------------------------------

@attrs.frozen
class ForgetInViews:
    """What forgetting a subject did to one generation of one projection."""

    projection: str
    generation: int
    scanned: int
    rewritten: int


def _stale(columns: _Columns, key: str, subject: str, values: Mapping[str, Any]) -> dict[str, str]:
    """The personal columns of the subject's row ``values`` (raw) to rewrite: every value that
    is not the replacement nor sealed with the subject's current key."""
    out: dict[str, str] = {}
    for column in columns.columns:
        if _subject(columns.projection, key, values, column) != subject:
            continue
        value = values.get(column)
        if not isinstance(value, str) or not value or value == REPLACEMENT:
            continue
        sealed = parse_sealed(value, f"{columns.type_name}.{column}")
        if sealed is not None and columns._keys().key_for(subject, sealed.key_id) is not None:
            continue  # sealed with a key made after the forget: a later message's
        out[column] = REPLACEMENT
    return out


def forget_in_views(store: ProjectionStore, projection: Projection, base: str, generation: int,
                    subject: str, key_store: KeyStore) -> ForgetInViews:
    """Rewrite the personal columns of ``subject``'s rows (views and category rows) of one
    generation to the replacement, in place (:class:`~projections.records.CellsWrite`), unless
    sealed with a key the subject got after being forgotten. Reads the raw rows of ``store``
    (a wrapping :class:`PersonalColumnsStore` is looked through); scans the generation, as
    there is no index by subject. Running it again rewrites nothing."""
    raw = store.inner if isinstance(store, PersonalColumnsStore) else store
    columns = _Columns(projection, key_store)
    scanned, rows = 0, []
    for key, stored in raw.scan_views(projection, base, generation):
        scanned += 1
        if stored.values is not None:
            stale = _stale(columns, key, subject, stored.values)
            if stale:
                rows.append(CellsWrite(key, stored.version, stale))
    if isinstance(projection, CategoryProjection):
        for group, row in raw.scan_category(projection, base, generation):
            scanned += 1
            if row.values is not None:
                stale = _stale(columns, row.aggregate_id, subject, row.values)
                if stale:
                    rows.append(CellsWrite(row.aggregate_id, row.version, stale, group, row.sort))
    if rows:
        raw.rewrite_cells(projection, base, generation, rows)
    return ForgetInViews(projection.name, generation, scanned, len(rows))


def forget_in_read_models(store: ProjectionStore, app: Any, subject: str, key_store: KeyStore,
                          report: Callable[[str], None] = lambda _: None) -> list[ForgetInViews]:
    """:func:`forget_in_views` for every generation (current and building) of every projection
    of ``app`` with personal columns; ``report`` gets a line per generation."""
    done = []
    for projection in projections_of(app).values():
        if not projection.personal_columns:
            continue
        base = table_base(app.name, projection.name)
        gens = store.generations(base)
        for generation in sorted({g for g in (gens.current, gens.building) if g is not None}):
            result = forget_in_views(store, projection, base, generation, subject, key_store)
            report(f"read model {projection.name!r} generation {generation}: "
                   f"{result.rewritten} row(s) of {subject!r} rewritten "
                   f"({result.scanned} scanned)")
            done.append(result)
    return done


def stack_store(store: ProjectionStore, cfg: CqrsConfig, app: Any) -> ProjectionStore:
    """``store`` for ``app`` on the stack: :func:`with_personal_columns` with the key store of
    the stack (:func:`cqrs.personal.key_store_for`), asked only when the app has personal
    columns."""
    if isinstance(store, PersonalColumnsStore) or not has_personal_columns(app):
        return store
    from cqrs.personal.stack import key_store_for

    return PersonalColumnsStore(store, key_store_for(cfg, app))


def forget_step(cfg: CqrsConfig, app: Any, subject: str, key_store: KeyStore,
                report: Callable[[str], None]) -> int:
    """The read models' step of ``cqrs forget`` / ``POST /subjects/{subject}/forget``
    (:func:`cqrs.personal.forgetting.forget_subject` takes it from the CLI and the HTTP service,
    which see both sides): :func:`forget_in_read_models` on the configured store. Answers the
    number of rows rewritten."""
    from projections.stores import cached_store

    results = forget_in_read_models(cached_store(cfg), app, subject, key_store, report)
    return sum(r.rewritten for r in results)


__all__ += ["REPLACEMENT", "forget_step", "stack_store"]
