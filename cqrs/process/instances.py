"""The instance table of a stateful process manager: one Cassandra row per instance key.

A row holds the instance's state (app-codec encoded; null once the instance is finished), the
highest event version it applied per source aggregate (JSON text, what makes a re-read event
harmless) and how many events it applied: every write is ``USING TIMESTAMP`` that count, so
a stale writer (a zombie driver, a re-run batch) never overwrites a newer row.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cqrs.cassandra_io import CassandraSession
from cqrs.codec.registry import Codec
from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.process.reactor import Instance
from cqrs.topics import AppTopics

__all__ = ["InstanceTable", "InstanceTableError", "instance_table_name", "open_instance_table"]

_UNSAFE = re.compile(r"[^a-z0-9_]")


class InstanceTableError(CqrsError, RuntimeError):
    """The instance table of a process manager cannot be read or written."""


def instance_table_name(app_base: str, process_manager: str) -> str:
    """``pm_<app>_<name>``, within Cassandra's 48 characters (hashed when longer)."""
    name = _UNSAFE.sub("_", f"pm_{app_base}_{process_manager}".lower())
    if len(name) <= 48:
        return name
    digest = hashlib.sha1(f"{app_base}/{process_manager}".encode()).hexdigest()[:10]
    return f"{name[:37]}_{digest}"


class InstanceTable:
    def __init__(self, cassandra: CassandraSession, codec: Codec, app_base: str,
                 process_manager: str) -> None:
        self.cassandra = cassandra
        self.codec = codec
        self.table = instance_table_name(app_base, process_manager)
        cassandra.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (key text PRIMARY KEY, "
                          "state blob, applied text, events bigint)")

    def _instance(self, row: Sequence[Any]) -> Instance:
        state = None if row[1] is None else self.codec.decode(bytes(row[1]))
        return Instance(row[0], state, json.loads(row[2] or "{}"))

    def read(self, keys: Sequence[str]) -> dict[str, Instance | None]:
        """The instances of ``keys`` (``None`` for a key with no row yet)."""
        found: dict[str, Instance | None] = dict.fromkeys(keys)
        if keys:
            rows = self.cassandra.read_in(
                f"SELECT key, state, applied, events FROM {self.table}", "key", list(keys))
            for r in rows:
                found[r[0]] = self._instance(r)
        return found

    def all(self) -> Iterator[Instance]:
        for r in self.cassandra.execute(f"SELECT key, state, applied, events FROM {self.table}"):
            yield self._instance(r)

    def write(self, instances: Mapping[str, Instance]) -> None:
        if not instances:
            return
        stmt = self.cassandra.prepare(
            f"INSERT INTO {self.table} (key, state, applied, events) VALUES (?, ?, ?, ?) "
            "USING TIMESTAMP ?", write=True)
        params = []
        for key, inst in instances.items():
            count = sum(inst.applied.values())  # only grows: the row's write timestamp
            state = None if inst.state is None else self.codec.encode(inst.state)
            params.append((key, state, json.dumps(dict(inst.applied), sort_keys=True), count, count))
        self.cassandra.write_rows(stmt, list(instances), params,
                                  [len(p[1] or b"") + len(p[2]) + 64 for p in params])

    def close(self) -> None:
        self.cassandra.close()


def open_instance_table(cfg: CqrsConfig, codec: Codec, topics: AppTopics,
                        process_manager: str) -> InstanceTable:
    p = cfg.processor
    session = CassandraSession(
        cfg.cassandra, read_consistency=p.read_consistency, write_consistency=p.write_consistency,
        concurrency=p.concurrency, rows_per_request=p.rows_per_request,
        error=lambda msg: InstanceTableError(f"process manager {process_manager!r}: {msg}"))
    try:
        return InstanceTable(session, codec, topics.base, process_manager)
    except Exception:
        session.close()
        raise
