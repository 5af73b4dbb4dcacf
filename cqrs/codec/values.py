"""Python values <-> Avro-ready values, driven by the classified type hints.

``to_avro`` checks every value against its declared type (so encoding errors name the field
and the value) and converts to what fastavro writes. ``from_avro`` builds the current classes
from decoded data; it is tolerant in the way Avro schema resolution is: missing fields take the
class default, unknown fields are ignored, ints are promoted to floats.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import uuid
from collections.abc import Mapping
from typing import Any

import attrs

from cqrs.codec import types as t
from cqrs.codec.types import Node, fields_of
from cqrs.errors import DecodeError, EncodeError, NaiveDatetimeError

__all__ = ["EPOCH", "from_avro", "record_from_avro", "record_to_avro", "to_avro"]

EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_EPOCH_DATE = _dt.date(1970, 1, 1)
_MICRO = _dt.timedelta(microseconds=1)
_LIMITS = {"long": (-(2**63), 2**63 - 1), "int": (-(2**31), 2**31 - 1)}


def _bad(where: str, value: Any, expected: str) -> EncodeError:
    return EncodeError(
        f"{where} = {value!r} ({type(value).__qualname__}) is not of its declared type "
        f"{expected}: pass a value of type {expected}"
    )


def to_avro(node: Node, value: Any, where: str) -> Any:
    """Check ``value`` against ``node`` and convert it for fastavro."""
    kind = node.kind
    if kind == t.STR:
        if isinstance(value, str):
            return value
        raise _bad(where, value, "str")
    if kind == t.INT:
        if isinstance(value, int) and not isinstance(value, bool):
            lo, hi = _LIMITS[node.avro_type or "long"]
            if lo <= value <= hi:
                return value
            raise EncodeError(
                f"{where} = {value} is outside the Avro {node.avro_type or 'long'} range "
                f"[{lo}, {hi}]: store it as a Decimal or str instead"
            )
        raise _bad(where, value, "int")
    if kind == t.FLOAT:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _bad(where, value, "float")
    if kind == t.BOOL:
        if isinstance(value, bool):
            return value
        raise _bad(where, value, "bool")
    if kind == t.BYTES:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise _bad(where, value, "bytes")
    if kind == t.DATETIME:
        if isinstance(value, _dt.datetime):
            if value.tzinfo is None or value.utcoffset() is None:
                raise NaiveDatetimeError(
                    f"{where} = {value!r} is a naive datetime: pass a timezone-aware one, "
                    "e.g. datetime.now(timezone.utc) or dt.replace(tzinfo=timezone.utc)"
                )
            return (value - EPOCH) // _MICRO
        raise _bad(where, value, "datetime")
    if kind == t.DATE:
        if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
            return (value - _EPOCH_DATE).days
        raise _bad(where, value, "date")
    if kind == t.DECIMAL:
        if isinstance(value, decimal.Decimal):
            return str(value)
        raise _bad(where, value, "Decimal")
    if kind == t.UUID:
        if isinstance(value, uuid.UUID):
            return str(value)
        raise _bad(where, value, "UUID")
    if kind == t.ENUM:
        if isinstance(value, node.cls):
            return value.name
        raise _bad(where, value, node.cls.__qualname__)
    if kind == t.OPTIONAL:
        return None if value is None else to_avro(node.inner, value, where)  # type: ignore[arg-type]
    if kind == t.LIST:
        if isinstance(value, (list, tuple)):
            return [to_avro(node.inner, v, f"{where}[{i}]") for i, v in enumerate(value)]  # type: ignore[arg-type]
        raise _bad(where, value, "list")
    if kind == t.MAP:
        if isinstance(value, Mapping):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise _bad(f"{where} key", k, "str")
                out[k] = to_avro(node.inner, v, f"{where}[{k!r}]")  # type: ignore[arg-type]
            return out
        raise _bad(where, value, "dict")
    if kind == t.RECORD:
        if isinstance(value, node.cls):
            return record_to_avro(value, where)
        raise _bad(where, value, node.cls.__qualname__)
    raise AssertionError(f"unknown node kind {kind}")  # pragma: no cover


_PATHS: dict[type, list[tuple[str, Node, str]]] = {}


def record_to_avro(obj: Any, where: str | None = None) -> dict[str, Any]:
    """An attrs instance as an Avro record dict (every field checked)."""
    cls = type(obj)
    if where is None:  # the hot path: field paths (used in error messages) computed once
        paths = _PATHS.get(cls)
        if paths is None:
            paths = _PATHS[cls] = [(f.name, f.node, f"{cls.__qualname__}.{f.name}")
                                   for f in fields_of(cls)]
    else:
        paths = [(f.name, f.node, f"{where}.{f.name}") for f in fields_of(cls)]
    return {name: to_avro(node, getattr(obj, name), path) for name, node, path in paths}


def _undecodable(where: str, value: Any, expected: str) -> DecodeError:
    return DecodeError(
        f"{where}: stored value {value!r} cannot be read as {expected}; the stored schema is "
        "incompatible with the current class: add a default or register an upcaster"
    )


def from_avro(node: Node, value: Any, where: str) -> Any:
    """Build the Python value of ``node`` from decoded Avro data."""
    kind = node.kind
    if kind == t.OPTIONAL:
        return None if value is None else from_avro(node.inner, value, where)  # type: ignore[arg-type]
    if value is None:
        raise _undecodable(where, value, kind)
    if kind == t.STR:
        return value.decode() if isinstance(value, bytes) else value
    if kind == t.INT:
        if isinstance(value, int):
            return value
        raise _undecodable(where, value, "int")
    if kind == t.FLOAT:
        return float(value)
    if kind == t.BOOL or kind == t.BYTES:
        return value.encode() if kind == t.BYTES and isinstance(value, str) else value
    if kind == t.DATETIME:
        if isinstance(value, _dt.datetime):
            return value if value.tzinfo else value.replace(tzinfo=_dt.timezone.utc)
        return EPOCH + value * _MICRO
    if kind == t.DATE:
        return value if isinstance(value, _dt.date) else _EPOCH_DATE + _dt.timedelta(days=value)
    if kind == t.DECIMAL:
        return decimal.Decimal(value)
    if kind == t.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(value)
    if kind == t.ENUM:
        try:
            return node.cls[value]
        except KeyError:
            raise _undecodable(where, value, f"a member of {node.cls.__qualname__}") from None
    if kind == t.LIST:
        return node.cls(from_avro(node.inner, v, f"{where}[]") for v in value)  # type: ignore[arg-type]
    if kind == t.MAP:
        return {k: from_avro(node.inner, v, f"{where}[{k!r}]") for k, v in value.items()}  # type: ignore[arg-type]
    if kind == t.RECORD:
        return record_from_avro(node.cls, value, where)
    raise AssertionError(f"unknown node kind {kind}")  # pragma: no cover


def record_from_avro(cls: type, data: Mapping[str, Any], where: str | None = None) -> Any:
    """An instance of the attrs class ``cls`` from a decoded Avro record dict."""
    prefix = where or cls.__qualname__
    kwargs: dict[str, Any] = {}
    for f in fields_of(cls):
        if f.name in data:
            kwargs[f.init_name] = from_avro(f.node, data[f.name], f"{prefix}.{f.name}")
        elif f.default is attrs.NOTHING:
            if f.node.kind == t.OPTIONAL:
                kwargs[f.init_name] = None
            else:
                raise DecodeError(
                    f"{prefix}.{f.name} is missing from the stored data and has no default: "
                    "add a default to the field or register an upcaster that sets it"
                )
    try:
        return cls(**kwargs)
    except Exception as exc:
        raise DecodeError(f"cannot build {cls.__qualname__} from stored data: {exc}") from exc
