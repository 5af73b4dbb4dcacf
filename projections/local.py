"""Run an app's projections in-process, without Kafka or Spark: for single-machine use with the
SQLite store, examples and tests. The fold, stores and idempotence are the projector's own.

>>> store = SqliteStore(":memory:")
>>> local = LocalProjector(app, store)
>>> local.apply(records_for(app, [("acc-1", AccountOpened("ann")), ("acc-1", Deposited(5))]))
>>> ProjectionReader(app, store).get("balances", "acc-1")["balance"]
5
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Sequence
from typing import Any

from cqrs.domain.messages import type_name
from projections.apply import BatchStats, Target, apply_batch
from projections.errors import DeadLetterRaisedError
from projections.model import Projection, select
from projections.personal import with_personal_columns
from projections.records import DeadLetter, EventRecord, Generations
from projections.store import ProjectionStore, table_base

__all__ = ["LocalProjector", "aggregate_type_of", "ensure_current_generation", "records_for"]

_T0 = _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc)


def records_for(app: Any, events: Iterable[tuple[str, object]], *,
                versions: dict[str, int] | None = None,
                start: _dt.datetime = _T0) -> list[EventRecord]:
    """Encoded event records for ``(aggregate id, event)`` pairs, versions counted per aggregate
    (continuing from ``versions``, updated in place), one second apart from ``start``."""
    versions = versions if versions is not None else {}
    out = []
    for i, (aggregate_id, event) in enumerate(events):
        version = versions.get(aggregate_id, 0) + 1
        versions[aggregate_id] = version
        aggregate_type = aggregate_type_of(app, event)
        out.append(EventRecord(aggregate_id, aggregate_type, type_name(event), version,
                               app.codec.encode(event),
                               (start + _dt.timedelta(seconds=i)).isoformat(), 0, i))
    return out


def aggregate_type_of(app: Any, event: object) -> str:
    """The type of the aggregate whose events a projection of ``app`` folds ``event`` from
    (the app's first aggregate when no projection handles it)."""
    name = type_name(event)
    for p in getattr(app, "projections", ()):
        if name in p.handlers:
            return p.aggregate_type
    aggregates = list(app.model.aggregates)
    return aggregates[0] if aggregates else ""


def ensure_current_generation(store: ProjectionStore, projection: Projection, base: str) -> int:
    """The projection's current generation, creating generation 1 on first use."""
    gens = store.generations(base)
    if gens.current is None:
        store.ensure_generation(projection, base, 1)
        store.set_generations(base, Generations(1, gens.building))
        return 1
    store.ensure_generation(projection, base, gens.current)
    return gens.current


class LocalProjector:
    """Applies event records to an app's projections (all, or those named) in a store.

    An event a projection cannot apply (its handler raised, or its aggregate is parked behind
    one that did) is a dead letter, as in the Spark projector: the view keeps the fold up to the
    event before. Here :meth:`apply` then raises :class:`DeadLetterRaisedError` naming it, after
    the batch is stored, so a failing handler does not go unnoticed in a test; with
    ``collect_dead_letters=True`` the letters are only added to :attr:`dead_letters`.
    """

    def __init__(self, app: Any, store: ProjectionStore, names: Sequence[str] = (), *,
                 collect_dead_letters: bool = False) -> None:
        self.app = app
        self.store = with_personal_columns(store, app)  # sealed with the app's key store
        self.collect_dead_letters = collect_dead_letters
        self.targets = []
        for p in select(app, names):
            base = table_base(app.name, p.name)
            self.targets.append(Target(p, base, ensure_current_generation(store, p, base)))
        self.dead_letters: list[DeadLetter] = []

    def apply(self, records: Iterable[EventRecord]) -> BatchStats:
        records = list(records)
        total = BatchStats()
        new: list[DeadLetter] = []
        for target in self.targets:
            total.add(apply_batch(self.store, target, records, self.app.codec.decode, new.extend))
        self.dead_letters.extend(new)
        if new and not self.collect_dead_letters:
            first = new[0]
            raise DeadLetterRaisedError(
                f"{len(new)} event(s) not applied; the first: {first.record.message_type} "
                f"version {first.record.version} of aggregate {first.record.aggregate_id!r} "
                f"({first.reason}: {first.error}). Fix the handler, or pass "
                "collect_dead_letters=True to keep them in .dead_letters (as the Spark projector "
                "keeps them in its dead-letter topic)", list(new))
        return total


class LocalReadModels:
    """An app's read models for :class:`cqrs.testing.runner.LocalRunner`: its projections folded
    by :class:`LocalProjector` into ``store`` (default: SQLite in memory) as the runner writes
    events; read them with :meth:`reader`. Dead letters of projections are kept in
    ``projector.dead_letters``, as the Spark projector keeps them in its topic.

    >>> runner = LocalRunner(app, read_models=LocalReadModels(app))
    >>> runner.read_models.reader().get("balances", "acc-1")
    """

    def __init__(self, app: Any, store: ProjectionStore | None = None) -> None:
        from projections.sqlite_store import SqliteStore

        self.app = app
        self.store = store if store is not None else SqliteStore(":memory:")
        self.projector = LocalProjector(app, self.store, collect_dead_letters=True)

    def apply(self, records: Sequence[tuple[bytes, bytes, Sequence[tuple[str, bytes | None]], int]]) -> None:
        """Fold events-topic records ``(key, value, headers, offset)`` (the runner's)."""
        from projections.records import event_record

        self.projector.apply([event_record(k, v, h, 0, o) for k, v, h, o in records])

    def reader(self) -> Any:
        from projections.query import ProjectionReader

        return ProjectionReader(self.app, self.store)
