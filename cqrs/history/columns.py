"""The event log as columns, the pure part: which columns an event type or an aggregate's state
becomes, and history rows, events and states to Arrow record batches and back. No Spark, Kafka
or Cassandra here (pyarrow only, imported when a batch is built): the Spark functions of
:mod:`cqrs.history.frames` and :mod:`cqrs.history.archive` run these in their executors, and the
unit tests run them alone.

Columns:

- the **envelope** (:data:`ENVELOPE_COLUMNS`): aggregate type and id, version, event type (the
  type name of today's class, after upcasting), event id, ``timestamp`` (the domain time) and
  ``recorded_at`` (when Kafka recorded it), command, correlation and causation ids, the type
  name and version the event was written with (``schema_type``, ``schema_version``), and the
  event's place in the events topic (``partition``, ``offset``);
- an event's **fields** as typed columns, from today's class: ``str`` -> string, ``int`` ->
  long (int when declared ``avro.type`` int), ``float`` -> double (float), ``bool``,
  ``bytes`` -> binary, ``datetime`` -> timestamp (UTC), ``date``, ``Decimal`` -> string (the
  exact decimal text, as on the wire), ``UUID`` -> string, an ``Enum`` -> string (the member's
  name), ``Optional[T]`` -> T (null), ``list[T]`` -> array, ``dict[str, T]`` -> map, a nested
  attrs class -> struct. A field named like an envelope column is prefixed (``event_version``
  for an event field ``version``; ``state_`` for a state's).
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from cqrs.codec import types as t
from cqrs.codec.types import Node, fields_of
from cqrs.codec.values import record_to_avro
from cqrs.domain.messages import type_name
from cqrs.errors import CqrsError
from cqrs.history.rows import HistoricState, HistoryEvent, HistoryRow

if TYPE_CHECKING:
    import pyarrow as pa

    from cqrs.app import App

__all__ = [
    "ENVELOPE_COLUMNS",
    "EVENTS_VIEW",
    "RESERVED_COLUMNS",
    "ROW_COLUMNS",
    "STATE_COLUMNS",
    "EventLayout",
    "LogTableError",
    "StateLayout",
    "arrow_type",
    "aware_time",
    "check_range",
    "event_id_sql",
    "event_type_names",
    "type_names",
    "row_schema",
    "rows_from_arrow",
    "rows_to_arrow",
    "view_names",
    "written_type_names",
]

EVENTS_VIEW: Final = "events"
"""The name of the view (and of ``cqrs sql``'s table) of every event's envelope."""

ENVELOPE_COLUMNS: Final = (
    "aggregate_type", "aggregate_id", "version", "event_type", "event_id", "timestamp",
    "recorded_at", "command_id", "correlation_id", "causation_id", "schema_type",
    "schema_version", "partition", "offset",
)
"""The envelope columns of every event row, in order."""

ROW_COLUMNS: Final = (
    "aggregate_type", "aggregate_id", "version", "event_id", "event_type", "timestamp",
    "recorded_at", "command_id", "correlation_id", "causation_id", "payload", "partition",
    "offset",
)
"""A history row's columns (:class:`~cqrs.history.rows.HistoryRow`: the envelope as the events
topic holds it, and the payload bytes as written), the stage before decoding."""

STATE_COLUMNS: Final = (
    "aggregate_type", "aggregate_id", "version", "deleted", "timestamp", "recorded_at",
)
"""The columns of an aggregate's state before its fields (see :class:`StateLayout`)."""

RESERVED_COLUMNS: Final = frozenset({*ENVELOPE_COLUMNS, *STATE_COLUMNS, "payload", "day"})
"""Column names a field cannot take (it is prefixed): the envelope's, the state's, and the
archive's ``payload`` and ``day``."""

_UTC: Final = _dt.timezone.utc
_IDENT: Final = re.compile(r"[^A-Za-z0-9_]")


class LogTableError(CqrsError, ValueError):
    """A request for the log as a table that cannot be answered as asked (an event or aggregate
    type the app does not have, a time without a UTC offset, an empty time range...)."""


# ---- types -------------------------------------------------------------------------------------


