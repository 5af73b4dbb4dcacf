"""Avro record schemas derived from attrs classes (commands, events, aggregate states, values).

* The record name is the class's stable type name made into a valid Avro fullname; classes
  with a version (``@command``, ``@event``, aggregates) get ``_v<version>`` appended to the last
  part (``bank.Deposited`` version 2 -> ``bank.Deposited_v2``) so that two versions never share
  a fingerprint. The original name and version are kept in the attributes ``cqrs.type`` and
  ``cqrs.version``.
* Named types (nested records, enums) are defined once per schema and referred to by name after.
* Fields whose class attribute has a default carry it as Avro default (needed for evolution);
  ``Optional`` fields default to null.
* ``Decimal`` is an Avro ``string`` holding the exact decimal text (``"12.50"``): no fixed
  precision or scale to declare, and the exponent survives a round trip.
* ``datetime`` is ``long`` / ``timestamp-micros`` and must be timezone-aware.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from cqrs.codec import types as t
from cqrs.codec.types import Node, fields_of
from cqrs.codec.values import to_avro
from cqrs.domain._names import TYPE_ATTR, VERSION_ATTR
from cqrs.domain.messages import type_name
from cqrs.errors import EncodeError, SchemaDerivationError

__all__ = ["avro_fullname", "canonical_json", "schema_for"]

_PART = re.compile(r"[^A-Za-z0-9_]")


def avro_fullname(name: str, version: int | None = None) -> str:
    """A valid Avro fullname for a stable type name (and version suffix if given)."""
    parts = []
    for part in name.replace("-", ".").split("."):
        part = _PART.sub("_", part) or "_"
        if part[0].isdigit():
            part = "_" + part
        parts.append(part)
    if version is not None:
        parts[-1] = f"{parts[-1]}_v{version}"
    return ".".join(parts)


def canonical_json(schema: Any) -> str:
    """The schema as compact JSON with sorted keys (what the schema store keeps)."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def schema_for(cls: type) -> dict[str, Any]:
    """The Avro record schema of an attrs class (a fresh dict)."""
    if not attrs.has(cls):
        raise SchemaDerivationError(
            f"{cls!r} is not an attrs class: decorate it with @command / @event, subclass "
            "Aggregate, or make it an attrs class"
        )
    return _record(cls, {})


def _versioned(cls: type) -> int | None:
    v = cls.__dict__.get(VERSION_ATTR)
    return v if isinstance(v, int) and cls.__dict__.get(TYPE_ATTR) else None


def _record(cls: type, defined: dict[str, type]) -> Any:
    tname = type_name(cls)
    version = _versioned(cls)
    full = avro_fullname(tname, version)
    if full in defined:
        if defined[full] is not cls:
            raise SchemaDerivationError(
                f"classes {defined[full].__qualname__} and {cls.__qualname__} both map to Avro "
                f"name {full!r}: give one of them another type name"
            )
        return full
    defined[full] = cls
    fields = []
    for f in fields_of(cls):
        field: dict[str, Any] = {"name": f.name, "type": _type(f.node, defined)}
        if f.node.kind == t.OPTIONAL and (f.default is attrs.NOTHING or f.default is None):
            field["default"] = None
        elif f.default is not attrs.NOTHING:
            where = f"default of {cls.__qualname__}.{f.name}"
            try:
                value = to_avro(f.node, f.default, where)
            except EncodeError as exc:
                raise SchemaDerivationError(str(exc)) from exc
            if f.node.kind == t.OPTIONAL:  # non-null default: the value's branch goes first
                field["type"] = [field["type"][1], "null"]
            field["default"] = _json_default(f.node, value)
        fields.append(field)
    schema: dict[str, Any] = {"type": "record", "name": full, "fields": fields, "cqrs.type": tname}
    if version is not None:
        schema["cqrs.version"] = version
    return schema


def _json_default(node: Node, value: Any) -> Any:
    """Avro JSON encoding of a default: bytes become latin-1 strings."""
    kind = node.kind
    if kind == t.OPTIONAL:
        return None if value is None else _json_default(node.inner, value)  # type: ignore[arg-type]
    if kind == t.BYTES:
        return value.decode("latin-1")
    if kind == t.LIST:
        return [_json_default(node.inner, v) for v in value]  # type: ignore[arg-type]
    if kind == t.MAP:
        return {k: _json_default(node.inner, v) for k, v in value.items()}  # type: ignore[arg-type]
    if kind == t.RECORD:
        return {f.name: _json_default(f.node, value[f.name]) for f in fields_of(node.cls)}
    return value


def _type(node: Node, defined: dict[str, type]) -> Any:
    kind = node.kind
    if kind == t.STR:
        return "string"
    if kind == t.INT:
        return node.avro_type or "long"
    if kind == t.FLOAT:
        return node.avro_type or "double"
    if kind == t.BOOL:
        return "boolean"
    if kind == t.BYTES:
        return "bytes"
    if kind == t.DATETIME:
        return {"type": "long", "logicalType": "timestamp-micros"}
    if kind == t.DATE:
        return {"type": "int", "logicalType": "date"}
    if kind == t.DECIMAL:
        return {"type": "string", "cqrs.logicalType": "decimal"}
    if kind == t.UUID:
        return {"type": "string", "logicalType": "uuid"}
    if kind == t.ENUM:
        cls = node.cls
        full = avro_fullname(type_name(cls))
        if full in defined:
            return full
        defined[full] = cls
        symbols = [m.name for m in cls]
        for s in symbols:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s):
                raise SchemaDerivationError(
                    f"enum member {cls.__qualname__}.{s} is not a valid Avro symbol: rename it"
                )
        return {"type": "enum", "name": full, "symbols": symbols, "cqrs.type": type_name(cls)}
    if kind == t.OPTIONAL:
        return ["null", _type(node.inner, defined)]  # type: ignore[arg-type]
    if kind == t.LIST:
        return {"type": "array", "items": _type(node.inner, defined)}  # type: ignore[arg-type]
    if kind == t.MAP:
        return {"type": "map", "values": _type(node.inner, defined)}  # type: ignore[arg-type]
    if kind == t.RECORD:
        return _record(node.cls, defined)
    raise AssertionError(f"unknown node kind {kind}")  # pragma: no cover
