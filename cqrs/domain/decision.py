"""The one decision function, shared by the Spark command processor and the test kit.

``decide(entry, aggregate_id, state, version, commands)`` runs an ordered batch of commands
against one aggregate and returns the new state, the new version and one outcome per command.
It is pure and deterministic: it never reads the clock (event timestamps come from the
commands), event ids are ``uuid5(EVENT_ID_NAMESPACE, f"{aggregate_type}/{aggregate_id}/{version}")``
and the input state is never mutated.

State conventions (shared with whatever stores the state):

* ``state is None and version == 0``: the aggregate does not exist yet; a command sees a fresh
  ``AggregateClass()`` and the state stays ``None`` unless an event is applied;
* ``state is None and version > 0``: the aggregate was deleted by a terminal event; every
  command is rejected with code ``"aggregate_deleted"``;
* otherwise ``state`` is the aggregate after ``version`` events.

Versions: each event increments the version by one; ``Accepted.version`` is the version after
the command's last event (unchanged when the handler returned no event).

Copying: the input state is copied once per call (shallow or deep, see
:mod:`cqrs.domain.aggregate`). If a handler crashes or an applier raises, the command gets a
:class:`Failed` outcome and the state is rebuilt to what it was before that command by replaying
the events accepted earlier in the same call onto a fresh copy (rare, so cheap on average).
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, TypeAlias, TypeVar

import attrs

from cqrs.domain.aggregate import Aggregate
from cqrs.domain.deadlines import Cancel, DeadlineChange, Schedule, resolve_deadlines
from cqrs.domain.handler import CommandContext, HandlerRoute
from cqrs.domain.messages import is_event, type_name
from cqrs.domain.model import AggregateEntry
from cqrs.errors import NotAMessageError, Rejected, ReplayError
from cqrs.native import builder, native

__all__ = [
    "EVENT_ID_NAMESPACE",
    "Accepted",
    "CommandInput",
    "Decision",
    "Failed",
    "NewEvent",
    "Outcome",
    "RejectedOutcome",
    "decide",
    "event_id_for",
    "replay",
]

A = TypeVar("A", bound=Aggregate)

EVENT_ID_NAMESPACE: Final = uuid.UUID("6f1c2a4e-0d8b-5c3a-9e57-c0a7e5d1b2f4")

CODE_WRONG_VERSION: Final = "wrong_expected_version"
CODE_DELETED: Final = "aggregate_deleted"


@attrs.frozen(slots=True)
class CommandInput:
    """One command to decide, in processing order (for Spark: sorted by partition, offset)."""

    command_id: str
    command: Any
    expected_version: int | None
    timestamp: _dt.datetime  # from the command envelope; becomes the events' timestamp
    correlation_id: str | None = None  # None: the command id


@attrs.frozen(slots=True)
class NewEvent:
    """An event produced by a command, with its position in the aggregate's stream."""

    event_id: str
    aggregate_id: str
    aggregate_type: str
    version: int
    type_name: str
    event: Any
    timestamp: _dt.datetime
    causation_id: str
    correlation_id: str


@attrs.frozen(slots=True)
class Accepted:
    """The command ran; ``version`` is the aggregate version after its last event;
    ``deadlines``: what it scheduled and cancelled (see :mod:`cqrs.domain.deadlines`)."""

    command_id: str
    version: int
    events: tuple[NewEvent, ...]
    deadlines: tuple[DeadlineChange, ...] = ()


@attrs.frozen(slots=True)
class RejectedOutcome:
    """The command was refused (business rule, wrong expected version, deleted aggregate)."""

    command_id: str
    reason: str
    code: str
    current_version: int


@attrs.frozen(slots=True)
class Failed:
    """The handler or an applier crashed (or returned a non-event); the state is untouched.
    ``error_types`` names the exception's class and its bases (most specific first), so a
    declared transient error matches its subclasses too."""

    command_id: str
    error_type: str
    message: str
    current_version: int
    error_types: tuple[str, ...] = attrs.field(default=(), eq=False)  # not part of the outcome


Outcome: TypeAlias = Accepted | RejectedOutcome | Failed


@attrs.frozen(slots=True)
class Decision:
    """Result of :func:`decide`: the state and version to keep, and one outcome per command."""

    state: Any
    version: int
    outcomes: tuple[Outcome, ...]


