"""Event envelopes survive the trip through a Kafka record, whatever their fields.

An event record carries only the headers :func:`cqrs.envelope.from_kafka` cannot derive (its
id from the aggregate and version, its causation and correlation from the command id): for any
event envelope, derived or not, ``from_kafka(to_kafka(env))`` gives it back, and the processor's
shortcut :func:`cqrs.envelope.event_to_kafka` writes exactly what ``to_kafka`` writes.
"""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from cqrs.domain.decision import NewEvent, event_id_for
from cqrs.envelope import Envelope, event_to_kafka, from_kafka, to_kafka

_text = st.text(min_size=1, max_size=12).filter(lambda s: "\0" not in s)
_times = st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2200, 1, 1),
                      timezones=st.sampled_from([dt.timezone.utc, dt.timezone(dt.timedelta(hours=2))]))


@st.composite
def event_envelopes(draw: st.DrawFn) -> Envelope:
    aggregate_type, aggregate_id = draw(_text), draw(_text)
    version = draw(st.integers(1, 2**40))
    command_id = draw(st.none() | _text)
    # each derivable field either equals what is derived or is something else (or absent)
    message_id = draw(st.sampled_from([event_id_for(aggregate_type, aggregate_id, version), "e-1"]))
    causation = draw(st.sampled_from([command_id, None, "cause"]))
    correlation = draw(st.sampled_from([command_id, None, "corr"]))
    return Envelope(message_id, draw(_text), "event", aggregate_type, aggregate_id,
                    draw(_times), version, None, command_id, correlation, causation)


@given(event_envelopes())
def test_an_event_envelope_reads_back_as_written(env: Envelope) -> None:
    key, value, headers = to_kafka(env, b"payload")
    read, payload = from_kafka(key, value, headers)
    assert payload == b"payload"
    assert read == env
    names = {name for name, _ in headers}
    assert "content-type" not in names
    if env.command_id is None or None not in (env.causation_id, env.correlation_id):
        assert "cqrs.kind" not in names  # lean: what can be derived is left out


@given(_text, _text, st.integers(1, 2**40), _text, _text, _times)
def test_the_processors_event_records_are_to_kafkas(aggregate_type: str, aggregate_id: str,
                                                    version: int, command_id: str,
                                                    correlation: str, at: dt.datetime) -> None:
    for correlation_id in (correlation, command_id):
        e = NewEvent(event_id_for(aggregate_type, aggregate_id, version), aggregate_id,
                     aggregate_type, version, "x.Happened", object(), at, command_id,
                     correlation_id)
        written = event_to_kafka(e, b"p")
        assert written == to_kafka(Envelope.for_event(e), b"p")
        assert len(written[2]) == (5 if correlation_id == command_id else 6)
        assert from_kafka(*written)[0] == Envelope.for_event(e)
