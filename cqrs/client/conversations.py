"""Waiting for the end of a conversation: the outcome a process manager records when it sees
one of its ``completes_on`` events (topic ``<app>.conversation-outcomes``, key = correlation
id; the correlation id of a conversation is the id of the command that started it, unless the
client gave another).

The waiter reads every partition of that small topic from a little before the call (an outcome
written before the caller started waiting is found too) and returns the first outcome of the
correlation id, with its event decoded.
"""

from __future__ import annotations

import time
from typing import Any

from cqrs.app import App
from cqrs.client.errors import ClientError
from cqrs.config import CqrsConfig
from cqrs.results import ConversationOutcome
from cqrs.topics import AppTopics, topics_for

__all__ = ["ConversationTimeoutError", "outcome_json", "wait_for_outcome"]


class ConversationTimeoutError(ClientError, TimeoutError):
    """No process manager recorded the end of the conversation in time."""


def outcome_json(outcome: ConversationOutcome, event: Any) -> dict[str, Any]:
    """The outcome as JSON-ready data (CLI and HTTP): its fields, and the event as ``type`` and
    ``data`` instead of its encoded bytes."""
    from cqrs.client.json_commands import to_jsonable

    body: dict[str, Any] = to_jsonable(outcome)
    body.pop("payload", None)
    body["event"] = {"type": outcome.event_type, "data": to_jsonable(event)}
    return body


def wait_for_outcome(cfg: CqrsConfig, app: App, correlation_id: str, *, timeout: float = 30.0,
                     since_s: float = 3600.0, topics: AppTopics | None = None,
                     codec: Any = None) -> tuple[ConversationOutcome, Any]:
    """``(outcome, event)`` of the conversation ``correlation_id``; outcomes written up to
    ``since_s`` seconds before the call count. Raises :class:`ConversationTimeoutError`."""
    from confluent_kafka import OFFSET_END, TopicPartition

    from cqrs.codec.kafka_schema_store import KafkaSchemaStore
    from cqrs.kafka_io import make_consumer, watermarks

    if not isinstance(correlation_id, str) or not correlation_id:
        raise ClientError(f"correlation id {correlation_id!r} must be a non-empty str")
    topics = topics or topics_for(app.name, cfg.kafka.topic_prefix)
    store = None
    if codec is None:
        store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, topics.schemas,
                                 cfg.kafka.client_options())
        codec = app.codec_for(store)
    consumer = make_consumer(cfg)
    try:
        partitions = sorted(watermarks(cfg, topics.outcomes))
        start_ms = int((time.time() - since_s) * 1000)
        wanted = [TopicPartition(topics.outcomes, p, start_ms) for p in partitions]
        found = consumer.offsets_for_times(wanted, timeout=30)
        consumer.assign([TopicPartition(topics.outcomes, tp.partition,
                                        tp.offset if tp.offset >= 0 else OFFSET_END)
                         for tp in found])
        key = correlation_id.encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(min(0.5, max(deadline - time.monotonic(), 0.01)))
            if msg is None or msg.error() is not None or msg.key() != key:
                continue
            outcome = codec.decode(msg.value())
            return outcome, codec.decode(outcome.payload)
    finally:
        consumer.close()
        if store is not None:
            store.close()
    raise ConversationTimeoutError(
        f"conversation {correlation_id!r} did not end within {timeout:g} s: is the process "
        f"manager running (`cqrs run process-manager ...`), and does one of its completes_on "
        "events end this conversation?")
