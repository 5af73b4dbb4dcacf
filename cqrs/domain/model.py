"""``DomainModel``: aggregates and handlers checked together and indexed by type name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from cqrs.domain.aggregate import Aggregate, is_aggregate_class
from cqrs.domain.handler import CommandHandler, HandlerRoute
from cqrs.domain.messages import is_command, is_event, type_name
from cqrs.errors import (
    DomainModelError,
    DuplicateHandlerError,
    DuplicateTypeNameError,
    MissingHandlerError,
    NotAMessageError,
    UnregisteredTypeError,
)

__all__ = ["AggregateEntry", "DomainModel"]


@attrs.frozen(slots=True)
class AggregateEntry:
    """One aggregate type of a model: its class, stable name, command routes and events."""

    aggregate_class: type[Aggregate]
    type_name: str
    routes: Mapping[type, HandlerRoute]
    event_classes: tuple[type, ...]


class DomainModel:
    """Validates aggregates, handlers, commands and events once, then answers look-ups.

    ``commands`` / ``events`` list extra classes to check (a listed command without a handler
    is an error) or to register for (de)serialization though no applier names them.
    """

    def __init__(
        self,
        aggregates: Iterable[type[Aggregate]],
        handlers: Iterable[CommandHandler[Any] | type[CommandHandler[Any]]],
        *,
        commands: Iterable[type] = (),
        events: Iterable[type] = (),
    ) -> None:
        aggs = list(aggregates)
        for agg in aggs:
            if not is_aggregate_class(agg):
                raise NotAMessageError(f"aggregates takes Aggregate subclasses, got {agg!r}")
        names: dict[str, type] = {}

        def claim(cls: type) -> None:
            name = type_name(cls)
            other = names.setdefault(name, cls)
            if other is not cls:
                raise DuplicateTypeNameError(
                    f"type name {name!r} is claimed by both {other.__module__}."
                    f"{other.__qualname__} and {cls.__module__}.{cls.__qualname__}: give one "
                    "of them another name, e.g. @event(name='context.NewName')"
                )

        routes: dict[type, list[HandlerRoute]] = {}
        by_agg: dict[type, dict[type, HandlerRoute]] = {a: {} for a in aggs}
        for h in handlers:
            instance = h() if isinstance(h, type) else h
            if not isinstance(instance, CommandHandler):
                raise NotAMessageError(f"handlers takes CommandHandler subclasses, got {h!r}")
            agg = type(instance).aggregate_class()
            if agg not in by_agg:
                raise DomainModelError(
                    f"handler {type(instance).__qualname__} is for aggregate "
                    f"{agg.__qualname__}, which is not in aggregates=[...]: add it"
                )
            for route in instance.routes():
                routes.setdefault(route.command_class, []).append(route)
                by_agg[agg][route.command_class] = route
        for cmd_cls, rs in routes.items():
            if len(rs) > 1:
                raise DuplicateHandlerError(
                    f"command {type_name(cmd_cls)!r} is handled by "
                    f"{', '.join(r.qualname for r in rs)}: keep exactly one handler method"
                )
        for cmd_cls in commands:
            if not is_command(cmd_cls):
                raise NotAMessageError(f"commands takes @command classes, got {cmd_cls!r}")
            if cmd_cls not in routes:
                raise MissingHandlerError(
                    f"command {type_name(cmd_cls)!r} has no handler: add a method "
                    f"'def x(self, aggregate, cmd: {cmd_cls.__name__})' to a CommandHandler"
                )
        entries: dict[str, AggregateEntry] = {}
        event_classes: dict[str, type] = {}
        for agg in aggs:
            claim(agg)
            evs = agg._cqrs_resolve_appliers()
            entries[type_name(agg)] = AggregateEntry(
                aggregate_class=agg,
                type_name=type_name(agg),
                routes=MappingProxyType(by_agg[agg]),
                event_classes=tuple(evs),
            )
            for ev in evs:
                claim(ev)
                event_classes[type_name(ev)] = ev
        for rs in routes.values():
            for ev in rs[0].declared_events:
                claim(ev)
                event_classes[type_name(ev)] = ev
        for ev in events:
            if not is_event(ev):
                raise NotAMessageError(f"events takes @event classes, got {ev!r}")
            claim(ev)
            event_classes[type_name(ev)] = ev
        for cls in routes:
            claim(cls)
        self._entries = entries
        self._by_class = {e.aggregate_class: e for e in entries.values()}
        self._routes = {c: (self._by_class[rs[0].handler.aggregate_class()], rs[0]) for c, rs in routes.items()}
        self.commands: Mapping[str, type] = MappingProxyType({type_name(c): c for c in routes})
        self.events: Mapping[str, type] = MappingProxyType(event_classes)
        self.aggregates: Mapping[str, AggregateEntry] = MappingProxyType(entries)

    def entry(self, aggregate: type[Aggregate] | str) -> AggregateEntry:
        """The entry of an aggregate class or aggregate type name."""
        found = (
            self._entries.get(aggregate)
            if isinstance(aggregate, str)
            else self._by_class.get(aggregate)
        )
        if found is None:
            raise UnregisteredTypeError(
                f"aggregate {aggregate!r} is not in this model (known: "
                f"{sorted(self._entries)}): add it to aggregates=[...]"
            )
        return found

    def route(self, command: object) -> tuple[AggregateEntry, HandlerRoute]:
        """Aggregate entry and handler route of a command (instance, class or type name)."""
        cls = self.commands.get(command) if isinstance(command, str) else None
        if cls is None:
            cls = command if isinstance(command, type) else type(command)
        found = self._routes.get(cls)
        if found is None:
            raise MissingHandlerError(
                f"command {command!r} has no handler in this model (known commands: "
                f"{sorted(self.commands)}): add a handler method for it"
            )
        return found

    def message_classes(self) -> list[type]:
        """Every command, event and aggregate class of the model (what the codec registers)."""
        return [
            *self.commands.values(),
            *self.events.values(),
            *(e.aggregate_class for e in self._entries.values()),
        ]
