"""``KafkaSchemaStore``: every schema in a compacted Kafka topic (key = fingerprint hex).

The topic (default ``_cqrs_schemas``) is created if missing with ``cleanup.policy=compact``;
the value is the schema's compact JSON (sorted keys, with the ``cqrs.type`` / ``cqrs.version``
attributes). The store reads the whole topic up to the high watermarks on start, and again when
asked for an unknown fingerprint. Any Kafka consumer can read the topic.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cqrs.codec.schema import canonical_json
from cqrs.codec.schema_store import SchemaStore
from cqrs.codec.single_object import fingerprint
from cqrs.errors import SchemaStoreError

__all__ = ["KafkaSchemaStore"]


class KafkaSchemaStore(SchemaStore):
    """Schemas kept in a compacted topic; a local copy answers ``get``."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str = "_cqrs_schemas",
        client_options: Mapping[str, str] | None = None,
        *,
        timeout: float = 30.0,
        replication_factor: int = -1,
    ) -> None:
        self.topic = topic
        self.timeout = timeout
        self._conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, **(client_options or {})}
        self._lock = threading.Lock()
        self._schemas: dict[bytes, str] = {}
        self._producer: Producer | None = None
        self._ensure_topic(replication_factor)
        self.refresh()

    def _ensure_topic(self, replication_factor: int) -> None:
        admin = AdminClient(self._conf)
        try:
            meta = admin.list_topics(timeout=self.timeout)
            if self.topic in meta.topics:
                return
            futures = admin.create_topics(
                [
                    NewTopic(
                        self.topic,
                        num_partitions=1,
                        replication_factor=replication_factor,
                        config={"cleanup.policy": "compact"},
                    )
                ],
                operation_timeout=self.timeout,
            )
            futures[self.topic].result(timeout=self.timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            raise SchemaStoreError(
                f"cannot create the schemas topic {self.topic!r} on "
                f"{self._conf['bootstrap.servers']}: {exc}; check that Kafka is reachable and "
                "that this client may create topics (or create it with cleanup.policy=compact)"
            ) from exc

    def refresh(self) -> None:
        """Read the topic from the beginning up to the current high watermarks."""
        consumer = Consumer(
            {
                **self._conf,
                "group.id": f"cqrs-schema-store-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            meta = consumer.list_topics(self.topic, timeout=self.timeout)
            parts = meta.topics[self.topic].partitions
            targets: dict[int, int] = {}
            assignment = []
            for p in parts:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self.timeout
                )
                if high > low:
                    targets[p] = high
                    assignment.append(TopicPartition(self.topic, p, low))
            if not assignment:
                return
            consumer.assign(assignment)
            deadline = time.monotonic() + self.timeout
            while targets:
                if time.monotonic() > deadline:
                    raise SchemaStoreError(
                        f"reading the schemas topic {self.topic!r} took longer than "
                        f"{self.timeout}s: check the brokers or raise the timeout"
                    )
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise SchemaStoreError(f"reading {self.topic!r} failed: {msg.error()}")
                self._remember(msg.key(), msg.value())
                if msg.offset() + 1 >= targets.get(msg.partition(), 0):
                    targets.pop(msg.partition(), None)
        except KafkaException as exc:
            raise SchemaStoreError(
                f"cannot read the schemas topic {self.topic!r}: {exc}"
            ) from exc
        finally:
            consumer.close()

    def _remember(self, key: bytes | None, value: bytes | None) -> None:
        if key is None or value is None:
            return  # tombstone or foreign record
        try:
            fp = bytes.fromhex(key.decode())
            json.loads(value)
        except (ValueError, UnicodeDecodeError):
            return  # not ours; the topic is readable by anyone, keep going
        with self._lock:
            self._schemas.setdefault(fp, value.decode())

    def put(self, schema: Mapping[str, Any]) -> bytes:
        fp = fingerprint(schema)
        if fp in self._schemas:
            return fp
        text = canonical_json(schema)
        with self._lock:
            if self._producer is None:
                self._producer = Producer({**self._conf, "enable.idempotence": True})
            errors: list[Any] = []
            self._producer.produce(
                self.topic,
                key=fp.hex().encode(),
                value=text.encode(),
                on_delivery=lambda err, _msg: errors.append(err) if err else None,
            )
            remaining = self._producer.flush(self.timeout)
            if remaining or errors:
                raise SchemaStoreError(
                    f"cannot write schema {schema.get('cqrs.type', schema.get('name'))} to "
                    f"{self.topic!r}: {errors or 'flush timed out'}; check the brokers"
                )
            self._schemas.setdefault(fp, text)
        return fp

    def get(self, fp: bytes) -> dict[str, Any]:
        text = self._schemas.get(fp)
        if text is None:
            self.refresh()  # written by another process since we started?
            text = self._schemas.get(fp)
        if text is None:
            raise self._unknown(fp, f"the schemas topic {self.topic!r}")
        return json.loads(text)  # type: ignore[no-any-return]

    def all(self) -> dict[bytes, dict[str, Any]]:
        with self._lock:
            items = list(self._schemas.items())
        return {fp: json.loads(text) for fp, text in items}

    def close(self) -> None:
        """Flush and release the producer."""
        if self._producer is not None:
            self._producer.flush(self.timeout)
            self._producer = None
