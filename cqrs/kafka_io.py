"""The framework's Kafka clients, built in one place from the configuration.

Producers hash keys with murmur2 like the Java client and Spark, so a key lands on the same
partition whoever writes it; they are idempotent with ``acks=all`` so nothing is lost or
reordered by a retry.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError, KafkaUnavailableError, TopicNotFoundError

__all__ = ["KafkaRecord", "OffsetReader", "make_admin", "make_consumer", "make_producer",
           "murmur2_partition", "read_to_end", "take", "watermarks"]


@attrs.frozen
class KafkaRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java client (and librdkafka's ``murmur2_random``) picks for ``key``."""
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    length = len(key)
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length - rest
    if rest == 3:
        h ^= key[tail + 2] << 16
    if rest >= 2:
        h ^= key[tail + 1] << 8
    if rest >= 1:
        h ^= key[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def _base(cfg: CqrsConfig) -> dict[str, Any]:
    """Options every client shares. librdkafka logs errors only (level 3): its warnings about
    transient states (a coordinator still loading, a broker restarting) are retried anyway and
    only clutter the terminal; ``kafka.extra = {log_level = "6"}`` brings them back."""
    return {"bootstrap.servers": cfg.kafka.bootstrap_servers, "log_level": 3,
            **cfg.kafka.client_options()}


def make_admin(cfg: CqrsConfig) -> Any:
    """An admin client; keep a reference while waiting on its futures."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(_base(cfg))


def make_producer(cfg: CqrsConfig, **extra: Any) -> Any:
    from confluent_kafka import Producer

    return Producer({
        **_base(cfg),
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",  # the Java client's partitioner
        "linger.ms": 5,
        **extra,
    })


def make_consumer(cfg: CqrsConfig, group_id: str | None = None, **extra: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer({
        **_base(cfg),
        "group.id": group_id or f"cqrs-reader-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        **extra,
    })


def take(consumer: Any, max_messages: int, timeout: float) -> list[Any]:
    """The messages ``consumer`` has ready, at most ``max_messages``, waiting up to ``timeout``
    seconds for the first one only. (librdkafka's ``consume(n, timeout)`` waits the whole
    timeout unless ``n`` messages came: at a few hundred messages a second that held every
    answer back by up to the timeout.)"""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, 0)] if max_messages > 1 else [first]


def watermarks(cfg: CqrsConfig, topic: str, retry_s: float = 30.0) -> dict[int, tuple[int, int]]:
    """``partition -> (low, high)`` offsets of ``topic`` (high: the offset the next record gets).

    Retriable errors are retried for ``retry_s`` seconds with a fresh consumer each time: a topic
    created a moment ago answers NOT_LEADER_FOR_PARTITION until its leaders are known, and a
    partition whose leader just died OFFSET_NOT_AVAILABLE until the new one caught up.
    """
    import time

    deadline = time.monotonic() + retry_s
    while True:
        try:
            return _watermarks(cfg, topic)
        except KafkaUnavailableError as exc:
            if not _transient(exc.__cause__) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _transient(exc: BaseException | None) -> bool:
    from confluent_kafka import KafkaError

    err = exc.args[0] if exc is not None and exc.args else None
    if not isinstance(err, KafkaError):
        return False
    # OFFSET_NOT_AVAILABLE: a partition's new leader, right after the old one died, does not
    # answer for its high watermark until it caught up (seconds; seen killing a broker)
    return err.retriable() or err.code() in (
        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.OFFSET_NOT_AVAILABLE)


def _watermarks(cfg: CqrsConfig, topic: str) -> dict[int, tuple[int, int]]:
    from confluent_kafka import KafkaException, TopicPartition

    consumer = make_consumer(cfg)
    try:
        meta = consumer.list_topics(topic, timeout=30)
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise TopicNotFoundError(
                f"topic {topic!r} does not exist on {cfg.kafka.bootstrap_servers}: check the app "
                "name and topic prefix, and that this is the cluster the processor writes to"
            )
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                for p in sorted(found.partitions)}
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"cannot read the offsets of topic {topic!r} on {cfg.kafka.bootstrap_servers}: {exc}; "
            "is Kafka reachable (`cqrs dev status`)?"
        ) from exc
    finally:
        consumer.close()


class OffsetReader:
    """A topic's watermarks read again and again through one consumer (a streaming source asks
    every micro-batch; a consumer per call costs a connection and a metadata round trip)."""

    def __init__(self, cfg: CqrsConfig, topic: str) -> None:
        self.cfg = cfg
        self.topic = topic
        self._consumer: Any = None
        self._partitions: list[int] = []

    def watermarks(self) -> dict[int, tuple[int, int]]:
        """``partition -> (low, high)``; the partitions are looked up once (a fresh consumer and
        a retry after an error, as :func:`watermarks` does)."""
        from confluent_kafka import KafkaException, TopicPartition

        if self._consumer is None:
            self._partitions = sorted(watermarks(self.cfg, self.topic))
            self._consumer = make_consumer(self.cfg)
        try:
            return {p: self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30)
                    for p in self._partitions}
        except KafkaException:
            self.close()  # reconnect on the next call; this one takes the slow, retrying path
            return watermarks(self.cfg, self.topic)

    def ends(self) -> dict[int, int]:
        """``partition -> high`` alone, in one ListOffsets request for every partition (a
        timestamp of -1 asks for the latest offset; :meth:`watermarks` makes two requests per
        partition). A streaming source asks this each time Spark polls for new data, every
        ``spark.sql.streaming.pollingDelay`` while nothing comes."""
        from confluent_kafka import KafkaException, TopicPartition

        if self._consumer is None:
            return {p: high for p, (_, high) in self.watermarks().items()}
        try:
            found = self._consumer.offsets_for_times(
                [TopicPartition(self.topic, p, -1) for p in self._partitions], timeout=30)
        except KafkaException:
            found = None
        if found is None or any(tp.error is not None or tp.offset < 0 for tp in found):
            return {p: high for p, (_, high) in self.watermarks().items()}
        return {tp.partition: tp.offset for tp in found}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def read_to_end(cfg: CqrsConfig, topics: Iterable[str], timeout_s: float = 60.0, *,
                starts: Mapping[tuple[str, int], int] | None = None) -> list[KafkaRecord]:
    """Every record of ``topics`` from the beginning (or ``starts[(topic, partition)]``, an
    offset) up to their ends as of this call."""
    import time

    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    consumer = make_consumer(cfg)
    try:
        metadata = consumer.list_topics(timeout=10)
        wanted: dict[tuple[str, int], int] = {}
        assignment = []
        for topic in topics:
            if topic not in metadata.topics or metadata.topics[topic].error is not None:
                raise CqrsError(f"topic {topic!r} does not exist at {cfg.kafka.bootstrap_servers}")
            for p in metadata.topics[topic].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                start = max(low, (starts or {}).get((topic, p), low))
                if high > start:
                    wanted[(topic, p)] = high
                    assignment.append(TopicPartition(topic, p, start if start > low
                                                     else OFFSET_BEGINNING))
        if not assignment:
            return []
        consumer.assign(assignment)
        out: list[KafkaRecord] = []
        deadline = time.monotonic() + timeout_s
        while wanted and time.monotonic() < deadline:
            for msg in take(consumer, 10_000, 0.5):
                if msg.error():
                    continue
                tp = (msg.topic(), msg.partition())
                end = wanted.get(tp)
                if end is None or msg.offset() >= end:
                    continue
                out.append(KafkaRecord(msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                       msg.value(), list(msg.headers() or []), msg.timestamp()[1]))
                if msg.offset() + 1 >= end:
                    del wanted[tp]
        if wanted:
            raise CqrsError(f"timed out after {timeout_s:.0f} s reading {sorted(wanted)} to the end")
        return out
    finally:
        consumer.close()
