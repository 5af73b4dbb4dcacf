"""The generated Avro writers and readers (``cqrs.codec.binary``) at the edges: the values and
byte sequences where hand-written varint, union, block and timestamp code could go wrong, each
compared with the codec using fastavro only (same bytes, same objects, same errors)."""

from __future__ import annotations

import copy
import datetime as dt
import decimal
import enum
import math
import os
import uuid
from typing import Any

import attrs
import pytest

from cqrs.codec import Codec, InMemorySchemaStore, schema_for
from cqrs.codec import binary as b
from cqrs.codec.binary import avro_reader, record_reader, record_writer, values_reader
from cqrs.codec.single_object import HEADER_SIZE
from cqrs.domain import event
from cqrs.errors import DecodeError, EncodeError, NaiveDatetimeError, TruncatedMessageError

UTC = dt.timezone.utc


class Shade(enum.Enum):
    DARK = "d"
    LIGHT = "l"
    DIM = "d"  # an alias: not a symbol of its own


@attrs.frozen
class Inner:
    n: int
    shade: Shade = Shade.LIGHT


@event(name="test.binary.Edges")
class Edges:
    wide: int = 0
    narrow: int = attrs.field(default=0, metadata={"avro.type": "int"})
    single: float = attrs.field(default=0.0, metadata={"avro.type": "float"})
    double: float = 0.0
    flag: bool = False
    text: str = ""
    raw: bytes = b""
    at: dt.datetime = dt.datetime(2024, 1, 1, tzinfo=UTC)
    day: dt.date = dt.date(2024, 1, 1)
    price: decimal.Decimal = decimal.Decimal("1.5")
    ident: uuid.UUID = uuid.UUID(int=1)
    shade: Shade = Shade.DARK
    maybe: int | None = None
    kept: int | None = 7  # non-null default: ["long", "null"]
    items: list[int] = attrs.field(factory=list)
    by_key: dict[str, Inner] = attrs.field(factory=dict)
    inner: Inner | None = None
    pair: tuple[str, ...] = ()


@event(name="test.binary.Empty")
class Empty:
    pass


class FastavroCodec(Codec):
    _generated = False


CODEC = Codec([Edges, Empty], store=InMemorySchemaStore())
REFERENCE = FastavroCodec([Edges, Empty], store=InMemorySchemaStore())
HEADER = CODEC.lookup(Edges).header


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - comparing exceptions is the point
        return "error", (type(exc), str(exc))


def same_encoding(obj: Any) -> tuple[str, Any]:
    fast = outcome(CODEC.encode, obj)
    assert fast == outcome(REFERENCE.encode, obj)
    return fast


def same_decoding(data: bytes) -> tuple[str, Any]:
    fast = outcome(CODEC.decode, data)
    slow = outcome(REFERENCE.decode, data)
    assert fast[0] == slow[0]
    if fast[0] == "error":
        assert fast == slow
    else:  # same types (True is not 1, 1.0 is not 1), same float bits (NaN is not NaN)
        assert repr(fast[1]) == repr(slow[1])
        for f in attrs.fields(type(fast[1])):
            assert type(getattr(fast[1], f.name)) is type(getattr(slow[1], f.name))
        assert REFERENCE.encode(fast[1]) == REFERENCE.encode(slow[1])
    return fast


