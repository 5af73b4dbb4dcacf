"""Declaring read models: :class:`Projection` (one view per aggregate),
:class:`CategoryProjection` (views grouped by a derived key, newest N per group) and
:class:`RekeyedProjection` (views keyed by a value of each event; also a category when it
subclasses both).

Handlers are plain Python: ``on_<anything>(self, view, event, meta)`` where ``event`` is
annotated with the event class (or a union of them) it handles. ``view`` is a dict of the value
columns, mutated in place; return :data:`DELETE` to delete the view. No Spark or Cassandra here.

>>> class Balances(Projection):
...     name = "balances"
...     aggregate = "example.bank.Account"
...     key = "account_id"
...     columns = {"owner": str, "balance": int}
...     defaults = {"balance": 0}
"""

from __future__ import annotations

import datetime as _dt
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Final

from cqrs.domain.messages import is_event, type_name
from projections.errors import ProjectionDefinitionError, UnknownProjectionError, ViewKeyError

__all__ = [
    "COLUMN_TYPES",
    "DELETE",
    "CategoryProjection",
    "Delete",
    "EventMeta",
    "Projection",
    "RekeyedProjection",
    "find_projection",
    "projections_of",
]

COLUMN_TYPES: Final[tuple[type, ...]] = (str, int, float, bool, _dt.datetime, _dt.date, bytes)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")
_COLUMN = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_RESERVED = frozenset({"grp", "sort", "aggregate_id"})


class Delete:
    """Returned by a handler: the view of this aggregate is deleted."""

    _instance: ClassVar[Delete | None] = None

    def __new__(cls) -> Delete:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DELETE"


DELETE: Final = Delete()


class EventMeta:
    """What a handler may know about an event besides its payload."""

    __slots__ = ("_timestamp", "_timestamp_text", "aggregate_id", "aggregate_type",
                 "message_type", "offset", "partition", "version")

    def __init__(self, aggregate_id: str, aggregate_type: str, message_type: str, version: int,
                 timestamp: str | _dt.datetime, partition: int = -1, offset: int = -1) -> None:
        self.aggregate_id = aggregate_id
        self.aggregate_type = aggregate_type
        self.message_type = message_type
        self.version = version
        self.partition = partition
        self.offset = offset
        if isinstance(timestamp, _dt.datetime):
            self._timestamp: _dt.datetime | None = timestamp
            self._timestamp_text = timestamp.isoformat()
        else:
            self._timestamp = None
            self._timestamp_text = timestamp

    @property
    def timestamp(self) -> _dt.datetime:
        """When the command that produced the event was issued (tz-aware; parsed on first use)."""
        if self._timestamp is None:
            self._timestamp = _dt.datetime.fromisoformat(self._timestamp_text)
        return self._timestamp

    def __repr__(self) -> str:
        return (f"EventMeta({self.aggregate_id!r}, {self.message_type!r}, "
                f"version={self.version})")


Handler = Callable[[Any, dict[str, Any], Any, EventMeta], Any]


def _event_classes(hint: Any) -> list[type]:
    origin = typing.get_origin(hint)
    if origin is typing.Union or isinstance(hint, types.UnionType):
        return [c for arg in typing.get_args(hint) for c in _event_classes(arg)]
    return [hint] if isinstance(hint, type) else []


def _handlers_of(cls: type) -> tuple[dict[str, str], frozenset[str]]:
    """``{event type name: method name}`` from the ``on_*`` methods' annotations, and the
    names of the methods that take ``meta``."""
    found: dict[str, str] = {}
    with_meta: set[str] = set()
    for attr in sorted(dir(cls)):
        if not attr.startswith("on_"):
            continue
        fn = getattr(cls, attr)
        if not callable(fn):
            continue
        params = list(inspect.signature(fn).parameters.values())
        if len(params) not in (3, 4):
            raise ProjectionDefinitionError(
                f"{cls.__qualname__}.{attr} must take (self, view, event) or "
                f"(self, view, event, meta); it takes {[p.name for p in params]}"
            )
        try:
            hints = typing.get_type_hints(fn)
        except Exception as exc:  # NameError etc. from unresolvable annotations
            raise ProjectionDefinitionError(
                f"cannot resolve the annotations of {cls.__qualname__}.{attr}: {exc}; import "
                "the event classes at module level"
            ) from exc
        classes = _event_classes(hints.get(params[2].name))
        if not classes or not all(is_event(c) for c in classes):
            raise ProjectionDefinitionError(
                f"{cls.__qualname__}.{attr}: annotate parameter {params[2].name!r} with the "
                "@event class (or union of classes) it handles"
            )
        for c in classes:
            name = type_name(c)
            if name in found:
                raise ProjectionDefinitionError(
                    f"{cls.__qualname__}: event {name!r} is handled by both {found[name]} and {attr}"
                )
            found[name] = attr
        if len(params) == 4:
            with_meta.add(attr)
    return found, frozenset(with_meta)


