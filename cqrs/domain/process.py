"""``ProcessManager``: rules that span aggregates. Events in, commands out.

>>> class Lending(ProcessManager):
...     completes_on = (BookLent, LoanRefused)
...
...     def requested(self, event: LoanRequested, ctx: ReactionContext) -> Send:
...         return Send(event.member_id, ReserveSlot(loan_id=ctx.aggregate_id))

A reaction is a method taking ``(self, event)`` or ``(self, event, ctx)``, found by the type
hint of its event parameter like a handler's command (an @event class, or a union of them:
``event: BookReturned | BookLost`` reacts to each member); it returns a :class:`Send`, a list of
them, or ``None``. A process manager that keeps state subclasses ``ProcessManager[S]`` and its
reactions take ``(self, state, event[, ctx])`` (``state`` is ``None`` for a new instance) and
return a :class:`Reaction` (new state plus commands) or ``None`` (nothing changes). Instances
are keyed by :meth:`ProcessManager.correlate`, the event's correlation id by default (the
conversation the event belongs to).

Reactions must be deterministic, as handlers are: time comes from ``ctx.timestamp`` (the
event's), and the commands they send get ids derived from the event and their position in the
reaction (:func:`derived_command_id`), so running a reaction twice sends the same commands,
which the processor recognises forever.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import re
import typing
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Final, Generic, TypeVar

import attrs

from cqrs.domain._methods import typed_methods, union_members
from cqrs.domain._names import snake_case
from cqrs.domain.deadlines import Cancel, Schedule
from cqrs.domain.messages import is_command, is_event, type_name
from cqrs.errors import DomainModelError, HandlerSignatureError, NotAMessageError

__all__ = [
    "DERIVED_PREFIX",
    "DerivedId",
    "ProcessManager",
    "Reaction",
    "ReactionContext",
    "ReactionRoute",
    "Send",
    "derived_command_id",
    "parse_derived_id",
    "react",
]

S = TypeVar("S")

_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
DERIVED_PREFIX: Final = "pm:"


@attrs.frozen(slots=True)
class Send:
    """A command a reaction sends to one aggregate (``expected_version`` as in a client send)."""

    aggregate_id: str
    command: Any
    expected_version: int | None = None

    def __attrs_post_init__(self) -> None:
        if not is_command(type(self.command)):
            raise NotAMessageError(
                f"Send(...) takes an @command instance, got {self.command!r}: decorate its "
                "class with @command"
            )
        if not isinstance(self.aggregate_id, str) or not self.aggregate_id:
            raise NotAMessageError(
                f"Send(...) needs the target aggregate id as a non-empty str, got "
                f"{self.aggregate_id!r}"
            )


def _sends(value: Iterable[Send | Schedule | Cancel] | Send | Schedule | Cancel,
           ) -> tuple[Send | Schedule | Cancel, ...]:
    return (value,) if isinstance(value, (Send, Schedule, Cancel)) else tuple(value)


@attrs.frozen(slots=True)
class Reaction(Generic[S]):
    """What a stateful reaction returns: the instance's next state (``None``: the instance is
    finished and forgotten) and the commands to send."""

    state: S | None
    send: tuple[Send | Schedule | Cancel, ...] = attrs.field(default=(), converter=_sends)


@attrs.frozen(slots=True)
class ReactionContext:
    """What a reaction may know besides the event: where and when it happened, and the
    conversation it belongs to."""

    aggregate_type: str
    aggregate_id: str
    version: int
    event_id: str
    timestamp: _dt.datetime  # the event's: becomes the sent commands' timestamp
    correlation_id: str  # the conversation: flows on to the sent commands
    causation_id: str | None = None  # the command that produced the event


@attrs.frozen(slots=True)
class ReactionRoute:
    """One reaction method: the event class it reacts to and how to call it."""

    event_class: type
    method_name: str
    function: Callable[..., Any]
    stateful: bool
    wants_context: bool


class ProcessManager(Generic[S]):
    """Base class of process managers; ``ProcessManager[S]`` for one that keeps state ``S``.

    Class attributes: ``name`` (stable: it is part of the derived command ids and the state
    table's name; default the class name in snake case), ``completes_on`` (event classes that
    end a conversation: a client waiting on the conversation gets that event).
    """

    name: ClassVar[str] = ""
    completes_on: ClassVar[tuple[type, ...]] = ()
    __cqrs_state__: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in vars(cls) or not vars(cls)["name"]:
            cls.name = snake_case(cls.__name__)
        if not isinstance(cls.name, str) or not _NAME.match(cls.name):
            raise DomainModelError(
                f"process manager name {cls.name!r} of {cls.__qualname__} is invalid: use "
                "lower-case letters, digits, '_', '.' and '-' (it names a table and command ids)"
            )
        for base in getattr(cls, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, ProcessManager):
                (arg,) = typing.get_args(base)
                cls.__cqrs_state__ = arg
                break
        for ev in cls.completes_on:
            if not is_event(ev):
                raise NotAMessageError(
                    f"{cls.__qualname__}.completes_on takes @event classes, got {ev!r}"
                )

    @classmethod
    def state_class(cls) -> type | None:
        """``S`` of ``ProcessManager[S]``; ``None`` for a stateless process manager."""
        state = cls.__cqrs_state__
        if state is None:
            return None
        if not isinstance(state, type) or not attrs.has(state):
            raise HandlerSignatureError(
                f"{cls.__qualname__}: ProcessManager[{state!r}] must name an attrs class "
                "(the state of one instance), written as the class itself"
            )
        return state

    def correlate(self, event: Any, ctx: ReactionContext) -> str:
        """The key of the instance ``event`` belongs to (stateful process managers only).
        Default: the conversation (``ctx.correlation_id``)."""
        return ctx.correlation_id

    def routes(self) -> list[ReactionRoute]:
        """The reaction methods of this process manager, one per event class (a method whose
        event parameter is a union has one route per member class)."""
        stateful = self.state_class() is not None
        found: dict[type, ReactionRoute] = {}
        for klass, name, fn, hints, params in typed_methods(self, ProcessManager):
            if name == "correlate":
                continue
            event_params = [i for i, p in enumerate(params)
                            if _names_an_event(hints.get(p.name, object))]
            if not event_params:
                continue  # a helper method
            at = 2 if stateful else 1
            if event_params != [at] or len(params) not in (at + 1, at + 2):
                shape = "self, state, event: SomeEvent" if stateful else "self, event: SomeEvent"
                raise HandlerSignatureError(
                    f"{klass.__qualname__}.{name} must be def name({shape}[, ctx: "
                    f"ReactionContext]); got {inspect.signature(fn)}"
                )
            for ev_cls in _reaction_events(klass, name, params[at].name, hints[params[at].name]):
                if ev_cls in found:
                    raise HandlerSignatureError(
                        f"{klass.__qualname__} reacts to {type_name(ev_cls)!r} in both "
                        f"{found[ev_cls].method_name} and {name}: keep one reaction per event"
                    )
                found[ev_cls] = ReactionRoute(ev_cls, name, fn, stateful, len(params) == at + 2)
        if not found:
            raise HandlerSignatureError(
                f"{type(self).__qualname__} has no reaction: add a method taking an @event "
                "parameter, e.g. def on_x(self, event: SomethingHappened) -> Send"
            )
        return list(found.values())


def _names_an_event(hint: Any) -> bool:
    """The annotation is an @event class or a union with at least one among its members."""
    return is_event(hint) or any(is_event(m) for m in union_members(hint))


def _reaction_events(klass: type, method: str, param: str, hint: Any) -> list[type]:
    """The event classes a reaction's event parameter names: the class itself, or each member
    of a union (``A | B``, ``Union[A, B]``); anything else in a union is refused."""
    members = union_members(hint) or (hint,)
    for member in members:
        if not is_event(member):
            raise HandlerSignatureError(
                f"{klass.__qualname__}.{method}: {param!r} is annotated with {hint!r}, whose "
                f"member {member!r} is not an @event class: a reaction's event parameter takes "
                "@event classes only (one class or a union of them; make a helper method "
                "private, _name, if it is not a reaction)"
            )
    return list(members)


def react(pm: ProcessManager[Any], route: ReactionRoute, state: Any, event: Any,
          ctx: ReactionContext) -> tuple[Any, tuple[Send | Schedule | Cancel, ...]]:
    """Run one reaction: ``(next state, commands and deadlines)``. A stateless reaction keeps ``state`` (None).
    Exceptions from the user's code propagate: the caller decides what a failure means."""
    if route.stateful:
        args = (pm, state, event, ctx) if route.wants_context else (pm, state, event)
        result = route.function(*args)
        if result is None:
            return state, ()
        if not isinstance(result, Reaction):
            raise NotAMessageError(
                f"{type(pm).__qualname__}.{route.method_name} returned {result!r}: a stateful "
                "reaction returns Reaction(state, send=[...]) or None"
            )
        return result.state, result.send
    args = (pm, event, ctx) if route.wants_context else (pm, event)
    result = route.function(*args)
    if result is None:
        return None, ()
    if isinstance(result, (Send, Schedule, Cancel)):
        return None, (result,)
    if isinstance(result, Reaction):
        raise NotAMessageError(
            f"{type(pm).__qualname__}.{route.method_name} returned {result!r}, but "
            f"{type(pm).__qualname__} keeps no state: subclass ProcessManager[S] (S an attrs "
            "class) to return Reaction(state, send=[...]), or return Sends here"
        )
    if isinstance(result, (str, bytes)) or not isinstance(result, Iterable):
        raise NotAMessageError(
            f"{type(pm).__qualname__}.{route.method_name} returned {result!r}: return a "
            "Send, a list of them, or None"
        )
    sends = tuple(result)
    for s in sends:
        if not isinstance(s, (Send, Schedule, Cancel)):
            raise NotAMessageError(
                f"{type(pm).__qualname__}.{route.method_name} returned {s!r} among its "
                "commands: wrap each command in Send(aggregate_id, command) (or Schedule / "
                "Cancel for deadlines)"
            )
    return None, sends