# the decision's objects made with every field given (see cqrs.native.builder): several per command
_make_event: Final = builder(NewEvent)
_make_accepted: Final = builder(Accepted)
_make_decision: Final = builder(Decision)
_NAMESPACE_BYTES: Final = EVENT_ID_NAMESPACE.bytes
# RFC 4122 variant: the top two bits of the 17th hex digit are 10, whatever the hash gave
_VARIANT_DIGIT: Final = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def event_id_for(aggregate_type: str, aggregate_id: str, version: int) -> str:
    """Deterministic event id of the event at ``version`` of one aggregate.

    Exactly ``str(uuid.uuid5(EVENT_ID_NAMESPACE, f"{aggregate_type}/{aggregate_id}/{version}"))``,
    written out because it runs once per event: the SHA-1 hex digest with the version digit set
    to 5 and the variant bits to 10, formatted 8-4-4-4-12, without building a ``UUID``.
    """
    name = f"{aggregate_type}/{aggregate_id}/{version}".encode()  # as uuid5: UTF-8, strict
    h = hashlib.sha1(_NAMESPACE_BYTES + name, usedforsecurity=False).hexdigest()
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{_VARIANT_DIGIT[h[16]]}{h[17:20]}-{h[20:32]}"


python_event_id_for: Final = event_id_for  # the Python one (the tests compare the two)
if native is not None:  # the same ids, ~10x quicker (~0.1 us; a command's event costs one)
    event_id_for = functools.partial(native.event_id, _NAMESPACE_BYTES)  # type: ignore[assignment]


# per (aggregate class, event class): terminal?, its applier, its type name (classes do not
# change once the model is built; a missing applier raises and is not kept)
_EVENT_PLANS: dict[tuple[type, type], tuple[bool, Any, str]] = {}


def _event_plan(cls: Any, ev_cls: type) -> tuple[bool, Any, str]:
    if cls._cqrs_is_terminal(ev_cls):
        plan = (True, cls._cqrs_applier_or_none(ev_cls), type_name(ev_cls))
    else:
        plan = (False, cls._cqrs_applier(ev_cls), type_name(ev_cls))
    _EVENT_PLANS[(cls, ev_cls)] = plan
    return plan


def _failed(command_id: str, exc: BaseException, version: int) -> Failed:
    return Failed(command_id, type(exc).__qualname__, str(exc), version,
                  tuple(c.__qualname__ for c in type(exc).__mro__[:-1]))


# event classes seen so far (a class is an event class for good): a set lookup per event
# instead of is_event's class-dict read
_EVENT_CLASSES: set[type] = set()


_NO_DEADLINES: tuple[Any, ...] = ()


