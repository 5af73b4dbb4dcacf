"""The fold of one aggregate's new events onto its stored view: pure Python, no I/O.

The same function serves the streaming projector, the rebuild, the dead-letter replay and the
unit tests, so they cannot disagree. Rules:

- events at or below the stored version are skipped (replays and re-written duplicates);
- a parked aggregate's events are dead-lettered behind the one that failed (no view is ever
  built over a hole); so are events after a gap in the versions;
- a failing handler parks the aggregate at that version: the view keeps the fold up to the
  event before, the event and its successors go to the dead letters;
- a category item whose group changes moves: :class:`CategoryTrail` writes it in its new
  group and leaves a deleted row in its slot of the old one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from cqrs.budget import Guard
from projections.errors import CategoryKeyChangedError
from projections.model import DELETE, CategoryProjection, EventMeta, Projection
from projections.personal import check_personal_copies
from projections.records import CategoryWrite, DeadLetter, EventRecord, StoredView, ViewWrite

__all__ = ["AggregateFold", "CategoryTrail", "fold_aggregate", "group_by_aggregate", "needs_read"]

Decode = Callable[[bytes], Any]


@attrs.define
class AggregateFold:
    """What folding one aggregate produced."""

    view: ViewWrite | None = None
    category: list[CategoryWrite] = attrs.Factory(list)  # the item, and the places it left
    dead: list[DeadLetter] = attrs.Factory(list)
    applied: int = 0


def group_by_aggregate(records: Iterable[EventRecord]) -> dict[str, list[EventRecord]]:
    """Records per aggregate id, in arrival order."""
    groups: dict[str, list[EventRecord]] = {}
    for rec in records:
        groups.setdefault(rec.aggregate_id, []).append(rec)
    return groups


def needs_read(records: Sequence[EventRecord]) -> bool:
    """Whether the stored view is needed: not when the batch holds the aggregate from version 1
    (the fold from nothing is complete; a replay of it writes the same values at the same
    timestamps, which the store ignores)."""
    return min(r.version for r in records) > 1


def _unique_sorted(records: Iterable[EventRecord], above: int) -> list[EventRecord]:
    seen: dict[int, EventRecord] = {}
    for rec in records:
        if rec.version > above and rec.version not in seen:
            seen[rec.version] = rec
    return [seen[v] for v in sorted(seen)]


Position = tuple[str, Any]  # a category item's place: (group, order value)


class CategoryTrail:
    """The places a category item held during a fold: where it is now, and each place it left
    with the version of the event that moved it out (a move to another group, a group set to
    None, a deletion). For other projections it records nothing.

    Every place left is written as a ``deleted`` row that keeps its slot in the group's newest
    ``keep``. Rows then only ever leave a group by trimming, and what a group keeps is the
    newest ``keep`` of every place any item ever held: the same for a rebuild as for the live
    fold, however the log is split into batches. (Removing the row instead would let an older
    item, already trimmed live, come back in a rebuild.)
    """

    __slots__ = ("at", "category", "left", "order")

    def __init__(self, projection: Projection, values: dict[str, Any] | None) -> None:
        self.category = projection if isinstance(projection, CategoryProjection) else None
        self.at, self.order = self._place(values)
        self.left: dict[Position, int] = {}

    def _place(self, values: dict[str, Any] | None) -> tuple[Position | None, Any]:
        if values is None or self.category is None:
            return None, None
        group, order = values.get(self.category.group_by), values.get(self.category.order_by)
        return (None if group is None else (group, order)), order

    def check(self, values: dict[str, Any]) -> None:
        """Raise :class:`CategoryKeyChangedError` when a handler changed the item's order value
        or put it in a group without one; its group may change (the item moves)."""
        p = self.category
        if p is None:
            return
        group, order = values.get(p.group_by), values.get(p.order_by)
        if self.order is not None and order != self.order:
            raise CategoryKeyChangedError(
                f"{type(p).__name__}: {p.order_by!r} changed from {self.order!r} to {order!r}; "
                "the order value of an item is fixed once set (its group may change)"
            )
        if group is not None and order is None:
            raise CategoryKeyChangedError(
                f"{type(p).__name__}: item in group {group!r} has no {p.order_by!r}; set the "
                "order value in the same handler that sets the group"
            )

    def moved(self, values: dict[str, Any] | None, version: int) -> None:
        """Record the item's place after the event ``version`` (``values`` None: deleted)."""
        if self.category is None:  # once per event folded: nothing to record
            return
        now, self.order = self._place(values)
        if self.at is not None and now != self.at:
            self.left[self.at] = version
        self.at = now

    def writes(self, key: str, values: dict[str, Any] | None, version: int) -> list[CategoryWrite]:
        """The rows to write: each place left as a deleted row, and the item where it is now
        (``values`` at ``version``)."""
        out = [CategoryWrite(group, order, key, None, left, True)
               for (group, order), left in self.left.items() if (group, order) != self.at]
        if self.at is not None:
            out.append(CategoryWrite(self.at[0], self.at[1], key, values, version))
        return out


