"""``App``: a named application: its domain model, projections and codec.

>>> bank = App("bank", aggregates=[Account], handlers=[AccountHandler])

Thin on purpose: the command processor, topics and client are wired on top of it elsewhere.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from cqrs.codec.registry import Codec, check_compatibility
from cqrs.codec.schema_store import InMemorySchemaStore, SchemaStore
from cqrs.codec.upcasting import Upcaster
from cqrs.domain.aggregate import Aggregate
from cqrs.domain.handler import CommandHandler
from cqrs.domain.messages import type_name
from cqrs.domain.model import DomainModel
from cqrs.domain.personal import personal_fields
from cqrs.domain.process import ProcessManager
from cqrs.envelope import CommandRecord
from cqrs.errors import DomainModelError, InvalidAppNameError, NotAMessageError
from cqrs.results import FRAMEWORK_CLASSES
from cqrs.retries import RetryPolicy

if TYPE_CHECKING:
    from cqrs.personal.keys import KeyStore

__all__ = ["App"]

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class App:
    """A named set of aggregates, handlers, projections and upcasters.

    ``codec`` encodes and decodes every command, event and aggregate state of the model; it uses
    an in-memory schema store until :meth:`use_schema_store` binds a shared one (e.g. Kafka).
    An app whose classes have ``personal()`` fields also needs the data subjects' keys
    (:meth:`use_key_store`); building the app checks those declarations.
    """

    def __init__(
        self,
        name: str,
        *,
        aggregates: Iterable[type[Aggregate]],
        handlers: Iterable[CommandHandler[Any] | type[CommandHandler[Any]]],
        projections: Iterable[Any] = (),
        upcasters: Iterable[Upcaster] = (),
        events: Iterable[type] = (),
        commands: Iterable[type] = (),
        retries: RetryPolicy | None = None,
        process_managers: Iterable[ProcessManager[Any] | type[ProcessManager[Any]]] = (),
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidAppNameError(
                f"app name {name!r} is invalid: use lower-case letters, digits, '_', '.' and "
                "'-', starting with a letter or digit (it prefixes topic and table names)"
            )
        self.name = name
        self.model = DomainModel(aggregates, handlers, events=events, commands=commands)
        self.projections: tuple[Any, ...] = tuple(projections)
        self.upcasters: tuple[Upcaster, ...] = tuple(upcasters)
        # which handler failures are transient (retried by the retry job), and their backoff
        self.retries: RetryPolicy = retries if retries is not None else RetryPolicy()
        self.process_managers: tuple[ProcessManager[Any], ...] = _process_managers(
            self.model, process_managers)
        self._classes: tuple[type, ...] = (
            *self.model.message_classes(), *FRAMEWORK_CLASSES, CommandRecord,
            *(s for s in (pm.state_class() for pm in self.process_managers) if s is not None))
        # the classes with personal fields (declarations checked here, at build)
        self.personal_classes: tuple[type, ...] = tuple(
            cls for cls in self._classes if personal_fields(cls) is not None)
        # the data subjects' keys every codec_for uses, once use_key_store bound them
        self.key_store: KeyStore | None = None
        self.codec = self.codec_for(InMemorySchemaStore())
        # the module whose top level built this app (through any factory): where its
        # ``module:attribute`` reference is looked for first (see cqrs.loading.app_reference)
        self.defined_in: str | None = _defining_module()

    def codec_for(self, store: SchemaStore, *, key_store: KeyStore | None = None) -> Codec:
        """A codec for this app's classes and upcasters bound to ``store``, with ``key_store``
        (default: the app's, see :meth:`use_key_store`) for the classes with personal fields."""
        return Codec(self._classes, upcasters=self.upcasters, store=store,
                     key_store=key_store if key_store is not None else self.key_store)

    def use_schema_store(self, store: SchemaStore, *, check: bool = True) -> Codec:
        """Bind ``self.codec`` to ``store`` (checking compatibility with it first)."""
        codec = self.codec_for(store)
        if check:
            check_compatibility(store, codec)
        self.codec = codec
        return codec

    def use_key_store(self, key_store: KeyStore) -> Codec:
        """Use ``key_store`` for personal fields, in ``self.codec`` and every later
        :meth:`codec_for` (e.g. ``MemoryKeyStore()`` in tests, ``open_key_store(cfg)`` on the
        stack)."""
        self.key_store = key_store
        self.codec = self.codec_for(self.codec.store)
        return self.codec

    def __repr__(self) -> str:
        return (
            f"App({self.name!r}, aggregates={sorted(self.model.aggregates)}, "
            f"commands={len(self.model.commands)}, events={len(self.model.events)})"
        )


def _defining_module() -> str | None:
    """The name of the module whose top-level code is running (``App(...)`` built there, or in
    a function it called), or ``None`` outside any module's top level."""
    frame = sys._getframe(2)  # noqa: SLF001 - the caller of App.__init__ and up
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            name = frame.f_globals.get("__name__")
            return name if isinstance(name, str) else None
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _process_managers(model: DomainModel,
                      given: Iterable[ProcessManager[Any] | type[ProcessManager[Any]]],
                      ) -> tuple[ProcessManager[Any], ...]:
    """Instances of ``given``, checked against the model: unique names, and every event they
    read and command they may send known to it (commands are checked when sent)."""
    found: dict[str, ProcessManager[Any]] = {}
    for pm in given:
        instance = pm() if isinstance(pm, type) else pm
        if not isinstance(instance, ProcessManager):
            raise NotAMessageError(f"process_managers takes ProcessManager subclasses, got {pm!r}")
        if instance.name in found:
            raise DomainModelError(
                f"two process managers are called {instance.name!r}: give one another "
                "name = '...' (it is part of the command ids they send)")
        for route in instance.routes():
            if type_name(route.event_class) not in model.events:
                raise DomainModelError(
                    f"{type(instance).__qualname__}.{route.method_name} reacts to "
                    f"{type_name(route.event_class)!r}, which no aggregate of the app applies: "
                    "add the aggregate, or list the event in App(events=[...])")
        for ev in instance.completes_on:
            if type_name(ev) not in model.events:
                raise DomainModelError(
                    f"{type(instance).__qualname__}.completes_on names {type_name(ev)!r}, which "
                    "no aggregate of the app applies, so no conversation could end on it: add "
                    "the aggregate, or list the event in App(events=[...])")
        found[instance.name] = instance
    return tuple(found.values())
