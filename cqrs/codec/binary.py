"""Avro binary bodies of attrs instances without fastavro: a writer and a reader generated per
class and schema (Python source, compiled once), for the codec's hot paths.

fastavro's generic union, array and logical-type handling made a ``CommandResult`` cost ~12 µs
each way. For a class whose schema is :func:`cqrs.codec.schema.schema_for`'s, this module
generates straight-line code that walks the class's fields and the schema together:

* :func:`record_writer` -- ``write(obj) -> prefix + body``: the bytes fastavro's
  ``schemaless_writer`` writes for ``record_to_avro(obj)``. It checks each value with the same
  exact-type guards as the compiled converters of :mod:`cqrs.codec.values` and raises
  :class:`Mismatch` (or anything else) on a value they would not take; the caller then encodes
  through ``record_to_avro`` + fastavro, which raises the errors users see.
* :func:`record_reader` -- ``read(data, offset) -> obj``: what ``record_from_avro`` builds from
  fastavro's ``schemaless_reader(body, schema, None)``, for the writer schema *equal* to the
  class's schema (schema resolution and upcasting stay with fastavro). It raises on anything
  unusual (truncated or trailing bytes, a non-canonical union index or block count, an overlong
  varint...), and the caller decodes again with fastavro, which raises the errors users see.
* :func:`avro_reader` -- the same reader returning fastavro's dict (used to compare the two).

With the optional native module (``native/``, :data:`NATIVE`),
:func:`record_writer`, :func:`record_reader` and :func:`values_reader` return its ``Writer`` and
``Reader`` instead, driven by a plan of the same checks (:meth:`_Generator.plan_record`): the
same bytes, objects and refusals, a few times quicker. ``native=False`` gives the generated
Python (the tests compare both with fastavro); :func:`avro_reader` is Python only.

Supported: every kind :mod:`cqrs.codec.types` classifies (null, boolean, int, long, float,
double, bytes, string, the logical types the codec writes, enums, arrays, maps, unions of null
and one type, nested and recursive records). A schema with anything else (a logical type the
codec does not write, a named type defined elsewhere...) gets ``None``: fastavro only.

Encodings are fastavro's: zig-zag varints; one array or map block (count, items, then a 0; an
empty one is the single 0); a union is its branch index then the value; doubles and floats are
little-endian IEEE 754.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import decimal
import inspect
import struct
import uuid
from collections.abc import Callable
from typing import Any, Final, NoReturn

from cqrs.codec import types as t
from cqrs.codec.codegen import Namespace
from cqrs.codec.schema import canonical_json
from cqrs.codec.types import Node, fields_of
from cqrs.codec.values import EPOCH

from cqrs.native import native as _native  # its Writer and Reader, when installed

# whether record_writer, record_reader and values_reader give the native module's
NATIVE: Final = _native is not None

__all__ = ["NATIVE", "Mismatch", "Reader", "Writer", "avro_reader",
           "leading_strings", "record_reader", "record_writer", "values_reader"]

Writer = Callable[[Any], bytes]
Reader = Callable[[bytes, int], Any]


class Mismatch(Exception):  # noqa: N818 - a signal to the caller, not an error users see
    """A value or byte sequence the generated code does not handle: use the fastavro path."""


class _Unsupported(Exception):
    """The schema has something the generator does not write code for."""


def _miss() -> NoReturn:
    raise Mismatch


def _inner(node: Node) -> Node:
    """The item, value or optional type of a LIST, MAP or OPTIONAL node."""
    assert node.inner is not None
    return node.inner


# ---- varints ---------------------------------------------------------------------------------

_MAX_LONG = 2**63 - 1
_MAX_INT = 2**31 - 1
_DAYS_SHIFT = _dt.date(1970, 1, 1).toordinal()
_LEN_TABLE_SIZE = 2048

# the varint of n for n < 128 is the byte n
_BYTE = [bytes((n,)) for n in range(128)]


def _uvarint(n: int) -> bytes:
    """Varint bytes of ``0 <= n < 2**64`` (already zig-zagged)."""
    if n < 0x80:
        return _BYTE[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    if n < 0x200000:
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    out = bytearray((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14 & 0x7F | 0x80))
    n >>= 21
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# the varints of small lengths / counts (zig-zag of n: 2n) and of longs 0 <= v < 64
_LEN = [_uvarint(n << 1) for n in range(_LEN_TABLE_SIZE)]
_SMALL = _LEN[:64]


def _len(n: int) -> bytes:
    """Varint of a length or count (``n >= 0``)."""
    return _LEN[n] if n < _LEN_TABLE_SIZE else _uvarint(n << 1)


def _long(v: int) -> bytes:
    """Varint of an Avro long, or :class:`Mismatch` outside its range."""
    if v >= 0:
        if v > _MAX_LONG:
            raise Mismatch
        n = v << 1
    elif v >= -_MAX_LONG - 1:
        n = ~v << 1 | 1
    else:
        raise Mismatch
    if n < 0x4000:
        return _BYTE[n] if n < 0x80 else bytes((n & 0x7F | 0x80, n >> 7))
    return _uvarint(n)


def _int(v: int) -> bytes:
    """Varint of an Avro int, or :class:`Mismatch` outside its range."""
    if v >= 0:
        if v <= _MAX_INT:
            return _uvarint(v << 1)
    elif v >= -_MAX_INT - 1:
        return _uvarint(~v << 1 | 1)
    raise Mismatch


# zig-zag decoding of one-byte varints
_ZIGZAG = tuple((b >> 1) ^ -(b & 1) for b in range(128))


def _rlong(d: bytes, p: int) -> tuple[int, int]:
    """The long whose varint starts at ``d[p]``, and the position after it.

    :class:`Mismatch` beyond 10 bytes or 64 bits: fastavro's C reader reads those its own way.
    """
    b = d[p]
    if b < 0x80:
        return _ZIGZAG[b], p + 1
    n = b & 0x7F
    b = d[p + 1]
    if b < 0x80:
        n |= b << 7
        return (n >> 1) ^ -(n & 1), p + 2
    n |= (b & 0x7F) << 7
    b = d[p + 2]
    if b < 0x80:
        n |= b << 14
        return (n >> 1) ^ -(n & 1), p + 3
    n |= (b & 0x7F) << 14
    shift = 21
    p += 3
    while b & 0x80:
        b = d[p]
        p += 1
        n |= (b & 0x7F) << shift
        shift += 7
    if shift > 70 or n >> 64:
        raise Mismatch
    return (n >> 1) ^ -(n & 1), p


def _rlen(d: bytes, p: int) -> tuple[int, int]:
    """A length or block count (:class:`Mismatch` when negative: fastavro decides)."""
    n, p = _rlong(d, p)
    if n < 0:
        raise Mismatch
    return n, p


def _rspan(d: bytes, p: int) -> tuple[int, int]:
    """``(start, end)`` of the bytes or string whose length varint starts at ``d[p]``."""
    n, p = _rlong(d, p)
    if n < 0:
        raise Mismatch
    return p, p + n


def leading_strings(data: bytes, start: int, count: int) -> list[str]:
    """The ``count`` Avro strings that ``data`` holds from ``start`` on: the first fields of a
    record whose schema begins with them, read without decoding the rest. Raises
    :class:`Mismatch` (or ``IndexError``, ``UnicodeDecodeError``) on bytes that are not that."""
    out: list[str] = []
    p = start
    for _ in range(count):
        begin, p = _rspan(data, p)
        if p > len(data):
            raise Mismatch
        out.append(data[begin:p].decode("utf-8"))
    return out


# ---- timestamps ------------------------------------------------------------------------------
#
# A timestamp-micros is an 8-byte varint (1979 to 3111) and, as fastavro reads it,
# ``EPOCH + timedelta(microseconds=v)``; building that timedelta is most of the cost. Both
# directions split v >= 0 at bit 20 (about a second): the varint bytes from the fourth on and
# the datetime of ``v >> 20 << 20`` are remembered per high part (bounded dicts: a stream's
# timestamps are close to each other), and the low 20 bits come from small tables.

_TIME_CACHE_SIZE = 4096
_TIME_BASES: dict[bytes, _dt.datetime] = {}  # 8-byte varint[3:] -> EPOCH + (v >> 20 << 20) µs
_TIME_HIGH: dict[int, bytes] = {}  # v >> 20 -> varint[3:]
_UTC: Final = _dt.timezone.utc
_LAST_TIME: tuple[_dt.datetime, bytes] = (EPOCH, b"\x00")  # the last UTC time written, its varint
_TD_HIGH = tuple(_dt.timedelta(microseconds=i << 10) for i in range(1024))
_TD_LOW = tuple(_dt.timedelta(microseconds=i) for i in range(1024))


def _rtime(d: bytes, p: int) -> tuple[_dt.datetime, int]:
    """The timestamp-micros at ``d[p]`` as fastavro reads it, and the position after it.

    Generated readers call this unless the first three bytes continue, the value is not
    negative (first bit) and the next five bytes are in ``_TIME_BASES``: then they compute
    ``_TIME_BASES[d[p + 3 : p + 8]] + _TD_HIGH[low >> 10] + _TD_LOW[low & 0x3FF]`` with
    ``low`` the value's 20 low bits, from the first three bytes.
    """
    v, end = _rlong(d, p)
    if end == p + 8 and v >= 0:
        if len(_TIME_BASES) >= _TIME_CACHE_SIZE:
            _TIME_BASES.clear()
        _TIME_BASES[d[p + 3 : end]] = EPOCH + _dt.timedelta(0, 0, v >> 20 << 20)
    return EPOCH + _dt.timedelta(0, 0, v), end


def _wtime(x: _dt.datetime) -> bytes:
    """The varint of an aware datetime as ``to_avro`` converts it (micros since the epoch)."""
    global _LAST_TIME
    last = _LAST_TIME
    if x.tzinfo is _UTC and x == last[0]:  # the instant written last: a command's time is
        return last[1]  # written with its record, then with its result (UTC: no fold to tell)
    q = x - EPOCH
    v = (q.days * 86400 + q.seconds) * 1000000 + q.microseconds
    if v >> 20 > 0:  # the varint of n = 2v >= 2**21: three bytes of its low 21 bits, then more
        high = _TIME_HIGH.get(v >> 20)
        if high is None:
            if len(_TIME_HIGH) >= _TIME_CACHE_SIZE:
                _TIME_HIGH.clear()
            high = _TIME_HIGH[v >> 20] = _long(v)[3:]
        n = (v & 0xFFFFF) << 1
        out = bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14 | 0x80)) + high
    else:
        out = _long(v)
    if x.tzinfo is _UTC:
        _LAST_TIME = (x, out)  # one tuple, replaced whole: threads see an old pair or the new
    return out


# ---- generation ------------------------------------------------------------------------------

_BASE_NAMESPACE: dict[str, Any] = {
    "__builtins__": builtins,
    "Mismatch": Mismatch,
    "_miss": _miss,
    "_len": _len,
    "_LEN": _LEN,
    "_SMALL": _SMALL,
    "_long": _long,
    "_int": _int,
    "_ZIGZAG": _ZIGZAG,
    "_rlong": _rlong,
    "_rlen": _rlen,
    "_rspan": _rspan,
    "_rtime": _rtime,
    "_TIME_BASES": _TIME_BASES,
    "_TD_HIGH": _TD_HIGH,
    "_TD_LOW": _TD_LOW,
    "_wtime": _wtime,
    "_datetime": _dt.datetime,
    "_date": _dt.date,
    "_fromordinal": _dt.date.fromordinal,
    "_Decimal": decimal.Decimal,
    "_UUID": uuid.UUID,
    "_UTC": _UTC,
    "_BOOL": (False, True),
    "_pack_d": struct.Struct("<d").pack,
    "_pack_f": struct.Struct("<f").pack,
    "_unpack_d": struct.Struct("<d").unpack_from,
    "_unpack_f": struct.Struct("<f").unpack_from,
}

_PRIMITIVE: dict[str, tuple[str, str | None]] = {
    # kind -> (Avro type, logical type) the schema must say for it
    t.STR: ("string", None),
    t.BOOL: ("boolean", None),
    t.BYTES: ("bytes", None),
    t.DATETIME: ("long", "timestamp-micros"),
    t.DATE: ("int", "date"),
    t.DECIMAL: ("string", None),  # ``cqrs.logicalType``: fastavro ignores it
    t.UUID: ("string", "uuid"),
}


class _Lines:
    """Indented source lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)


