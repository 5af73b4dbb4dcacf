"""The native module's pieces give what the Python code they replace gives (cqrs/native.py).

The codec's native writer has its own properties (test_codec_binary_properties.py), and event
ids theirs (tests/unit/test_event_ids.py); here are the rest: a UTC time's header text, the
objects a builder makes without their class's ``__init__``, and the dedup memory's append.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.domain.decision import (
    Accepted, CommandInput, Decision, NewEvent, event_id_for, python_event_id_for,
)
from cqrs.envelope import Envelope, _python_utc_text, _utc_text
from cqrs import results
from cqrs.native import builder, native
from cqrs.results import AggregateRecord, SeenCommand, accepted_seen

pytestmark = pytest.mark.skipif(native is None, reason="cqrs_native is not installed")
SETTINGS = settings(max_examples=300, deadline=None)


@SETTINGS
@given(st.datetimes(min_value=dt.datetime(1, 1, 1), timezones=st.just(dt.timezone.utc)))
def test_a_utc_times_text_is_its_isoformat(at: dt.datetime) -> None:
    assert _utc_text(at) == _python_utc_text(at) == at.isoformat(timespec="microseconds").encode()


def test_the_native_pieces_are_in_use() -> None:
    assert event_id_for is not python_event_id_for
    assert _utc_text is native.utc_text  # type: ignore[union-attr]
    assert results._remember_accepted is native.remember_accepted  # type: ignore[union-attr]  # noqa: SLF001


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


remembered = st.lists(
    st.builds(SeenCommand, st.text(st.characters(blacklist_characters="\0"), min_size=1, max_size=8),
              st.integers(0, 10_000), st.binary(max_size=12)),
    max_size=12)
utc_times = st.datetimes(min_value=dt.datetime(1, 1, 1), timezones=st.just(dt.timezone.utc))
plain = st.tuples(  # what the native path appends: half the examples or so
    st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), min_size=1,
            max_size=6),
    st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1),
                 timezones=st.just(dt.timezone.utc)),
    st.integers(-2**63, 2**63 - 1), st.integers(0, 2**32 - 1), st.integers(-2**31, 2**31 - 1),
    st.integers(-2**63, 2**63 - 1))
odd = st.tuples(  # what it leaves to the Python path, and its errors
    st.text(min_size=1, max_size=6),  # NULs and lone surrogates too
    st.one_of(utc_times, st.datetimes(timezones=st.timezones()),
              st.datetimes(timezones=st.just(dt.timezone(dt.timedelta(hours=5))))),
    st.integers(-2**70, 2**70), st.integers(-5, 2**33), st.integers(-2**33, 2**33),
    st.integers(-2**70, 2**70))


@SETTINGS
@given(remembered, plain | odd, st.integers(2**61, 2**62) | st.integers(0, 12_000),
       st.integers(13, 14) | st.integers(0, 14), st.sampled_from(["read", "bounds known", "made by remember"]))
def test_remembering_an_acceptance_natively_equals_remembering_its_entry(
        old: list[SeenCommand], acceptance: tuple[Any, ...], window_ms: int, max_count: int,
        origin: str) -> None:
    """``AggregateRecord.remember_accepted`` appends natively: the same record, time bounds and
    errors as ``remember`` of the acceptance's entry (the Python path), whatever the record's
    bounds are known from (read from a row, asked once, carried by remember)."""
    record = AggregateRecord.of(3, False, b"s", old)
    if origin == "bounds known" and old:
        record.time_bounds()
    elif origin == "made by remember" and old:
        record = AggregateRecord.of(2, False, b"s", old[:-1]).remember(3, False, b"s", old[-1:],
                                                                      2**62, 100)
    twin = AggregateRecord.of(3, False, b"s", old)
    try:
        expected: Any = twin.remember(4, False, b"t", [accepted_seen(*acceptance)], window_ms,
                                      max_count)
    except Exception as exc:  # noqa: BLE001 - the same error either way
        expected = type(exc)
    try:
        got: Any = record.remember_accepted(4, False, b"t", *acceptance, window_ms, max_count)
    except Exception as exc:  # noqa: BLE001
        got = type(exc)
    assert got == expected
    if isinstance(got, AggregateRecord) and got.seen_times:
        times = [s.timestamp_ms for s in got.seen]
        assert got.time_bounds() == expected.time_bounds() == (min(times), max(times))
