"""Any message of a class with personal fields survives the codec; once its subject is
forgotten, it decodes with every other field equal and each personal one its replacement."""

from __future__ import annotations

import datetime as dt

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.codec import Codec
from cqrs.domain import FORGOTTEN, event, personal
from cqrs.personal import SEALED_PREFIX, MemoryKeyStore
from cqrs.testing.strategies import from_message_type

SETTINGS = settings(max_examples=150, deadline=None)


@event(name="prop.Personal", subject="person")
class PersonalMessage:
    person: str
    name: str = personal()
    email: str | None = personal(replacement="")
    note: str | None = personal(replacement="(erased)")
    amount: int = 0
    at: dt.datetime | None = None
    tags: list[str] = attrs.field(factory=list)
    label: str = ""


REPLACEMENTS = {"name": FORGOTTEN, "email": "", "note": "(erased)"}
messages = from_message_type(PersonalMessage).filter(lambda m: m.person != "")


@SETTINGS
@given(messages, st.lists(messages, max_size=3))
def test_messages_round_trip_and_forgetting_replaces_only_the_personal_fields(
        message: PersonalMessage, others: list[PersonalMessage]) -> None:
    keys = MemoryKeyStore()
    codec = Codec([PersonalMessage], key_store=keys)
    data = codec.encode(message)
    others_data = [codec.encode(o) for o in others]
    assert codec.decode(data) == message
    sealed = [n for n, r in REPLACEMENTS.items() if getattr(message, n) not in (None, "", r)]
    plain_text = message.person + message.label + "".join(message.tags)
    if SEALED_PREFIX not in plain_text:
        assert data.count(SEALED_PREFIX.encode()) == len(sealed)

    keys.forget(message.person)
    forgotten = codec.decode(data)
    for field in attrs.fields(PersonalMessage):
        got, before = getattr(forgotten, field.name), getattr(message, field.name)
        if field.name in REPLACEMENTS and before:  # None and "" stay: nothing to hide
            assert got == REPLACEMENTS[field.name], field.name
        else:
            assert got == before, field.name
    for other, blob in zip(others, others_data):
        back = codec.decode(blob)
        if other.person != message.person:
            assert back == other
        else:
            assert back.amount == other.amount and back.tags == other.tags
