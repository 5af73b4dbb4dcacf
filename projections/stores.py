"""Build the configured store (``[projections] store``); one cached per process for executors."""

from __future__ import annotations

import threading

from cqrs.config import CqrsConfig, cache_key
from projections.errors import ProjectionStoreError
from projections.store import ProjectionStore

__all__ = ["cached_store", "open_store"]

_CACHE: dict[str, ProjectionStore] = {}
_LOCK = threading.Lock()


def open_store(cfg: CqrsConfig) -> ProjectionStore:
    """A new store as configured: Cassandra (``[cassandra]``) or SQLite (``sqlite_path``)."""
    kind = cfg.projections.store.lower()
    if kind == "cassandra":
        from projections.cassandra_store import CassandraStore

        return CassandraStore(cfg.cassandra, cfg.projections)
    if kind == "sqlite":
        from projections.sqlite_store import SqliteStore

        return SqliteStore(cfg.projections.sqlite_path)
    raise ProjectionStoreError(
        f"[projections] store = {cfg.projections.store!r}: use 'cassandra' or 'sqlite'"
    )


def cached_store(cfg: CqrsConfig) -> ProjectionStore:
    """The store for ``cfg``, opened once per process (Spark Python workers reuse it)."""
    key = cache_key(cfg.projections, cfg.cassandra)
    with _LOCK:
        store = _CACHE.get(key)
        if store is None:
            store = _CACHE[key] = open_store(cfg)
        return store
