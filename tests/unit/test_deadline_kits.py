"""Deadlines in the test kits: asserting what a command or a reaction scheduled and cancelled,
and moving a test's clock to fire what is due, with no services and no sleeping."""

from __future__ import annotations

import datetime as dt
from datetime import timedelta

import pytest

from cqrs import command
from cqrs.domain.deadlines import DeadlineChange
from cqrs.testing.deadlines import ClockError, PendingDeadlines

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@command(name="kit.Remind")
class Remind:
    pass


# --- the bookkeeping rules ----------------------------------------------------------------------------

def _change(owner: str, name: str, due_s: int | None) -> DeadlineChange:
    if due_s is None:
        return DeadlineChange(owner, name)
    return DeadlineChange(owner, name, T0 + timedelta(seconds=due_s), "a-1", Remind())


def test_pending_deadlines_rules() -> None:
    pending = PendingDeadlines([_change("o", "b", 5), _change("o", "a", 5), _change("p", "a", 1),
                                _change("o", "c", 9), _change("o", "c", None), _change("o", "d", 9),
                                _change("o", "d", 2)])
    assert [(d.owner, d.name) for d in pending] == [("p", "a"), ("o", "d"), ("o", "a"), ("o", "b")]
    copy = pending.copy()
    assert [d.name for d in pending.due(T0 + timedelta(seconds=2))] == ["a", "d"]
    assert pending.pop_due(T0) is None
    assert pending.pop_due(T0 + timedelta(seconds=1)) == _change("p", "a", 1)
    assert len(pending) == 3 and len(copy) == 4
    with pytest.raises(ClockError, match="timezone-aware"):
        pending.due(dt.datetime(2024, 1, 1))
