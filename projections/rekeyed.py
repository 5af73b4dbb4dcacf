"""The fold of a re-keyed projection's events onto one view: pure Python, no I/O.

A view of a :class:`~projections.model.RekeyedProjection` is fed by many source aggregates.
It stores ``sources``: the last version it applied per source aggregate. Rules:

- an event ``(source, version)`` is applied to a view only when ``version`` is above the
  view's ``sources[source]``: so replays, duplicates and any split into batches apply it once
  (the caller guarantees that a source's events reach a view in version order, which holds
  because positions in the log only move forward and each batch is sorted here per source);
- a view's ``version`` counts the events applied to it (the write timestamps of
  :mod:`projections.records` follow it, so an older copy of a view never overwrites a newer);
- a failing handler parks the *view* at ``version + 1``: the view keeps the fold before the
  event; that event and every later event for the view (from any source) go to the dead
  letters until a dead-letter replay applies them (``unpark``);
- a re-keyed category (also a :class:`~projections.model.CategoryProjection`) writes its item
  where it is and the places it left (:class:`~projections.fold.CategoryTrail`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Any

from cqrs.budget import Guard

from projections.fold import AggregateFold, CategoryTrail, Decode
from projections.model import DELETE, EventMeta, RekeyedProjection
from projections.personal import check_personal_copies
from projections.records import DeadLetter, EventRecord, StoredView, ViewWrite

__all__ = ["Keyed", "fold_view", "group_by_view"]

Keyed = tuple[EventRecord, Any]  # a record and its decoded event


def _meta(rec: EventRecord) -> EventMeta:
    return EventMeta(rec.aggregate_id, rec.aggregate_type, rec.message_type, rec.version,
                     rec.timestamp, rec.partition, rec.offset)


def group_by_view(projection: RekeyedProjection, records: Iterable[EventRecord],
                  decode: Decode) -> dict[str, list[Keyed]]:
    """The handled records per view key (``key_of``), decoded; events keyed None are left out."""
    groups: dict[str, list[Keyed]] = {}
    for rec in records:
        if projection.handler_for(rec.message_type) is None:
            continue
        event = decode(rec.value)
        key = projection.view_key(event, _meta(rec))
        if key is not None:
            groups.setdefault(key, []).append((rec, event))
    return groups


def _new_events(items: Iterable[Keyed], sources: dict[str, int]) -> list[Keyed]:
    """The events not applied yet, each once, in version order per source (sources merged by
    timestamp: any merge would do, handlers may not depend on the order across sources)."""
    per_source: dict[str, dict[int, Keyed]] = {}
    for item in items:
        rec = item[0]
        if rec.version > sources.get(rec.aggregate_id, 0):
            per_source.setdefault(rec.aggregate_id, {}).setdefault(rec.version, item)
    runs = [[by_version[v] for v in sorted(by_version)]
            for _, by_version in sorted(per_source.items())]
    return list(heapq.merge(*runs, key=lambda item: item[0].timestamp))


def _dead(items: Sequence[Keyed], key: str, parked_at: int) -> list[DeadLetter]:
    return [DeadLetter(rec, "parked", f"view {key!r} parked at version {parked_at}", parked_at)
            for rec, _ in items]


def fold_view(projection: RekeyedProjection, key: str, stored: StoredView | None,
              items: Iterable[Keyed], *, unpark: bool = False, guard: Guard | None = None) -> AggregateFold:
    """Fold ``items`` (any sources, any order, duplicates allowed) onto the view ``key``.

    ``unpark`` (dead-letter replay): ignore the parking mark and clear it when every event
    applies.
    """
    out = AggregateFold()
    sources = dict(stored.sources or {}) if stored is not None else {}
    todo = _new_events(items, sources)
    version = stored.version if stored is not None else 0
    parked = stored.parked_at if stored is not None else None
    if not todo:
        if unpark and parked is not None and stored is not None:
            out.view = ViewWrite(key, stored.values, version, stored.deleted, "unpark",
                                 sources=sources)
        return out
    if parked is not None and not unpark:
        out.dead = _dead(todo, key, parked)
        return out
    values = dict(stored.values) if stored is not None and stored.visible and stored.values else None
    deleted = stored.deleted if stored is not None else False
    trail = CategoryTrail(projection, values)
    for i, (rec, event) in enumerate(todo):
        handler = projection.handler_for(rec.message_type)
        assert handler is not None  # group_by_view keeps handled events only
        work = dict(values) if values is not None else projection.new_view()
        try:
            if guard is not None:
                guard.enter(rec)
            result = handler(work, event, _meta(rec))
            if result is not DELETE:
                trail.check(work)
                check_personal_copies(projection, event, work, key)
        except Exception as exc:  # the handler's bug: park the view, keep the fold before
            failed = version + 1
            out.dead = [DeadLetter(rec, "handler", f"{type(exc).__name__}: {exc}", failed),
                        *_dead(todo[i + 1:], key, failed)]
            out.view = ViewWrite(key, values, version, deleted, "park", failed, sources=sources)
            if out.applied:
                out.category = trail.writes(key, values, version)
            return out
        values, deleted = (None, True) if result is DELETE else (work, False)
        version += 1
        sources[rec.aggregate_id] = rec.version
        trail.moved(values, version)
        out.applied += 1
    out.view = ViewWrite(key, values, version, deleted, "unpark" if unpark else "normal",
                         sources=sources)
    out.category = trail.writes(key, values, version)
    return out
