"""Reading the command processor's aggregate state: straight from the aggregate-state table
(or, with ``[processor] state_store = "kafka"``, from its changelog: :mod:`cqrs.processor.changelog`).

The processor keeps one row per (aggregate type, aggregate id) in Cassandra
(:mod:`cqrs.processor.state_table`), written after the events and results it explains. A
:class:`StateReader` keeps a Cassandra session and the app's codec open, so a read is one
single-partition query and a decode: milliseconds, no Spark.

>>> with StateReader(app, cfg) as states:                          # doctest: +SKIP
...     acc = states.get("acc-1", min_version=3, timeout=10)       # read-your-writes
...     acc.version, acc.state.balance
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.processor.changelog import ChangelogView, changelog_topic, uses_changelog
from cqrs.results import AggregateRecord
from cqrs.topics import AppTopics, topics_for

if TYPE_CHECKING:
    from cqrs.app import App
    from cqrs.codec.registry import Codec
    from cqrs.processor.state_table import StateTable, StoredAggregate

__all__ = [
    "AggregateState",
    "AmbiguousAggregateError",
    "StateReadError",
    "StateReader",
    "StateTimeoutError",
    "decode_state",
    "state_codec",
]


class AmbiguousAggregateError(CqrsError, LookupError):
    """An aggregate id exists under several aggregate types and no type was given."""


class StateReadError(CqrsError, RuntimeError):
    """The aggregate state cannot be read (no state table yet, bad type, undecodable row)."""


class StateTimeoutError(CqrsError, TimeoutError):
    """An aggregate did not reach the version waited for in time."""


@attrs.frozen
class AggregateState:
    """One aggregate as the processor holds it.

    ``state`` is the decoded aggregate object (``None`` before the first event and after a
    terminal event, then ``deleted`` is true); ``seen_command_ids`` are the command ids the
    processor remembers for de-duplication, oldest first.
    """

    aggregate_type: str
    aggregate_id: str
    version: int
    deleted: bool
    state: Any
    seen_command_ids: tuple[str, ...] = ()


def state_codec(cfg: CqrsConfig, app: App, topics: AppTopics | None = None) -> tuple[Codec, Any]:
    """The app's codec bound to the Kafka schema store and the app's key store, and the schema
    store (close it when done)."""
    from cqrs.codec.kafka_schema_store import KafkaSchemaStore
    from cqrs.personal.stack import key_store_for

    key_store = key_store_for(cfg, app)
    t = topics or topics_for(app.name, cfg.kafka.topic_prefix)
    store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, t.schemas, cfg.kafka.client_options())
    return app.codec_for(store, key_store=key_store), store


def decode_state(codec: Codec, aggregate_type: str, aggregate_id: str, blob: bytes) -> AggregateState:
    """An :class:`AggregateState` from the stored record bytes."""
    record = codec.decode(bytes(blob))
    if not isinstance(record, AggregateRecord):
        raise StateReadError(
            f"state of {aggregate_type} {aggregate_id!r} holds a {type(record).__name__}, not an "
            "AggregateRecord: the row was not written by the cqrs command processor"
        )
    state = None if record.snapshot is None else codec.decode(record.snapshot)
    return AggregateState(aggregate_type, aggregate_id, record.version, record.deleted, state,
                          tuple(record.seen_command_ids()))


class StateReader:
    """Reads aggregate states of ``app`` from its aggregate-state table (the current generation,
    or ``generation``). Thread-safe; opens its Cassandra session and schema store on first use.
    Close it (or use ``with``) when done."""

    def __init__(self, app: App, cfg: CqrsConfig, *, topics: AppTopics | None = None,
                 generation: int | None = None) -> None:
        self.app = app
        self.cfg = cfg
        self.topics = topics
        self.generation = generation
        self._table: StateTable | None = None
        self._codec: Codec | None = None
        self._store: Any = None
        self._views: dict[int, ChangelogView] = {}  # [processor] state_store = "kafka"
        self._lock = threading.Lock()

    def __enter__(self) -> StateReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _open(self) -> tuple[StateTable, Codec, int]:
        with self._lock:
            if self._table is None:
                from cqrs.processor.state_table import open_state_table

                self._table = open_state_table(
                    self.cfg, self.topics or topics_for(self.app.name, self.cfg.kafka.topic_prefix))
                self._codec, self._store = state_codec(self.cfg, self.app, self.topics)
            generation = self.generation or self._table.current_generation()
            if generation is None:
                raise StateReadError(
                    f"app {self.app.name!r} has no aggregate state in Cassandra keyspace "
                    f"{self.cfg.cassandra.keyspace!r} yet: start its processor (`cqrs run processor "
                    "<module:app>`), or check [cassandra] keyspace")
            assert self._codec is not None
            return self._table, self._codec, generation

    def _rows(self, table: StateTable, generation: int, aggregate_id: str | None,
              ) -> Iterable[StoredAggregate]:
        """The rows of ``aggregate_id`` (None: every row), from the table or the changelog."""
        if not uses_changelog(self.cfg):
            return table.scan(generation) if aggregate_id is None else table.get(generation, aggregate_id)
        with self._lock:
            view = self._views.get(generation)
            if view is None:
                view = self._views[generation] = ChangelogView(
                    self.cfg, changelog_topic(table.app_name, generation))
            return view.scan() if aggregate_id is None else view.get(aggregate_id)

    def _decode(self, codec: Codec, row: StoredAggregate) -> AggregateState:
        return decode_state(codec, row.aggregate_type, row.aggregate_id, row.record)

    def get(self, aggregate_id: str, aggregate_type: str | None = None, *,
            min_version: int | None = None, timeout: float = 10.0) -> AggregateState | None:
        """The aggregate's state (version, decoded state, recent command ids) or ``None``.

        ``aggregate_type`` (stable type name, e.g. ``example.bank.Account``) is needed only when
        the same id exists under several types. ``min_version``: wait up to ``timeout`` seconds
        until the aggregate is at that version or later (read-your-writes after a command's
        result), else :class:`StateTimeoutError`.
        """
        if aggregate_type is not None and aggregate_type not in self.app.model.aggregates:
            raise StateReadError(
                f"aggregate type {aggregate_type!r} is not in app {self.app.name!r} (types: "
                f"{sorted(self.app.model.aggregates)}): pass one of these to --type"
            )
        deadline = time.monotonic() + timeout
        while True:
            table, codec, generation = self._open()
            rows = [r for r in self._rows(table, generation, aggregate_id)
                    if aggregate_type is None or r.aggregate_type == aggregate_type]
            if len(rows) > 1:
                types = sorted(r.aggregate_type for r in rows)
                raise AmbiguousAggregateError(
                    f"aggregate id {aggregate_id!r} exists under several types {types}: pass the "
                    "type (aggregate_type=... / --type)")
            if min_version is None or (rows and rows[0].version >= min_version):
                return self._decode(codec, rows[0]) if rows else None
            if time.monotonic() >= deadline:
                at = rows[0].version if rows else 0
                raise StateTimeoutError(
                    f"aggregate {aggregate_id!r} is at version {at}, not {min_version}, after "
                    f"{timeout:g} s: is the processor running and has the command been answered?")
            time.sleep(0.02)

    def all(self) -> Iterator[AggregateState]:
        """Every aggregate of the table (for tests, comparisons and small apps)."""
        table, codec, generation = self._open()
        for row in self._rows(table, generation, None):
            yield self._decode(codec, row)

    def close(self) -> None:
        with self._lock:
            if self._table is not None:
                self._table.close()
                self._store.close()
            self._table = self._codec = self._store = None
            self._views.clear()