class Projection:
    """A read model with one view (a row) per aggregate, keyed by the aggregate id.

    Class attributes to declare:

    - ``name``: lower-case identifier, unique in the app (prefixes its tables);
    - ``aggregate``: the Aggregate class (or its type name) whose events are folded;
    - ``key``: name of the key column (holds the aggregate id), default ``"id"``;
    - ``columns``: ``{column: type}``, types among str, int, float, bool, datetime, date, bytes;
    - ``defaults``: initial values of a new view (others start as None);
    - ``personal_columns``: ``{column: subject column}``, the ``str`` columns that hold
      personal data (a copy of an event's ``personal()`` field) and the column (or the key)
      holding their data subject's id, as ``personal()`` and ``subject=`` read on messages.
      The stores write them sealed with the subject's key and the readers open them: once the
      subject is forgotten they read as :data:`~cqrs.domain.FORGOTTEN`
      (see docs/personal-data.md).
    """

    name: ClassVar[str]
    aggregate: ClassVar[Any]
    key: ClassVar[str] = "id"
    columns: ClassVar[Mapping[str, type]] = {}
    defaults: ClassVar[Mapping[str, Any]] = {}
    personal_columns: ClassVar[Mapping[str, str]] = {}  # personal column -> its subject column
    handlers: ClassVar[Mapping[str, str]] = {}  # event type name -> method name (derived)
    takes_meta: ClassVar[frozenset[str]] = frozenset()  # methods with a meta parameter
    aggregate_type: ClassVar[str] = ""  # derived from ``aggregate``

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            return  # an abstract intermediate class
        cls._validate()

    @classmethod
    def _validate(cls) -> None:
        where = cls.__qualname__
        if not isinstance(cls.name, str) or not _NAME.match(cls.name):
            raise ProjectionDefinitionError(
                f"{where}.name = {cls.name!r}: use 1-31 lower-case letters, digits or '_', "
                "starting with a letter (it is part of table names)"
            )
        agg = getattr(cls, "aggregate", None)
        if agg is None:
            raise ProjectionDefinitionError(f"{where}: declare `aggregate = <Aggregate class>`")
        cls.aggregate_type = agg if isinstance(agg, str) else type_name(agg)
        names = [cls.key, *cls.columns]
        for col in names:
            if not isinstance(col, str) or not _COLUMN.match(col) or col in _RESERVED:
                raise ProjectionDefinitionError(
                    f"{where}: column name {col!r} is invalid: use lower-case letters, digits, "
                    f"'_', starting with a letter, and none of {sorted(_RESERVED)}"
                )
        if len(set(names)) != len(names):
            raise ProjectionDefinitionError(f"{where}: the key and column names repeat: {names}")
        for col, kind in cls.columns.items():
            if kind not in COLUMN_TYPES:
                raise ProjectionDefinitionError(
                    f"{where}.columns[{col!r}] = {kind!r}: use one of "
                    f"{[t.__name__ for t in COLUMN_TYPES]}"
                )
        unknown = set(cls.defaults) - set(cls.columns)
        if unknown:
            raise ProjectionDefinitionError(f"{where}.defaults name unknown columns {sorted(unknown)}")
        cls._validate_personal()
        cls.handlers, cls.takes_meta = _handlers_of(cls)
        if not cls.handlers:
            raise ProjectionDefinitionError(f"{where} has no on_* handler for any event")

    @classmethod
    def _validate_personal(cls) -> None:
        where = f"{cls.__qualname__}.personal_columns"
        declared = cls.personal_columns
        if not isinstance(declared, Mapping):
            raise ProjectionDefinitionError(
                f"{where} = {declared!r}: give a dict {{personal column: column holding its "
                "data subject's id}}, e.g. {'customer_name': 'customer_id'}")
        for col, subject in declared.items():
            if col not in cls.columns:
                raise ProjectionDefinitionError(
                    f"{where} names {col!r}, which is not one of the columns "
                    f"{sorted(cls.columns)}: declare it in `columns` first (as str)")
            if cls.columns[col] is not str:
                raise ProjectionDefinitionError(
                    f"{where}: column {col!r} is {cls.columns[col].__name__}; personal columns "
                    "are str (they are stored as encrypted text): make it a str column")
            if subject != cls.key and subject not in cls.columns:
                raise ProjectionDefinitionError(
                    f"{where}[{col!r}] = {subject!r}: name the column holding the data "
                    f"subject's id (the key {cls.key!r} or one of {sorted(cls.columns)}), as "
                    "subject= names a field on a message")
            if subject != cls.key and cls.columns[subject] is not str:
                raise ProjectionDefinitionError(
                    f"{where}[{col!r}] = {subject!r}: the subject column is "
                    f"{cls.columns[subject].__name__}; it must be a str column (the person's id)")
            if subject in declared:
                raise ProjectionDefinitionError(
                    f"{where}: {subject!r} is both a personal column and the data subject of "
                    f"{col!r}; the subject's id stays readable (it finds the key): name an id "
                    "column that is not personal")
            for role in ("group_by", "order_by"):
                if getattr(cls, role, None) == col:
                    raise ProjectionDefinitionError(
                        f"{where}: {col!r} is the {role} column of the category; groups and "
                        "their order are stored in clear (they are the table's keys): group "
                        "and order by an id or a date, not personal data")

    @classmethod
    def new_view(cls) -> dict[str, Any]:
        """The values of a view before its first event."""
        return {c: cls.defaults.get(c) for c in cls.columns}

    def handler_for(self, message_type: str) -> Callable[[dict[str, Any], Any, EventMeta], Any] | None:
        """The handler of an event type as ``f(view, event, meta)``, or None if ignored."""
        try:  # once per event folded: one attribute and one dict read when known
            return self.__dict__["_bound"][message_type]  # type: ignore[no-any-return]
        except KeyError:
            pass
        cache = self.__dict__.setdefault("_bound", {})
        method = self.handlers.get(message_type)
        fn = getattr(self, method) if method is not None else None
        if fn is not None and method not in self.takes_meta:
            fn = (lambda f: lambda view, event, meta: f(view, event))(fn)
        cache[message_type] = fn
        return fn