EDGE_VALUES: list[tuple[str, Any]] = [
    *[("wide", v) for v in (0, 1, -1, 63, 64, -64, -65, 8191, 8192, -8193, 2**31, 2**62)],
    *[("wide", v) for v in (2**63 - 1, -(2**63), 2**63, -(2**63) - 1, True, 1.0)],
    *[("narrow", v) for v in (2**31 - 1, -(2**31), 2**31, -(2**31) - 1)],
    *[("single", v) for v in (1e300, -1e300, 3.4e38, 1e-50, -0.0, math.inf, math.nan, 3, 2**200)],
    *[("double", v) for v in (math.nan, -math.inf, -0.0, 5e-324, 7, 2**1024)],
    ("flag", True), ("flag", 1), ("flag", None),
    *[("text", v) for v in ("x" * 63, "x" * 64, "é" * 40, "€" * 3000, "\ud800", b"x")],
    *[("raw", v) for v in (b"x" * 64, b"\x00" * 5000, bytearray(b"ab"), memoryview(b"cd"))],
    *[("at", dt.datetime(*ymd, tzinfo=UTC)) for ymd in ((1970, 1, 1), (1, 1, 1), (1978, 12, 1))],
    *[("at", dt.datetime(*ymd, tzinfo=UTC)) for ymd in ((1979, 1, 1), (3111, 1, 1), (3112, 1, 1))],
    ("at", dt.datetime.max.replace(tzinfo=UTC)),
    ("at", dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    *[("at", b.EPOCH + dt.timedelta(microseconds=2**k + d)) for k in (19, 20, 48) for d in (-1, 0)],
    ("at", dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=-7)))),
    ("at", dt.datetime(2024, 5, 1, 12)),  # naive
    ("at", 1_700_000_000),
    *[("day", v) for v in (dt.date.min, dt.date.max, dt.date(1970, 1, 1), dt.datetime(2024, 1, 1))],
    ("price", decimal.Decimal("NaN")), ("price", decimal.Decimal("-0.00")), ("price", "1"),
    ("ident", uuid.UUID(int=2**128 - 1)), ("ident", str(uuid.UUID(int=3))),
    ("shade", Shade.DIM), ("shade", Shade.LIGHT), ("shade", "DARK"),
    ("maybe", 5), ("maybe", -(2**63)), ("maybe", "5"),
    ("kept", None), ("kept", 0), ("kept", 2**63),
    ("items", list(range(63))), ("items", list(range(-64, 64))), ("items", (1, 2)),
    ("items", [1, "2"]),
    ("by_key", {str(i): Inner(i, Shade.DIM) for i in range(70)}), ("by_key", {1: Inner(1)}),
    ("by_key", {"\ud800": Inner(1)}), ("by_key", {"k": {"n": 1}}),
    ("inner", Inner(-1)), ("inner", Inner(2**64)),  # type: ignore[arg-type]
    ("pair", ("a", "b" * 100)), ("pair", ["c"]), ("pair", ("a", None)),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), EDGE_VALUES, ids=lambda v: repr(v)[:30])
def test_edge_values_encode_and_decode_as_with_fastavro(field: str, value: Any) -> None:
    obj = attrs.evolve(Edges(), **{field: value})
    encoded = same_encoding(obj)
    if encoded[0] == "ok":
        decoded = same_decoding(encoded[1])
        assert decoded[0] == "ok"


def test_naive_datetimes_and_wrong_types_keep_their_errors() -> None:
    with pytest.raises(NaiveDatetimeError, match=r"Edges\.at = "):
        CODEC.encode(Edges(at=dt.datetime(2024, 1, 1)))
    with pytest.raises(EncodeError, match=r"Edges\.by_key\['k'\]\.n = 'x'"):
        CODEC.encode(Edges(by_key={"k": Inner("x")}))  # type: ignore[arg-type]


def body_of(obj: Any) -> bytes:
    return REFERENCE.encode(obj)[len(HEADER) :]