def arrow_type(node: Node, where: str = "", _seen: frozenset[type] = frozenset()) -> pa.DataType:
    """The Arrow type of a classified field type (see the module doc); Spark reads it as the
    matching Spark SQL type."""
    import pyarrow as pa

    kind = node.kind
    simple = {
        t.STR: pa.string(), t.BOOL: pa.bool_(), t.BYTES: pa.binary(),
        t.DATETIME: pa.timestamp("us", tz="UTC"), t.DATE: pa.date32(), t.DECIMAL: pa.string(),
        t.UUID: pa.string(), t.ENUM: pa.string(),
    }
    if kind in simple:
        return simple[kind]
    if kind == t.INT:
        return pa.int32() if node.avro_type == "int" else pa.int64()
    if kind == t.FLOAT:
        return pa.float32() if node.avro_type == "float" else pa.float64()
    if kind == t.OPTIONAL:
        return arrow_type(node.inner, where, _seen)  # type: ignore[arg-type]
    if kind == t.LIST:
        return pa.list_(arrow_type(node.inner, where, _seen))  # type: ignore[arg-type]
    if kind == t.MAP:
        return pa.map_(pa.string(), arrow_type(node.inner, where, _seen))  # type: ignore[arg-type]
    if kind == t.RECORD:
        if node.cls in _seen:
            raise LogTableError(
                f"{where or node.cls.__qualname__}: {node.cls.__qualname__} contains itself, which "
                "no table column can hold: leave the event type out (event_types=...)")
        inner = _seen | {node.cls}
        return pa.struct([(f.name, arrow_type(f.node, f"{where}.{f.name}", inner))
                          for f in fields_of(node.cls)])
    raise AssertionError(f"unknown node kind {kind}")  # pragma: no cover


@attrs.frozen
class _Fields:
    """The field columns of one class: (field name, column name, Arrow type) each."""

    names: tuple[str, ...]
    columns: tuple[str, ...]
    types: tuple[Any, ...]

    @classmethod
    def of(cls, klass: type, prefix: str) -> _Fields:
        fields = fields_of(klass)
        where = klass.__qualname__
        columns = tuple(f"{prefix}{f.name}" if f.name in RESERVED_COLUMNS else f.name
                        for f in fields)
        for i, column in enumerate(columns):
            if column in columns[:i]:
                raise LogTableError(
                    f"{where}.{fields[i].name} is named like an envelope column, so its column "
                    f"is {column!r}, which another field of {where} already is: rename one of "
                    "the two fields")
        return cls(tuple(f.name for f in fields), columns,
                   tuple(arrow_type(f.node, f"{where}.{f.name}") for f in fields))

    def struct(self) -> pa.DataType:
        import pyarrow as pa

        return pa.struct(list(zip(self.columns, self.types, strict=True)))

    def arrays(self, objects: Sequence[Any]) -> list[pa.Array]:
        """One array per field of ``objects`` (instances of the class, or ``None``: nulls)."""
        import pyarrow as pa

        records = [None if o is None else record_to_avro(o) for o in objects]
        return [pa.array([None if r is None else r[name] for r in records], type=kind)
                for name, kind in zip(self.names, self.types, strict=True)]

    def struct_array(self, objects: Sequence[Any]) -> pa.Array:
        """One struct per object (null for ``None``)."""
        import pyarrow as pa

        records = [None if o is None else record_to_avro(o) for o in objects]
        renamed = [None if r is None else {c: r[n] for n, c in zip(self.names, self.columns,
                                                                   strict=True)}
                   for r in records]
        return pa.array(renamed, type=self.struct())


# ---- event types and their names ---------------------------------------------------------------


