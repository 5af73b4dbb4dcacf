"""Waiting for the end of a conversation: the outcome a process manager records when it sees
one of its ``completes_on`` events (topic ``<app>.conversation-outcomes``, key = correlation
id; the correlation id of a conversation is the id of the command that started it, unless the
client gave another).

:func:`wait_for_outcome` reads every partition of that small topic from a little before the
call (an outcome written before the caller started waiting is found too) and returns the first
outcome of the correlation id, with its event decoded: one consumer per call, for the command
line. A :class:`CommandClient` (and so the HTTP service) keeps an :class:`OutcomeWatcher`
instead: one consumer that follows the topic as outcomes are written and hands each to whoever
waits for it, a few milliseconds after the process manager wrote it.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from cqrs.app import App
from cqrs.client.errors import ClientError
from cqrs.config import CqrsConfig
from cqrs.results import ConversationOutcome
from cqrs.topics import AppTopics, topics_for

__all__ = ["ConversationTimeoutError", "OutcomeWatcher", "outcome_json", "wait_for_outcome"]


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


def _outcome_positions(cfg: CqrsConfig, consumer: Any, topics: AppTopics, since: float) -> list[Any]:
    """Where to read the outcomes topic from to see every outcome written since ``since`` (a
    ``time.time()``): per partition the first offset at or after it, else the end as it was
    *before* the look-up (the end taken later, e.g. ``OFFSET_END`` at the first fetch, would
    miss an outcome written in between: a conversation may end within milliseconds)."""
    from confluent_kafka import TopicPartition

    from cqrs.kafka_io import watermarks

    ends = {p: high for p, (_, high) in watermarks(cfg, topics.outcomes).items()}
    wanted = [TopicPartition(topics.outcomes, p, int(since * 1000)) for p in sorted(ends)]
    found = consumer.offsets_for_times(wanted, timeout=30)
    return [TopicPartition(topics.outcomes, tp.partition,
                           tp.offset if tp.offset >= 0 else ends[tp.partition]) for tp in found]


def _timeout_error(correlation_id: str, timeout: float) -> ConversationTimeoutError:
    return ConversationTimeoutError(
        f"conversation {correlation_id!r} did not end within {timeout:g} s: is the process "
        f"manager running (`cqrs run process-manager ...`), and does one of its completes_on "
        "events end this conversation?")


def wait_for_outcome(cfg: CqrsConfig, app: App, correlation_id: str, *, timeout: float = 30.0,
                     since_s: float = 3600.0, topics: AppTopics | None = None,
                     codec: Any = None) -> tuple[ConversationOutcome, Any]:
    """``(outcome, event)`` of the conversation ``correlation_id``; outcomes written up to
    ``since_s`` seconds before the call count. Raises :class:`ConversationTimeoutError`."""
    from cqrs.codec.kafka_schema_store import KafkaSchemaStore
    from cqrs.kafka_io import make_consumer

    if not isinstance(correlation_id, str) or not correlation_id:
        raise ClientError(f"correlation id {correlation_id!r} must be a non-empty str")
    topics = topics or topics_for(app.name, cfg.kafka.topic_prefix)
    store = None
    if codec is None:
        from cqrs.personal.stack import key_store_for

        key_store = key_store_for(cfg, app)
        store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, topics.schemas,
                                 cfg.kafka.client_options())
        codec = app.codec_for(store, key_store=key_store)
    consumer = make_consumer(cfg)
    try:
        consumer.assign(_outcome_positions(cfg, consumer, topics, time.time() - since_s))
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
    raise _timeout_error(correlation_id, timeout)


class OutcomeWatcher:
    """Follows the outcomes topic from ``since_s`` before its start, keeping the first outcome of
    each of the last ``capacity`` correlation ids it saw, and hands each outcome to the callers
    of :meth:`wait` as soon as it is read (one consumer, whatever the number of waiters)."""

    def __init__(self, cfg: CqrsConfig, topics: AppTopics, codec: Any, *, since_s: float = 3600.0,
                 capacity: int = 100_000) -> None:
        from cqrs.kafka_io import make_consumer

        self.cfg = cfg
        self.topics = topics
        self.codec = codec
        self.capacity = capacity
        self.covers_from = time.time() - since_s  # outcomes written since then are seen
        self._seen: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._waiting: dict[str, list[threading.Event]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._consumer = make_consumer(cfg, **{"fetch.wait.max.ms": 100})
        try:
            self._consumer.assign(_outcome_positions(cfg, self._consumer, topics, self.covers_from))
        except BaseException:
            self._consumer.close()
            raise
        self._thread = threading.Thread(target=self._follow, name="cqrs-outcomes", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        from cqrs.kafka_io import take

        try:
            while not self._closed.is_set():
                for msg in take(self._consumer, 1000, 0.2):
                    key = msg.key()
                    if msg.error() is not None or not key:
                        continue
                    cid = key.decode("utf-8", errors="replace")
                    with self._lock:
                        if cid in self._seen:
                            continue
                        self._seen[cid] = msg.value()
                        if len(self._seen) > self.capacity:
                            self._seen.popitem(last=False)
                        waiters = self._waiting.pop(cid, [])
                    for w in waiters:
                        w.set()
        except BaseException as exc:  # noqa: BLE001 - waiters see it
            self._error = exc
            with self._lock:
                waiting, self._waiting = self._waiting, {}
            for ws in waiting.values():
                for w in ws:
                    w.set()
        finally:
            self._consumer.close()

    def covers(self, since_s: float) -> bool:
        """Whether outcomes written up to ``since_s`` before now are seen by this watcher."""
        return time.time() - since_s >= self.covers_from and not self._closed.is_set()

    def wait(self, correlation_id: str, timeout: float) -> tuple[ConversationOutcome, Any]:
        """``(outcome, event)`` of the conversation; raises :class:`ConversationTimeoutError`."""
        if not isinstance(correlation_id, str) or not correlation_id:
            raise ClientError(f"correlation id {correlation_id!r} must be a non-empty str")
        ready = threading.Event()
        with self._lock:
            value = self._seen.get(correlation_id)
            if value is None:
                self._waiting.setdefault(correlation_id, []).append(ready)
        if value is None:
            ready.wait(timeout)
            with self._lock:
                value = self._seen.get(correlation_id)
                if value is None:
                    waiters = self._waiting.get(correlation_id, [])
                    if ready in waiters:
                        waiters.remove(ready)
                        if not waiters:
                            del self._waiting[correlation_id]
            if value is None:
                if self._error is not None:
                    raise ClientError(f"reading {self.topics.outcomes} failed: {self._error}")
                raise _timeout_error(correlation_id, timeout)
        outcome = self.codec.decode(value)
        return outcome, self.codec.decode(outcome.payload)

    def close(self) -> None:
        self._closed.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