def varint(v: int) -> bytes:
    n = (v << 1) ^ (v >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


DEFAULT_BODY = body_of(Edges())


def tail_body(maybe: bytes, kept: bytes, items: bytes, by_key: bytes = b"\x00",
              inner: bytes = b"\x00", pair: bytes = b"\x00") -> bytes:  # fmt: skip
    """A message of ``Edges()`` whose last fields are the given raw bytes."""
    return HEADER + DEFAULT_BODY[:-7] + maybe + kept + items + by_key + inner + pair


def test_the_tail_helper_rebuilds_the_default_message() -> None:
    assert DEFAULT_BODY[-7:] == b"\x00\x00\x0e\x00\x00\x00\x00"  # maybe, kept=7, 4 empties
    assert tail_body(b"\x00", b"\x00\x0e", b"\x00") == HEADER + DEFAULT_BODY


# unusual encodings: fastavro reads some (the generated reader leaves them to it), fails others
UNUSUAL: list[tuple[str, bytes]] = [
    ("union index as two bytes", tail_body(b"\x80\x00", b"\x00\x0e", b"\x00")),
    ("union index 1 as two bytes", tail_body(b"\x82\x00\x0a", b"\x00\x0e", b"\x00")),
    ("union index -1", tail_body(b"\x01\x0a", b"\x00\x0e", b"\x00")),
    ("union index 2", tail_body(b"\x04\x0a", b"\x00\x0e", b"\x00")),
    ("null-second union's null", tail_body(b"\x00", b"\x02", b"\x00")),
    ("negative block count", tail_body(b"\x00", b"\x02", b"\x03\x04\x02\x04\x00")),
    ("two blocks", tail_body(b"\x00", b"\x02", b"\x02\x02\x02\x04\x00")),
    ("count as two bytes", tail_body(b"\x00", b"\x02", b"\x84\x00\x02\x04\x00")),
    ("overlong zero", tail_body(b"\x00", b"\x00" + b"\x80" * 10 + b"\x00", b"\x00")),
    ("ten-byte varint", tail_body(b"\x00", b"\x00" + b"\xff" * 9 + b"\x01", b"\x00")),
    ("ten-byte varint past 64 bits", tail_body(b"\x00", b"\x00" + b"\xff" * 9 + b"\x7f", b"\x00")),
    ("eleven-byte varint", tail_body(b"\x00", b"\x00" + b"\xff" * 10 + b"\x01", b"\x00")),
    ("huge block count", tail_body(b"\x00", b"\x02", varint(2**62) + b"\x02")),
    ("negative string length", tail_body(b"\x00", b"\x02", b"\x00", b"\x02\x01")),
    ("map key as bad UTF-8", tail_body(b"\x00", b"\x02", b"\x00", b"\x02\x02\xff\x02\x02\x00")),
    ("enum index -1", tail_body(b"\x00", b"\x02", b"\x00", b"\x02\x02k\x02\x01\x00")),
    ("enum index 9", tail_body(b"\x00", b"\x02", b"\x00", b"\x02\x02k\x02\x12\x00")),
    ("nested record, truncated", tail_body(b"\x00", b"\x02", b"\x00", b"\x00", b"\x02\x02")),
    ("tuple items", tail_body(b"\x00", b"\x02", b"\x00", b"\x00", b"\x00", b"\x04\x02a\x00\x00")),
]  # fmt: skip


def readers_agree(cls: type, schema: dict[str, Any], data: bytes, offset: int) -> tuple[str, Any]:
    """The native reader (when installed) and the generated Python one both raise, or both
    read the same objects; the Python reader's outcome."""
    python_reader, native_reader = (record_reader(cls, schema, native=n) for n in (False, True))
    python = outcome(python_reader, data, offset)
    native = outcome(native_reader, data, offset)
    assert native[0] == python[0], (native, python)
    if python[0] == "ok":
        assert repr(native[1]) == repr(python[1])
        for f in attrs.fields(cls):
            assert type(getattr(native[1], f.name)) is type(getattr(python[1], f.name))
    return python


@pytest.mark.parametrize(("label", "data"), UNUSUAL, ids=[u[0] for u in UNUSUAL])
def test_unusual_encodings_decode_as_with_fastavro(label: str, data: bytes) -> None:
    same_decoding(data)
    readers_agree(Edges, CODEC.lookup(Edges).schema, data, len(HEADER))


def single(hint: Any) -> type:
    """A class with one field ``x: hint``."""
    cls = attrs.make_class("Single", {"x": attrs.field(type=hint)}, frozen=True)
    cls.__module__ = __name__
    cls.__qualname__ = f"Single_{abs(hash(repr(hint)))}"
    return cls


# bodies of one field that fastavro cannot read, or reads its own way
CORRUPT: list[tuple[Any, bytes]] = [
    (bool, b"\x02"), (bool, b"\xff"), (bool, b""),
    (str, b"\x04\xff\xfe"), (str, b"\x04\xed\xa0"), (str, b"\x01"), (str, b"\x04a"),
    (bytes, b"\x05ab"), (bytes, b"\x80"),
    (decimal.Decimal, b"\x04ab"), (uuid.UUID, b"\x06abc"),
    (dt.datetime, varint(2**62)), (dt.datetime, varint(-(2**62))), (dt.datetime, b"\xff" * 9),
    (dt.date, varint(2**30)), (dt.date, varint(-(2**30))),
    (Shade, b"\x04"), (Shade, b"\x01"), (Shade, b"\x80\x00"),
    (float, b"\x00" * 7), (int | None, b"\x06"), (int | None, b"\x02"),
    (list[int], b"\x02"), (list[int], b"\x01\x02\x02\x00"), (dict[str, int], b"\x02\x02k"),
]  # fmt: skip


@pytest.mark.parametrize(("hint", "data"), CORRUPT, ids=lambda v: repr(v)[:24])
def test_corrupt_values_read_as_with_fastavro(hint: Any, data: bytes) -> None:
    cls = single(hint)
    fast, slow = Codec([cls]), FastavroCodec([cls])
    message = fast.lookup(cls).header + data
    assert outcome(fast.decode, message) == outcome(slow.decode, message)
    readers_agree(cls, fast.lookup(cls).schema, message, HEADER_SIZE)


_US = 86_400_000_000
# microseconds and days from the epoch at and just past the ends of Python's datetime and date
TIME_EDGES = [-719_162 * _US, -719_162 * _US - 1, 2_932_897 * _US - 1, 2_932_897 * _US,
              -1, 0, 2**63 - 1, -(2**63), 951_782_400_000_000, 951_868_799_999_999]
DAY_EDGES = [-719_162, -719_163, 2_932_896, 2_932_897, -1, 0, 11_016, 11_017, 2**63 - 1, -(2**63)]


@pytest.mark.parametrize(("hint", "v"), [(dt.datetime, v) for v in TIME_EDGES]
                         + [(dt.date, v) for v in DAY_EDGES], ids=repr)
def test_times_and_dates_read_the_same_to_the_ends_of_their_range(hint: Any, v: int) -> None:
    """``EPOCH + timedelta(microseconds=v)`` and ``date.fromordinal``: the native reader's
    calendar arithmetic builds the same values and raises beyond the same ends."""
    cls = single(hint)
    fast, slow = Codec([cls]), FastavroCodec([cls])
    message = fast.lookup(cls).header + varint(v)
    read = readers_agree(cls, fast.lookup(cls).schema, message, HEADER_SIZE)
    assert outcome(fast.decode, message) == outcome(slow.decode, message)
    if read[0] == "ok":
        assert read[1].x == (b.EPOCH + dt.timedelta(microseconds=v) if hint is dt.datetime
                             else dt.date.fromordinal(v + 719_163))


def test_truncated_and_trailing_bytes_keep_their_errors() -> None:
    data = CODEC.encode(Edges(text="hello", items=[1, 2, 3]))
    for cut in range(len(HEADER), len(data)):
        error = same_decoding(data[:cut])
        assert error[0] == "error" and error[1][0] in (TruncatedMessageError, DecodeError)
    with pytest.raises(TruncatedMessageError, match="ends early"):
        CODEC.decode(data[:-1])
    with pytest.raises(DecodeError, match="1 bytes left after a test.binary.Edges v1 message"):
        CODEC.decode(data + b"\x00")
    assert same_decoding(CODEC.encode(Empty()) + b"\x00")[0] == "error"
    assert CODEC.decode(CODEC.encode(Empty())) == Empty()


def test_timestamps_remembered_or_not_read_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(b, "_TIME_CACHE_SIZE", 3)  # the caches fill up and are emptied often
    b._TIME_HIGH.clear()  # (filled by earlier tests beyond 3)
    b._TIME_BASES.clear()
    # the generated Python ones have the caches (the codec may use the native ones)
    python_writer = record_writer(Edges, schema_for(Edges), native=False)
    python_reader = record_reader(Edges, schema_for(Edges), native=False)
    assert python_writer is not None and python_reader is not None
    start = dt.datetime(2024, 5, 1, 12, tzinfo=UTC)
    for step in range(0, 40_000_000, 999_983):  # across second and 2**20 µs boundaries
        obj = Edges(at=start + dt.timedelta(microseconds=step))
        data = REFERENCE.encode(obj)
        assert CODEC.encode(obj) == data
        assert python_writer(obj) == data[HEADER_SIZE:]
        assert CODEC.decode(data) == REFERENCE.decode(data) == obj
        assert CODEC.decode(data) == obj
        assert python_reader(data, HEADER_SIZE) == obj
        assert python_reader(data, HEADER_SIZE) == obj  # remembered now (unless just emptied)
    assert len(b._TIME_BASES) <= 3 and len(b._TIME_HIGH) <= 3


def test_remembered_timestamps_are_not_confused_with_negative_ones() -> None:
    """Zig-zag puts the sign in the first byte: -v - 1 and v share the other seven."""
    negative = -(2**50) - 12_345
    for v in (negative, -negative - 1, negative, -negative - 1):
        obj = Edges(at=b.EPOCH + dt.timedelta(microseconds=v))
        data = REFERENCE.encode(obj)
        assert CODEC.encode(obj) == data
        assert CODEC.decode(data) == obj


def test_a_negative_length_never_moves_the_reader_back() -> None:
    cls = attrs.make_class("TwoTexts", {"x": attrs.field(type=str), "y": attrs.field(type=str)})
    cls.__module__ = __name__
    read = record_reader(cls, schema_for(cls))
    # read back from a length of -2, y would be the whole of these three bytes
    with pytest.raises(b.Mismatch):
        read(b"\x03A\x06", 0)  # type: ignore[misc]


def test_readers_take_bytes_like_input_and_offsets() -> None:
    obj = Edges(text="t", items=[5], by_key={"k": Inner(3)}, pair=("x",))
    data = CODEC.encode(obj)
    for view in (bytearray(data), memoryview(data), memoryview(b"xx" + data)[2:]):
        assert CODEC.decode(view) == obj
    schema = CODEC.lookup(Edges).schema
    assert record_reader(Edges, schema)(data, len(HEADER)) == obj  # type: ignore[misc]
    record = avro_reader(Edges, schema)(data, len(HEADER))  # type: ignore[misc]
    assert record["shade"] == "DARK" and record["pair"] == ["x"]  # fastavro's types
    assert record["by_key"] == {"k": {"n": 3, "shade": "LIGHT"}}
    assert record["price"] == "1.5" and record["ident"] == uuid.UUID(int=1)
    values = values_reader(Edges, schema)(data, len(HEADER))  # type: ignore[misc]
    assert values == tuple(getattr(obj, f.name) for f in attrs.fields(Edges))  # objects inside


def schema_with(change: Any) -> dict[str, Any]:
    schema = copy.deepcopy(schema_for(Edges))
    change(schema)
    return schema


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f["name"] == name)


