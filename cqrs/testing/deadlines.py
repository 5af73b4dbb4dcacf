"""Pending deadlines in memory: the bookkeeping rules of the deadline store, without a store.

A deadline is known by ``(owner, name)``. Changes apply in order and the last one wins:
scheduling a name again moves it (its new due time, target and command replace the old ones),
cancelling it removes it (nothing happens when it is not pending). What is due at ``now`` is
every pending deadline whose due time is at or before ``now``, earliest first, ties in
``(owner, name)`` order as the store's due table sorts them. A deadline that fired is no longer
pending; what its command decides applies afterwards, so it may schedule its name again.

Pure: no clock, no codec. The test kits (:mod:`cqrs.testing.scenario`,
:mod:`cqrs.testing.process`) keep one per test, and an in-process runner can keep one too.

>>> pending = PendingDeadlines()
>>> pending.apply(outcome.deadlines)          # what a decision scheduled and cancelled
>>> while (deadline := pending.pop_due(now)) is not None:
...     fire(deadline)                        # then apply what its command decided
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Iterator

from cqrs.domain.deadlines import DeadlineChange, due_ms_of
from cqrs.errors import CqrsError

__all__ = ["ClockError", "PendingDeadlines", "advance_clock", "aware", "last_changes"]


class ClockError(CqrsError, ValueError):
    """A time a test's clock cannot take: a naive datetime, a step back."""


def _order(change: DeadlineChange) -> tuple[int, str, str]:
    assert change.due is not None
    return due_ms_of(change.due), change.owner, change.name


def aware(now: _dt.datetime) -> _dt.datetime:
    """``now`` if it is a timezone-aware datetime, else a :class:`ClockError`."""
    if not isinstance(now, _dt.datetime) or now.tzinfo is None:
        raise ClockError(
            f"pending deadlines are due at timezone-aware times, got {now!r}: pass a datetime "
            "with a tzinfo (e.g. datetime(2024, 1, 1, tzinfo=timezone.utc))")
    return now


def last_changes(changes: Iterable[DeadlineChange]) -> list[DeadlineChange]:
    """The last change of each deadline (``owner``, ``name``), in the order of those last
    changes: what a run of changes amounts to (scheduled then cancelled is cancelled)."""
    last: dict[tuple[str, str], DeadlineChange] = {}
    for change in changes:
        last.pop((change.owner, change.name), None)
        last[(change.owner, change.name)] = change
    return list(last.values())


class PendingDeadlines:
    """The deadlines scheduled and neither cancelled nor fired yet (see the module doc)."""

    def __init__(self, changes: Iterable[DeadlineChange] = ()) -> None:
        self._by_key: dict[tuple[str, str], DeadlineChange] = {}
        self.apply(changes)

    def apply(self, changes: Iterable[DeadlineChange]) -> None:
        """Apply schedules and cancellations in order: the last change of a deadline wins."""
        for change in last_changes(changes):
            if change.cancelled:
                self._by_key.pop((change.owner, change.name), None)
            else:
                self._by_key[(change.owner, change.name)] = change

    def due(self, now: _dt.datetime) -> list[DeadlineChange]:
        """The deadlines due at ``now`` (due time at or before it), earliest first."""
        aware(now)
        return sorted((c for c in self._by_key.values() if c.due is not None and c.due <= now),
                      key=_order)

    def pop_due(self, now: _dt.datetime) -> DeadlineChange | None:
        """Take the earliest deadline due at ``now`` out of the pending ones (it fires), or
        ``None`` when nothing is due."""
        due = self.due(now)
        if not due:
            return None
        first = due[0]
        del self._by_key[(first.owner, first.name)]
        return first

    def copy(self) -> PendingDeadlines:
        """An independent copy (changes to one do not show in the other)."""
        other = PendingDeadlines()
        other._by_key = dict(self._by_key)
        return other

    def __iter__(self) -> Iterator[DeadlineChange]:
        """Every pending deadline, earliest first."""
        return iter(sorted(self._by_key.values(), key=_order))

    def __len__(self) -> int:
        return len(self._by_key)

    def __repr__(self) -> str:
        return f"PendingDeadlines({list(self)!r})"


def advance_clock(now: _dt.datetime, by: _dt.timedelta) -> _dt.datetime:
    """``now + by``, for a ``by`` that is a timedelta of zero or more (time never goes back)."""
    if not isinstance(by, _dt.timedelta) or by < _dt.timedelta(0):
        raise ClockError(
            f"advance(...) takes a timedelta of zero or more, got {by!r}: e.g. "
            "advance(timedelta(minutes=15)); time in a test never goes back")
    return aware(now) + by
