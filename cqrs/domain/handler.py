"""``CommandHandler[A]``: decisions. One method per command type, found by its type hint.

>>> class AccountHandler(CommandHandler[Account]):
...     def deposit(self, account: Account, cmd: Deposit) -> list[Event]:
...         if cmd.amount <= 0:
...             raise Rejected("amount must be positive", code="invalid_amount")
...         return [Deposited(cmd.amount)]

A handler method takes ``(self, aggregate, command)`` or ``(self, aggregate, command, ctx)``
where ``ctx`` is a :class:`CommandContext` (aggregate id, version, command id, timestamp...).
It returns a list / iterable of events, a single event, or ``None`` (no event). It must be
deterministic: time comes from ``ctx.timestamp``, never from the clock. It must not mutate the
aggregate: state changes only through events and appliers.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import attrs

from cqrs.domain._methods import typed_methods
from cqrs.domain.aggregate import Aggregate, is_aggregate_class
from cqrs.errors import HandlerSignatureError, Rejected

__all__ = ["CommandContext", "CommandHandler", "HandlerRoute", "Rejected"]

A = TypeVar("A", bound=Aggregate)


@attrs.frozen(slots=True)
class CommandContext:
    """What a handler may know besides the state and the command (4th handler argument)."""

    aggregate_id: str
    version: int
    command_id: str
    timestamp: _dt.datetime
    correlation_id: str


@attrs.frozen(slots=True)
class HandlerRoute:
    """One handler method: the command class it handles and how to call it."""

    command_class: type
    handler: CommandHandler[Any]
    method_name: str
    function: Callable[..., Any]
    wants_context: bool
    declared_events: tuple[type, ...] = ()  # event classes named in the return annotation

    @property
    def qualname(self) -> str:
        return f"{type(self.handler).__qualname__}.{self.method_name}"


class CommandHandler(Generic[A]):
    """Base class of command handlers for aggregate ``A`` (write ``CommandHandler[Account]``)."""

    __cqrs_aggregate__: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, CommandHandler):
                (arg,) = typing.get_args(base)
                cls.__cqrs_aggregate__ = arg
                break

    @classmethod
    def aggregate_class(cls) -> type[Aggregate]:
        """The aggregate class ``A`` of ``CommandHandler[A]``."""
        agg = cls.__cqrs_aggregate__
        if isinstance(agg, typing.ForwardRef | str):
            raise HandlerSignatureError(
                f"{cls.__qualname__}: CommandHandler[{agg!r}] uses a forward reference; "
                "write CommandHandler[TheAggregateClass] with the class itself"
            )
        if not is_aggregate_class(agg):
            raise HandlerSignatureError(
                f"{cls.__qualname__} must subclass CommandHandler[SomeAggregate] with an "
                f"Aggregate subclass, got {agg!r}"
            )
        return typing.cast(type[Aggregate], agg)

    def routes(self) -> list[HandlerRoute]:
        """The handler methods of this handler, one per command class (model build)."""
        from cqrs.domain.messages import is_command

        found: list[HandlerRoute] = []
        for klass, name, fn, hints, params in typed_methods(self, CommandHandler):
            cmd_params = [
                i for i, p in enumerate(params) if is_command(hints.get(p.name, object))
            ]
            if not cmd_params:
                continue  # a helper method, not a handler
            if cmd_params != [2] or len(params) not in (3, 4):
                raise HandlerSignatureError(
                    f"{klass.__qualname__}.{name} must be "
                    "def name(self, aggregate, cmd: SomeCommand[, ctx: CommandContext]); "
                    f"got {inspect.signature(fn)}"
                )
            found.append(
                HandlerRoute(
                    command_class=hints[params[2].name],
                    handler=self,
                    method_name=name,
                    function=fn,
                    wants_context=len(params) == 4,
                    declared_events=tuple(_event_classes_in(hints.get("return"))),
                )
            )
        return found


def _event_classes_in(hint: Any) -> list[type]:
    from cqrs.domain.messages import is_event

    if isinstance(hint, type) and is_event(hint):
        return [hint]
    return [ev for arg in typing.get_args(hint) for ev in _event_classes_in(arg)]