UNSUPPORTED = {
    "time logical type": lambda s: _field(s, "wide").update(
        type={"type": "long", "logicalType": "time-micros"}
    ),
    "decimal logical type": lambda s: _field(s, "raw").update(
        type={"type": "bytes", "logicalType": "decimal", "precision": 4}
    ),
    "three-branch union": lambda s: _field(s, "maybe").update(type=["null", "long", "string"]),
    "renamed field": lambda s: _field(s, "wide").update(name="broad"),
    "missing field": lambda s: s["fields"].pop(),
    "reordered symbols": lambda s: _field(s, "shade")["type"].update(symbols=["LIGHT", "DARK"]),
    "enum default": lambda s: _field(s, "shade")["type"].update(default="DARK"),
    "namespace": lambda s: _field(s, "by_key")["type"]["values"].update(namespace="x"),
    "unknown reference": lambda s: _field(s, "inner").update(type=["null", "other.Inner"]),
    "narrowed long": lambda s: _field(s, "wide").update(type="int"),
    "array of map": lambda s: _field(s, "items").update(type={"type": "map", "values": "long"}),
}


@pytest.mark.parametrize("change", UNSUPPORTED.values(), ids=list(UNSUPPORTED))
def test_schemas_other_than_the_classes_get_no_generated_code(change: Any) -> None:
    schema = schema_with(change)
    assert record_writer(Edges, schema) is None
    assert record_reader(Edges, schema) is None
    assert avro_reader(Edges, schema) is None


