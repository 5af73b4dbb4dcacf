"""The retry job's delivery against real Kafka and Cassandra, without Spark: a round that died
after claiming a retry (before or after producing it) is finished by the next job exactly once,
and a replayed dead letter is not delivered again."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cqrs.client import encode_command
from cqrs.config import CqrsConfig
from cqrs.kafka_io import KafkaRecord, make_producer, read_to_end, watermarks
from cqrs.processor.step import DLQ_PREFIX
from cqrs.retrier.plan import redelivery
from cqrs.retrier.service import Retrier
from cqrs.retries import ATTEMPT_HEADER
from cqrs.topics import AppTopics, ensure_topics, topics_for

sys.path.insert(0, str(Path(__file__).parent / "apps"))
import flaky_app  # noqa: E402

app = flaky_app.app


@pytest.fixture
def topics(cqrs_config: CqrsConfig) -> AppTopics:
    t = topics_for(app.name, f"t-rdeliv-{uuid.uuid4().hex[:8]}-")
    ensure_topics(cqrs_config, t, partitions=2)
    return t


@pytest.fixture
def cfg(cqrs_config: CqrsConfig, topics: AppTopics) -> CqrsConfig:
    return cqrs_config.with_overrides(kafka={"topic_prefix": topics.base.removesuffix("flaky")})


def letter(topics: AppTopics, aggregate_id: str, offset: int, *, attempt: int = 1,
           age_s: float = 30.0) -> KafkaRecord:
    """A dead letter as the processor writes it for a transient failure (already due)."""
    _, key, value, headers = encode_command(app, aggregate_id, flaky_app.Charge(1, "/nonexistent"),
                                            command_id=f"cmd-{aggregate_id}")
    dlq = [("stage", "handler"), ("error_type", "ServiceUnavailable"), ("error", "down"),
           ("topic", topics.commands), ("partition", "0"), ("offset", str(offset)),
           ("transient", "1"), ("attempt", str(attempt)), ("final", "0")]
    return KafkaRecord(topics.dead_letters, 0, offset, key, value,
                       [*headers, *((DLQ_PREFIX + k, v.encode()) for k, v in dlq)],
                       int((time.time() - age_s) * 1000))


def retries_sent(cfg: CqrsConfig, topics: AppTopics, command_id: str) -> list[KafkaRecord]:
    return [r for r in read_to_end(cfg, [topics.commands])
            if ATTEMPT_HEADER in dict(r.headers) and r.value and command_id.encode() in r.value]


@pytest.fixture
def retrier(cfg: CqrsConfig, topics: AppTopics) -> Iterator[Retrier]:
    r = Retrier(cfg, app, topics)
    yield r
    r.close()


def claim(r: Retrier, cfg: CqrsConfig, topics: AppTopics, command_id: str) -> None:
    """What a round does before producing: the claim, with the topics' ends noted."""
    ends = {t: {str(p): hw for p, (_, hw) in watermarks(cfg, t).items()}
            for t in (topics.commands, topics.results)}
    applied, _ = r.store.change_state(command_id, 1, "waiting", "delivering",
                                      delivering_ms=int(time.time() * 1000), offsets=json.dumps(ends))
    assert applied


def test_a_round_that_died_after_producing_is_not_delivered_again(
        cfg: CqrsConfig, topics: AppTopics, retrier: Retrier) -> None:
    rec = letter(topics, "a", 0)
    assert retrier.ingest([rec]).waiting == 1
    claim(retrier, cfg, topics, "cmd-a")
    producer = make_producer(cfg)
    key, value, headers = redelivery(rec.key, rec.value, [], 2)
    producer.produce(topics.commands, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0  # ...and the job died here, before marking it delivered

    restarted = Retrier(cfg, app, topics)
    try:
        stats = restarted.deliver_due()
        assert (stats.due, stats.delivered, stats.found_delivered) == (1, 0, 1)
        assert restarted.deliver_due().due == 0  # the entry is gone
    finally:
        restarted.close()
    assert len(retries_sent(cfg, topics, "cmd-a")) == 1
    assert retrier.store.attempt("cmd-a", 1).state == "delivered"


def test_a_round_that_died_before_producing_delivers_once(
        cfg: CqrsConfig, topics: AppTopics, retrier: Retrier) -> None:
    retrier.ingest([letter(topics, "b", 0)])
    claim(retrier, cfg, topics, "cmd-b")  # ...and the job died here
    restarted = Retrier(cfg, app, topics)
    try:
        stats = restarted.deliver_due()
        assert (stats.due, stats.delivered, stats.found_delivered) == (1, 1, 0)
        assert restarted.deliver_due().due == 0
    finally:
        restarted.close()
    sent = retries_sent(cfg, topics, "cmd-b")
    assert [dict(r.headers)[ATTEMPT_HEADER] for r in sent] == [b"2"]


def test_a_replayed_letter_is_not_delivered_again(
        cfg: CqrsConfig, topics: AppTopics, retrier: Retrier) -> None:
    rec = letter(topics, "c", 0)
    retrier.ingest([rec])
    assert retrier.deliver_due().delivered == 1
    # the processor re-ran its micro-batch (the same letter again) and the job replays a batch
    again = letter(topics, "c", 1)
    stats = retrier.ingest([rec, again])
    assert stats.seen_before == 2
    assert retrier.deliver_due().delivered == 0
    assert len(retries_sent(cfg, topics, "cmd-c")) == 1


def test_a_letter_due_later_waits_and_the_read_is_a_range(
        cfg: CqrsConfig, topics: AppTopics, retrier: Retrier) -> None:
    soon = letter(topics, "d", 0, age_s=0.0)  # due in ~1 s (initial backoff, +-20 %)
    retrier.ingest([soon])
    assert retrier.deliver_due().delivered == 0
    time.sleep(1.5)
    stats = retrier.deliver_due()
    assert stats.delivered == 1 and stats.buckets_read <= 2