class CategoryProjection(Projection):
    """Views grouped by a derived key, e.g. a customer's orders, newest first.

    Besides the per-aggregate view (queried by aggregate id like any projection), every view
    whose ``group_by`` column is set appears in its group, ordered by ``order_by`` descending;
    a group keeps its newest ``keep`` items (older ones are trimmed from the group).

    An item whose ``group_by`` value changes moves to the new group; one whose group becomes
    None leaves the category. The place it left stays in the old group's newest ``keep`` as a
    deleted row, as a deleted view's item does: so the trimmed groups are the same however the
    log is split into batches (a rebuild equals the live tables). The ``order_by`` value is
    fixed once set (until the view is deleted): a handler changing it fails.

    Subclass :class:`RekeyedProjection` too for items keyed by a value of the events (one item
    per loan of many books' events, grouped by member): ``key_of`` gives the item, ``group_by``
    its group.
    """

    group_by: ClassVar[str]
    order_by: ClassVar[str]
    keep: ClassVar[int] = 30

    @classmethod
    def _validate(cls) -> None:
        super()._validate()
        where = cls.__qualname__
        for attr in ("group_by", "order_by"):
            col = getattr(cls, attr, None)
            if col not in cls.columns:
                raise ProjectionDefinitionError(
                    f"{where}.{attr} = {col!r}: name one of the columns {sorted(cls.columns)}"
                )
        if cls.columns[cls.group_by] is not str:
            raise ProjectionDefinitionError(
                f"{where}.group_by column {cls.group_by!r} is "
                f"{getattr(cls.columns[cls.group_by], '__name__', cls.columns[cls.group_by])}; a "
                "group is named by a str column: store the value's text (a date's isoformat())")
        if not isinstance(cls.keep, int) or cls.keep < 1:
            raise ProjectionDefinitionError(f"{where}.keep = {cls.keep!r}: use a positive int")


