"""The native module's pieces give what the Python code they replace gives (cqrs/native.py).

The codec's native writer has its own properties (test_codec_binary_properties.py), and event
ids theirs (tests/unit/test_event_ids.py); here are the rest.
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.domain.decision import event_id_for, python_event_id_for
from cqrs.envelope import _python_utc_text, _utc_text
from cqrs.native import native

pytestmark = pytest.mark.skipif(native is None, reason="cqrs_native is not installed")
SETTINGS = settings(max_examples=300, deadline=None)


@SETTINGS
@given(st.datetimes(min_value=dt.datetime(1, 1, 1), timezones=st.just(dt.timezone.utc)))
def test_a_utc_times_text_is_its_isoformat(at: dt.datetime) -> None:
    assert _utc_text(at) == _python_utc_text(at) == at.isoformat(timespec="microseconds").encode()


def test_the_native_pieces_are_in_use() -> None:
    assert event_id_for is not python_event_id_for
    assert _utc_text is native.utc_text  # type: ignore[union-attr]
