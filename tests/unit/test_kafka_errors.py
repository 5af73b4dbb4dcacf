"""Which Kafka errors the framework waits out instead of failing (no broker needed)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from cqrs.kafka_io import _transient


@pytest.mark.parametrize("code", [
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.OFFSET_NOT_AVAILABLE,  # a new leader, right after a broker died (fault suite)
])
def test_leadership_changes_are_waited_out(code: int) -> None:
    assert _transient(KafkaException(KafkaError(code)))


def test_an_authorization_failure_is_not() -> None:
    assert not _transient(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert not _transient(None)
