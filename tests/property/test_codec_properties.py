"""Round trips of generated values through the Avro codec, and evolution under generation."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.codec import Codec, InMemorySchemaStore
from cqrs.domain import DomainModel, event
from cqrs.testing.example import Account, AccountHandler
from cqrs.testing.strategies import for_type, from_message_type

SETTINGS = settings(max_examples=60, deadline=None)


class Level(enum.Enum):
    LOW = "l"
    HIGH = "h"


@attrs.frozen
class Point:
    x: float
    y: float
    label: str | None = None


@event(name="prop.AllTypes")
class AllTypes:
    s: str
    i: int
    small: int = attrs.field(metadata={"avro.type": "int"})
    f: float
    b: bool
    raw: bytes
    at: dt.datetime
    day: dt.date
    price: decimal.Decimal
    ident: uuid.UUID
    level: Level
    maybe: uuid.UUID | None
    items: list[Point]
    frozen_items: tuple[int, ...]
    by_name: dict[str, Level]
    where: Point
    note: str = "-"


MODEL = DomainModel([Account], [AccountHandler], events=[AllTypes])
CODEC = Codec(MODEL.message_classes())


@SETTINGS
@given(from_message_type(AllTypes))
def test_every_supported_type_roundtrips(value: AllTypes) -> None:
    assert CODEC.decode(CODEC.encode(value)) == value


@SETTINGS
@given(st.sampled_from(MODEL.message_classes()).flatmap(from_message_type))
def test_every_model_message_and_state_roundtrips(value: object) -> None:
    assert CODEC.decode(CODEC.encode(value)) == value


@event(name="prop.Reading", version=1)
class ReadingV1:
    value: int = attrs.field(metadata={"avro.type": "int"})
    unit: str


@event(name="prop.Reading", version=1)
class ReadingV1b:  # same version, evolved: promoted, one field removed, one added with default
    value: float
    source: str = "sensor"


@SETTINGS
@given(from_message_type(ReadingV1))
def test_old_data_decodes_under_evolved_schema(old: ReadingV1) -> None:
    store = InMemorySchemaStore()
    data = Codec([ReadingV1], store=store).encode(old)
    assert Codec([ReadingV1b], store=store).decode(data) == ReadingV1b(float(old.value))


@SETTINGS
@given(for_type(list[Point]) | for_type(dict[str, int]))
def test_for_type_builds_supported_containers(value: object) -> None:
    assert isinstance(value, (list, dict))