def event_id_sql(aggregate_type: str = "aggregate_type", aggregate_id: str = "aggregate_id",
                 version: str = "version") -> str:
    """Spark SQL for the event id :func:`cqrs.domain.decision.event_id_for` derives from the
    columns named (a uuid5 of ``type/id/version``: SHA-1, version digit 5, variant 10), so that
    a DataFrame derives it in the JVM, and only when a query reads it. A test compares the two."""
    from cqrs.domain.decision import EVENT_ID_NAMESPACE

    h = (f"sha1(concat(X'{EVENT_ID_NAMESPACE.bytes.hex()}', encode(concat_ws('/', "
         f"{aggregate_type}, {aggregate_id}, CAST({version} AS STRING)), 'UTF-8')))")
    # h repeated: Spark computes a common subexpression once
    return (f"concat(substr({h}, 1, 8), '-', substr({h}, 9, 4), '-5', substr({h}, 14, 3), '-', "
            f"lower(hex((CAST(conv(substr({h}, 17, 1), 16, 10) AS INT) & 3) | 8)), "
            f"substr({h}, 18, 3), '-', substr({h}, 21, 12))")


def type_names(events: Sequence[Any]) -> list[str]:
    """The type name of each of ``events`` (:func:`~cqrs.domain.messages.type_name`, asked once
    per class)."""
    known: dict[type, str] = {}
    out = []
    for e in events:
        cls = type(e)
        name = known.get(cls)
        if name is None:
            name = known[cls] = type_name(cls)
        out.append(name)
    return out


def event_type_names(app: App, event_types: Iterable[str | type] | None) -> tuple[str, ...]:
    """The type names of ``event_types`` (classes or type names of the app's events; ``None``:
    every event type of the app), in the order given; :class:`LogTableError` for one the app
    does not have."""
    known = app.model.events
    if event_types is None:
        return tuple(sorted(known))
    if isinstance(event_types, (str, type)):
        event_types = [event_types]
    names: list[str] = []
    for wanted in event_types:
        name = wanted if isinstance(wanted, str) else type_name(wanted)
        if name not in known:
            raise LogTableError(
                f"event type {name!r} is not an event of app {app.name!r} (its events: "
                f"{sorted(known)}): pass one of these")
        if name not in names:
            names.append(name)
    if not names:
        raise LogTableError("event_types is empty: name at least one event type, or pass None "
                            "for every event type of the app")
    return tuple(names)


def written_type_names(app: App, names: Iterable[str]) -> frozenset[str]:
    """The type names events of ``names`` may have been written under: the names themselves and
    those the app's upcasters rename to them (to filter the log before it is decoded)."""
    found = set(names)
    grew = True
    while grew:
        grew = False
        for up in app.upcasters:
            if up.target[0] in found and up.type_name not in found:
                found.add(up.type_name)
                grew = True
    return frozenset(found)


def view_names(names: Iterable[str]) -> dict[str, str]:
    """A view (and struct column) name per event type name: the last part of the name
    (``Deposited`` for ``example.bank.Deposited``) when no other type of ``names`` ends the same
    way (Spark compares names ignoring case) and it is no envelope column or ``events``; else the
    whole name with ``_`` for ``.`` and ``-``."""
    names = list(names)
    short = {n: _IDENT.sub("_", n.rsplit(".", 1)[-1]) for n in names}
    counts: dict[str, int] = {}
    for s in short.values():
        counts[s.lower()] = counts.get(s.lower(), 0) + 1
    taken = {c.lower() for c in (*ENVELOPE_COLUMNS, EVENTS_VIEW, "payload", "day")}
    views = {n: (short[n] if counts[short[n].lower()] == 1 and short[n].lower() not in taken
                 else _IDENT.sub("_", n)) for n in names}
    seen: dict[str, str] = {}
    for name, view in views.items():
        other = seen.setdefault(view.lower(), name)
        if other != name:
            raise LogTableError(
                f"event types {other!r} and {name!r} both make the view and column name {view!r}: "
                "give one of them another type name (@event(name=...) with an upcaster that "
                "renames the old one)")
    return views


# ---- times -------------------------------------------------------------------------------------


