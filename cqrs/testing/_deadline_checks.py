"""The deadline assertions both test kits share (``then_scheduled``, ``then_cancelled``,
``then_nothing_scheduled``, ``then_fired``): what they compare and how a failure reads.

The expected deadline is resolved by the decision's own :func:`resolve_deadlines`, so
``then_scheduled(cmd, after=...)`` means exactly what ``Schedule(cmd, after=...)`` in a handler
means: the same default name, the same due time from the deciding command's (or event's) time.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cqrs.domain.deadlines import DeadlineChange, Schedule, deadline_name, resolve_deadlines
from cqrs.domain.process import Send
from cqrs.testing._diff import diff
from cqrs.testing.deadlines import last_changes

__all__ = ["as_send", "check_cancelled", "check_fired", "check_nothing_scheduled", "check_scheduled",
           "show"]


def show(change: DeadlineChange) -> str:
    """One line per deadline change, for messages."""
    if change.cancelled:
        return f"cancel {change.name!r}"
    assert change.due is not None
    return (f"{change.name!r} due {change.due.isoformat()} to {change.target_id!r}: "
            f"{change.command!r}")


def _listing(changes: Iterable[DeadlineChange], empty: str) -> str:
    lines = [f"  {show(c)}" for c in changes]
    return "\n".join(lines) if lines else f"  {empty}"


def _fields(change: DeadlineChange) -> dict[str, Any]:
    return {"name": change.name, "due": change.due, "to": change.target_id, "command": change.command}


def check_scheduled(where: str, changes: Sequence[DeadlineChange], schedule: Schedule, *,
                    now: _dt.datetime, times: Mapping[str, _dt.datetime],
                    default_target: str | None, note: str = "") -> DeadlineChange:
    """The schedule among ``changes`` (their last changes) that ``schedule`` describes, else an
    ``AssertionError`` listing what was scheduled. ``times``: the time of each deciding command
    or event by its id (the change's causation id), ``after`` counts from it (``now`` if not
    found); ``default_target``: the deciding aggregate (None for a process manager)."""

    def expected(at: _dt.datetime) -> DeadlineChange:
        (change,) = resolve_deadlines([schedule], owner="", now=at, default_target=default_target,
                                      correlation_id="", causation_id="", where="then_scheduled")
        return change

    left = last_changes(changes)
    scheduled = [c for c in left if not c.cancelled]
    for c in scheduled:
        if _fields(expected(times.get(c.causation_id or "", now))) == _fields(c):
            return c
    want = expected(now)
    same_name = [c for c in scheduled if c.name == want.name]
    if same_name:
        want = expected(times.get(same_name[0].causation_id or "", now))
        detail = f"\n{diff(_fields(want), _fields(same_name[0]))}"
    else:
        detail = ""
    raise AssertionError(
        f"{where}: expected it to schedule\n  {show(want)}\nbut its deadline changes were\n"
        f"{_listing(left, 'none' + note)}{detail}")


def check_cancelled(where: str, changes: Sequence[DeadlineChange], name: str | type,
                    note: str = "") -> DeadlineChange:
    """The cancellation of the deadline ``name`` (a str or the command class) among
    ``changes`` (their last changes), else an ``AssertionError`` listing the changes."""
    wanted = deadline_name(name)
    left = last_changes(changes)
    for c in left:
        if c.cancelled and c.name == wanted:
            return c
    raise AssertionError(f"{where}: expected it to cancel {wanted!r}, but its deadline changes "
                         f"were\n{_listing(left, 'none' + note)}")


def check_nothing_scheduled(where: str, changes: Sequence[DeadlineChange]) -> None:
    """No schedule among ``changes`` (their last changes; cancellations are allowed)."""
    scheduled = [c for c in last_changes(changes) if not c.cancelled]
    if scheduled:
        raise AssertionError(f"{where}: expected it to schedule nothing, but it scheduled\n"
                             f"{_listing(scheduled, 'nothing')}")


def as_send(change: DeadlineChange) -> Send:
    """A fired deadline as the command it sent (to its target, no expected version)."""
    assert change.target_id is not None
    return Send(change.target_id, change.command)


def check_fired(where: str, fired: Sequence[DeadlineChange], expected: Sequence[Any],
                pending: Iterable[DeadlineChange], *, shorthand_for: str | None = None) -> None:
    """The commands ``fired`` sent equal ``expected`` (``Send``s, in order), else an
    ``AssertionError`` with a diff and what is still pending. ``shorthand_for``: an aggregate
    id whose commands may be given bare (an aggregate's own deadlines)."""

    def short(send: Send) -> Any:
        return send.command if send.aggregate_id == shorthand_for else send

    actual = [short(as_send(c)) for c in fired]
    wanted = [short(e) if isinstance(e, Send) else e for e in expected]
    if actual != wanted:
        raise AssertionError(
            f"{where}: the deadlines that fired differ:\n{diff(wanted, actual)}\n"
            f"fired:\n{_listing(fired, 'nothing')}\nstill pending:\n{_listing(pending, 'nothing')}")
