"""Apply a batch of events to one projection generation in a store: read, fold, write, trim.

Called once per Spark partition by the projector and the rebuild, and directly (no Spark) by
the dead-letter replay and the SQLite examples. Dead letters are handed to ``dead_letter``
before the parking marks are written, so a crash in between only repeats them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import attrs

from cqrs.budget import BudgetedThread, Guard

from projections.fold import Decode, fold_aggregate, group_by_aggregate, needs_read
from projections.model import CategoryProjection, Projection, RekeyedProjection
from projections.records import DeadLetter, EventRecord
from projections.rekeyed import fold_view, group_by_view
from projections.store import ProjectionStore

__all__ = ["BatchStats", "Target", "apply_batch", "apply_within_budget"]


@attrs.frozen
class Target:
    """Where a projection writes: its store, table base and generation."""

    projection: Projection
    base: str
    generation: int


@attrs.define
class BatchStats:
    events: int = 0
    applied: int = 0
    aggregates: int = 0
    dead_letters: int = 0
    positions: dict[int, int] = attrs.Factory(dict)  # partition -> next offset

    def add(self, other: BatchStats) -> None:
        self.events += other.events
        self.applied += other.applied
        self.aggregates += other.aggregates
        self.dead_letters += other.dead_letters
        for p, o in other.positions.items():
            self.positions[p] = max(o, self.positions.get(p, 0))


def apply_batch(store: ProjectionStore, target: Target, records: Iterable[EventRecord],
                decode: Decode, dead_letter: Callable[[Sequence[DeadLetter]], None], *,
                unpark: bool = False, guard: Guard | None = None) -> BatchStats:
    """Fold ``records`` (any aggregates, arrival order) into the target's tables.

    A re-keyed projection's records are grouped by view key; the caller must hand all the
    records of one view key in a batch to one call (the Spark job partitions by view key).
    ``guard``: the time budget of the handlers (see :func:`apply_within_budget`)."""
    projection, stats = target.projection, BatchStats()
    wanted = projection.aggregate_type
    mine: list[EventRecord] = []
    for rec in records:
        stats.events += 1
        if rec.partition >= 0:
            stats.positions[rec.partition] = max(rec.offset + 1, stats.positions.get(rec.partition, 0))
        if rec.aggregate_type == wanted:
            mine.append(rec)
    if not mine:
        return stats
    if isinstance(projection, RekeyedProjection):
        by_view = group_by_view(projection, mine, decode)
        stored = store.read_views(projection, target.base, target.generation, list(by_view))
        folds = [fold_view(projection, key, stored.get(key), items, unpark=unpark, guard=guard)
                 for key, items in by_view.items()]
        stats.aggregates = len(by_view)
    else:
        groups = group_by_aggregate(mine)
        to_read = [agg for agg, recs in groups.items() if unpark or needs_read(recs)]
        stored = store.read_views(projection, target.base, target.generation, to_read) if to_read else {}
        folds = [fold_aggregate(projection, agg, stored.get(agg), recs, decode, unpark=unpark,
                                guard=guard)
                 for agg, recs in groups.items()]
        stats.aggregates = len(groups)
    views = [f.view for f in folds if f.view is not None]
    category = [c for f in folds for c in f.category]
    dead = [d for f in folds for d in f.dead]
    stats.applied = sum(f.applied for f in folds)
    stats.dead_letters = len(dead)
    if guard is not None:
        guard.watch.record = None
        guard.check_not_cancelled()  # abandoned past the budget: the caller decides again
    if dead:
        dead_letter(dead)
    if not views and not category:
        return stats
    store.write(projection, target.base, target.generation, category, views)
    if category and isinstance(projection, CategoryProjection):
        store.trim(projection, target.base, target.generation, sorted({c.group for c in category}))
    return stats


def apply_within_budget(runner: BudgetedThread, budget_s: float, store: ProjectionStore,
                        target: Target, records: Sequence[EventRecord], decode: Decode,
                        dead_letter: Callable[[Sequence[DeadLetter]], None]) -> BatchStats:
    """:func:`apply_batch` in ``runner``'s thread, each handler under the decision budget: an
    event whose handler runs past ``budget_s`` is failed as a handler that raised
    (``DecisionTimeoutError``: its view parked, the event dead-lettered) and the batch is
    applied again, that handler not run again; the abandoned call writes nothing."""
    if budget_s <= 0:
        return apply_batch(store, target, records, decode, dead_letter)
    timed_out: dict[tuple[int, int], float] = {}
    handlers = f"{type(target.projection).__name__}'s handler"

    def describe(rec: EventRecord) -> str:
        return (f"{handlers} of {rec.message_type} version {rec.version} of "
                f"{rec.aggregate_id[:80]!r}")

    while True:
        guard = Guard(timed_out, lambda rec: (rec.partition, rec.offset), describe)
        done, value = runner.call(
            lambda g=guard: apply_batch(store, target, records, decode, dead_letter, guard=g),
            guard.watch, budget_s, guard.cancelled.set)
        if done:
            return value  # type: ignore[no-any-return]
        timed_out[(value.partition, value.offset)] = budget_s
