"""The compiled converters keep the generic converters' errors, and the codec's fast paths its
behaviour: same exception types and messages (naming ``Class.field`` and the value)."""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import threading
import uuid
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import attrs
import pytest
from test_codec import SAMPLE, Color, Everything, Money  # the codec tests' kitchen-sink class

from cqrs.codec import Codec, InMemorySchemaStore
from cqrs.codec.values import (
    record_from_avro,
    record_from_avro_generic,
    record_to_avro,
    record_to_avro_generic,
)
from cqrs.domain import event
from cqrs.errors import DecodeError, EncodeError, NaiveDatetimeError, TruncatedMessageError

UTC = dt.timezone.utc


class NoOffset(dt.tzinfo):
    """A tzinfo whose ``utcoffset`` is ``None``: the codec treats such datetimes as naive."""

    def utcoffset(self, d: dt.datetime | None) -> None:
        return None


class Text(str):
    """A str subclass: valid for the codec, but not what the compiled guards expect."""


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """``("ok", result)`` or ``("error", (type, message))``, to compare two paths."""
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - comparing exceptions is the point
        return "error", (type(exc), str(exc))


# (field, value, expected error or None when the value is accepted)
ENCODE_CASES: list[tuple[str, Any, type[Exception] | None]] = [
    ("s", 3, EncodeError),
    ("s", b"x", EncodeError),
    ("s", Text("sub"), None),
    ("i", "5", EncodeError),
    ("i", True, EncodeError),
    ("i", 1.0, EncodeError),
    ("i", 2**63, EncodeError),
    ("i", -(2**63) - 1, EncodeError),
    ("i", 2**63 - 1, None),
    ("i", -(2**63), None),
    ("f", 3, None),
    ("f", True, EncodeError),
    ("f", "1.5", EncodeError),
    ("f", 2**1024, OverflowError),
    ("b", 1, EncodeError),
    ("raw", "text", EncodeError),
    ("raw", bytearray(b"ab"), None),
    ("raw", memoryview(b"ab"), None),
    ("at", dt.datetime(2024, 1, 1), NaiveDatetimeError),
    ("at", dt.datetime(2024, 1, 1, tzinfo=NoOffset()), NaiveDatetimeError),
    ("at", dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=-5))), None),
    ("at", 1_700_000_000, EncodeError),
    ("day", dt.datetime(2024, 1, 1, tzinfo=UTC), EncodeError),
    ("day", 19000, EncodeError),
    ("price", 1.5, EncodeError),
    ("price", "1.5", EncodeError),
    ("ident", str(uuid.UUID(int=7)), EncodeError),
    ("color", "RED", EncodeError),
    ("color", 1, EncodeError),
    ("maybe", "x", EncodeError),
    ("maybe", True, EncodeError),
    ("maybe", 2**64, EncodeError),
    ("tags", ["a", 1], EncodeError),
    ("tags", "ab", EncodeError),
    ("tags", ("a", "b"), None),
    ("pair", [1, "2"], EncodeError),
    ("pair", [1, 2], None),
    ("by_key", {1: Money(decimal.Decimal(1))}, EncodeError),
    ("by_key", {"k": "m"}, EncodeError),
    ("by_key", {"k": Money(1.5)}, EncodeError),  # type: ignore[arg-type]
    ("by_key", MappingProxyType({"k": Money(decimal.Decimal(1))}), None),
    ("money", {"amount": 1}, EncodeError),
    ("money", Money("1"), EncodeError),  # type: ignore[arg-type]
    ("other_money", Money(decimal.Decimal(2), 5), EncodeError),  # type: ignore[arg-type]
    ("note", b"x", EncodeError),
]


@pytest.mark.parametrize(("field", "value", "error"), ENCODE_CASES)
def test_compiled_encoding_raises_the_generic_error(
    field: str, value: Any, error: type[Exception] | None
) -> None:
    bad = attrs.evolve(SAMPLE, **{field: value})
    for where in ("Outer.inner", None):
        fast = outcome(record_to_avro, bad, where)
        assert fast == outcome(record_to_avro_generic, bad, where)
        if error is None:
            assert fast[0] == "ok"
            continue
        assert fast[0] == "error" and fast[1][0] is error
        if error is not OverflowError:  # the codec's own messages name the path and the value
            assert f"{where or 'Everything'}.{field}" in fast[1][1]
    if error is not None:  # what Codec.encode raises: the top-level (where=None) error
        with pytest.raises(error) as raised:
            Codec([Everything]).encode(bad)
        assert str(raised.value) == fast[1][1]


@event(name="test.fastpath.Widths")
class Widths:
    wide: int
    narrow: int = attrs.field(metadata={"avro.type": "int"})
    single: float = attrs.field(metadata={"avro.type": "float"})


@pytest.mark.parametrize("bits", [31, 63])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_int_range_edges(bits: int, offset: int) -> None:
    for value in (2**bits - 1 + offset, -(2**bits) - offset):
        for obj in (Widths(value, 0, 0.0), Widths(0, value, 0.0), Widths(0, 0, value)):
            assert outcome(record_to_avro, obj) == outcome(record_to_avro_generic, obj)


