"""``Aggregate``: the base class of event-sourced state, folded from events by appliers.

>>> class Account(Aggregate):
...     balance: int = 0
...     def apply_deposited(self, e: Deposited) -> None:
...         self.balance += e.amount

A subclass is made a mutable attrs class automatically (every field needs a default: a new
aggregate is ``Account()``). Appliers are methods named ``apply_<snake_case_event_name>`` or
decorated with ``@applies(EventClass)``; they are found when the class is created and bound to
event classes when the :class:`~cqrs.domain.model.DomainModel` is built.

Appliers mutate ``self`` in place (or return a new instance). State is copied *shallowly* once
per decision when every field is immutable (numbers, strings, tuples, frozen attrs classes...);
aggregates with mutable nested fields (``list``, ``dict``, mutable attrs classes) are deep-copied.
Pass ``copy="shallow"`` to skip the deep copy when appliers only ever *replace* nested values
(``self.items = [*self.items, x]``) and never mutate them (``self.items.append(x)``).
"""

from __future__ import annotations

import copy as _copy
import datetime as _dt
import decimal
import enum
import inspect
import types
import typing
import uuid
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal, TypeVar

import attrs

from cqrs.domain._names import (
    KIND_ATTR,
    SUBJECT_ATTR,
    TYPE_ATTR,
    VERSION_ATTR,
    check_type_name,
    check_version,
    default_type_name,
    snake_case,
)
from cqrs.domain.messages import events_named, is_event, is_terminal
from cqrs.domain.personal import check_subject
from cqrs.errors import AggregateDefinitionError, MissingApplierError, NotAMessageError

__all__ = ["Aggregate", "CopyMode", "applies", "is_aggregate_class"]

A = TypeVar("A", bound="Aggregate")
F = TypeVar("F", bound=Callable[..., Any])
CopyMode = Literal["auto", "shallow", "deep"]
Applier = Callable[[Any, Any], Any]

_APPLIES_ATTR = "__cqrs_applies__"
_IMMUTABLE_ATOMS: tuple[type, ...] = (
    int, float, complex, str, bytes, bool, type(None),
    _dt.datetime, _dt.date, _dt.time, _dt.timedelta, decimal.Decimal, uuid.UUID,
)  # fmt: skip


def applies(*event_classes: type) -> Callable[[F], F]:
    """Mark a method as the applier of the given event classes (any method name)."""
    for ev in event_classes:
        if not is_event(ev) or not isinstance(ev, type):
            raise NotAMessageError(f"@applies takes @event classes, got {ev!r}")

    def mark(fn: F) -> F:
        setattr(fn, _APPLIES_ATTR, tuple(event_classes))
        return fn

    return mark


def is_aggregate_class(obj: object) -> bool:
    """True for subclasses of :class:`Aggregate` (not the base itself)."""
    return isinstance(obj, type) and issubclass(obj, Aggregate) and obj is not Aggregate


