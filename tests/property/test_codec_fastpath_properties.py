"""The compiled converters of ``cqrs.codec.values`` behave exactly as the generic ones.

``record_to_avro`` / ``record_from_avro`` run a function generated per class and fall back to
``record_to_avro_generic`` / ``record_from_avro_generic`` (the node-walking reference) on any
value they do not expect. For random instances of classes covering every field kind: the same
dicts down to the Python types, the same bytes once written, the same decoded objects; and for
values of the wrong type, the same exception type and message.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import attrs
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st
from test_codec_properties import MODEL, AllTypes, Level, Point  # the shared example classes

from cqrs.codec import Codec, InMemorySchemaStore
from cqrs.codec import types as t
from cqrs.codec.types import Node, fields_of
from cqrs.codec.values import (
    record_from_avro,
    record_from_avro_generic,
    record_to_avro,
    record_to_avro_generic,
)
from cqrs.domain import event
from cqrs.results import AggregateRecord, CommandResult, SeenCommand
from cqrs.testing.strategies import for_node, from_message_type

SETTINGS = settings(max_examples=150, deadline=None)


@attrs.frozen
class Tree:
    """A record nested in itself (the compiled converters refer to their own class)."""

    label: str
    children: list[Tree] = attrs.field(factory=list)


@event(name="prop.FastPathKinds")
class Kinds:
    """The kinds and nestings :class:`AllTypes` leaves out."""

    single: float = attrs.field(metadata={"avro.type": "float"})
    maybe_point: Point | None
    maybe_level: Level | None
    holes: list[int | None]
    days_by_key: dict[str, list[dt.date]]
    levels: tuple[Level, ...]
    prices_by_key: dict[str, dict[str, decimal.Decimal]]
    stamps: list[dt.datetime]
    points_by_key: dict[str, Point]
    tree: Tree
    blob: bytes | None = None
    maybe_day: dt.date | None = None


TREES = st.recursive(
    st.builds(Tree, st.text(max_size=5)),
    lambda kids: st.builds(Tree, st.text(max_size=5), st.lists(kids, max_size=3)),
    max_leaves=8,
)

CLASSES: list[type] = [
    AllTypes, Kinds, Point, Tree, CommandResult, AggregateRecord, SeenCommand,
    *MODEL.message_classes(),
]  # fmt: skip
CODEC = Codec(CLASSES, store=InMemorySchemaStore())


def valid(node: Node) -> st.SearchStrategy[Any]:
    """``for_node``, except that trees come from a bounded recursive strategy."""
    if node.cls is Tree:
        return TREES
    if node.kind == t.LIST and node.inner.cls is Tree:  # type: ignore[union-attr]
        return st.lists(TREES, max_size=3)
    return for_node(node)


def instances(cls: type) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` with every field drawn."""
    if cls is Tree:
        return TREES
    return st.builds(cls, **{f.init_name: valid(f.node) for f in fields_of(cls)})


VALUES = st.sampled_from(CLASSES).flatmap(instances)

class _NoOffset(dt.tzinfo):
    """A tzinfo whose ``utcoffset`` is ``None``: such datetimes count as naive."""

    def utcoffset(self, d: dt.datetime | None) -> None:
        return None

    def __repr__(self) -> str:
        return "_NoOffset()"


# values of every shape, many of them of the wrong type for any given field
JUNK: st.SearchStrategy[Any] = st.deferred(
    lambda: st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False),
        st.text(max_size=5),
        st.binary(max_size=5),
        st.builds(bytearray, st.binary(max_size=3)),
        st.datetimes(),  # naive
        st.datetimes(timezones=st.just(dt.timezone.utc)),
        st.datetimes(timezones=st.just(_NoOffset())),  # tzinfo without an offset: naive too
        st.dates(),
        st.decimals(allow_nan=False),
        st.uuids(),
        st.uuids().map(str),
        st.sampled_from(Level),
        st.sampled_from([m.name for m in Level] + ["NOPE"]),
        st.lists(st.integers(-3, 3) | st.text(max_size=2) | st.none(), max_size=3),
        st.lists(st.integers(-3, 3), max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=2) | st.integers(0, 2), st.integers(0, 2), max_size=2),
        st.builds(Point, JUNK, JUNK),
        st.lists(st.builds(Point, st.floats(allow_nan=False), JUNK), max_size=2),
        st.builds(Tree, JUNK),
    )
)