def test_generated_code_is_cached_per_class_schema_and_prefix() -> None:
    schema = schema_for(Edges)
    assert record_writer(Edges, schema) is record_writer(Edges, schema_for(Edges))
    assert record_writer(Edges, schema, b"x") is not record_writer(Edges, schema)
    assert record_reader(Edges, schema) is record_reader(Edges, schema)
    assert record_reader(Edges, schema) is not avro_reader(Edges, schema)


def test_the_codec_uses_the_generated_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once past the first message of a class, neither direction calls fastavro."""
    from cqrs.codec import registry

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("fastavro called")

    codec = Codec([Edges])
    obj = Edges(text="t", at=dt.datetime(2000, 1, 1, tzinfo=UTC), items=[1], inner=Inner(2))
    expected = REFERENCE.encode(obj)
    monkeypatch.setattr(registry, "schemaless_writer", fail)
    monkeypatch.setattr(registry, "schemaless_reader", fail)
    data = codec.encode(obj)
    assert data == expected
    assert codec.decode(data) == obj
    assert codec.decode(memoryview(data)) == obj
    with pytest.raises(DecodeError, match="fastavro called"):  # fastavro decides these
        codec.decode(data + b"\x00")


def test_the_native_writer_and_reader_are_used_when_the_environment_expects_them() -> None:
    """CI installs the native module (native/) and says so: a build that failed to load would
    otherwise leave every test on the generated Python writers and readers, unnoticed."""
    from cqrs.codec import binary

    if os.environ.get("CQRS_TEST_NATIVE") != "1":
        pytest.skip("CQRS_TEST_NATIVE=1 is not set: the native writer is optional")
    assert binary.NATIVE, "cqrs_native is not importable: pip install ./native"
    writer = record_writer(Edges, schema_for(Edges))
    assert type(writer).__module__ == "cqrs_native"
    for make in (record_reader, values_reader):
        assert type(make(Edges, schema_for(Edges))).__module__ == "cqrs_native"
        assert type(make(Edges, schema_for(Edges), native=False)).__module__ != "cqrs_native"
