"""The generated Avro writers and readers of ``cqrs.codec.binary`` behave exactly as fastavro.

For random instances of classes covering every field kind (the compiled-converter properties'
classes, the processor's records, the example bank's messages, plus long strings, big
containers and optionals with non-null defaults): the writer gives fastavro's bytes, the readers
give fastavro's dicts and the objects built from them. Truncated, extended and corrupted
messages, and values of the wrong type, give the same results or errors (types and messages)
as a codec that uses fastavro only. Where the native module is installed, its writer and
reader are held to the same, and to the generated Python ones (``native=False``).
"""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import attrs
import pytest
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st
from test_codec_fastpath_properties import (  # the compiled converters' classes and helpers
    CLASSES as CONVERTER_CLASSES,
)
from test_codec_fastpath_properties import (
    Level,
    Point,
    assert_same,
    assert_same_outcome,
    instances,
    near,
    outcome,
)

from cqrs.codec import Codec, InMemorySchemaStore
from cqrs.codec.binary import (
    NATIVE,
    avro_reader,
    record_reader,
    record_writer,
    values_reader,
)
from cqrs.codec.single_object import HEADER_SIZE
from cqrs.codec.types import fields_of
from cqrs.codec.values import record_from_avro, record_to_avro_generic
from cqrs.domain import event
from cqrs.results import AggregateRecord, CommandResult
from cqrs.testing.example import AccountOpened, Deposited, Withdrawn

SETTINGS = settings(max_examples=120, deadline=None)


@event(name="prop.binary.Sizes")
class Sizes:
    """Multi-byte lengths and block counts (the other classes' values are short)."""

    text: str
    blob: bytes
    many: list[int]
    by_key: dict[str, Point]
    maybe_text: str | None = None


@event(name="prop.binary.Defaults")
class Defaults:
    """Optionals whose default is not null: their unions put the value's branch first."""

    count: int | None = 5
    level: Level | None = Level.HIGH
    label: str | None = "x"
    at: dt.datetime | None = None


@attrs.frozen
class Stamp:
    at: dt.datetime


@event(name="prop.binary.Keywords")
class Keywords:
    """Fields the constructor takes by keyword: the readers call it with their names."""

    first: int
    _hidden: str = ""
    after: list[Point] = attrs.field(factory=list, kw_only=True)
    at: dt.datetime | None = attrs.field(default=None, kw_only=True)


class FastavroCodec(Codec):
    """The reference: the codec with fastavro only."""

    _generated = False


CLASSES: list[type] = [*CONVERTER_CLASSES, Sizes, Defaults, Stamp, Keywords]
assert {CommandResult, AggregateRecord, AccountOpened, Deposited, Withdrawn} <= set(CLASSES)
CODEC = Codec(CLASSES, store=InMemorySchemaStore())
REFERENCE = FastavroCodec(CLASSES, store=InMemorySchemaStore())

LONG_TEXT = st.text(min_size=30, max_size=400)  # 64 bytes and more: two-byte lengths
SIZES = st.builds(
    Sizes,
    LONG_TEXT,
    st.binary(min_size=60, max_size=3000),
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=60, max_size=150),
    st.dictionaries(st.text(max_size=3), st.builds(Point, st.floats(), st.floats()), max_size=70),
    st.none() | LONG_TEXT,
)


def values_of(cls: type) -> st.SearchStrategy[Any]:
    return SIZES if cls is Sizes else instances(cls)


VALUES = st.sampled_from(CLASSES).flatmap(values_of)


def body(value: Any) -> bytes:
    """What fastavro writes for ``value``."""
    buf = io.BytesIO()
    schemaless_writer(buf, CODEC.lookup(type(value)).parsed, record_to_avro_generic(value))
    return buf.getvalue()


def message(value: Any) -> bytes:
    return CODEC.lookup(type(value)).header + body(value)


def readers(cls: type) -> list[Any]:
    """The readers of ``cls`` (objects, then values): native when installed, then Python."""
    schema = CODEC.lookup(cls).schema
    found = [make(cls, schema, native=n) for make in (record_reader, values_reader)
             for n in (True, False)]  # fmt: skip
    assert None not in found
    return found


def assert_readers_agree(cls: type, data: bytes, offset: int) -> tuple[str, Any]:
    """The native and the generated Python readers of ``cls`` both raise on ``data[offset:]``
    or both read the same objects (their errors may differ: the codec falls back on any)."""
    native, python, native_values, python_values = (outcome(r, data, offset) for r in readers(cls))
    assert native[0] == python[0] == native_values[0] == python_values[0], (native, python)
    if native[0] == "ok":
        assert_same(native[1], python[1])
        assert_same(native_values[1], python_values[1])
        assert_same(native_values[1], tuple(getattr(native[1], f.name) for f in fields_of(cls)))
    return python


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__qualname__)
def test_every_class_gets_generated_code(cls: type) -> None:
    schema = CODEC.lookup(cls).schema
    assert record_writer(cls, schema) is not None
    assert record_reader(cls, schema) is not None
    assert avro_reader(cls, schema) is not None
    if NATIVE:  # every class's plan is one the native reader takes
        assert type(record_reader(cls, schema)).__module__ == "cqrs_native"
        assert type(values_reader(cls, schema)).__module__ == "cqrs_native"


