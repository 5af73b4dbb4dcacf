"""``event_id_for`` is exactly the documented uuid5 formula, only faster: the native one
(cqrs_native, when installed) and the Python one alike."""

from __future__ import annotations

import itertools
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.domain.decision import EVENT_ID_NAMESPACE, event_id_for, python_event_id_for

TYPES = ["example.bank.Account", "bänk.Kontø", "銀行.口座", ""]
IDS = ["acc-1", "ünïcødé", "Кошелёк", "日本語", "emoji 😀", "", "a/b/3", " ", "\x00", "x" * 300]
VERSIONS = [0, 1, 2, 9, 10, 255, 2**31, 2**63 - 1, -1]


def reference(aggregate_type: str, aggregate_id: str, version: int) -> str:
    return str(uuid.uuid5(EVENT_ID_NAMESPACE, f"{aggregate_type}/{aggregate_id}/{version}"))


def test_event_id_is_the_uuid5_formula() -> None:
    for args in itertools.product(TYPES, IDS, VERSIONS):
        assert event_id_for(*args) == reference(*args) == python_event_id_for(*args), args


def test_event_ids_are_version_5_rfc_4122_uuids() -> None:
    for n in range(2000):  # every variant digit (8, 9, a, b) shows up many times
        parsed = uuid.UUID(event_id_for("t", f"id-{n}", n))
        assert (parsed.version, parsed.variant) == (5, uuid.RFC_4122)


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text(), st.integers())
def test_event_id_matches_uuid5_for_any_text(aggregate_type: str, aggregate_id: str, v: int) -> None:
    try:
        expected: object = reference(aggregate_type, aggregate_id, v)
    except UnicodeEncodeError as exc:  # lone surrogates: both refuse them alike
        expected = (type(exc), str(exc))
    for implementation in (event_id_for, python_event_id_for):
        try:
            got: object = implementation(aggregate_type, aggregate_id, v)
        except UnicodeEncodeError as exc:
            got = (type(exc), str(exc))
        assert got == expected