def assert_same(a: Any, b: Any) -> None:
    """Equal, and of the same types all the way down (``1 == 1.0`` is not enough here)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif attrs.has(type(a)):
        for f in attrs.fields(type(a)):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    else:  # NaN (a Decimal read from "NaN") equals nothing, not even itself
        assert a == b or (a != a and repr(a) == repr(b)), (a, b)


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """``("ok", result)`` or ``("error", (exception type, message))``."""
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - comparing exceptions is the point
        return "error", (type(exc), str(exc))


def assert_same_outcome(fast: tuple[str, Any], generic: tuple[str, Any]) -> None:
    assert fast[0] == generic[0], (fast, generic)
    assert_same(fast[1], generic[1])


def write(cls: type, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, CODEC.lookup(cls).parsed, record)
    return buf.getvalue()


def read(cls: type, body: bytes) -> Any:
    return schemaless_reader(io.BytesIO(body), CODEC.lookup(cls).parsed, None)


@SETTINGS
@given(VALUES)
def test_compiled_encoding_gives_the_generic_dict_and_bytes(value: Any) -> None:
    cls = type(value)
    fast, generic = record_to_avro(value), record_to_avro_generic(value)
    assert_same(fast, generic)
    assert write(cls, fast) == write(cls, generic)
    assert CODEC.encode(value) == CODEC.lookup(cls).header + write(cls, generic)


@SETTINGS
@given(VALUES)
def test_compiled_decoding_gives_the_generic_object(value: Any) -> None:
    cls = type(value)
    data = read(cls, write(cls, record_to_avro_generic(value)))
    fast = record_from_avro(cls, data)
    assert_same(fast, record_from_avro_generic(cls, data))
    assert_same(CODEC.decode(CODEC.encode(value)), fast)


@SETTINGS
@given(VALUES, st.data())
def test_decoding_looser_dicts_falls_back_to_the_same_result(value: Any, data: st.DataObject) -> None:
    """What upcasters hand over: Avro-level values (micros, day numbers, strings), missing keys."""
    cls = type(value)
    read_back = read(cls, write(cls, record_to_avro_generic(value)))
    avro_level = record_to_avro_generic(value)
    mixed = {}
    for name in read_back:
        choice = data.draw(st.sampled_from(["read", "avro", "drop"]), label=name)
        if choice != "drop":
            mixed[name] = read_back[name] if choice == "read" else avro_level[name]
    assert_same_outcome(
        outcome(record_from_avro, cls, mixed), outcome(record_from_avro_generic, cls, mixed)
    )


def near(node: Node) -> st.SearchStrategy[Any]:
    """Values a field of ``node`` may be given by mistake (or legitimately, in another type)."""
    kind = node.kind
    extra: st.SearchStrategy[Any] = st.nothing()
    if kind in (t.INT, t.FLOAT):
        limits = [2**31, 2**63]  # both ends of both Avro widths, and one past each
        edges = [v for n in limits for v in (n - 1, n, -n, -n - 1)]
        extra = st.sampled_from([*edges, 2**1024, 0, True, False, 1.5, "1"])
    elif kind == t.DATETIME:
        offsets = st.integers(-23, 23).map(lambda h: dt.timezone(dt.timedelta(hours=h)))
        extra = st.datetimes(timezones=offsets) | st.integers(-(2**40), 2**40)
    elif kind == t.DATE:
        extra = st.integers(-1000, 1000) | st.datetimes()
    elif kind in (t.STR, t.BYTES):
        bad_utf8 = st.sampled_from([b"\xff", b"\xc3", b"ok"])
        extra = bad_utf8 | st.builds(memoryview, st.binary(max_size=3)) | st.builds(_Text, st.text())
    elif kind == t.DECIMAL:
        extra = st.sampled_from(["1.5", "abc", "NaN", "-0"]) | st.floats(allow_nan=False)
    elif kind == t.ENUM:
        extra = st.sampled_from(["LOW", "low", "HIGH", "x"]) | st.lists(st.none(), max_size=1)
    elif kind == t.OPTIONAL:
        extra = near(node.inner)  # type: ignore[arg-type]
    elif kind == t.LIST:
        item = near(node.inner)  # type: ignore[arg-type]
        extra = st.lists(item, max_size=3) | st.lists(item, max_size=3).map(tuple)
    elif kind == t.MAP:
        keys = st.text(max_size=3) | st.integers(0, 3)
        maps = st.dictionaries(keys, near(node.inner), max_size=3)  # type: ignore[arg-type]
        extra = maps | maps.map(MappingProxyType) | maps.map(list)
    elif kind == t.RECORD:
        fields = {f.init_name: JUNK | valid(f.node) for f in fields_of(node.cls)}
        extra = st.builds(node.cls, **fields) | st.dictionaries(st.text(max_size=3), JUNK)
    return st.one_of(extra, valid(node), JUNK)


class _Text(str):
    """A str subclass: accepted by the codec, but not by the compiled guards (generic path)."""


@SETTINGS
@given(VALUES, st.data())
def test_wrong_values_raise_the_generic_error_on_encode(value: Any, data: st.DataObject) -> None:
    """Each field in turn gets a near-miss: same result or same error, whatever ``where`` is."""
    for field in fields_of(type(value)):
        bad = attrs.evolve(value, **{field.init_name: data.draw(near(field.node), label=field.name)})
        for where in (None, "Outer.inner"):
            assert_same_outcome(
                outcome(record_to_avro, bad, where), outcome(record_to_avro_generic, bad, where)
            )


@SETTINGS
@given(VALUES, st.data())
def test_wrong_values_raise_the_generic_error_on_decode(value: Any, data: st.DataObject) -> None:
    """Each field of a read record in turn gets a near-miss: same object or same error."""
    cls = type(value)
    record = read(cls, write(cls, record_to_avro_generic(value)))
    for field in fields_of(cls):
        bad = {**record, field.name: data.draw(near(field.node), label=field.name)}
        for where in (None, "Outer.inner"):
            assert_same_outcome(
                outcome(record_from_avro, cls, bad, where),
                outcome(record_from_avro_generic, cls, bad, where),
            )


@given(instances(CommandResult))
def test_a_result_head_is_the_first_fields_of_the_decoded_result(result: CommandResult) -> None:
    from cqrs.results import result_head

    head = result_head(CODEC.encode(result))
    assert head is not None
    assert (head.command_id, head.status, head.aggregate_type, head.aggregate_id) == (
        result.command_id, result.status, result.aggregate_type, result.aggregate_id)


@given(st.binary(max_size=40))
def test_a_result_head_of_other_bytes_is_none_or_four_strings(value: bytes) -> None:
    from cqrs.results import result_head

    head = result_head(value)
    assert head is None or all(isinstance(x, str) for x in attrs.astuple(head))
