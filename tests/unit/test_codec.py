"""Codec: schemas, single-object encoding, typed errors, evolution and compatibility."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import io
import uuid
from typing import Any

import attrs
import fastavro
import pytest

from cqrs.codec import (
    MAGIC,
    Codec,
    InMemorySchemaStore,
    Upcaster,
    avro_fullname,
    check_compatibility,
    fingerprint,
    schema_for,
    upcaster,
)
from cqrs.domain import event
from cqrs.errors import (
    BadMagicError,
    DecodeError,
    EncodeError,
    IncompatibleSchemaError,
    MissingUpcasterError,
    NaiveDatetimeError,
    SchemaDerivationError,
    TruncatedMessageError,
    UnknownSchemaError,
    UnregisteredTypeError,
)
from cqrs.testing.example import Account, Deposited


class Color(enum.Enum):
    RED = 1
    GREEN = 2


@attrs.frozen
class Money:
    amount: decimal.Decimal
    currency: str = "EUR"


@event(name="test.Everything")
class Everything:
    s: str
    i: int
    f: float
    b: bool
    raw: bytes
    at: dt.datetime
    day: dt.date
    price: decimal.Decimal
    ident: uuid.UUID
    color: Color
    maybe: int | None
    tags: list[str]
    pair: tuple[int, ...]
    by_key: dict[str, Money]
    money: Money
    other_money: Money | None = None
    note: str = "n/a"


UTC = dt.timezone.utc
SAMPLE = Everything(
    "x", -5, 1.5, True, b"\x00\xff", dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    dt.date(1999, 12, 31), decimal.Decimal("12.50"), uuid.UUID(int=7), Color.GREEN, None,
    ["a", "b"], (1, 2), {"k": Money(decimal.Decimal("1"))}, Money(decimal.Decimal("-0.001"), "USD"),
)  # fmt: skip


def test_schema_of_every_supported_type() -> None:
    schema = schema_for(Everything)
    assert schema["name"] == "test.Everything_v1"
    assert (schema["cqrs.type"], schema["cqrs.version"]) == ("test.Everything", 1)
    types = {f["name"]: f["type"] for f in schema["fields"]}
    assert types["i"] == "long" and types["f"] == "double" and types["b"] == "boolean"
    assert types["at"] == {"type": "long", "logicalType": "timestamp-micros"}
    assert types["day"] == {"type": "int", "logicalType": "date"}
    assert types["ident"] == {"type": "string", "logicalType": "uuid"}
    assert types["color"]["symbols"] == ["RED", "GREEN"]
    assert types["maybe"] == ["null", "long"]
    money_record = types["by_key"]["values"]
    assert money_record["type"] == "record" and money_record["cqrs.type"].endswith("Money")
    assert types["money"] == money_record["name"]  # a named type is defined once, then by name
    assert types["other_money"] == ["null", money_record["name"]]
    defaults = {f["name"]: f.get("default", "<none>") for f in schema["fields"]}
    assert defaults["maybe"] is None and defaults["note"] == "n/a" and defaults["s"] == "<none>"
    fastavro.parse_schema(schema)


def test_roundtrip_and_wire_layout() -> None:
    codec = Codec([Everything])
    data = codec.encode(SAMPLE)
    assert data[:2] == MAGIC and data[2:10] == fingerprint(schema_for(Everything))
    assert codec.decode(data) == SAMPLE
    assert codec.writer_of(data) == ("test.Everything", 1)


def test_schema_is_published_to_the_store_on_first_encode() -> None:
    store = InMemorySchemaStore()
    codec = Codec([Deposited], store=store)
    assert store.all() == {}
    codec.encode(Deposited(1))
    (schema,) = store.all().values()
    assert schema["cqrs.type"] == "example.bank.Deposited"


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("i", "5", EncodeError),
        ("i", True, EncodeError),
        ("i", 2**64, EncodeError),
        ("s", 3, EncodeError),
        ("at", dt.datetime(2024, 1, 1), NaiveDatetimeError),
        ("day", dt.datetime(2024, 1, 1, tzinfo=UTC), EncodeError),
        ("color", "RED", EncodeError),
        ("tags", ["a", 1], EncodeError),
        ("money", {"amount": 1}, EncodeError),
    ],
)
def test_wrong_value_type_on_encode(field: str, value: Any, error: type[Exception]) -> None:
    bad = attrs.evolve(SAMPLE, **{field: value})
    with pytest.raises(error, match=f"Everything.{field}"):
        Codec([Everything]).encode(bad)


def test_naive_datetime_message_says_what_to_do() -> None:
    with pytest.raises(NaiveDatetimeError, match="timezone-aware"):
        Codec([Everything]).encode(attrs.evolve(SAMPLE, at=dt.datetime(2024, 1, 1)))


def test_unsupported_type_is_refused_when_deriving_the_schema() -> None:
    @attrs.frozen
    class Weird:
        x: int | str

    with pytest.raises(SchemaDerivationError, match="Optional"):
        schema_for(Weird)


def test_bad_bytes_get_typed_errors() -> None:
    codec = Codec([Deposited])
    data = codec.encode(Deposited(300))
    with pytest.raises(BadMagicError, match="c3 01"):
        codec.decode(b"\x00\x01" + data[2:])
    with pytest.raises(TruncatedMessageError, match="10-byte"):
        codec.decode(data[:6])
    with pytest.raises(TruncatedMessageError, match="truncated"):
        codec.decode(data[:-1])
    with pytest.raises(DecodeError, match="bytes left"):
        codec.decode(data + b"\x00")
    with pytest.raises(UnknownSchemaError, match="no schema with fingerprint"):
        codec.decode(MAGIC + b"\x01" * 8 + data[10:])


def test_unregistered_types() -> None:
    with pytest.raises(UnregisteredTypeError, match="not registered"):
        Codec([]).encode(Deposited(1))
    store = InMemorySchemaStore()
    data = Codec([Deposited], store=store).encode(Deposited(1))
    with pytest.raises(UnregisteredTypeError, match="example.bank.Deposited v1"):
        Codec([Account], store=store).decode(data)


# ---- evolution ---------------------------------------------------------------------------


def _write(schema: dict[str, Any], record: dict[str, Any], store: InMemorySchemaStore) -> bytes:
    """Bytes as an older version of the code wrote them (hand-written writer schema)."""
    fp = store.put(schema)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return MAGIC + fp + buf.getvalue()


def _v(name: str, version: int, fields: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "record", "name": avro_fullname(name, version), "fields": fields,
        "cqrs.type": name, "cqrs.version": version,
    }  # fmt: skip


@event(name="evo.Paid")
class Paid:
    amount: int
    fee: float
    memo: str = ""


def test_added_field_with_default_removed_field_and_promotions() -> None:
    store = InMemorySchemaStore()
    old = _v("evo.Paid", 1, [
        {"name": "amount", "type": "int"},
        {"name": "fee", "type": "float"},
        {"name": "legacy", "type": "string"},
    ])  # fmt: skip
    data = _write(old, {"amount": 7, "fee": 0.5, "legacy": "gone"}, store)
    codec = Codec([Paid], store=store)
    check_compatibility(store, codec)
    assert codec.decode(data) == Paid(7, 0.5, "")


def test_incompatible_changes_are_refused_at_start() -> None:
    store = InMemorySchemaStore()
    store.put(_v("evo.Paid", 1, [{"name": "fee", "type": "string"}]))
    with pytest.raises(IncompatibleSchemaError) as info:
        check_compatibility(store, Codec([Paid], store=store))
    text = str(info.value)
    assert "evo.Paid.amount: new field without a default" in text
    assert "evo.Paid.fee: type changed from string to double" in text
    assert "add a default or register an upcaster" in text


class Shade(enum.Enum):
    RED = 1


@event(name="evo.Painted")
class Painted:
    shade: Shade


def test_removed_enum_symbol_is_refused() -> None:
    store = InMemorySchemaStore()
    enum_schema = {"type": "enum", "name": schema_for(Painted)["fields"][0]["type"]["name"],
                   "symbols": ["RED", "BLUE"]}  # fmt: skip
    store.put(_v("evo.Painted", 1, [{"name": "shade", "type": enum_schema}]))
    with pytest.raises(IncompatibleSchemaError, match=r"symbols \['BLUE'\] were removed"):
        check_compatibility(store, Codec([Painted], store=store))


@event(name="evo.Person", version=3)
class PersonRegistered:
    first: str
    last: str
    age: int = -1


@upcaster("evo.Customer", 1, to_type_name="evo.Person", to_version=2)
def customer_to_person(data: dict[str, Any]) -> dict[str, Any]:
    return {"name": data["full_name"]}


@upcaster("evo.Person", 2)
def split_name(data: dict[str, Any]) -> dict[str, Any]:
    first, _, last = data["name"].partition(" ")
    return {"first": first, "last": last}


def test_upcasters_chain_rename_and_split() -> None:
    store = InMemorySchemaStore()
    v1 = _write(_v("evo.Customer", 1, [{"name": "full_name", "type": "string"}]),
                {"full_name": "Ada Lovelace"}, store)  # fmt: skip
    v2 = _write(_v("evo.Person", 2, [{"name": "name", "type": "string"}]), {"name": "Alan Turing"}, store)
    codec = Codec([PersonRegistered], upcasters=[customer_to_person, split_name], store=store)
    check_compatibility(store, codec)
    assert codec.decode(v1) == PersonRegistered("Ada", "Lovelace")
    assert codec.decode(v2) == PersonRegistered("Alan", "Turing")
    assert codec.decode(codec.encode(PersonRegistered("a", "b", 3))) == PersonRegistered("a", "b", 3)


def test_missing_upcaster_is_reported_at_start_and_on_decode() -> None:
    store = InMemorySchemaStore()
    v2 = _write(_v("evo.Person", 2, [{"name": "name", "type": "string"}]), {"name": "A B"}, store)
    codec = Codec([PersonRegistered], store=store)
    with pytest.raises(IncompatibleSchemaError, match="register an upcaster from evo.Person v2"):
        check_compatibility(store, codec)
    with pytest.raises(MissingUpcasterError, match="evo.Person v2"):
        codec.decode(v2)


def test_upcaster_must_lead_somewhere_new() -> None:
    with pytest.raises(ValueError, match="leads to itself"):
        Upcaster("x.Y", 2, lambda d: d, to_version=2)
