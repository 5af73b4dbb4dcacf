"""The native module's pieces give what the Python code they replace gives (cqrs/native.py).

The codec's native writer has its own properties (test_codec_binary_properties.py), and event
ids theirs (tests/unit/test_event_ids.py); here are the rest: a UTC time's header text, and
the objects a builder makes without their class's ``__init__``.
"""

from __future__ import annotations

import datetime as dt

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.domain.decision import (
    Accepted, CommandInput, Decision, NewEvent, event_id_for, python_event_id_for,
)
from cqrs.envelope import Envelope, _python_utc_text, _utc_text
from cqrs.native import builder, native
from cqrs.results import AggregateRecord, SeenCommand

pytestmark = pytest.mark.skipif(native is None, reason="cqrs_native is not installed")
SETTINGS = settings(max_examples=300, deadline=None)


@SETTINGS
@given(st.datetimes(min_value=dt.datetime(1, 1, 1), timezones=st.just(dt.timezone.utc)))
def test_a_utc_times_text_is_its_isoformat(at: dt.datetime) -> None:
    assert _utc_text(at) == _python_utc_text(at) == at.isoformat(timespec="microseconds").encode()


def test_the_native_pieces_are_in_use() -> None:
    assert event_id_for is not python_event_id_for
    assert _utc_text is native.utc_text  # type: ignore[union-attr]


def _fields(obj: object) -> list[tuple[str, object]]:
    """Every attrs field of ``obj``, those left out of equality too, with its value's type."""
    return [(f.name, (type(getattr(obj, f.name)), getattr(obj, f.name)))
            for f in attrs.fields(type(obj))]


NOW = dt.datetime(2026, 11, 27, 21, 0, 1, 5, tzinfo=dt.timezone.utc)
MADE = [  # each class the per-command path makes with a builder, and its __init__ arguments
    (NewEvent, ("e-1", "acc-1", "bank.Account", 3, "bank.Deposited", object(), NOW, "c-1", "c-1")),
    (Accepted, ("c-1", 3, (), ())),
    (Decision, (None, 3, ())),
    (CommandInput, ("c-1", object(), None, NOW, None)),
    (AggregateRecord, (3, False, b"snap", "c-1", b"\0" * 8, b"\0" * 4, b"r", "", b"", "")),
    (SeenCommand, ("c-1", 17, b"\x01x")),
    (Envelope, ("c-1", "bank.Deposit", "command", "bank.Account", "acc-1", NOW, None, 2, "c-1",
                None, None, 1, "application/avro")),
]


@pytest.mark.parametrize(("cls", "values"), MADE, ids=lambda v: getattr(v, "__name__", ""))
def test_a_builder_makes_what_the_class_makes(cls: type, values: tuple[object, ...]) -> None:
    make = builder(cls)
    assert make is not cls, f"{cls.__name__} has a validator, converter or hook: no builder"
    made, expected = make(*values), cls(*values)
    assert type(made) is cls and made == expected and _fields(made) == _fields(expected)
    assert hash(made) == hash(expected)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made.x = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="takes"):
        make(*values[:-1])


def test_no_builder_for_a_class_whose_init_does_more() -> None:
    @attrs.frozen
    class Checked:
        x: int = attrs.field(validator=attrs.validators.instance_of(int))

    @attrs.frozen
    class Hooked:
        x: int

        def __attrs_post_init__(self) -> None:
            pass

    @attrs.frozen
    class Made:
        x: int
        y: list[int] = attrs.field(init=False, factory=list)

    assert builder(Checked) is Checked and builder(Hooked) is Hooked and builder(Made) is Made
