"""The dedup memory's compact entries: a plain acceptance is kept as its varying fields and
expands back to the very result (and bytes) first sent."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from cqrs.domain.decision import event_id_for
from cqrs.results import ACCEPTED, FAILED, REJECTED, CommandResult, expand_seen, seen_command
from cqrs.testing.example import make_app

APP = make_app("dedup-memory")
TYPE, ID = "example.bank.Account", "acc-ü"

zones = st.sampled_from([dt.timezone.utc, dt.timezone(dt.timedelta(hours=2)),
                         dt.timezone(dt.timedelta(hours=-9, minutes=-30))])
times = st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2200, 1, 1),
                     timezones=zones)


@given(st.integers(0, 2**40), st.integers(0, 5), st.integers(0, 2**31 - 1), st.integers(0, 2**62),
       times, st.text(min_size=1, max_size=40).filter(lambda s: "\0" not in s))
def test_an_acceptance_expands_to_the_same_bytes(version: int, events: int, partition: int,
                                                 offset: int, ts: dt.datetime, cid: str) -> None:
    events = min(events, version)
    result = CommandResult(cid, ACCEPTED, TYPE, ID, version, ts, partition, offset,
                           [event_id_for(TYPE, ID, v) for v in range(version - events + 1, version + 1)])
    encoded = APP.codec.encode(result)
    seen = seen_command(result, encoded)
    assert len(seen.result) == 33 < len(encoded)
    assert seen.timestamp_ms == int(ts.timestamp() * 1000)
    back = expand_seen(seen, TYPE, ID)
    assert back is not None and APP.codec.encode(back) == encoded


@given(st.sampled_from([(REJECTED, "no", "code", None, None), (FAILED, None, None, "E", "boom"),
                        (ACCEPTED, "odd", None, None, None)]))
def test_other_answers_are_kept_encoded(fields: tuple[str, str | None, str | None, str | None, str | None]) -> None:
    status, reason, code, error_type, message = fields
    result = CommandResult("c1", status, TYPE, ID, 3, dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
                           0, 9, [], reason, code, error_type, message)
    encoded = APP.codec.encode(result)
    seen = seen_command(result, encoded)
    assert seen.result == encoded and expand_seen(seen, TYPE, ID) is None
