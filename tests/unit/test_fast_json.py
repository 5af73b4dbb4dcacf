"""The HTTP service's orjson rendering writes the text the standard library's JSONResponse
writes, for the values the service answers with (plain JSON values, and UTC datetimes written as
their ``isoformat()``)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from fastapi.responses import JSONResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.http.fast_json import FastJSONResponse

_UTC = dt.timezone.utc
times = st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(9999, 1, 1),
                     timezones=st.just(_UTC))
scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text()
           | st.floats(allow_nan=False, allow_infinity=False))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def _standard(content: Any) -> bytes:
    return bytes(JSONResponse(content).body)


@settings(max_examples=300, deadline=None)
@given(values)
def test_plain_values_render_as_the_standard_library_renders_them(value: Any) -> None:
    assert json.loads(FastJSONResponse(value).body) == json.loads(_standard(value))


@settings(max_examples=300, deadline=None)
@given(times)
def test_a_utc_time_renders_as_its_isoformat(at: dt.datetime) -> None:
    assert FastJSONResponse({"t": at}).body == _standard({"t": at.isoformat()})


def test_an_integer_beyond_64_bits_falls_back_to_the_standard_library() -> None:
    big = {"n": 2**70, "t": dt.datetime(2026, 1, 1, tzinfo=_UTC)}
    assert FastJSONResponse(big).body == _standard({"n": 2**70, "t": "2026-01-01T00:00:00+00:00"})
