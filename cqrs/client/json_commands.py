"""Commands from JSON (CLI ``--data``, HTTP bodies) and results / state back to JSON.

JSON is first checked against the command's classified fields (JSON shape, unknown and missing
fields, ISO-8601 text for dates and datetimes, base64 for bytes), then built with the codec's own
``record_from_avro`` and checked again with ``record_to_avro`` (ranges, attrs validators), so a
command accepted here is one the codec can encode. Every error names the offending field.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import decimal
import enum
import functools
import json
import uuid
from collections.abc import Mapping
from typing import Any, Final

import attrs

from cqrs.app import App
from cqrs.codec import types as t
from cqrs.codec.types import Node, fields_of
from cqrs.codec.values import record_from_avro, record_to_avro
from cqrs.domain.messages import type_name
from cqrs.client.errors import CommandDataError, UnknownCommandTypeError
from cqrs.errors import CodecError

__all__ = [
    "command_fields",
    "command_from_json",
    "parse_json_object",
    "resolve_command_type",
    "to_jsonable",
]

_JSON_NAMES = {
    t.STR: "a string", t.INT: "an integer", t.FLOAT: "a number", t.BOOL: "true or false",
    t.BYTES: "a base64 string", t.DATETIME: "an ISO-8601 datetime string with a UTC offset",
    t.DATE: "an ISO-8601 date string (YYYY-MM-DD)", t.DECIMAL: "a decimal string or an integer",
    t.UUID: "a UUID string", t.LIST: "an array", t.MAP: "an object", t.RECORD: "an object",
}  # fmt: skip


def resolve_command_type(app: App, command: str | type) -> type:
    """The command class of ``command``: a class of the app, its stable type name
    (``example.bank.Deposit``) or its class name (``Deposit``) when that is unambiguous."""
    known = app.model.commands
    if isinstance(command, type):
        if command in known.values():
            return command
        shown = f"{command.__module__}.{command.__qualname__}"
    elif isinstance(command, str):
        if command in known:
            return known[command]
        matches = [cls for cls in known.values() if cls.__name__ == command]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise UnknownCommandTypeError(
                f"command class name {command!r} is ambiguous in app {app.name!r}: use one of "
                f"the type names {sorted(type_name(c) for c in matches)}"
            )
        shown = command
    else:
        raise UnknownCommandTypeError(
            f"a command type is a type name or a class, got {command!r} ({type(command).__name__})"
        )
    raise UnknownCommandTypeError(
        f"unknown command type {shown!r} for app {app.name!r}; known command types: "
        f"{', '.join(sorted(known)) or '(none)'}"
    )


def parse_json_object(text: str | bytes, what: str = "command data") -> dict[str, Any]:
    """A JSON object from text, or :class:`CommandDataError` saying where the text is broken."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandDataError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; "
            "write an object such as '{\"amount\": 10}'"
        ) from None
    if not isinstance(value, dict):
        raise CommandDataError(
            f"{what} must be a JSON object of field values, got {type(value).__name__} {value!r}"
        )
    return value


def command_from_json(app: App, command: str | type, data: Mapping[str, Any] | str | bytes) -> Any:
    """An instance of the app's command ``command`` built from JSON ``data`` (an object or its
    text), checked against the command's schema."""
    cls = resolve_command_type(app, command)
    if isinstance(data, (str, bytes)):
        data = parse_json_object(data)
    values = _record(cls, data, "")
    try:
        instance = record_from_avro(cls, values)
    except CodecError as exc:
        cause = exc.__cause__ or exc
        raise CommandDataError(f"{type_name(cls)} refused the data: {cause}") from None
    try:
        record_to_avro(instance)
    except CodecError as exc:
        raise CommandDataError(f"{type_name(cls)}: {exc}") from None
    return instance


def command_fields(cls: type) -> dict[str, dict[str, Any]]:
    """The JSON fields a command takes: ``{name: {"type": ..., "required": bool}}``."""
    return {
        f.name: {"type": _describe(f.node), "required": f.default is attrs.NOTHING
                 and f.node.kind != t.OPTIONAL}
        for f in fields_of(cls)
    }