@SETTINGS
@given(VALUES)
def test_the_writer_writes_fastavros_bytes(value: Any) -> None:
    cls, expected = type(value), body(value)
    reg = CODEC.lookup(cls)
    write, prefixed = record_writer(cls, reg.schema), record_writer(cls, reg.schema, b"@")
    python = record_writer(cls, reg.schema, b"@", native=False)  # the generated Python writer
    assert write is not None and prefixed is not None and python is not None
    assert write(value) == expected and prefixed(value) == b"@" + expected == python(value)
    assert CODEC.encode(value) == reg.header + expected == REFERENCE.encode(value)
    values = tuple(getattr(value, f.name) for f in fields_of(cls))
    from_values = CODEC.values_writer(cls)
    assert from_values is not None and from_values(values) == reg.header + expected


@SETTINGS
@given(VALUES)
def test_the_readers_read_what_fastavro_reads(value: Any) -> None:
    cls, data = type(value), body(value)
    schema = CODEC.lookup(cls).schema
    expected = schemaless_reader(io.BytesIO(data), CODEC.lookup(cls).parsed, None)
    assert_same(avro_reader(cls, schema)(data, 0), expected)  # type: ignore[misc]
    decoded = record_reader(cls, schema)(b"xyz" + data, 3)  # type: ignore[misc]
    assert_same(decoded, record_from_avro(cls, expected))
    for _ in range(2):  # the second time with the timestamps' high parts remembered
        assert_same(CODEC.decode(message(value)), decoded)
        assert_same(REFERENCE.decode(message(value)), decoded)
    assert_same(CODEC.decode(bytearray(message(value))), decoded)
    assert_same(CODEC.decode(memoryview(message(value))), decoded)
    read = assert_readers_agree(cls, b"xyz" + data, 3)
    assert read[0] == "ok"
    assert_same(read[1], decoded)


@SETTINGS
@given(VALUES, st.data())
def test_truncated_messages_fail_as_with_fastavro(value: Any, data: st.DataObject) -> None:
    full = message(value)
    cut = data.draw(st.integers(0, len(full) - 1), label="cut")
    truncated = full[:cut]
    fast = outcome(CODEC.decode, truncated)
    assert fast[0] == "error"
    assert_same_outcome(fast, outcome(REFERENCE.decode, truncated))
    if cut >= HEADER_SIZE:  # no reader reads a prefix as a message: whatever they raise,
        assert assert_readers_agree(type(value), truncated, HEADER_SIZE)[0] == "error"
        # the codec falls back to fastavro


@SETTINGS
@given(VALUES, st.binary(min_size=1, max_size=9))
def test_trailing_bytes_fail_as_with_fastavro(value: Any, extra: bytes) -> None:
    extended = message(value) + extra
    fast = outcome(CODEC.decode, extended)
    assert fast[0] == "error"
    assert_same_outcome(fast, outcome(REFERENCE.decode, extended))
    assert assert_readers_agree(type(value), extended, HEADER_SIZE)[0] == "error"


@SETTINGS
@given(VALUES, st.data())
def test_corrupted_messages_decode_as_with_fastavro(value: Any, data: st.DataObject) -> None:
    """Any byte of the body replaced (varints, lengths, union indexes, counts...): same object
    or same error."""
    corrupted = bytearray(message(value))
    if len(corrupted) == HEADER_SIZE:
        corrupted += data.draw(st.binary(min_size=1, max_size=3), label="body")
    for _ in range(data.draw(st.integers(1, 3), label="changes")):
        at = data.draw(st.integers(HEADER_SIZE, len(corrupted) - 1), label="at")
        corrupted[at] = data.draw(st.integers(0, 255), label="byte")
    expected = outcome(REFERENCE.decode, bytes(corrupted))
    assert_same_outcome(outcome(CODEC.decode, bytes(corrupted)), expected)
    read = assert_readers_agree(type(value), bytes(corrupted), HEADER_SIZE)
    if read[0] == "ok":  # what the readers read at all, they read as fastavro does
        assert_same_outcome(read, expected)


@SETTINGS
@given(VALUES, st.data())
def test_wrong_values_raise_the_same_errors(value: Any, data: st.DataObject) -> None:
    """Each field in turn gets a near-miss: same bytes or same error as with fastavro."""
    for field in fields_of(type(value)):
        wrong = data.draw(near(field.node), label=field.name)
        bad = attrs.evolve(value, **{field.init_name: wrong})
        assert_same_outcome(outcome(CODEC.encode, bad), outcome(REFERENCE.encode, bad))
        # the native writer and the generated Python one take and refuse the same values
        # (their errors may differ: the codec encodes again through the path that names them)
        schema = CODEC.lookup(type(value)).schema
        native, python = (outcome(record_writer(type(value), schema, native=n), bad)  # type: ignore[arg-type]
                          for n in (True, False))
        assert native[0] == python[0] and (native[0] == "error" or native[1] == python[1]), \
            (native, python)


OFFSETS = st.integers(-23, 23).map(lambda h: dt.timezone(dt.timedelta(hours=h)))
TIMES = st.datetimes(
    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=OFFSETS
)


@SETTINGS
@given(TIMES, st.lists(st.integers(-(2**22), 2**22), max_size=8))
def test_timestamps_close_to_each_other(start: dt.datetime, steps: list[int]) -> None:
    """Timestamps sharing their high part (remembered by the writer and the reader)."""
    at = start
    for step in [0, *steps]:
        try:
            at += dt.timedelta(microseconds=step)
        except OverflowError:
            continue
        stamp = Stamp(at)
        data = REFERENCE.encode(stamp)
        assert CODEC.encode(stamp) == data
        decoded = CODEC.decode(data)
        assert_same(decoded, REFERENCE.decode(data))
        assert decoded == stamp and decoded.at.tzinfo is dt.timezone.utc