@attrs.frozen(slots=True)
class DerivedId:
    """The parts of a derived command id: which process manager sent it, reacting to which
    event (aggregate type, id and version), as the how-manieth command of the reaction."""

    process_manager: str
    aggregate_type: str
    aggregate_id: str
    version: int
    index: int

    @property
    def stream(self) -> str:
        """What the processor keeps a high-water mark for: one process manager reacting to one
        aggregate's events (they arrive in version order)."""
        return f"{self.process_manager}:{self.aggregate_type}:{self.aggregate_id}"

    @property
    def position(self) -> tuple[int, int]:
        return self.version, self.index


def derived_command_id(process_manager: str, ctx: ReactionContext, index: int) -> str:
    """``pm:<process manager>:<aggregate type>:<version>:<index>:<aggregate id>``: the id of the
    ``index``-th command a reaction to the event at ``ctx`` sends (the event's id is a hash of
    its aggregate type, id and version, so this is the event's identity, readable)."""
    return (f"{DERIVED_PREFIX}{process_manager}:{ctx.aggregate_type}:{ctx.version}:{index}:"
            f"{ctx.aggregate_id}")


def parse_derived_id(command_id: str) -> DerivedId | None:
    """The parts of a derived command id; ``None`` for any other id."""
    if not command_id.startswith(DERIVED_PREFIX):
        return None
    parts = command_id[len(DERIVED_PREFIX):].split(":", 4)
    if len(parts) != 5:
        return None
    pm, agg_type, version, index, agg_id = parts
    if not (version.isdigit() and index.isdigit() and pm and agg_type and agg_id):
        return None
    return DerivedId(pm, agg_type, agg_id, int(version), int(index))