def _describe(node: Node) -> str:
    if node.kind == t.OPTIONAL:
        return f"{_describe(node.inner)} | null"  # type: ignore[arg-type]
    if node.kind == t.LIST:
        return f"array of {_describe(node.inner)}"  # type: ignore[arg-type]
    if node.kind == t.MAP:
        return f"object of {_describe(node.inner)}"  # type: ignore[arg-type]
    if node.kind == t.ENUM:
        return "one of " + ", ".join(repr(m) for m in node.cls.__members__)
    if node.kind == t.RECORD:
        return "object " + json.dumps({f.name: _describe(f.node) for f in fields_of(node.cls)})
    return _JSON_NAMES[node.kind]


def _bad(path: str, value: Any, node: Node) -> CommandDataError:
    return CommandDataError(
        f"field {path!r} = {json.dumps(value, default=str)} is not {_describe(node)}", field=path
    )


def _record(cls: type, data: Any, path: str) -> dict[str, Any]:
    where = path or type_name(cls)
    if not isinstance(data, Mapping):
        raise CommandDataError(f"{where} must be a JSON object, got {json.dumps(data)}", field=path or None)
    fields = fields_of(cls)
    names = {f.name for f in fields}
    unknown = [f"{path}.{k}" if path else k for k in sorted(set(data) - names)]
    if unknown:
        raise CommandDataError(
            f"unknown field(s) {unknown} in {where}; its fields are {sorted(names) or '(none)'}",
            field=unknown[0],
        )
    out: dict[str, Any] = {}
    for f in fields:
        sub = f"{path}.{f.name}" if path else f.name
        if f.name in data:
            out[f.name] = _value(f.node, data[f.name], sub)
        elif f.default is attrs.NOTHING and f.node.kind != t.OPTIONAL:
            raise CommandDataError(
                f"required field {sub!r} ({_describe(f.node)}) is missing from {where}", field=sub
            )
    return out


def _value(node: Node, value: Any, path: str) -> Any:  # noqa: C901 - one branch per kind
    kind = node.kind
    if kind == t.OPTIONAL:
        return None if value is None else _value(node.inner, value, path)  # type: ignore[arg-type]
    ok = {
        t.STR: isinstance(value, str),
        t.INT: isinstance(value, int) and not isinstance(value, bool),
        t.FLOAT: isinstance(value, (int, float)) and not isinstance(value, bool),
        t.BOOL: isinstance(value, bool),
        t.DECIMAL: isinstance(value, (str, int)) and not isinstance(value, bool),
        t.LIST: isinstance(value, list),
        t.MAP: isinstance(value, dict),
        t.RECORD: isinstance(value, dict),
    }.get(kind, isinstance(value, str))  # bytes, datetime, date, uuid, enum: text in JSON
    if not ok:
        raise _bad(path, value, node)
    if kind == t.LIST:
        return [_value(node.inner, v, f"{path}[{i}]") for i, v in enumerate(value)]  # type: ignore[arg-type]
    if kind == t.MAP:
        return {k: _value(node.inner, v, f"{path}.{k}") for k, v in value.items()}  # type: ignore[arg-type]
    if kind == t.RECORD:
        return _record(node.cls, value, path)
    try:
        if kind == t.BYTES:
            return base64.b64decode(value, validate=True)
        if kind == t.DATETIME:
            parsed = _dt.datetime.fromisoformat(value)
            if parsed.tzinfo is None:
                raise ValueError("no UTC offset")
            return parsed
        if kind == t.DATE:
            return _dt.date.fromisoformat(value)
        if kind == t.DECIMAL:
            return str(decimal.Decimal(str(value)))
        if kind == t.UUID:
            return str(uuid.UUID(value))
        if kind == t.ENUM and value not in node.cls.__members__:
            raise ValueError(value)
    except (ValueError, binascii.Error, decimal.InvalidOperation):
        raise _bad(path, value, node) from None
    return value


_PLAIN: Final = frozenset({str, int, float, bool, type(None)})


@functools.lru_cache(maxsize=1024)
def _attrs_names(kind: type) -> tuple[str, ...] | None:
    """The field names of an attrs class, None for any other type."""
    return tuple(a.name for a in attrs.fields(kind)) if attrs.has(kind) else None


def to_jsonable(value: Any) -> Any:
    """Plain JSON values for results, states and commands (ISO text for times, base64 for
    bytes, names for enums): the inverse of what :func:`command_from_json` reads."""
    kind = type(value)
    if kind in _PLAIN:  # most values: first, without the checks below
        return value
    names = _attrs_names(kind)
    if names is not None:
        return {n: to_jsonable(getattr(value, n)) for n in names}
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value