def aware_time(at: _dt.datetime | None, what: str) -> _dt.datetime | None:
    """``at`` in UTC; :class:`LogTableError` naming ``what`` for a time without a UTC offset."""
    if at is None:
        return None
    if not isinstance(at, _dt.datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise LogTableError(
            f"{what} {at!r} is not a time with a UTC offset: give a timezone-aware datetime, "
            "e.g. datetime(2026, 3, 1, tzinfo=timezone.utc)")
    return at.astimezone(_UTC)


def check_range(since: _dt.datetime | None, until: _dt.datetime | None) -> None:
    """:class:`LogTableError` unless ``since`` is before ``until`` (when both are given)."""
    if since is not None and until is not None and since >= until:
        raise LogTableError(
            f"since {since.isoformat()} is not before until {until.isoformat()}: the range "
            "holds the events recorded at or after since and before until")


# ---- history rows <-> Arrow ----------------------------------------------------------------------


def row_schema() -> pa.Schema:
    """The Arrow schema of :data:`ROW_COLUMNS`."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([
        ("aggregate_type", pa.string()), ("aggregate_id", pa.string()), ("version", pa.int64()),
        ("event_id", pa.string()), ("event_type", pa.string()), ("timestamp", ts),
        ("recorded_at", ts), ("command_id", pa.string()), ("correlation_id", pa.string()),
        ("causation_id", pa.string()), ("payload", pa.binary()), ("partition", pa.int32()),
        ("offset", pa.int64()),
    ])


def rows_to_arrow(rows: Sequence[HistoryRow]) -> pa.RecordBatch:
    """History rows as a record batch of :data:`ROW_COLUMNS`."""
    import pyarrow as pa

    schema = row_schema()
    columns = [
        [r.aggregate_type for r in rows], [r.aggregate_id for r in rows],
        [r.version for r in rows], [r.event_id for r in rows], [r.event_type for r in rows],
        [r.timestamp_us for r in rows], [r.recorded_ms * 1000 for r in rows],
        [r.command_id for r in rows], [r.correlation_id for r in rows],
        [r.causation_id for r in rows], [r.payload for r in rows], [r.partition for r in rows],
        [r.offset for r in rows],
    ]
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)


def rows_from_arrow(batch: pa.RecordBatch | pa.Table) -> list[HistoryRow]:
    """The history rows of a record batch of :data:`ROW_COLUMNS` (in any order)."""
    import pyarrow as pa

    def ints(name: str) -> list[Any]:
        return batch.column(name).cast(pa.int64()).to_pylist()  # timestamps: microseconds

    c = {n: batch.column(n).to_pylist() for n in ROW_COLUMNS
         if n not in ("timestamp", "recorded_at")}
    recorded = [None if us is None else us // 1000 for us in ints("recorded_at")]
    return [HistoryRow(*values) for values in zip(
        c["aggregate_type"], c["aggregate_id"], c["version"], c["event_id"], c["event_type"],
        ints("timestamp"), recorded, c["command_id"], c["correlation_id"], c["causation_id"],
        c["payload"], c["partition"], c["offset"], strict=True)]


# ---- events and states -> Arrow ------------------------------------------------------------------


def _envelope_fields() -> list[pa.Field]:
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return [
        pa.field("aggregate_type", pa.string()), pa.field("aggregate_id", pa.string()),
        pa.field("version", pa.int64()), pa.field("event_type", pa.string()),
        pa.field("event_id", pa.string()), pa.field("timestamp", ts),
        pa.field("recorded_at", ts), pa.field("command_id", pa.string()),
        pa.field("correlation_id", pa.string()), pa.field("causation_id", pa.string()),
        pa.field("schema_type", pa.string()), pa.field("schema_version", pa.int32()),
        pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
    ]


def _as_array(values: Any, kind: pa.DataType) -> pa.Array:
    import pyarrow as pa

    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values if values.type == kind else values.cast(kind)
    return pa.array(values, type=kind)


class EventLayout:
    """The columns of decoded events of some types of an app: the envelope, then

    - ``flat`` (one type): that type's fields as columns;
    - otherwise one struct column per type, named by :func:`view_names`, holding the event's
      fields on the rows of that type and null on the others.

    ``payload``: also the event's bytes as written (the archive keeps them)."""

    def __init__(self, app: App, names: Sequence[str], *, flat: bool, payload: bool = False) -> None:
        if flat and len(names) != 1:
            raise LogTableError(f"a flat layout takes one event type, not {len(names)}")
        self.names = tuple(names)
        self.flat = flat
        self.payload = payload
        self.columns = view_names(self.names)
        self._fields = {n: _Fields.of(app.model.events[n], "event_") for n in self.names}

    def schema(self) -> pa.Schema:
        import pyarrow as pa

        fields = _envelope_fields()
        if self.payload:
            fields.append(pa.field("payload", pa.binary()))
        if self.flat:
            f = self._fields[self.names[0]]
            fields += [pa.field(c, k) for c, k in zip(f.columns, f.types, strict=True)]
        else:
            fields += [pa.field(self.columns[n], self._fields[n].struct()) for n in self.names]
        return pa.schema(fields)

    def batch(self, events: Sequence[HistoryEvent],
              payloads: Sequence[bytes] | None = None) -> pa.RecordBatch:
        """Events of the layout's types (upcast to today's classes) as one record batch."""
        envelope = {
            "aggregate_type": [e.aggregate_type for e in events],
            "aggregate_id": [e.aggregate_id for e in events],
            "version": [e.version for e in events], "event_id": [e.event_id for e in events],
            "timestamp": [e.timestamp for e in events],
            "recorded_at": [e.recorded_at for e in events],
            "command_id": [e.command_id for e in events],
            "correlation_id": [e.correlation_id for e in events],
            "causation_id": [e.causation_id for e in events],
            "schema_type": [e.schema_type for e in events],
            "schema_version": [e.schema_version for e in events],
            "partition": [e.partition for e in events], "offset": [e.offset for e in events],
        }
        return self.batch_of(envelope, [e.event for e in events], payloads)

    def batch_of(self, envelope: Mapping[str, Any], events: Sequence[Any],
                 payloads: Sequence[bytes] | pa.Array | None = None,
                 types: Sequence[str] | None = None) -> pa.RecordBatch:
        """One record batch of ``events`` (instances of the layout's types, today's classes)
        with ``envelope``: a list or an Arrow array per envelope column but ``event_type``
        (the events' type names: ``types`` when the caller has them)."""
        import pyarrow as pa

        schema = self.schema()
        if types is None:
            types = type_names(events)
        arrays = []
        for f in schema:
            if f.name == "event_type":
                arrays.append(pa.array(types, type=f.type))
            elif f.name in ENVELOPE_COLUMNS:
                arrays.append(_as_array(envelope[f.name], f.type))
        if self.payload:
            arrays.append(_as_array(payloads if payloads is not None else [], pa.binary()))
        if self.flat:
            arrays += self._fields[self.names[0]].arrays(events)
        else:
            for name in self.names:
                arrays.append(self._fields[name].struct_array(
                    [e if kind == name else None for e, kind in zip(events, types, strict=True)]))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


class StateLayout:
    """The columns of an aggregate type's states (:class:`~cqrs.history.rows.HistoricState`):
    :data:`STATE_COLUMNS`, then the aggregate's fields (null when ``deleted``)."""

    def __init__(self, aggregate_class: type) -> None:
        self._fields = _Fields.of(aggregate_class, "state_")

    def schema(self) -> pa.Schema:
        import pyarrow as pa

        ts = pa.timestamp("us", tz="UTC")
        return pa.schema([
            pa.field("aggregate_type", pa.string()), pa.field("aggregate_id", pa.string()),
            pa.field("version", pa.int64()), pa.field("deleted", pa.bool_()),
            pa.field("timestamp", ts), pa.field("recorded_at", ts),
            *(pa.field(c, k) for c, k in zip(self._fields.columns, self._fields.types,
                                             strict=True)),
        ])

    def batch(self, states: Sequence[HistoricState]) -> pa.RecordBatch:
        import pyarrow as pa

        schema = self.schema()
        head = [[s.aggregate_type for s in states], [s.aggregate_id for s in states],
                [s.version for s in states], [s.deleted for s in states],
                [s.timestamp for s in states], [s.recorded_at for s in states]]
        arrays = [pa.array(v, type=f.type) for v, f in zip(head, schema, strict=False)]
        arrays += self._fields.arrays([s.state for s in states])
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
