"""The one interface every read-model store implements (Cassandra, SQLite).

A projection's data lives in generations: tables ``<base>_g<n>`` (views by aggregate id) and,
for category projections, ``<base>_g<n>_c`` (items by group, newest first). A small metadata
table says which generation readers use (``current``) and which one a rebuild fills
(``building``); switching is one row write. Positions (Kafka offsets applied per partition) are
kept per generation for ``cqrs projections status``.
"""

from __future__ import annotations

import abc
import datetime as _dt
import hashlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

from projections.model import CategoryProjection, Projection
from projections.records import (
    CategoryRow, CategoryWrite, CellsWrite, Generations, StoredView, ViewWrite,
)

__all__ = ["ProjectionStore", "normalize_value", "table_base", "table_names"]

_UNSAFE = re.compile(r"[^a-z0-9_]")


def table_base(app_name: str, projection: str) -> str:
    """The prefix of a projection's tables: ``<app>__<projection>`` (hashed when too long)."""
    app = _UNSAFE.sub("_", app_name.lower())
    base = f"{app}__{projection}"
    if len(base) <= 38:
        return base
    digest = hashlib.sha1(f"{app_name}/{projection}".encode()).hexdigest()[:8]
    return f"p{digest}_{projection}"[:38]


def table_names(base: str, generation: int) -> tuple[str, str]:
    """(views table, category table) of one generation."""
    return f"{base}_g{generation}", f"{base}_g{generation}_c"


def normalize_value(kind: type, value: Any) -> Any:
    """A column value as every store gives it back: datetimes in UTC to the millisecond,
    dates as ``datetime.date``."""
    if value is None:
        return None
    if kind is _dt.datetime:
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        value = value.astimezone(_dt.timezone.utc)
        return value.replace(microsecond=value.microsecond // 1000 * 1000)
    if kind is _dt.date:  # a datetime is a date too: keep the day; Cassandra's driver gives
        if isinstance(value, _dt.datetime):  # its own Date, which has .date()
            return value.date()
        return value if isinstance(value, _dt.date) else value.date()
    if kind is bool:
        return bool(value)
    if kind is bytes:
        return bytes(value)
    return value


class ProjectionStore(abc.ABC):
    """Reads and writes of projection tables; implementations must be safe to share by threads.

    ``base`` names the projection's tables (:func:`table_base`); ``generation`` picks one copy.
    Writes are idempotent: a write whose timestamp is not above the stored one changes nothing.
    """

    # --- generations and schema --------------------------------------------------------------

    @abc.abstractmethod
    def ensure_generation(self, projection: Projection, base: str, generation: int) -> None:
        """Create the generation's tables if missing."""

    @abc.abstractmethod
    def drop_generation(self, projection: Projection, base: str, generation: int) -> None:
        """Drop the generation's tables and positions (readers must have switched away)."""

    @abc.abstractmethod
    def generations(self, base: str) -> Generations:
        """The current and building generation (``Generations(None, None)`` if never run)."""

    @abc.abstractmethod
    def set_generations(self, base: str, generations: Generations) -> None:
        """Record the current and building generation in one write (readers switch on it)."""

    # --- the projector's side ----------------------------------------------------------------

    @abc.abstractmethod
    def read_views(self, projection: Projection, base: str, generation: int,
                   keys: Sequence[str]) -> dict[str, StoredView]:
        """The stored rows of ``keys`` (absent keys are left out)."""

    @abc.abstractmethod
    def write(self, projection: Projection, base: str, generation: int,
              category: Sequence[CategoryWrite], views: Sequence[ViewWrite]) -> None:
        """Write category rows, then view rows (the view's version marks the work as done)."""

    @abc.abstractmethod
    def rewrite_cells(self, projection: Projection, base: str, generation: int,
                      rows: Sequence[CellsWrite]) -> None:
        """Write ``rows``' columns into their existing rows at their timestamp, other columns
        untouched (forgetting a data subject); a newer write of a row wins, as always."""

    @abc.abstractmethod
    def trim(self, projection: CategoryProjection, base: str, generation: int,
             groups: Sequence[str]) -> None:
        """Delete the rows of ``groups`` beyond the newest ``projection.keep``."""

    @abc.abstractmethod
    def save_positions(self, base: str, generation: int, positions: dict[int, int]) -> None:
        """Record the next offset to read per events-topic partition."""

    @abc.abstractmethod
    def positions(self, base: str, generation: int) -> dict[int, int]:
        """The recorded next offset per partition (empty if none)."""

    # --- the readers' side -------------------------------------------------------------------

    def view(self, projection: Projection, base: str, generation: int, key: str) -> StoredView | None:
        return self.read_views(projection, base, generation, [key]).get(key)

    @abc.abstractmethod
    def category_rows(self, projection: CategoryProjection, base: str, generation: int,
                      group: str, limit: int) -> list[CategoryRow]:
        """A group's rows, newest first (then by aggregate id), deleted ones included."""

    @abc.abstractmethod
    def scan_views(self, projection: Projection, base: str,
                   generation: int) -> Iterator[tuple[str, StoredView]]:
        """Every view row of a generation (for comparisons and tools; not for hot paths)."""

    @abc.abstractmethod
    def scan_category(self, projection: CategoryProjection, base: str,
                      generation: int) -> Iterator[tuple[str, CategoryRow]]:
        """Every category row of a generation as (group, row)."""

    def close(self) -> None:
        """Release connections."""
