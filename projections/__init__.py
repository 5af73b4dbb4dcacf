"""The read side: projections folded from the event log into Cassandra or SQLite, and queried.

Declare projections with :class:`Projection` / :class:`CategoryProjection` /
:class:`RekeyedProjection`, list them in
``App(..., projections=[...])``, run them with ``cqrs run projector``, query them with
:class:`ProjectionReader`. See docs/projections.md.
"""

from __future__ import annotations

from projections.errors import (
    CategoryKeyChangedError,
    DeadLetterRaisedError,
    GenerationError,
    PageTokenError,
    ProjectionDefinitionError,
    ProjectionError,
    ProjectionStoreError,
    UnknownProjectionError,
    ViewKeyError,
    WaitTimeoutError,
)
from projections.local import LocalProjector, LocalReadModels, records_for
from projections.model import DELETE, CategoryProjection, Delete, EventMeta, Projection, RekeyedProjection
from projections.query import Page, ProjectionReader
from projections.sqlite_store import SqliteStore
from projections.store import ProjectionStore
from projections.stores import open_store

__all__ = [
    "DELETE",
    "CategoryKeyChangedError",
    "CategoryProjection",
    "DeadLetterRaisedError",
    "Delete",
    "EventMeta",
    "GenerationError",
    "LocalProjector",
    "LocalReadModels",
    "Page",
    "PageTokenError",
    "Projection",
    "ProjectionDefinitionError",
    "ProjectionError",
    "ProjectionReader",
    "ProjectionStore",
    "ProjectionStoreError",
    "RekeyedProjection",
    "SqliteStore",
    "UnknownProjectionError",
    "ViewKeyError",
    "WaitTimeoutError",
    "open_store",
    "records_for",
]
