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
from projections.model import Projection, select
from projections.records import DeadLetter, EventRecord, Generations
from projections.store import ProjectionStore, table_base

__all__ = ["LocalProjector", "ensure_current_generation", "records_for"]

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
        aggregate_type = _aggregate_type_of(app, event)
        out.append(EventRecord(aggregate_id, aggregate_type, type_name(event), version,
                               app.codec.encode(event),
                               (start + _dt.timedelta(seconds=i)).isoformat(), 0, i))
    return out


def _aggregate_type_of(app: Any, event: object) -> str:
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
    """Applies event records to an app's projections (all, or those named) in a store."""

    def __init__(self, app: Any, store: ProjectionStore, names: Sequence[str] = ()) -> None:
        self.app = app
        self.store = store
        self.targets = []
        for p in select(app, names):
            base = table_base(app.name, p.name)
            self.targets.append(Target(p, base, ensure_current_generation(store, p, base)))
        self.dead_letters: list[DeadLetter] = []

    def apply(self, records: Iterable[EventRecord]) -> BatchStats:
        records = list(records)
        total = BatchStats()
        for target in self.targets:
            total.add(apply_batch(self.store, target, records, self.app.codec.decode,
                                  self.dead_letters.extend))
        return total
