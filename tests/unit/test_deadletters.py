"""Dead letters parsed from the processor's own output, and the records a retry sends."""

from __future__ import annotations

import datetime as dt

import pytest

from cqrs.client import encode_command
from cqrs.deadletters import DeadLetterError, parse_dead_letter, retry_id, retry_record
from cqrs.envelope import from_kafka
from cqrs.kafka_io import KafkaRecord
from cqrs.processor import AggregateStep, InputRecord
from cqrs.testing.example import Explode, OpenAccount, make_app
from cqrs.topics import topics_for

APP = make_app("dlq-test")
TOPICS = topics_for("dlq-test")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _dead_letter_record() -> KafkaRecord:
    records = []
    for offset, command in enumerate([OpenAccount("ann"), Explode("x")]):
        _, key, value, headers = encode_command(APP, "acc-1", command, command_id=f"c{offset}",
                                                timestamp=T0, correlation_id="conv-1")
        records.append(InputRecord(key, value, headers, 2, 40 + offset, TOPICS.commands))
    _, out = AggregateStep(APP, APP.codec, TOPICS).run("example.bank.Account", "acc-1", None, records)
    (dead,) = [r for r in out if r.topic == TOPICS.dead_letters]
    return KafkaRecord(TOPICS.dead_letters, 1, 7, dead.key, dead.value, dead.headers, 0)


def test_a_dead_letter_is_parsed_with_its_origin() -> None:
    dead = parse_dead_letter(_dead_letter_record())
    assert (dead.position, dead.stage, dead.error_type) == ("1:7", "handler", "RuntimeError")
    assert (dead.source_topic, dead.source_partition, dead.source_offset) == (TOPICS.commands, 2, 41)
    assert (dead.command_id, dead.aggregate_id, dead.message_type) == ("c1", "acc-1", "example.bank.Explode")
    assert not any(k.startswith("cqrs.dlq.") for k, _ in dead.headers)


def test_a_retry_is_the_original_command_under_a_derived_id() -> None:
    dead = parse_dead_letter(_dead_letter_record())
    key, value, headers = retry_record(dead)
    envelope, payload = from_kafka(key, value, headers)
    assert envelope.command_id == envelope.message_id == retry_id(dead) == "c1~retry@1:7"
    assert (envelope.causation_id, envelope.correlation_id) == ("c1", "conv-1")
    assert APP.codec.decode(payload) == Explode("x")
    assert retry_record(dead) == (key, value, headers)  # the same every time: retries de-duplicate


def test_a_dead_letter_without_a_command_id_cannot_be_retried() -> None:
    rec = _dead_letter_record()  # its value garbled: no readable envelope, so no command id
    dead = parse_dead_letter(KafkaRecord(rec.topic, 0, 3, rec.key, rec.value[:20], rec.headers, 0))
    with pytest.raises(DeadLetterError, match="0:3 .*no readable command id"):
        retry_id(dead)
