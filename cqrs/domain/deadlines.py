"""Deadlines: a decision that says "later". Pure: no clock, no storage.

A command handler (or a process manager's reaction) returns, beside its events (or ``Send``s),

- ``Schedule(command, after=timedelta(...))`` or ``Schedule(command, at=datetime)``: send
  ``command`` at that time, to the deciding aggregate (or ``to=`` another one; a process
  manager always says ``to=``). ``after`` counts from the command's own timestamp (the
  event's, for a reaction), never from the clock, so a replay decides the same time;
- ``Cancel(ExpireHold)`` (or ``Cancel("name")``): forget a deadline scheduled earlier.

A deadline is known by its **owner** (the aggregate that scheduled it, ``<type>:<id>``; for a
process manager ``pm:<name>:<instance key or correlation id>``) and its **name** (by default the
command's type name, e.g. ``ticketing.ExpireHold``): scheduling the same name again moves it,
cancelling it by name forgets it. When it is due, the command is sent as any command with the
id :func:`deadline_command_id` ``dl:<owner>:<name>:<due ms>``, stamped with the due time and the
scheduling command's correlation id, so the processor's dedup answers a second firing with the
first result, and the handler decides as for any command (an order paid meanwhile ignores its
expiry).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable
from typing import Any

import attrs

from cqrs.domain.messages import is_command, type_name
from cqrs.errors import NotAMessageError

__all__ = [
    "DEADLINE_PREFIX",
    "Cancel",
    "DeadlineChange",
    "Schedule",
    "deadline_command_id",
    "deadline_name",
    "due_ms_of",
    "resolve_deadlines",
]

DEADLINE_PREFIX = "dl:"


def deadline_name(name_or_command: str | type | object) -> str:
    """A deadline's name: a string as given, else the (command) class's type name."""
    if isinstance(name_or_command, str):
        if not name_or_command:
            raise NotAMessageError("a deadline name must be a non-empty str")
        return name_or_command
    cls = name_or_command if isinstance(name_or_command, type) else type(name_or_command)
    if not is_command(cls):
        raise NotAMessageError(
            f"a deadline is named by a str or an @command class, got {name_or_command!r}")
    return type_name(cls)


@attrs.frozen(slots=True)
class Schedule:
    """Send ``command`` later: ``after`` the deciding command's (or event's) timestamp, or ``at``
    a time; to the deciding aggregate unless ``to`` names another (a process manager must say
    ``to``). ``name``: the deadline's name (default: the command's type name)."""

    command: Any
    after: _dt.timedelta | None = None
    at: _dt.datetime | None = None
    to: str | None = None
    name: str | None = None

    def __attrs_post_init__(self) -> None:
        if not is_command(type(self.command)):
            raise NotAMessageError(
                f"Schedule(...) takes an @command instance, got {self.command!r}")
        if (self.after is None) == (self.at is None):
            raise NotAMessageError(
                f"Schedule({self.command!r}) needs exactly one of after=timedelta(...) "
                "(from the command's own time) or at=datetime (timezone-aware)")
        if self.after is not None and not isinstance(self.after, _dt.timedelta):
            raise NotAMessageError(f"Schedule(after=...) takes a timedelta, got {self.after!r}")
        if self.at is not None and (not isinstance(self.at, _dt.datetime) or self.at.tzinfo is None):
            raise NotAMessageError(
                f"Schedule(at=...) takes a timezone-aware datetime, got {self.at!r}")
        if self.to is not None and (not isinstance(self.to, str) or not self.to):
            raise NotAMessageError(f"Schedule(to=...) takes an aggregate id (str), got {self.to!r}")
        if self.name is not None:
            deadline_name(self.name)


@attrs.frozen(slots=True)
class Cancel:
    """Forget the deadline ``name`` (a str, or the scheduled command's class) the deciding
    aggregate or process manager scheduled; nothing happens when there is none."""

    name: str | type

    def __attrs_post_init__(self) -> None:
        deadline_name(self.name)


@attrs.frozen(slots=True)
class DeadlineChange:
    """A resolved schedule (``due`` set) or cancellation (``due`` None) of one deadline."""

    owner: str
    name: str
    due: _dt.datetime | None = None
    target_id: str | None = None  # the aggregate the command goes to
    command: Any = None
    correlation_id: str | None = None
    causation_id: str | None = None  # the command (or event) that decided it

    @property
    def cancelled(self) -> bool:
        return self.due is None

    @property
    def command_id(self) -> str:
        """The id of the command this deadline sends (a schedule only)."""
        assert self.due is not None, "a cancellation sends no command"
        return deadline_command_id(self.owner, self.name, self.due)


def due_ms_of(due: _dt.datetime) -> int:
    """Milliseconds since the epoch (the due table's unit)."""
    return int(due.timestamp() * 1000)


def deadline_command_id(owner: str, name: str, due: _dt.datetime) -> str:
    """``dl:<owner>:<name>:<due ms>``: the same for a deadline however often it fires."""
    return f"{DEADLINE_PREFIX}{owner}:{name}:{due_ms_of(due)}"


def resolve_deadlines(items: Iterable[Schedule | Cancel], *, owner: str, now: _dt.datetime,
                      default_target: str | None, correlation_id: str,
                      causation_id: str, where: str) -> tuple[DeadlineChange, ...]:
    """The changes a decision's ``Schedule`` / ``Cancel`` items make, in order. ``now``: the
    deciding command's (or event's) timestamp; ``default_target``: the deciding aggregate
    (None for a process manager, whose schedules must name ``to``); ``where``: the handler or
    reaction, for error messages."""
    out: list[DeadlineChange] = []
    for item in items:
        if isinstance(item, Cancel):
            out.append(DeadlineChange(owner, deadline_name(item.name),
                                      correlation_id=correlation_id, causation_id=causation_id))
            continue
        target = item.to or default_target
        if target is None:
            raise NotAMessageError(
                f"{where} scheduled {item.command!r} without to=...: a process manager names "
                "the aggregate a deadline's command goes to")
        due = item.at if item.at is not None else now + item.after  # type: ignore[operator]
        out.append(DeadlineChange(owner, deadline_name(item.name or item.command), due, target,
                                  item.command, correlation_id, causation_id))
    return tuple(out)