class RekeyedProjection(Projection):
    """A read model keyed by a value derived from each event, not by the aggregate id: e.g.
    loyalty points per customer, folded from the purchases recorded by many store aggregates.

    Declare it like a :class:`Projection` (``aggregate`` names the *source* aggregate whose
    events are folded; ``key`` names the key column) and add ``key_of(self, event, meta)``
    returning the view key of an event, or None to ignore the event.

    Each view remembers, per source aggregate, the last version it applied, so every
    ``(source aggregate, version)`` is applied to a view at most once: replays change nothing.
    Events of one source aggregate arrive in version order; across source aggregates there is
    no order, so handlers must not depend on it (sums, counts, max/min are fine; "the last
    event wins" is not). A view's ``version`` counts the events applied to it.

    Subclass :class:`CategoryProjection` as well (``class LoansByMember(RekeyedProjection,
    CategoryProjection)``) to group the views: each view is an item of the group its
    ``group_by`` column names, and moves when that changes. Its group and order values must
    then be set by the events of one source aggregate (e.g. a loan's events all come from its
    book): a move depends on the order of the events, which is only kept per source.
    """

    def key_of(self, event: Any, meta: EventMeta) -> str | None:
        raise NotImplementedError

    @classmethod
    def _validate(cls) -> None:
        super()._validate()
        if cls.key_of is RekeyedProjection.key_of:
            raise ProjectionDefinitionError(
                f"{cls.__qualname__}: define `def key_of(self, event, meta) -> str | None` "
                "returning the view key of an event (None: the event is ignored)"
            )
        if isinstance(cls.__dict__.get("key_of"), (staticmethod, classmethod)):
            raise ProjectionDefinitionError(
                f"{cls.__qualname__}.key_of must be a plain method (self, event, meta)")

    def view_key(self, event: Any, meta: EventMeta) -> str | None:
        """``key_of``, checked: a view key is a non-empty str (or None).

        Raises :class:`~projections.errors.ViewKeyError` when ``key_of`` fails or returns
        something else."""
        where = f"{type(self).__qualname__}.key_of"
        try:
            key = self.key_of(event, meta)
        except Exception as exc:
            raise ViewKeyError(
                f"{where} raised {type(exc).__name__}: {exc} for {meta!r} of aggregate "
                f"{meta.aggregate_id!r}; fix key_of and restart the projector (the batch is "
                "retried from its checkpoint)"
            ) from exc
        if key is not None and (not isinstance(key, str) or not key):
            raise ViewKeyError(
                f"{where} returned {key!r} for {meta!r} of aggregate {meta.aggregate_id!r}; "
                "return a non-empty str, or None to ignore the event"
            )
        return key


def projections_of(app: Any) -> dict[str, Projection]:
    """The app's projections as instances by name (classes are instantiated)."""
    found: dict[str, Projection] = {}
    for p in getattr(app, "projections", ()):
        inst = p() if isinstance(p, type) else p
        if not isinstance(inst, Projection):
            raise ProjectionDefinitionError(
                f"app {app.name!r} lists {p!r} as a projection: subclass projections.Projection"
            )
        if inst.name in found:
            raise ProjectionDefinitionError(f"app {app.name!r} has two projections named {inst.name!r}")
        found[inst.name] = inst
    return found


def find_projection(app: Any, name: str) -> Projection:
    found = projections_of(app)
    if name not in found:
        raise UnknownProjectionError(
            f"app {app.name!r} has no projection {name!r}; it has {sorted(found) or 'none'}"
        )
    return found[name]


def select(app: Any, names: Iterable[str]) -> list[Projection]:
    """The named projections of the app, or all of them when ``names`` is empty."""
    wanted = list(names)
    if not wanted:
        return list(projections_of(app).values())
    return [find_projection(app, n) for n in wanted]


__all__ += ["select"]
