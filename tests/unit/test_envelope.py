"""Envelope <-> Kafka record mapping and its typed errors."""

from __future__ import annotations

import datetime as dt

import pytest

from cqrs.domain import CommandInput, DomainModel, decide
import attrs

from cqrs.envelope import (
    COMMAND_RECORD_PREFIX, CONTENT_TYPE, Envelope, event_to_kafka, from_kafka, read_command, to_kafka,
)
from cqrs.errors import EncodeError, EnvelopeError, MalformedHeaderError, MissingHeaderError
from cqrs.testing.example import Account, AccountHandler, Deposit, OpenAccount

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def _command_envelope() -> Envelope:
    return Envelope.for_command(
        Deposit(3), command_id="c-1", aggregate_type="example.bank.Account",
        aggregate_id="acc-ü", timestamp=T0, expected_version=2,
    )  # fmt: skip


def _legacy_command(env: Envelope, payload: bytes) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """A command record in the older form, its envelope in headers."""
    headers = [("content-type", CONTENT_TYPE.encode())]
    for name in ("message_id", "message_type", "kind", "aggregate_type", "timestamp",
                 "expected_version", "reply_partition", "command_id", "correlation_id",
                 "causation_id"):
        value = getattr(env, name)
        if value is not None:
            text = value.isoformat(timespec="microseconds") if name == "timestamp" else str(value)
            headers.append((f"cqrs.{name}", text.encode()))
    return env.aggregate_id.encode(), payload, headers


def test_command_roundtrip() -> None:
    env = _command_envelope()
    key, value, headers = to_kafka(env, b"payload")
    assert key == "acc-ü".encode()
    assert headers == [] and value.startswith(COMMAND_RECORD_PREFIX)  # the envelope is in the value
    assert from_kafka(key, value, headers) == (env, b"payload")
    assert read_command("acc-ü", value) == (env, b"payload")


def test_commands_in_the_older_header_form_are_still_read() -> None:
    env = _command_envelope()
    key, value, headers = _legacy_command(env, b"payload")
    assert ("content-type", CONTENT_TYPE.encode()) in headers
    assert ("cqrs.expected_version", b"2") in headers
    assert from_kafka(key, value, headers) == (env, b"payload")


@pytest.mark.parametrize("cut", [COMMAND_RECORD_PREFIX.__len__() + 1, 20, -1])
def test_a_garbled_command_record_names_the_problem(cut: int) -> None:
    key, value, headers = to_kafka(_command_envelope(), b"payload")
    assert read_command("acc-ü", value[:cut]) is None
    with pytest.raises(MalformedHeaderError, match="not a readable cqrs.CommandRecord"):
        from_kafka(key, value[:cut], headers)


def test_a_command_field_of_the_wrong_type_is_named() -> None:
    env = attrs.evolve(_command_envelope(), expected_version="2")  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match="expected_version"):
        to_kafka(env, b"p")


def test_event_envelope_from_decision() -> None:
    entry = DomainModel([Account], [AccountHandler]).entry(Account)
    d = decide(entry, "a", None, 0, [CommandInput("c9", OpenAccount("x"), 0, T0, "corr")])
    (new_event,) = d.outcomes[0].events  # type: ignore[union-attr]
    env = Envelope.for_event(new_event)
    assert (env.kind, env.version, env.causation_id, env.correlation_id) == ("event", 1, "c9", "corr")
    key, value, headers = to_kafka(env, b"x")
    # Spark hands headers over as structs with key / value
    spark_headers = [{"key": k, "value": v} for k, v in headers + [("traceparent", b"00-ab")]]
    assert from_kafka(key, value, spark_headers)[0] == env
    # the processor's shortcut writes exactly what to_kafka writes
    assert event_to_kafka(new_event, b"x") == (key, value, headers)


@pytest.mark.parametrize(
    ("mutate", "error", "text"),
    [
        (lambda h: [x for x in h if x[0] != "cqrs.message_type"], MissingHeaderError, "message_type"),
        (lambda h: h + [("cqrs.version", b"seven")], MalformedHeaderError, "not an integer"),
        (lambda h: h + [("cqrs.timestamp", b"yesterday")], MalformedHeaderError, "ISO-8601"),
        (lambda h: h + [("cqrs.timestamp", b"2024-01-01T00:00:00")], MalformedHeaderError, "UTC offset"),
        (lambda h: h + [("cqrs.kind", b"query")], MalformedHeaderError, "'command' or 'event'"),
        (lambda h: h + [("cqrs.command_id", b"\xff")], MalformedHeaderError, "UTF-8"),
        (lambda h: h + [("content-type", b"application/json")], MalformedHeaderError, "content-type"),
        (lambda h: h + [("cqrs.message_id", None)], MissingHeaderError, "message_id"),
    ],
)
def test_garbled_headers(mutate, error: type[EnvelopeError], text: str) -> None:  # type: ignore[no-untyped-def]
    key, value, headers = _legacy_command(_command_envelope(), b"p")
    with pytest.raises(error, match=text):
        from_kafka(key, value, mutate(headers))


def test_missing_key_value_and_naive_timestamp() -> None:
    _, value, headers = to_kafka(_command_envelope(), b"p")
    with pytest.raises(MissingHeaderError, match="no key"):
        from_kafka(None, value, headers)
    with pytest.raises(MissingHeaderError, match="no value"):
        from_kafka(b"k", None, headers)
    with pytest.raises(MalformedHeaderError, match="naive"):
        to_kafka(Envelope("m", "t", "command", "A", "a", dt.datetime(2024, 1, 1)), b"p")


@pytest.mark.parametrize(("key", "text"), [(b"", "is empty"), (b"k" * 65_536, "65,536 bytes long")])
def test_an_aggregate_id_cassandra_cannot_key_by_is_refused(key: bytes, text: str) -> None:
    from cqrs.client import encode_command
    from cqrs.testing.example_app import app

    _, _, value, headers = encode_command(app, "acc-1", Deposit(1))
    with pytest.raises(MalformedHeaderError, match=text):
        from_kafka(key, value, headers)
    from cqrs.client import InvalidAggregateIdError

    with pytest.raises(InvalidAggregateIdError, match=text):  # the client's typed error
        encode_command(app, key.decode(), Deposit(1))
    from_kafka(b"k" * 65_535, value, headers)  # at the limit: fine