class _Generator(Namespace):
    """Source of every function a class's writer or reader needs, in one namespace."""

    def __init__(self, mode: str) -> None:
        # "write", "read" (objects), "values" (objects, but the top record's field values as a
        # tuple, for a caller that builds something else of them) or "dict" (fastavro's dicts)
        self.mode = mode
        super().__init__(_BASE_NAMESPACE)
        self.functions: dict[type, str] = {}  # record class -> name of its nested function
        self.pending: list[tuple[type, dict[str, Any], str]] = []
        self.defined: dict[type, dict[str, Any]] = {}  # class -> its named schema
        self.chunks: list[str] = []

    # -- schema checks --

    def collect(self, node: Node, schema: Any) -> None:
        """Pair the named types (records, enums) of ``schema`` with the classes of ``node``.

        A schema defines each named type where it first occurs (depth first) and refers to it
        by name after: the definitions are found before any code is generated, in that order.
        """
        kind = node.kind
        if kind == t.OPTIONAL:
            null_first = self.union(schema)
            self.collect(_inner(node), schema[1] if null_first else schema[0])
        elif kind == t.LIST or kind == t.MAP:
            if isinstance(schema, dict):
                self.collect(_inner(node), schema.get("items" if kind == t.LIST else "values"))
        elif (kind == t.RECORD or kind == t.ENUM) and not isinstance(schema, str):
            avro_type = "record" if kind == t.RECORD else "enum"
            if (
                not isinstance(schema, dict)
                or schema.get("type") != avro_type
                or not isinstance(schema.get("name"), str)
                or "namespace" in schema
                or "logicalType" in schema
                or node.cls in self.defined
            ):
                raise _Unsupported(schema)
            self.defined[node.cls] = schema
            if kind == t.RECORD:
                for f, ftype in self.record_fields(node.cls, schema):
                    self.collect(f.node, ftype)

    def named(self, node: Node, schema: Any) -> dict[str, Any]:
        """The definition of the record or enum ``node`` (given here or referred to by name)."""
        found = self.defined.get(node.cls)
        if found is None or not (found is schema or found["name"] == schema):
            raise _Unsupported(schema)
        return found

    def record_fields(self, cls: type, schema: dict[str, Any]) -> list[tuple[Any, Any]]:
        """``(FieldInfo, field type schema)`` pairs, when the schema is the class's."""
        fields = fields_of(cls)
        declared = schema.get("fields")
        if not isinstance(declared, list) or [
            f.get("name") if isinstance(f, dict) else None for f in declared
        ] != [f.name for f in fields]:
            raise _Unsupported(cls)
        return [(f, d.get("type")) for f, d in zip(fields, declared, strict=True)]

    def record_function(self, cls: type, schema: Any) -> str:
        """Name of the nested function of a record class (generated after the current one)."""
        definition = self.named(Node(t.RECORD, cls=cls), schema)
        found = self.functions.get(cls)
        if found is None:
            found = self.functions[cls] = self.name("_rec")
            self.pending.append((cls, definition, found))
        return found

    def finish(self) -> None:
        """Generate the nested record functions referred to (recursively)."""
        while self.pending:
            cls, definition, fname = self.pending.pop()
            self.chunks.append(
                self.write_record(cls, definition, fname, None)
                if self.mode == "write"
                else self.read_record(cls, definition, fname, top=False)
            )

    # -- writing --

    def write_record(self, cls: type, schema: dict[str, Any], fname: str, prefix: Any,
                     given: tuple[str, ...] = ()) -> str:
        """``fname(o)``: the fragments of a record (``prefix``: the top function's bytes);
        with ``given`` field names, ``fname(o, s)``: those fields' values are ``s[0]``,
        ``s[1]``... instead of ``o``'s."""
        out = _Lines()
        frags: list[str] = []
        fields = self.record_fields(cls, schema)
        for n, (f, _) in enumerate(fields):
            out.add(1, f"v{n} = s[{given.index(f.name)}]" if f.name in given else f"v{n} = o.{f.name}")
        for n, (f, ftype) in enumerate(fields):
            frags += self.write_value(f.node, ftype, f"v{n}", out, 1)
        if prefix is None:
            out.add(1, f"return ({', '.join(frags)}{',' if len(frags) == 1 else ''})")
        else:
            out.add(1, f"return b''.join(({', '.join([self.const(prefix), *frags])},))")
        # the top function takes values like the native Writer (``write(obj, values=None)``),
        # even for a class with no fields (``values_writer`` passes them whatever the class)
        params = "o" if prefix is None else "o, s=None"
        return f"def {fname}({params}):\n" + "\n".join(out.lines) + "\n"

    def write_value(self, node: Node, schema: Any, x: str, out: _Lines, ind: int) -> list[str]:
        """Statements checking ``x`` (added to ``out``) and the expressions of its bytes.

        An expression ``*name`` splices a sequence of fragments.
        """
        kind = node.kind
        if kind == t.INT or kind == t.FLOAT:
            width = node.avro_type or ("long" if kind == t.INT else "double")
            if schema != width:
                raise _Unsupported(schema)
            if kind == t.FLOAT:
                pack = "_pack_d" if width == "double" else "_pack_f"
                out.add(ind, f"if type({x}) is not float:")
                out.add(ind + 1, f"{x} = float({x}) if type({x}) is int else _miss()")
                return [f"{pack}({x})"]
            out.add(ind, f"if type({x}) is not int: raise Mismatch")
            if width == "long":
                return [f"(_SMALL[{x}] if 0 <= {x} < 64 else _long({x}))"]
            return [f"(_SMALL[{x}] if 0 <= {x} < 64 else _int({x}))"]
        if kind in _PRIMITIVE:
            self.primitive(kind, schema)
        if kind == t.STR or kind == t.DECIMAL or kind == t.UUID:
            if kind == t.STR:
                out.add(ind, f"if type({x}) is not str: raise Mismatch")
                text = x
            else:
                cls = "_Decimal" if kind == t.DECIMAL else "_UUID"
                out.add(ind, f"if type({x}) is not {cls}: raise Mismatch")
                text = f"str({x})"
            e, n = self.name("e"), self.name("n")
            out.add(ind, f"{e} = {text}.encode()")
            out.add(ind, f"{n} = len({e})")
            return [f"(_LEN[{n}] if {n} < {_LEN_TABLE_SIZE} else _len({n}))", e]
        if kind == t.BOOL:
            return [f"(b'\\x01' if {x} is True else b'\\x00' if {x} is False else _miss())"]
        if kind == t.BYTES:
            out.add(ind, f"if type({x}) is not bytes: raise Mismatch")
            n = self.name("n")
            out.add(ind, f"{n} = len({x})")
            return [f"(_LEN[{n}] if {n} < {_LEN_TABLE_SIZE} else _len({n}))", x]
        if kind == t.DATETIME:
            # aware datetimes only (as ``to_avro``); UTC ones need no utcoffset() call
            out.add(
                ind,
                f"if type({x}) is not _datetime or ({x}.tzinfo is not _UTC "
                f"and {x}.utcoffset() is None): raise Mismatch",
            )
            return [f"_wtime({x})"]
        if kind == t.DATE:
            out.add(ind, f"if type({x}) is not _date: raise Mismatch")
            return [f"_int({x}.toordinal() - {_DAYS_SHIFT})"]
        if kind == t.ENUM:
            symbols = self.enum_symbols(node, schema)
            index = self.const({node.cls[s]: _uvarint(i << 1) for i, s in enumerate(symbols)})
            out.add(ind, f"if type({x}) is not {self.const(node.cls)}: raise Mismatch")
            return [f"{index}[{x}]"]
        if kind == t.OPTIONAL:
            null_first = self.union(schema)
            inner_schema = schema[1] if null_first else schema[0]
            null, value = (b"\x00", b"\x02") if null_first else (b"\x02", b"\x00")
            o = self.name("o")
            out.add(ind, f"if {x} is None:")
            out.add(ind + 1, f"{o} = ({null!r},)")
            out.add(ind, "else:")
            frags = self.write_value(_inner(node), inner_schema, x, out, ind + 1)
            out.add(ind + 1, f"{o} = ({value!r}, {', '.join(frags)})")
            return [f"*{o}"]
        if kind == t.LIST or kind == t.MAP:
            is_list = kind == t.LIST
            avro_type, key = ("array", "items") if is_list else ("map", "values")
            if not isinstance(schema, dict) or schema.get("type") != avro_type or len(schema) != 2:
                raise _Unsupported(schema)
            parts, item = self.name("a"), self.name("i")
            if is_list:
                out.add(ind, f"if type({x}) is not list and type({x}) is not tuple: raise Mismatch")
            else:
                out.add(ind, f"if type({x}) is not dict: raise Mismatch")
            out.add(ind, f"if {x}:")
            out.add(ind + 1, f"{parts} = [_len(len({x}))]")
            if is_list:
                out.add(ind + 1, f"for {item} in {x}:")
                frags = []
            else:
                k, ek, nk = self.name("k"), self.name("e"), self.name("n")
                out.add(ind + 1, f"for {k}, {item} in {x}.items():")
                out.add(ind + 2, f"if type({k}) is not str: raise Mismatch")
                out.add(ind + 2, f"{ek} = {k}.encode()")
                out.add(ind + 2, f"{nk} = len({ek})")
                frags = [f"(_LEN[{nk}] if {nk} < {_LEN_TABLE_SIZE} else _len({nk}))", ek]
            frags += self.write_value(_inner(node), schema[key], item, out, ind + 2)
            if len(frags) == 1 and not frags[0].startswith("*"):
                out.add(ind + 2, f"{parts}.append({frags[0]})")
            else:
                out.add(ind + 2, f"{parts} += ({', '.join(frags)},)")
            out.add(ind + 1, f"{parts}.append(b'\\x00')")
            out.add(ind, "else:")
            out.add(ind + 1, f"{parts} = (b'\\x00',)")
            return [f"*{parts}"]
        if kind == t.RECORD:
            fname = self.record_function(node.cls, schema)
            out.add(ind, f"if type({x}) is not {self.const(node.cls)}: raise Mismatch")
            return [f"*{fname}({x})"]
        raise _Unsupported(kind)  # pragma: no cover

    # -- the native writer's plan --

    def plan_record(self, cls: type, schema: Any, given: tuple[str, ...] = ()) -> list[Any]:
        """The records of the native writer and reader of ``cls`` (see ``native/src/lib.rs``):
        per record class, in order of first use and ``cls`` first, its fields' names, ``given``
        indices and operations, then the names of the last fields its constructor is called
        with by keyword (the reader's ``cls(v0, v1, name2=v2)``). The operations carry what
        either direction needs (an enum's index for writing, its members for reading; a list's
        container). The schema was checked already by :meth:`write_record` or
        :meth:`read_record`."""
        records: list[Any] = []
        index: dict[type, int] = {}

        def record(rcls: type, rschema: Any, top_given: tuple[str, ...]) -> int:
            found = index.get(rcls)
            if found is not None:
                return found
            definition = self.named(Node(t.RECORD, cls=rcls), rschema)
            index[rcls] = len(records)
            fields = self.record_fields(rcls, definition)
            names = [f.init_name for f, _ in fields]
            entry: tuple[type, list[Any], tuple[str, ...]] = (
                rcls, [], tuple(names[_positional(rcls, names):]))
            records.append(entry)
            for f, ftype in fields:
                entry[1].append((f.name, top_given.index(f.name) if f.name in top_given else None,
                                 value(f.node, ftype)))
            return index[rcls]

        def value(node: Node, schema: Any) -> tuple[Any, ...]:
            kind = node.kind
            if kind == t.INT:
                return (node.avro_type or "long",)
            if kind == t.FLOAT:
                return (node.avro_type or "double",)
            if kind == t.DECIMAL or kind == t.UUID:
                return ("strof", decimal.Decimal if kind == t.DECIMAL else uuid.UUID)
            if kind == t.ENUM:
                symbols = self.enum_symbols(node, schema)
                return ("enum", node.cls, {node.cls[s]: _uvarint(i << 1) for i, s in enumerate(symbols)},
                        tuple(node.cls.__members__[s] for s in symbols))
            if kind == t.OPTIONAL:
                null_first = self.union(schema)
                return ("optional", null_first,
                        value(_inner(node), schema[1] if null_first else schema[0]))
            if kind == t.LIST:
                return ("list", value(_inner(node), schema["items"]), node.cls is tuple)
            if kind == t.MAP:
                return ("map", value(_inner(node), schema["values"]))
            if kind == t.RECORD:
                return ("record", record(node.cls, schema, ()))
            return (kind,)  # str, bytes, bool, datetime, date: the operation's name is the kind

        self.collect(Node(t.RECORD, cls=cls), schema)
        record(cls, schema, given)
        return records

    # -- reading --

    def read_record(self, cls: type, schema: dict[str, Any], fname: str, *, top: bool) -> str:
        """``fname(d, p)``: the record at ``d[p]`` (and the position after it unless ``top``)."""
        out = _Lines()
        fields = self.record_fields(cls, schema)
        for n, (f, ftype) in enumerate(fields):
            self.read_value(f.node, ftype, f"v{n}", out, 1)
        if self.mode == "dict":
            value = "{" + ", ".join(f"{f.name!r}: v{n}" for n, (f, _) in enumerate(fields)) + "}"
        elif self.mode == "values" and top:
            value = "(" + "".join(f"v{n}, " for n in range(len(fields))) + ")"
        else:
            value = f"{self.const(cls)}({_arguments(cls, [f.init_name for f, _ in fields])})"
        if top:
            out.add(1, "if p != len(d): raise Mismatch")
            out.add(1, f"return {value}")
        else:
            out.add(1, f"return {value}, p")
        return f"def {fname}(d, p):\n" + "\n".join(out.lines) + "\n"

    def read_varint(self, target: str, out: _Lines, ind: int, *, length: bool) -> None:
        """``target`` = the long (or non-negative length) at ``d[p]``, with a one-byte path."""
        out.add(ind, "b = d[p]")
        if length:  # one byte, non-negative: 0 <= b < 128 and even
            out.add(ind, "if b & 0x81:")
            out.add(ind + 1, f"{target}, p = _rlen(d, p)")
            out.add(ind, "else:")
            out.add(ind + 1, f"{target} = b >> 1")
        else:
            out.add(ind, "if b & 0x80:")
            out.add(ind + 1, f"{target}, p = _rlong(d, p)")
            out.add(ind, "else:")
            out.add(ind + 1, f"{target} = _ZIGZAG[b]")
        out.add(ind + 1, "p += 1")

    def read_value(self, node: Node, schema: Any, target: str, out: _Lines, ind: int) -> None:
        """Statements setting ``target`` to the value at ``d[p]`` and moving ``p`` past it."""
        kind = node.kind
        objects = self.mode != "dict"
        if kind == t.INT or kind == t.FLOAT:
            width = node.avro_type or ("long" if kind == t.INT else "double")
            if schema != width:
                raise _Unsupported(schema)
            if kind == t.INT:
                self.read_varint(target, out, ind, length=False)
            else:
                size, unpack = (8, "_unpack_d") if width == "double" else (4, "_unpack_f")
                out.add(ind, f"{target} = {unpack}(d, p)[0]")
                out.add(ind, f"p += {size}")
            return
        if kind in _PRIMITIVE:
            self.primitive(kind, schema)
        if kind == t.STR or kind == t.DECIMAL or kind == t.UUID or kind == t.BYTES:
            out.add(ind, "b = d[p]")  # a one-byte length: 0 <= b < 128 and even
            out.add(ind, "if b & 0x81:")
            out.add(ind + 1, "q, p = _rspan(d, p)")
            out.add(ind, "else:")
            out.add(ind + 1, "q = p + 1")
            out.add(ind + 1, "p = q + (b >> 1)")
            raw = "d[q:p]"
            if kind == t.BYTES:
                value = raw
            elif kind == t.UUID:
                value = f"_UUID({raw}.decode())"
            elif kind == t.DECIMAL and objects:
                value = f"_Decimal({raw}.decode())"
            else:
                value = f"{raw}.decode()"
            out.add(ind, f"{target} = {value}")
            return
        if kind == t.BOOL:  # 0 or 1 (other bytes: fastavro's reading of them)
            out.add(ind, f"{target} = _BOOL[d[p]]")
            out.add(ind, "p += 1")
            return
        if kind == t.DATETIME:  # _rtime, with its remembered high parts inline
            out.add(ind, "b = d[p]")
            continued = "(b1 := d[p + 1]) & (b2 := d[p + 2]) & 0x80"
            out.add(ind, f"if b & 0x80 and not b & 1 and {continued}:")
            out.add(ind + 1, "q = _TIME_BASES.get(d[p + 3 : p + 8])")
            out.add(ind, "else:")
            out.add(ind + 1, "q = None")
            out.add(ind, "if q is None:")
            out.add(ind + 1, f"{target}, p = _rtime(d, p)")
            out.add(ind, "else:")
            out.add(ind + 1, "b = ((b & 0x7F) | (b1 & 0x7F) << 7 | (b2 & 0x7F) << 14) >> 1")
            out.add(ind + 1, f"{target} = q + _TD_HIGH[b >> 10] + _TD_LOW[b & 0x3FF]")
            out.add(ind + 1, "p += 8")
            return
        if kind == t.DATE:
            self.read_varint(target, out, ind, length=False)
            out.add(ind, f"{target} = _fromordinal({target} + {_DAYS_SHIFT})")
            return
        if kind == t.ENUM:
            symbols = self.enum_symbols(node, schema)
            values = tuple(node.cls.__members__[s] for s in symbols) if objects else tuple(symbols)
            self.read_varint(target, out, ind, length=False)
            out.add(ind, f"{target} = {self.const(values)}[{target}]")
            return
        if kind == t.OPTIONAL:
            null_first = self.union(schema)
            inner_schema = schema[1] if null_first else schema[0]
            null, value = (0, 2) if null_first else (2, 0)
            out.add(ind, "b = d[p]")
            out.add(ind, "p += 1")
            out.add(ind, f"if b == {null}:")
            out.add(ind + 1, f"{target} = None")
            out.add(ind, f"elif b == {value}:")
            self.read_value(_inner(node), inner_schema, target, out, ind + 1)
            out.add(ind, "else:")
            out.add(ind + 1, "raise Mismatch")
            return
        if kind == t.LIST or kind == t.MAP:
            is_list = kind == t.LIST
            avro_type, key = ("array", "items") if is_list else ("map", "values")
            if not isinstance(schema, dict) or schema.get("type") != avro_type or len(schema) != 2:
                raise _Unsupported(schema)
            acc, count, item = self.name("a"), self.name("c"), self.name("i")
            out.add(ind, f"{acc} = []" if is_list else f"{acc} = {{}}")
            self.read_varint(count, out, ind, length=True)
            out.add(ind, f"while {count}:")
            out.add(ind + 1, f"for _ in range({count}):")
            if is_list:
                self.read_value(_inner(node), schema[key], item, out, ind + 2)
                out.add(ind + 2, f"{acc}.append({item})")
            else:
                k = self.name("k")
                self.read_value(Node(t.STR), "string", k, out, ind + 2)
                self.read_value(_inner(node), schema[key], item, out, ind + 2)
                out.add(ind + 2, f"{acc}[{k}] = {item}")
            self.read_varint(count, out, ind + 1, length=True)
            tuple_ = is_list and objects and node.cls is tuple
            out.add(ind, f"{target} = tuple({acc})" if tuple_ else f"{target} = {acc}")
            return
        if kind == t.RECORD:
            fname = self.record_function(node.cls, schema)
            out.add(ind, f"{target}, p = {fname}(d, p)")
            return
        raise _Unsupported(kind)  # pragma: no cover

    # -- shared --

    def primitive(self, kind: str, schema: Any) -> None:
        avro_type, logical = _PRIMITIVE[kind]
        if logical is None:
            if schema == avro_type:
                return
            if isinstance(schema, dict) and schema.get("type") == avro_type:
                if "logicalType" not in schema:  # e.g. {"type": "string", "cqrs.logicalType"...}
                    return
        elif (
            isinstance(schema, dict)
            and schema.get("type") == avro_type
            and schema.get("logicalType") == logical
        ):
            return
        raise _Unsupported(schema)

    def enum_symbols(self, node: Node, schema: Any) -> list[str]:
        definition = self.named(node, schema)
        symbols = definition.get("symbols")
        if symbols != [m.name for m in node.cls] or "default" in definition:
            raise _Unsupported(definition)
        return symbols  # type: ignore[no-any-return]

    @staticmethod
    def union(schema: Any) -> bool:
        """Whether null is the first branch of an optional's union."""
        if isinstance(schema, list) and len(schema) == 2 and schema.count("null") == 1:
            return schema[0] == "null"
        raise _Unsupported(schema)

    def compile(self, filename: str) -> Any:
        """The ``_top`` function, once every nested one is generated."""
        self.finish()
        code = "\n".join(self.chunks)
        # the source holds field names (identifiers, as attrs compiles them), generated names,
        # reprs of small byte strings and ints; every other value is bound in the namespace
        exec(compile(code, filename, "exec"), self.namespace)  # noqa: S102
        return self.namespace["_top"]