class Aggregate:
    """Base class of aggregates; subclasses become mutable attrs classes with defaults.

    Class keywords: ``name`` (stable type name, default ``module.QualName``), ``version``
    (state schema version, default 1), ``terminal_events`` (event classes that delete the
    aggregate, besides those declared ``@event(terminal=True)``), ``copy`` (see module doc) and
    ``subject`` (the ``str`` field holding the person its ``personal()`` fields are about).
    """

    __cqrs_by_class__: ClassVar[dict[type, Applier]]
    __cqrs_by_name__: ClassVar[dict[str, Applier]]
    __cqrs_terminal_events__: ClassVar[frozenset[type]]
    __cqrs_copy__: ClassVar[CopyMode]

    def __init_subclass__(
        cls,
        *,
        name: str | None = None,
        version: int = 1,
        terminal_events: Iterable[type] = (),
        copy: CopyMode = "auto",
        subject: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if "__attrs_attrs__" in cls.__dict__:
            raise AggregateDefinitionError(
                f"{cls.__qualname__}: do not decorate Aggregate subclasses with attrs, "
                "subclassing Aggregate makes them attrs classes already"
            )
        if copy not in ("auto", "shallow", "deep"):
            raise AggregateDefinitionError(
                f"{cls.__qualname__}: copy={copy!r} is invalid, use 'auto', 'shallow' or 'deep'"
            )
        setattr(cls, TYPE_ATTR, check_type_name(name or default_type_name(cls), cls))
        setattr(cls, VERSION_ATTR, check_version(version, cls))
        setattr(cls, KIND_ATTR, "aggregate")
        if subject is not None:  # else inherited, with the fields
            setattr(cls, SUBJECT_ATTR, check_subject(subject, cls))
        attrs.define(cls, slots=False, eq=True, kw_only=False)  # patches cls in place
        missing = [a.name for a in attrs.fields(cls) if a.default is attrs.NOTHING]
        if missing:
            raise AggregateDefinitionError(
                f"aggregate {cls.__qualname__} fields {missing} have no default: give every "
                "field a default, a new aggregate is created as "
                f"{cls.__name__}() before its first event"
            )
        terminal = frozenset(terminal_events)
        for ev in terminal:
            if not is_event(ev):
                raise NotAMessageError(
                    f"{cls.__qualname__}: terminal_events takes @event classes, got {ev!r}"
                )
        cls.__cqrs_terminal_events__ = terminal
        cls.__cqrs_copy__ = copy
        by_class: dict[type, Applier] = {}
        by_name: dict[str, Applier] = {}
        for klass in reversed(cls.__mro__):
            for attr_name, value in vars(klass).items():
                if not inspect.isfunction(value):
                    continue
                for ev in getattr(value, _APPLIES_ATTR, ()):
                    by_class[ev] = value
                if attr_name.startswith("apply_") and len(attr_name) > 6:
                    by_name[attr_name[6:]] = value
        cls.__cqrs_by_class__ = by_class
        cls.__cqrs_by_name__ = by_name

    # ---- used by the model and the decision function -------------------------------------

    @classmethod
    def _cqrs_applier(cls, event_cls: type) -> Applier:
        fn = cls.__cqrs_by_class__.get(event_cls)
        if fn is None:
            fn = cls.__cqrs_by_name__.get(snake_case(event_cls.__name__))
            if fn is None:
                raise MissingApplierError(
                    f"aggregate {cls.__qualname__} has no applier for event "
                    f"{event_cls.__qualname__}: add a method "
                    f"'apply_{snake_case(event_cls.__name__)}(self, e)' or decorate one with "
                    f"@applies({event_cls.__name__})"
                )
            cls.__cqrs_by_class__[event_cls] = fn
        return fn

    @classmethod
    def _cqrs_applier_or_none(cls, event_cls: type) -> Applier | None:
        fn = cls.__cqrs_by_class__.get(event_cls)
        if fn is None:
            fn = cls.__cqrs_by_name__.get(snake_case(event_cls.__name__))
        return fn

    @classmethod
    def _cqrs_is_terminal(cls, event_cls: type) -> bool:
        return event_cls in cls.__cqrs_terminal_events__ or is_terminal(event_cls)

    @classmethod
    def _cqrs_resolve_appliers(cls) -> list[type]:
        """Bind every applier to its event class; return the event classes (model build)."""
        for attr_name in list(cls.__cqrs_by_name__):
            fn = cls.__cqrs_by_name__[attr_name]
            if any(f is fn for f in cls.__cqrs_by_class__.values()):
                continue
            ev = _annotated_event(cls, fn)
            if ev is not None:
                if snake_case(ev.__name__) != attr_name:
                    raise AggregateDefinitionError(
                        f"{cls.__qualname__}.apply_{attr_name} is annotated with event "
                        f"{ev.__qualname__}: rename it apply_{snake_case(ev.__name__)} or "
                        f"decorate it with @applies({ev.__name__})"
                    )
            else:
                found = events_named(attr_name)
                if len(found) != 1:
                    what = "no @event class" if not found else f"several event classes {found}"
                    raise AggregateDefinitionError(
                        f"{cls.__qualname__}.apply_{attr_name} matches {what}: annotate its "
                        "event parameter (def apply_x(self, e: X)) or use @applies(X)"
                    )
                ev = found[0]
            cls.__cqrs_by_class__[ev] = fn
        return list(dict.fromkeys([*cls.__cqrs_by_class__, *cls.__cqrs_terminal_events__]))

    @classmethod
    def _cqrs_copier(cls: type[A]) -> Callable[[A], A]:
        copier = cls.__dict__.get("__cqrs_copier__")
        if copier is None:
            mode = cls.__cqrs_copy__
            if mode == "auto":
                mode = "shallow" if _all_fields_immutable(cls) else "deep"
            copier = _shallow_copy if mode == "shallow" else _copy.deepcopy
            type.__setattr__(cls, "__cqrs_copier__", copier)
        return copier  # type: ignore[no-any-return]


def _shallow_copy(obj: A) -> A:
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    return new


def _annotated_event(cls: type, fn: Applier) -> type | None:
    params = list(inspect.signature(fn).parameters.values())
    if len(params) < 2:
        raise AggregateDefinitionError(
            f"{cls.__qualname__}.{fn.__name__} must take (self, event)"
        )
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward reference: fall back to the method name
        return None
    hint = hints.get(params[1].name)
    return hint if isinstance(hint, type) and is_event(hint) else None


def _all_fields_immutable(cls: type) -> bool:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        return False
    return all(_immutable(hints.get(a.name, Any), set()) for a in attrs.fields(cls))


def _immutable(hint: Any, seen: set[type]) -> bool:
    origin = typing.get_origin(hint)
    if origin is None:
        if not isinstance(hint, type):
            return False
        if issubclass(hint, _IMMUTABLE_ATOMS) or issubclass(hint, enum.Enum):
            return True
        if attrs.has(hint):
            if hint in seen:
                return True
            params = getattr(hint, "__attrs_attrs__", ())
            if not _is_frozen(hint):
                return False
            seen.add(hint)
            try:
                hints = typing.get_type_hints(hint)
            except Exception:
                return False
            return all(_immutable(hints.get(a.name, Any), seen) for a in params)
        return False
    if origin in (typing.Union, types.UnionType, tuple, frozenset, typing.Literal):
        if origin is typing.Literal:
            return True
        return all(a is Ellipsis or _immutable(a, seen) for a in typing.get_args(hint))
    return False


def _is_frozen(cls: type) -> bool:
    from attr._make import _frozen_setattrs  # no public API tells whether a class is frozen

    return getattr(cls, "__setattr__", None) is _frozen_setattrs