def _events_of(result: object, route: HandlerRoute) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The events a handler returned, and its ``Schedule`` / ``Cancel`` items (``route``: the
    handler's, named in the error when it returned something else)."""
    if result is None:
        return (), _NO_DEADLINES
    if type(result) is list:  # the common case: a list of events of known classes
        if len(result) == 1:  # (one: no generator for all())
            if type(result[0]) in _EVENT_CLASSES:
                return (result[0],), _NO_DEADLINES
        elif all(type(ev) in _EVENT_CLASSES for ev in result):
            return tuple(result), _NO_DEADLINES
    if is_event(result):
        _EVENT_CLASSES.add(type(result))
        return (result,), _NO_DEADLINES
    if isinstance(result, (Schedule, Cancel)):
        return (), (result,)
    if isinstance(result, (str, bytes)) or not isinstance(result, Iterable):
        raise NotAMessageError(
            f"handler {route.qualname} returned {result!r}: return an @event instance, a list of "
            "them (with Schedule / Cancel items for deadlines), or None"
        )
    events: list[Any] = []
    deadlines: list[Any] = []
    for ev in result:
        if is_event(ev):
            _EVENT_CLASSES.add(type(ev))
            events.append(ev)
        elif isinstance(ev, (Schedule, Cancel)):
            deadlines.append(ev)
        else:
            raise NotAMessageError(
                f"handler {route.qualname} returned {ev!r} ({type(ev).__qualname__}) among its "
                "events: return only @event instances and Schedule / Cancel items"
            )
    return tuple(events), tuple(deadlines)


def decide(
    entry: AggregateEntry,
    aggregate_id: str,
    state: Any,
    version: int,
    commands: Iterable[CommandInput],
    router: Callable[[Any], object] | None = None,
) -> Decision:
    """Decide an ordered batch of commands for one aggregate (see the module doc). ``router``
    (the app model's ``route``) checks that each command a handler schedules has a handler: a
    deadline that could never be decided fails the command that scheduled it, at once."""
    cls = entry.aggregate_class
    routes = entry.routes
    agg_type = entry.type_name
    copier = cls._cqrs_copier()
    deleted = state is None and version > 0
    working = None if state is None else copier(state)
    applied: list[Any] = []  # event objects accepted in this call, for rollback
    outcomes: list[Outcome] = []
    for ci in commands:
        cid = ci.command_id
        if deleted:
            outcomes.append(
                RejectedOutcome(
                    cid,
                    f"aggregate {agg_type} {aggregate_id!r} was deleted at version {version}",
                    CODE_DELETED,
                    version,
                )
            )
            continue
        expected = ci.expected_version
        if expected is not None and expected != version:
            outcomes.append(
                RejectedOutcome(
                    cid,
                    f"expected version {expected} but aggregate {agg_type} {aggregate_id!r} "
                    f"is at version {version}",
                    CODE_WRONG_VERSION,
                    version,
                )
            )
            continue
        route = routes.get(type(ci.command))
        if route is None:
            outcomes.append(
                Failed(
                    cid,
                    "MissingHandlerError",
                    f"aggregate {agg_type} has no handler for command {ci.command!r}",
                    version,
                )
            )
            continue
        current = working if working is not None else cls()
        correlation = ci.correlation_id or cid
        try:
            if route.wants_context:
                ctx = CommandContext(aggregate_id, version, cid, ci.timestamp, correlation)
                result = route.function(route.handler, current, ci.command, ctx)
            else:
                result = route.function(route.handler, current, ci.command)
            events, later = _events_of(result, route)
            deadlines = resolve_deadlines(
                later, owner=f"{agg_type}:{aggregate_id}", now=ci.timestamp,
                default_target=aggregate_id, correlation_id=correlation, causation_id=cid,
                where=route.qualname) if later else _NO_DEADLINES
            if router is not None:
                for change in deadlines:
                    if change.command is not None:
                        router(change.command)
        except Rejected as rej:
            outcomes.append(RejectedOutcome(cid, rej.reason, rej.code, version))
            continue
        except Exception as exc:  # noqa: BLE001 - a crashing handler is an outcome
            outcomes.append(_failed(cid, exc, version))
            continue
        if not events:
            outcomes.append(Accepted(cid, version, (), deadlines))
            continue
        v = version
        new_events: list[NewEvent] = []
        terminal = False
        try:
            for ev in events:
                ev_cls = type(ev)
                if terminal:
                    raise ReplayError(
                        f"handler {route.qualname} returned {ev!r} after the terminal event: "
                        "the terminal event must be the last one"
                    )
                plan = _EVENT_PLANS.get((cls, ev_cls)) or _event_plan(cls, ev_cls)
                is_last, fn, ev_type = plan
                if is_last:
                    terminal = True
                if fn is not None:
                    returned = fn(current, ev)
                    if returned is not None and isinstance(returned, cls):
                        current = returned
                v += 1
                new_events.append(
                    _make_event(
                        event_id_for(agg_type, aggregate_id, v),
                        aggregate_id,
                        agg_type,
                        v,
                        ev_type,
                        ev,
                        ci.timestamp,
                        cid,
                        correlation,
                    )
                )
        except Exception as exc:  # noqa: BLE001 - a crashing applier is an outcome
            outcomes.append(_failed(cid, exc, version))
            working = _rebuild(cls, state, copier, applied)
            continue
        applied.extend(events)
        version = v
        outcomes.append(_make_accepted(cid, v, tuple(new_events), deadlines))
        if terminal:
            working, deleted = None, True
        else:
            working = current
    return _make_decision(working, version, tuple(outcomes))


def _rebuild(cls: type[A], original: A | None, copier: Any, events: Sequence[Any]) -> A | None:
    if original is None and not events:
        return None
    current = cls() if original is None else copier(original)
    for ev in events:
        fn = cls._cqrs_applier_or_none(type(ev))
        if fn is not None:
            returned = fn(current, ev)
            if returned is not None and isinstance(returned, cls):
                current = returned
    return current


def replay(
    aggregate_cls: type[A],
    events: Iterable[Any],
    state: A | None = None,
    version: int = 0,
) -> tuple[A | None, int]:
    """Fold events (event objects or :class:`NewEvent`) into ``(state, version)``.

    Start from ``(state, version)`` to continue from a snapshot; the input state is not mutated.
    A terminal event yields ``(None, version)``; any event after it is a :class:`ReplayError`.
    """
    deleted = state is None and version > 0
    current: A | None = None if state is None else aggregate_cls._cqrs_copier()(state)
    for item in events:
        ev = item.event if isinstance(item, NewEvent) else item
        ev_cls = type(ev)
        if deleted:
            raise ReplayError(
                f"event {ev!r} follows the terminal event of a {aggregate_cls.__qualname__} at "
                f"version {version}: nothing may follow a deletion"
            )
        if not is_event(ev):
            raise NotAMessageError(f"replay takes @event instances, got {ev!r}")
        if current is None:
            current = aggregate_cls()
        if aggregate_cls._cqrs_is_terminal(ev_cls):
            fn = aggregate_cls._cqrs_applier_or_none(ev_cls)
            deleted = True
        else:
            fn = aggregate_cls._cqrs_applier(ev_cls)
        if fn is not None:
            returned = fn(current, ev)
            if returned is not None and isinstance(returned, aggregate_cls):
                current = returned
        version += 1
        if deleted:
            current = None
    return current, version