def test_nested_and_listed_records_name_their_path() -> None:
    bad = attrs.evolve(SAMPLE, by_key={"k": Money(decimal.Decimal(1), 7)})  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match=r"Everything\.by_key\['k'\]\.currency = 7"):
        record_to_avro(bad)


# (what to change in a decoded record, expected error or None when it decodes)
DECODE_CASES: list[tuple[dict[str, Any], type[Exception] | None]] = [
    ({"i": "5"}, DecodeError),
    ({"i": None}, DecodeError),
    ({"i": True}, None),
    ({"f": 3}, None),
    ({"f": "x"}, ValueError),
    ({"s": b"bytes"}, None),
    ({"s": b"\xff"}, UnicodeDecodeError),
    ({"raw": "text"}, None),
    ({"at": 1_700_000_000_000_000}, None),
    ({"at": dt.datetime(2024, 1, 1)}, None),
    ({"day": 19000}, None),
    ({"price": "abc"}, decimal.InvalidOperation),
    ({"ident": "not a uuid"}, ValueError),
    ({"ident": str(uuid.UUID(int=9))}, None),
    ({"color": "BLUE"}, DecodeError),
    ({"color": ["RED"]}, TypeError),
    ({"tags": ("a", "b")}, None),
    ({"pair": [1, 2]}, None),
    ({"by_key": {"k": {"amount": "1"}}}, None),
    ({"money": {"currency": "USD"}}, DecodeError),
    ({"money": MappingProxyType({"amount": "2", "currency": "USD"})}, None),
    ({"maybe": "x"}, DecodeError),
    ({"b": "x"}, None),  # from_avro does not check types it need not convert
    ({"s": None}, DecodeError),
]


def _decoded(changes: dict[str, Any]) -> dict[str, Any]:
    return {**record_to_avro_generic(SAMPLE), "at": SAMPLE.at, "day": SAMPLE.day, **changes}


@pytest.mark.parametrize(("changes", "error"), DECODE_CASES)
def test_compiled_decoding_raises_the_generic_error(
    changes: dict[str, Any], error: type[Exception] | None
) -> None:
    data = _decoded(changes)
    for where in (None, "Outer.inner"):
        fast = outcome(record_from_avro, Everything, data, where)
        assert fast == outcome(record_from_avro_generic, Everything, data, where)
        assert fast[0] == ("ok" if error is None else "error")
        if error is not None:
            assert fast[1][0] is error


def test_missing_fields_take_defaults_or_fail_like_the_generic_path() -> None:
    data = _decoded({})
    del data["note"], data["maybe"]  # a default, and an optional without one: both fine
    assert record_from_avro(Everything, data) == record_from_avro_generic(Everything, data)
    del data["s"]
    with pytest.raises(DecodeError, match=r"Everything\.s is missing"):
        record_from_avro(Everything, data)
    assert outcome(record_from_avro, Everything, data) == outcome(
        record_from_avro_generic, Everything, data
    )


def test_mappings_other_than_dicts_are_read_as_the_generic_path_reads_them() -> None:
    data = _decoded({})
    del data["note"]
    for mapping in (MappingProxyType(data), collections.defaultdict(lambda: "made up", data)):
        decoded = record_from_avro(Everything, mapping)
        assert decoded == record_from_avro_generic(Everything, mapping)
        assert decoded.note == "n/a"  # the class default, not what defaultdict makes up


def test_decoded_class_construction_errors_are_wrapped_the_same() -> None:
    @attrs.frozen
    class Positive:
        n: int = attrs.field(validator=attrs.validators.gt(0))

    for data in ({"n": 1}, {"n": 0}, {"n": "x"}):
        assert outcome(record_from_avro, Positive, data) == outcome(
            record_from_avro_generic, Positive, data
        )
    with pytest.raises(DecodeError, match=r"cannot build .*\.Positive from stored data: 'n' must be > 0"):
        record_from_avro(Positive, {"n": 0})


def test_fast_decode_path_keeps_its_errors_and_input_types() -> None:
    warm = Codec([Everything], store=InMemorySchemaStore())
    data = warm.encode(SAMPLE)
    assert warm.decode(data) == SAMPLE  # the per-fingerprint plan now exists
    for blob in (bytearray(data), memoryview(data)):
        assert warm.decode(blob) == SAMPLE
    for broken in (data[:-1], data + b"\x00", data[:12]):
        cold = Codec([Everything], store=warm.store)
        expected = outcome(cold.decode, broken)
        assert expected[0] == "error"
        assert outcome(warm.decode, broken) == expected
    with pytest.raises(TruncatedMessageError, match="truncated"):
        warm.decode(data[:-1])
    with pytest.raises(DecodeError, match="1 bytes left"):
        warm.decode(data + b"\x00")


def test_encoders_are_built_once_and_safely_from_many_threads() -> None:
    @attrs.frozen
    class Fresh:
        name: str
        tags: list[str]
        money: Money
        color: Color = Color.RED

    values = [Fresh(f"n{i}", ["t"] * (i % 3), Money(decimal.Decimal(i))) for i in range(200)]
    expected = [record_to_avro_generic(v) for v in values]
    results: list[list[dict[str, Any]]] = []
    start = threading.Barrier(8)

    def work() -> None:
        start.wait()
        results.append([record_to_avro(v) for v in values])

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == [expected] * 8
