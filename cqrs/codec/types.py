"""Type hints of attrs classes, classified into the small set of shapes the codec supports.

Supported: ``str``, ``int`` (Avro ``long``, or ``int`` with ``metadata={"avro.type": "int"}``),
``float`` (``double``, or ``float`` via metadata), ``bool``, ``bytes``, ``datetime`` (tz-aware,
``timestamp-micros``), ``date``, ``Decimal`` (exact decimal *string*), ``UUID``, ``Enum``
subclasses, ``Optional[T]`` / ``T | None``, ``list[T]`` / ``tuple[T, ...]`` /
``Sequence[T]``, ``dict[str, T]`` / ``Mapping[str, T]`` and nested attrs classes.
"""

from __future__ import annotations

import collections.abc as cabc
import datetime as _dt
import decimal
import enum
import types
import typing
import uuid
from typing import Any

import attrs

from cqrs.errors import SchemaDerivationError

__all__ = ["FieldInfo", "Node", "fields_of", "node_for"]

# node kinds
STR, INT, FLOAT, BOOL, BYTES = "str", "int", "float", "bool", "bytes"
DATETIME, DATE, DECIMAL, UUID, ENUM = "datetime", "date", "decimal", "uuid", "enum"
OPTIONAL, LIST, MAP, RECORD = "optional", "list", "map", "record"

_ATOMS: dict[type, str] = {
    str: STR, bool: BOOL, int: INT, float: FLOAT, bytes: BYTES,
    _dt.datetime: DATETIME, _dt.date: DATE, decimal.Decimal: DECIMAL, uuid.UUID: UUID,
}  # fmt: skip


@attrs.frozen(slots=True)
class Node:
    """One classified type: ``kind`` plus what it needs (inner node, class, Avro width)."""

    kind: str
    cls: Any = None  # enum / record class, or the container type (list / tuple) for LIST
    inner: Node | None = None
    avro_type: str | None = None  # "int" / "float" narrowing for INT / FLOAT


@attrs.frozen(slots=True)
class FieldInfo:
    """One attrs field: its name, ``__init__`` argument name, node and default."""

    name: str
    init_name: str
    node: Node
    default: Any  # attrs.NOTHING when required; a Factory is called once


def node_for(hint: Any, where: str, metadata: typing.Mapping[str, Any] | None = None) -> Node:
    """Classify a type hint; ``where`` names the field for error messages."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        return node_for(args[0], where, metadata)
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1 and len(args) == 2:
            return Node(OPTIONAL, inner=node_for(non_null[0], where, metadata))
        raise SchemaDerivationError(
            f"{where}: union {hint!r} is not supported; only Optional[T] (T | None) is. "
            "Use one type per field, or separate event classes"
        )
    if origin in (list, tuple, cabc.Sequence, typing.Sequence):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise SchemaDerivationError(
                f"{where}: {hint!r} is not supported; use tuple[T, ...] or list[T]"
            )
        if not args:
            raise SchemaDerivationError(f"{where}: give the item type, e.g. list[int]")
        container = tuple if origin is tuple else list
        return Node(LIST, cls=container, inner=node_for(args[0], f"{where}[]"))
    if origin in (dict, cabc.Mapping, typing.Mapping):
        if len(args) != 2 or args[0] is not str:
            raise SchemaDerivationError(
                f"{where}: {hint!r} is not supported; Avro maps need str keys: dict[str, T]"
            )
        return Node(MAP, inner=node_for(args[1], f"{where}{{}}"))
    if origin is not None or not isinstance(hint, type):
        raise SchemaDerivationError(
            f"{where}: type {hint!r} is not supported by the Avro codec; use str, int, float, "
            "bool, bytes, datetime, date, Decimal, UUID, an Enum, Optional/list/dict of "
            "those, or an attrs class"
        )
    if issubclass(hint, enum.Enum):
        return Node(ENUM, cls=hint)
    if attrs.has(hint):
        return Node(RECORD, cls=hint)
    kind = _ATOMS.get(hint)
    if kind is None:
        for base, k in _ATOMS.items():
            if issubclass(hint, base):
                kind = k
                break
    if kind is None:
        raise SchemaDerivationError(
            f"{where}: type {hint.__qualname__} is not supported by the Avro codec; make it an "
            "attrs class or use a supported type (str, int, float, bool, bytes, datetime, date, "
            "Decimal, UUID, Enum)"
        )
    narrow = (metadata or {}).get("avro.type")
    if narrow is not None:
        if (kind, narrow) not in ((INT, "int"), (INT, "long"), (FLOAT, "float"), (FLOAT, "double")):
            raise SchemaDerivationError(
                f"{where}: metadata avro.type={narrow!r} does not fit {hint.__qualname__}; use "
                "'int'/'long' for int fields and 'float'/'double' for float fields"
            )
        return Node(kind, avro_type=narrow)
    return Node(kind)


_FIELDS_CACHE: dict[type, tuple[FieldInfo, ...]] = {}


def fields_of(cls: type) -> tuple[FieldInfo, ...]:
    """The classified fields of an attrs class (cached)."""
    found = _FIELDS_CACHE.get(cls)
    if found is not None:
        return found
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        raise SchemaDerivationError(
            f"type hints of {cls.__module__}.{cls.__qualname__} cannot be resolved ({exc}): "
            "define the class and the types it uses at module level"
        ) from exc
    out: list[FieldInfo] = []
    for a in attrs.fields(cls):
        if not a.init:
            continue
        if not a.name.isascii() or not a.name.isidentifier():
            raise SchemaDerivationError(
                f"field {cls.__qualname__}.{a.name} is not a valid Avro field name: use ASCII"
            )
        hint = hints.get(a.name, a.type)
        if hint is None:
            raise SchemaDerivationError(
                f"field {cls.__qualname__}.{a.name} has no type hint: annotate it"
            )
        default = a.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = attrs.NOTHING if default.takes_self else default.factory()
        out.append(
            FieldInfo(
                name=a.name,
                init_name=a.alias or a.name,
                node=node_for(hint, f"{cls.__qualname__}.{a.name}", a.metadata),
                default=default,
            )
        )
    result = tuple(out)
    _FIELDS_CACHE[cls] = result
    return result