def _refold(projection: Projection, aggregate_id: str, start: tuple[Any, bool],
            records: Sequence[EventRecord], decode: Decode) -> tuple[Any, bool]:
    """The fold of ``records`` (all applied fine before) from ``start``: handlers are
    deterministic, so this is the view as it was before the failing event."""
    values, deleted = start
    work = dict(values) if values is not None else None
    for rec in records:
        handler = projection.handler_for(rec.message_type)
        if handler is None:
            continue
        if work is None:
            work = projection.new_view()
        meta = EventMeta(aggregate_id, rec.aggregate_type, rec.message_type, rec.version,
                         rec.timestamp, rec.partition, rec.offset)
        if handler(work, decode(rec.value), meta) is DELETE:
            values, deleted, work = None, True, None
        else:
            values, deleted = work, False
    return values, deleted


def fold_aggregate(projection: Projection, aggregate_id: str, stored: StoredView | None,
                   records: Iterable[EventRecord], decode: Decode, *,
                   unpark: bool = False, guard: Guard | None = None) -> AggregateFold:
    """Fold ``records`` (one aggregate's, any order, duplicates allowed) onto ``stored``.

    ``unpark`` (dead-letter replay): ignore the parking mark and clear it when every event
    applies.
    """
    out = AggregateFold()
    base = stored.version if stored is not None else 0
    todo = _unique_sorted(records, base)
    parked = stored.parked_at if stored is not None else None
    if not todo:
        if unpark and parked is not None and stored is not None:
            out.view = ViewWrite(aggregate_id, stored.values, stored.version, stored.deleted, "unpark")
        return out
    if parked is not None and not unpark:
        out.dead = [DeadLetter(r, "parked", f"aggregate parked at version {parked}", parked)
                    for r in todo]
        return out

    visible = stored is not None and stored.visible
    values = dict(stored.values) if visible and stored is not None else None
    deleted = stored.deleted if stored is not None else False
    row_exists = stored is not None and stored.version > 0
    trail = CategoryTrail(projection, values)
    start = (values, deleted)  # to re-fold from when a handler fails half-way
    work = dict(values) if values is not None else None  # one copy per aggregate, not per event
    last = base
    changed_at = 0  # the version of the last event a handler applied (batching-independent)
    changed = False
    for i, rec in enumerate(todo):
        if last > 0 and rec.version != last + 1:
            failed = last + 1
            out.dead = [DeadLetter(r, "gap", f"version {failed} is missing before {rec.version}",
                                   failed) for r in todo[i:]]
            out.view = ViewWrite(aggregate_id, values, last, deleted, "park", failed)
            break
        handler = projection.handler_for(rec.message_type)
        if handler is None:
            last = rec.version
            continue
        if work is None:
            work = projection.new_view()
        meta = EventMeta(aggregate_id, rec.aggregate_type, rec.message_type, rec.version,
                         rec.timestamp, rec.partition, rec.offset)
        try:
            if guard is not None:
                guard.enter(rec)
            event = decode(rec.value)
            result = handler(work, event, meta)
            if result is not DELETE:
                trail.check(work)
                check_personal_copies(projection, event, work)
        except Exception as exc:  # the handler's bug, parked with its message
            error = f"{type(exc).__name__}: {exc}"
            # ``work`` may be half-changed: the view to keep is the fold of the events before
            values, deleted = _refold(projection, aggregate_id, start, todo[:i], decode)
            out.dead = [DeadLetter(rec, "handler", error, rec.version)]
            out.dead += [DeadLetter(r, "parked", f"aggregate parked at version {rec.version}",
                                    rec.version) for r in todo[i + 1:]]
            out.view = ViewWrite(aggregate_id, values, last, deleted, "park", rec.version)
            break
        if result is DELETE:
            values, deleted, work = None, True, None
        else:
            values, deleted = work, False
        trail.moved(values, rec.version)
        last = changed_at = rec.version
        changed = True
        out.applied += 1
    else:
        if changed or (row_exists and last > base) or unpark:
            mode = "unpark" if unpark else "normal"
            out.view = ViewWrite(aggregate_id, values, last, deleted, mode)
    if changed:
        # stamped with the last applied event, not the last event seen: an unhandled event
        # after it must not make the row differ between batchings of the same log
        out.category = trail.writes(aggregate_id, values, changed_at)
    return out
