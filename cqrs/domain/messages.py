"""``@command`` and ``@event``: plain annotated classes become frozen, named, versioned messages.

>>> @event(name="bank.Deposited", version=2)
... class Deposited:
...     amount: int

The stable *type name* (default ``module.QualName``) identifies the class on the wire, so a
class can move or be renamed in code if it keeps its name. The *version* (default 1) is raised
when the shape changes in a way that needs an upcaster. ``subject`` names the field holding
the person whose ``personal()`` fields the message carries (see :mod:`cqrs.domain.personal`).
"""

from __future__ import annotations

import abc
import enum
import weakref
from typing import Callable, Literal, TypeVar, overload

import attrs

from cqrs.domain._names import (
    KIND_ATTR,
    SUBJECT_ATTR,
    TERMINAL_ATTR,
    TYPE_ATTR,
    VERSION_ATTR,
    check_type_name,
    check_version,
    default_type_name,
    snake_case,
)
from cqrs.domain.personal import check_subject
from cqrs.errors import NotAMessageError

__all__ = [
    "Command",
    "Event",
    "Message",
    "command",
    "event",
    "is_command",
    "is_event",
    "is_terminal",
    "type_name",
    "type_version",
]

C = TypeVar("C", bound=type)
Kind = Literal["command", "event"]

# every decorated event class, to resolve ``apply_<snake_name>`` appliers without annotations
_EVENT_CLASSES: weakref.WeakSet[type] = weakref.WeakSet()


class Message(abc.ABC):  # noqa: B024 - a marker: classes are registered, never subclassed
    """Marker of every ``@command`` / ``@event`` class (``isinstance(x, Message)`` works)."""


class Command(Message):  # noqa: B024
    """Marker of ``@command`` classes: ``isinstance(x, Command)`` is true for them."""


class Event(Message):  # noqa: B024
    """Marker of ``@event`` classes: ``isinstance(x, Event)`` is true for them."""


def _make(cls: C, kind: Kind, name: str | None, version: int, terminal: bool,
          subject: str | None) -> C:
    if not isinstance(cls, type):
        raise NotAMessageError(f"@{kind} decorates classes, got {cls!r}")
    if attrs.has(cls):
        raise NotAMessageError(
            f"{cls.__qualname__} is already an attrs class: remove @attrs.define/@frozen, "
            f"@{kind} makes it a frozen attrs class itself"
        )
    tname = check_type_name(default_type_name(cls) if name is None else name, cls)
    check_version(version, cls)
    subject = check_subject(subject, cls)
    new = attrs.frozen(cls, kw_only=False, slots=True)
    setattr(new, TYPE_ATTR, tname)
    setattr(new, VERSION_ATTR, version)
    setattr(new, KIND_ATTR, kind)
    setattr(new, TERMINAL_ATTR, bool(terminal))
    setattr(new, SUBJECT_ATTR, subject)
    if kind == "event":
        Event.register(new)
        _EVENT_CLASSES.add(new)
    else:
        Command.register(new)
    return new


@overload
def command(cls: C, /) -> C: ...
@overload
def command(
    *, name: str | None = None, version: int = 1, subject: str | None = None
) -> Callable[[C], C]: ...
def command(
    cls: C | None = None, /, *, name: str | None = None, version: int = 1,
    subject: str | None = None,
) -> C | Callable[[C], C]:
    """Make ``cls`` a frozen attrs command class with a stable type name and a version.

    ``subject`` names the ``str`` field holding the person its ``personal()`` fields are about.
    """
    if cls is not None:
        return _make(cls, "command", name, version, False, subject)
    return lambda c: _make(c, "command", name, version, False, subject)


@overload
def event(cls: C, /) -> C: ...
@overload
def event(
    *, name: str | None = None, version: int = 1, terminal: bool = False,
    subject: str | None = None,
) -> Callable[[C], C]: ...
def event(
    cls: C | None = None,
    /,
    *,
    name: str | None = None,
    version: int = 1,
    terminal: bool = False,
    subject: str | None = None,
) -> C | Callable[[C], C]:
    """Make ``cls`` a frozen attrs event class with a stable type name and a version.

    ``terminal=True`` marks a deletion: once applied, the aggregate is gone and every further
    command for it is rejected with code ``"aggregate_deleted"``. ``subject`` names the ``str``
    field holding the person its ``personal()`` fields are about.
    """
    if cls is not None:
        return _make(cls, "event", name, version, terminal, subject)
    return lambda c: _make(c, "event", name, version, terminal, subject)


def _cls(obj: object) -> type:
    return obj if isinstance(obj, type) else type(obj)


def type_name(obj: object) -> str:
    """Stable type name of a message / aggregate class or instance.

    Plain attrs classes (nested values) fall back to ``module.QualName``.
    """
    cls = _cls(obj)
    name = cls.__dict__.get(TYPE_ATTR)
    if isinstance(name, str):
        return name
    if attrs.has(cls) or issubclass(cls, enum.Enum):
        return default_type_name(cls)
    raise NotAMessageError(
        f"{cls.__qualname__} has no stable type name: decorate it with @command or @event, "
        "subclass Aggregate, or make it an attrs class"
    )


def type_version(obj: object) -> int:
    """Class version of a message / aggregate class or instance (1 for plain attrs classes)."""
    cls = _cls(obj)
    version = cls.__dict__.get(VERSION_ATTR)
    if isinstance(version, int):
        return version
    if attrs.has(cls):
        return 1
    raise NotAMessageError(
        f"{cls.__qualname__} has no class version: decorate it with @command or @event"
    )


def is_event(obj: object) -> bool:
    """True for ``@event`` classes and their instances."""
    return _cls(obj).__dict__.get(KIND_ATTR) == "event"


def is_command(obj: object) -> bool:
    """True for ``@command`` classes and their instances."""
    return _cls(obj).__dict__.get(KIND_ATTR) == "command"


def is_terminal(obj: object) -> bool:
    """True for events declared ``@event(terminal=True)``."""
    return bool(_cls(obj).__dict__.get(TERMINAL_ATTR, False))


def events_named(snake_name: str) -> list[type]:
    """Decorated event classes whose class name in snake_case is ``snake_name``."""
    return [c for c in list(_EVENT_CLASSES) if snake_case(c.__name__) == snake_name]