def _arguments(cls: type, names: list[str]) -> str:
    """``v0, v1, name2=v2...``: positional while the signature of ``cls`` allows (quicker)."""
    count = _positional(cls, names)
    return ", ".join(f"v{n}" if n < count else f"{name}=v{n}" for n, name in enumerate(names))


def _positional(cls: type, names: list[str]) -> int:
    """How many of ``names`` (constructor arguments, in order) ``cls`` takes by position."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        params = []
    for n, name in enumerate(names):
        if not (n < len(params) and params[n].name == name and params[n].kind is _POSITIONAL):
            return n
    return len(names)


_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD

_CACHE: dict[tuple[str, type, str, bytes], Any] = {}


def _generated(mode: str, cls: type, schema: dict[str, Any], prefix: bytes = b"",
               given: tuple[str, ...] = ()) -> Any:
    key = (mode, cls, canonical_json(schema), prefix, given)
    found = _CACHE.get(key)
    if found is not None:
        return found
    gen = _Generator(mode)
    try:
        gen.collect(Node(t.RECORD, cls=cls), schema)
        if mode == "write":
            gen.chunks.append(gen.write_record(cls, schema, "_top", prefix, given))
        else:
            gen.chunks.append(gen.read_record(cls, schema, "_top", top=True))
        fn = gen.compile(f"<cqrs avro {mode} of {cls.__module__}.{cls.__qualname__}>")
    except Exception:  # noqa: BLE001 - _Unsupported, or anything odd: fastavro serves the class
        return None
    _CACHE[key] = fn
    return fn


def record_writer(cls: type, schema: dict[str, Any], prefix: bytes = b"",
                  given: tuple[str, ...] = (), native: bool = True) -> Callable[..., bytes] | None:
    """``write(obj)``: ``prefix`` + the Avro body of an instance of ``cls``, or ``None`` when
    ``schema`` (``schema_for(cls)``) has a type this module does not generate code for.
    With ``given`` (names of top-level fields): ``write(obj, values)`` writes ``values[i]`` as
    the field ``given[i]`` instead of ``obj``'s value (a class's sealed personal fields, written
    without a copy of the object).

    The body is byte for byte what ``schemaless_writer(schema, record_to_avro(obj))`` writes.
    ``write`` raises (usually :class:`Mismatch`) on a value the compiled converters would not
    take: encode through ``record_to_avro`` then, to get the error that names the field.

    With the native module installed (:data:`NATIVE`) and ``native`` true, the writer is its
    ``Writer``: the same bytes and guards, ~5x quicker (``native=False``: the generated Python).
    """
    writer: Callable[..., bytes] | None = _generated("write", cls, schema, prefix, given)
    if writer is None or not native or _native is None:
        return writer
    key = ("native", cls, canonical_json(schema), prefix, given)
    found = _CACHE.get(key)
    if found is None:
        records = _Generator("write").plan_record(cls, schema, given)
        found = _CACHE[key] = _native.Writer(prefix, records, Mismatch, _UTC)
    return found  # type: ignore[no-any-return]


def _native_reader(mode: str, cls: type, schema: dict[str, Any], native: bool) -> Reader | None:
    """The generated reader of ``mode`` ("read" or "values"), or the native ``Reader`` of the
    same plan when the module is there (:data:`NATIVE`) and ``native``."""
    reader: Reader | None = _generated(mode, cls, schema)
    if reader is None or not native or _native is None:
        return reader
    key = (f"native {mode}", cls, canonical_json(schema), b"", ())
    found = _CACHE.get(key)
    if found is None:
        records = _Generator(mode).plan_record(cls, schema)
        found = _CACHE[key] = _native.Reader(records, mode == "values", Mismatch, _UTC)
    return found  # type: ignore[no-any-return]


def record_reader(cls: type, schema: dict[str, Any], native: bool = True) -> Reader | None:
    """``read(data, offset)``: the instance of ``cls`` whose Avro body is ``data[offset:]``, all
    of it, written with ``schema`` (``schema_for(cls)``); ``None`` if the schema is unsupported.

    Returns what ``record_from_avro(cls, schemaless_reader(body, schema, None))`` returns.
    ``read`` raises (usually :class:`Mismatch`) on bytes it does not read as fastavro would
    (truncated, trailing, corrupt, unusual encodings): decode with fastavro then, for its result
    or its error.

    With the native module installed (:data:`NATIVE`) and ``native`` true, the reader is
    its ``Reader``: the same objects, raising on the same bytes (``native=False``: the generated
    Python).
    """
    return _native_reader("read", cls, schema, native)


def values_reader(cls: type, schema: dict[str, Any], native: bool = True) -> Reader | None:
    """Like :func:`record_reader`, returning the values of the top record's fields (in the
    schema's order, as ``cls``'s constructor would take them) as a tuple instead of the instance:
    for a caller that builds another object of them."""
    return _native_reader("values", cls, schema, native)


def avro_reader(cls: type, schema: dict[str, Any]) -> Reader | None:
    """Like :func:`record_reader`, returning fastavro's ``schemaless_reader`` dict instead."""
    reader: Reader | None = _generated("dict", cls, schema)
    return reader
