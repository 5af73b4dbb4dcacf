"""Python values <-> Avro-ready values, driven by the classified type hints.

``to_avro`` checks every value against its declared type (so encoding errors name the field
and the value) and converts to what fastavro writes. ``from_avro`` builds the current classes
from decoded data; it is tolerant in the way Avro schema resolution is: missing fields take the
class default, unknown fields are ignored, ints are promoted to floats.

``record_to_avro`` / ``record_from_avro`` (what the codec calls per message) run a function
generated once per class that converts plain fields with a few inline operations; any value it
does not expect sends the whole record through ``record_to_avro_generic`` /
``record_from_avro_generic``, the node-walking reference, so results and errors are theirs.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import decimal
import functools
import uuid
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeAlias

import attrs

from cqrs.codec import types as t
from cqrs.codec.codegen import Namespace
from cqrs.codec.types import Node, fields_of
from cqrs.errors import DecodeError, EncodeError, NaiveDatetimeError

__all__ = [
    "EPOCH",
    "Decoder",
    "Encoder",
    "from_avro",
    "record_decoder",
    "record_encoder",
    "record_from_avro",
    "record_from_avro_generic",
    "record_to_avro",
    "record_to_avro_generic",
    "to_avro",
]

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
            return record_to_avro_generic(value, where)
        raise _bad(where, value, node.cls.__qualname__)
    raise AssertionError(f"unknown node kind {kind}")  # pragma: no cover


_PATHS: dict[type, list[tuple[str, Node, str]]] = {}


def record_to_avro_generic(obj: Any, where: str | None = None) -> dict[str, Any]:
    """An attrs instance as an Avro record dict (every field checked), node by node.

    The reference for :func:`record_to_avro`: its compiled converters fall back to this on any
    value they do not handle, so that errors are the ones raised here.
    """
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
        return record_from_avro_generic(node.cls, value, where)
    raise AssertionError(f"unknown node kind {kind}")  # pragma: no cover


def record_from_avro_generic(
    cls: type, data: Mapping[str, Any], where: str | None = None
) -> Any:
    """An instance of the attrs class ``cls`` from a decoded Avro record dict, node by node.

    The reference for :func:`record_from_avro` (its compiled converters fall back to this).
    """
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


# ---- compiled converters -------------------------------------------------------------------
#
# Walking the type nodes per field per call (above) is what made encoding and decoding slow.
# For each class, one Python function is generated that reads every field and converts it with
# a few inline operations, guarded by exact type checks (``type(v) is str``, range checks...).
# Whenever a guard fails (or anything at all raises), the whole record is converted again by the
# generic functions above, so results *and* errors are exactly theirs: a guard that passes
# implies the generic path returns the same value without raising.

Encoder: TypeAlias = Callable[[Any, str | None], dict[str, Any]]
Decoder: TypeAlias = Callable[[Mapping[str, Any], str | None], Any]

_EPOCH_ORDINAL = _EPOCH_DATE.toordinal()

_ENCODERS: dict[type, Encoder] = {}
_DECODERS: dict[type, Decoder] = {}


class _Mismatch(Exception):
    """A value the compiled converter does not handle: the generic converter decides."""


def _miss() -> NoReturn:
    """Raise :class:`_Mismatch`: generated expressions call it (``raise`` is a statement)."""
    raise _Mismatch


# kinds whose values are checked by exact builtin type, by name in generated source
_EXACT_TYPE: dict[str, str] = {
    t.STR: "str",
    t.INT: "int",
    t.FLOAT: "float",
    t.BOOL: "bool",
    t.BYTES: "bytes",
}

_BASE_NAMESPACE: dict[str, Any] = {
    "__builtins__": builtins,
    "_miss": _miss,
    "_datetime": _dt.datetime,
    "_date": _dt.date,
    "_Decimal": decimal.Decimal,
    "_UUID": uuid.UUID,
    "_EPOCH": EPOCH,
    "_MICRO": _MICRO,
}


class _Source(Namespace):
    """The constants and nested converters one generated function refers to, by name."""

    def __init__(self) -> None:
        super().__init__(_BASE_NAMESPACE)
        self.nested: dict[str, type] = {}  # generated name -> record class whose converter it is

    def converter(self, cls: type) -> str:
        """The name of the raw (raising) converter of a nested record class, bound later."""
        ident = self.name("_r")
        self.nested[ident] = cls
        return ident


def _enc_expr(node: Node, x: str, src: _Source) -> str:
    """Source of an expression converting the local ``x`` like :func:`to_avro`, or missing."""
    kind = node.kind
    if kind == t.STR:
        return f"({x} if type({x}) is str else _miss())"
    if kind == t.INT:
        lo, hi = _LIMITS[node.avro_type or "long"]
        return f"({x} if type({x}) is int and {lo} <= {x} <= {hi} else _miss())"
    if kind == t.FLOAT:
        return f"({x} if type({x}) is float else float({x}) if type({x}) is int else _miss())"
    if kind in (t.BOOL, t.BYTES):
        return f"({x} if type({x}) is {_EXACT_TYPE[kind]} else _miss())"
    if kind == t.DATETIME:
        return (
            f"(({x} - _EPOCH) // _MICRO if type({x}) is _datetime "
            f"and {x}.utcoffset() is not None else _miss())"
        )
    if kind == t.DATE:
        return f"({x}.toordinal() - {_EPOCH_ORDINAL} if type({x}) is _date else _miss())"
    if kind in (t.DECIMAL, t.UUID):
        cls = "_Decimal" if kind == t.DECIMAL else "_UUID"
        return f"(str({x}) if type({x}) is {cls} else _miss())"
    if kind == t.ENUM:
        return f"({x}.name if type({x}) is {src.const(node.cls)} else _miss())"
    if kind == t.OPTIONAL:
        return f"(None if {x} is None else {_enc_expr(node.inner, x, src)})"  # type: ignore[arg-type]
    if kind == t.LIST:
        i = src.name("_i")
        item = _enc_expr(node.inner, i, src)  # type: ignore[arg-type]
        return f"([{item} for {i} in {x}] if type({x}) is list or type({x}) is tuple else _miss())"
    if kind == t.MAP:
        k, v = src.name("_key"), src.name("_v")
        value = _enc_expr(node.inner, v, src)  # type: ignore[arg-type]
        key = f"({k} if type({k}) is str else _miss())"
        return f"({{{key}: {value} for {k}, {v} in {x}.items()}} if type({x}) is dict else _miss())"
    if kind == t.RECORD:
        convert, cls = src.converter(node.cls), src.const(node.cls)
        return f"({convert}({x}) if type({x}) is {cls} else _miss())"
    raise AssertionError(f"unknown node kind {kind}")  # pragma: no cover


def _dec_expr(node: Node, x: str, src: _Source) -> str:
    """Source of an expression building the value of ``x`` like :func:`from_avro`, or missing."""
    kind = node.kind
    if kind in _EXACT_TYPE:  # fastavro's types; from_avro converts others (the generic path)
        return f"({x} if type({x}) is {_EXACT_TYPE[kind]} else _miss())"
    if kind == t.DATETIME:  # fastavro gives aware datetimes; ``if tzinfo`` as in from_avro
        return f"({x} if type({x}) is _datetime and {x}.tzinfo else _miss())"
    if kind == t.DATE:
        return f"({x} if type({x}) is _date else _miss())"
    if kind == t.DECIMAL:
        return f"(_Decimal({x}) if type({x}) is str else _miss())"
    if kind == t.UUID:
        return f"({x} if type({x}) is _UUID else _UUID({x}) if type({x}) is str else _miss())"
    if kind == t.ENUM:
        members = src.const(node.cls.__members__)  # a live view: cls[name] looks up the same
        return f"({members}[{x}] if type({x}) is str and {x} in {members} else _miss())"
    if kind == t.OPTIONAL:
        return f"(None if {x} is None else {_dec_expr(node.inner, x, src)})"  # type: ignore[arg-type]
    if kind == t.LIST:
        i = src.name("_i")
        items = f"[{_dec_expr(node.inner, i, src)} for {i} in {x}]"  # type: ignore[arg-type]
        built = f"tuple({items})" if node.cls is tuple else items
        return f"({built} if type({x}) is list else _miss())"
    if kind == t.MAP:
        k, v = src.name("_key"), src.name("_v")
        value = _dec_expr(node.inner, v, src)  # type: ignore[arg-type]
        return f"({{{k}: {value} for {k}, {v} in {x}.items()}} if type({x}) is dict else _miss())"
    if kind == t.RECORD:
        return f"({src.converter(node.cls)}({x}) if type({x}) is dict else _miss())"
    raise AssertionError(f"unknown node kind {kind}")  # pragma: no cover


def _encoder_source(cls: type, src: _Source) -> str:
    """``_raw(obj)`` (raises on anything unusual) and ``_safe(obj, where)`` (falls back)."""
    fields = fields_of(cls)  # attrs itself writes these names into source: identifiers
    reads = [f"v{n} = obj.{f.name}" for n, f in enumerate(fields)]
    items = ", ".join(f"{f.name!r}: {_enc_expr(f.node, f'v{n}', src)}"
                      for n, f in enumerate(fields))
    body = [*reads, f"return {{{items}}}"]
    return _raw_and_safe("obj", body, "_generic(obj, where)")


def _decoder_source(cls: type, src: _Source) -> str:
    """``_raw(data)`` and ``_safe(data, where)`` building ``cls`` from a complete record dict."""
    fields = fields_of(cls)
    reads = [f"v{n} = data[{f.name!r}]" for n, f in enumerate(fields)]  # missing: KeyError
    args = ", ".join(f"{f.init_name}={_dec_expr(f.node, f'v{n}', src)}"
                     for n, f in enumerate(fields))
    body = ["if type(data) is not dict: _miss()", *reads, f"return _cls({args})"]
    src.namespace["_cls"] = cls
    return _raw_and_safe("data", body, "_generic(_cls, data, where)")


def _raw_and_safe(arg: str, body: list[str], fallback: str) -> str:
    """The same body twice: bare for nesting, and guarded (one frame less than a wrapper)."""
    raw = "\n".join(f"    {line}" for line in body)
    safe = "\n".join(f"        {line}" for line in body)
    return (
        f"def _raw({arg}):\n{raw}\n\n"
        f"def _safe({arg}, where=None):\n    try:\n{safe}\n"
        f"    except Exception:\n        return {fallback}\n"
    )


def _compile(cls: type, kind: str, built: dict[type, tuple[Any, Any]]) -> tuple[Any, Any]:
    """``(raw, safe)`` converters of ``cls`` (``kind`` "encoder" / "decoder"), nested ones too.

    ``built`` holds what this compilation made so far, so that recursive classes terminate.
    """
    found = built.get(cls)
    if found is not None:
        return found
    src = _Source()
    if kind == "encoder":
        code, generic = _encoder_source(cls, src), record_to_avro_generic
    else:
        code, generic = _decoder_source(cls, src), record_from_avro_generic
    src.namespace["_generic"] = generic
    filename = f"<cqrs {kind} of {cls.__module__}.{cls.__qualname__}>"
    # the source holds only field names (identifiers: attrs compiles them too), their reprs,
    # generated names and constants bound in the namespace
    exec(compile(code, filename, "exec"), src.namespace)  # noqa: S102
    pair = built[cls] = (src.namespace["_raw"], src.namespace["_safe"])
    for ident, nested_cls in src.nested.items():
        src.namespace[ident] = _compile(nested_cls, kind, built)[0]
    return pair


def _converter(cls: type, kind: str, cache: dict[type, Any], generic: Any) -> Any:
    """The cached safe converter of ``cls``; ``generic`` when it cannot be compiled."""
    found = cache.get(cls)
    if found is not None:
        return found
    built: dict[type, tuple[Any, Any]] = {}
    try:
        _compile(cls, kind, built)
    except Exception:  # noqa: BLE001 - e.g. unresolvable hints: the generic path raises them
        return generic  # not cached: the class may become usable later
    for compiled_cls, (_raw, safe) in built.items():
        cache.setdefault(compiled_cls, safe)
    return cache[cls]


def record_encoder(cls: type) -> Encoder:
    """The compiled ``f(obj, where=None)`` of ``cls``: :func:`record_to_avro_generic`, faster.

    Built once per class; callers on hot paths (the codec) keep it rather than look it up.
    """
    encoder: Encoder = _converter(cls, "encoder", _ENCODERS, record_to_avro_generic)
    return encoder


def record_decoder(cls: type) -> Decoder:
    """The compiled ``f(data, where=None)`` of ``cls``: :func:`record_from_avro_generic`, faster.
    """
    generic = functools.partial(record_from_avro_generic, cls)
    decoder: Decoder = _converter(cls, "decoder", _DECODERS, generic)
    return decoder


def record_to_avro(obj: Any, where: str | None = None) -> dict[str, Any]:
    """An attrs instance as an Avro record dict, every field checked (compiled per class)."""
    encoder = _ENCODERS.get(type(obj))
    if encoder is None:
        encoder = record_encoder(type(obj))
    return encoder(obj, where)


def record_from_avro(cls: type, data: Mapping[str, Any], where: str | None = None) -> Any:
    """An instance of the attrs class ``cls`` from a decoded Avro record dict (compiled)."""
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = record_decoder(cls)
    return decoder(data, where)
