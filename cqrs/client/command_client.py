"""``CommandClient``: send commands to an app's processor and get their results back.

>>> with CommandClient(app, cfg) as client:                               # doctest: +SKIP
...     r = client.send_and_wait("acc-1", Deposit(10), expected_version=3, timeout=10)
...     r.accepted, r.version, r.reason

Records go through :func:`~cqrs.client.encoding.encode_command` and the framework's producer
(idempotent, ``acks=all``, Java's murmur2 partitioner: per-aggregate order kept, nothing lost,
the same partition as Spark would pick). Results come back on the client's reply partition
(:mod:`cqrs.client.replies`). Thread-safe: share one client per process.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from typing import Any

import attrs

from cqrs.app import App
from cqrs.client.encoding import encode_command
from cqrs.client.errors import (
    ClientClosedError,
    CommandDeliveryError,
    InvalidAggregateIdError,
    InvalidCommandIdError,
)
from cqrs.client.json_commands import resolve_command_type
from cqrs.client.replies import (
    ListenerStats,
    ReplyListener,
    ResultFuture,
    choose_reply_partition,
    settle,
)
from cqrs.config import CqrsConfig, load_config
from cqrs.errors import CqrsError
from cqrs.kafka_io import make_producer, watermarks
from cqrs.results import CommandResult
from cqrs.topics import AppTopics, ensure_topics, topics_for

__all__ = ["CommandClient", "Outgoing", "check_ids"]


@attrs.frozen
class Outgoing:
    """One command to send with :meth:`CommandClient.send_many`."""

    aggregate_id: str
    command: object
    expected_version: int | None = None
    command_id: str | None = None
    correlation_id: str | None = None


def _check_text(kind: str, value: Any, error: type[CqrsError], optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise error(f"{kind} {value!r} must be a non-empty str")
    if "\0" in value:
        raise error(f"{kind} {value!r} contains a NUL character: use printable text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error(f"{kind} {value!r} cannot be encoded as UTF-8 (lone surrogate?)") from None


def check_ids(aggregate_id: Any, command_id: Any = None, correlation_id: Any = None,
              expected_version: Any = None) -> None:
    """Refuse ids and versions that cannot travel as a Kafka key / envelope header."""
    _check_text("aggregate id", aggregate_id, InvalidAggregateIdError, optional=False)
    _check_text("command id", command_id, InvalidCommandIdError, optional=True)
    _check_text("correlation id", correlation_id, InvalidCommandIdError, optional=True)
    if expected_version is not None and (
        not isinstance(expected_version, int) or isinstance(expected_version, bool)
        or expected_version < 0
    ):
        raise InvalidCommandIdError(
            f"expected_version {expected_version!r} must be None (any), 0 (new aggregate) or a "
            "positive int (exactly that version)"
        )


class CommandClient:
    """Sends commands of ``app`` to its commands topic and resolves futures with their results.

    ``cfg`` defaults to :func:`~cqrs.config.load_config`; ``topics`` to the app's topics under
    ``kafka.topic_prefix``. Creating the client creates missing topics, publishes the app's
    schemas and starts the results listener; :meth:`close` (or ``with``) stops it.
    """

    def __init__(self, app: App, cfg: CqrsConfig | None = None, *,
                 topics: AppTopics | None = None) -> None:
        from cqrs.codec.kafka_schema_store import KafkaSchemaStore
        from cqrs.personal.stack import key_store_for

        self.app = app
        self.cfg = cfg = cfg if cfg is not None else load_config()
        self.topics = topics or topics_for(app.name, cfg.kafka.topic_prefix)
        self.client_id = cfg.client.client_id or f"{app.name}-{uuid.uuid4().hex[:12]}"
        self.default_timeout = cfg.client.timeout_s
        self.max_record_bytes = cfg.kafka.max_record_bytes()  # a bigger command is refused
        key_store = key_store_for(cfg, app)  # a missing master key is said before Kafka
        ensure_topics(cfg, self.topics)
        self._store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, self.topics.schemas,
                                       cfg.kafka.client_options())
        try:
            self._codec = app.codec_for(self._store, key_store=key_store)
            self._codec.publish_schemas()  # the processor finds every schema this client writes
            ends = {p: high for p, (_, high) in watermarks(cfg, self.topics.results).items()}
            self.reply_partition: int | None = None
            if cfg.client.reply_routing:
                self.reply_partition = choose_reply_partition(
                    self.client_id, len(ends), cfg.client.reply_partition)
                ends = {self.reply_partition: ends[self.reply_partition]}
        except BaseException:
            self._store.close()
            raise
        self._producer = make_producer(cfg, **{"client.id": self.client_id})
        self._listener = ReplyListener(cfg, self.topics.results, ends, self._decode_result,
                                       name=f"cqrs-replies-{self.client_id}")
        self._closed = threading.Event()
        self._outcomes: Any = None  # the OutcomeWatcher, from the first wait_conversation on
        self._watcher_lock = threading.Lock()
        self._poller = threading.Thread(target=self._poll, name=f"cqrs-producer-{self.client_id}",
                                        daemon=True)
        self._poller.start()

    # ---- conversations -------------------------------------------------------------------

    def wait_conversation(self, correlation_id: str, timeout: float | None = None,
                          since_s: float = 3600.0) -> tuple[Any, Any]:
        """``(outcome, event)``: the end of the conversation ``correlation_id`` (the id of the
        command that started it, unless you gave another), as recorded by a process manager
        (see :mod:`cqrs.client.conversations`)."""
        from cqrs.client.conversations import OutcomeWatcher, wait_for_outcome

        timeout = self.default_timeout if timeout is None else timeout
        with self._watcher_lock:
            if self._outcomes is None and not self._closed.is_set():
                self._outcomes = OutcomeWatcher(self.cfg, self.topics, self._codec,
                                                since_s=max(since_s, 3600.0))
            watcher = self._outcomes
        if watcher is not None and watcher.covers(since_s):
            return watcher.wait(correlation_id, timeout)
        return wait_for_outcome(self.cfg, self.app, correlation_id, timeout=timeout,
                                since_s=since_s, topics=self.topics, codec=self._codec)

    # ---- sending ------------------------------------------------------------------------

    def send(self, aggregate_id: str, command: object, expected_version: int | None = None,
             command_id: str | None = None, correlation_id: str | None = None) -> ResultFuture:
        """Send ``command`` to ``aggregate_id``; a future of its :class:`CommandResult`.

        ``expected_version``: ``None`` any, ``0`` the aggregate must be new, ``n`` exactly n.
        Resending with the same ``command_id`` is safe: the processor answers it once.
        Refused before anything is sent: :class:`InvalidAggregateIdError` (an id that is empty
        or too long for its aggregate-state row), :class:`CommandTooLargeError` (a record over
        ``kafka.max_record_bytes()``); :class:`CommandDeliveryError` when the producer refuses
        the record at once, or later in the future when Kafka does.
        """
        if self._closed.is_set():
            raise ClientClosedError("this CommandClient is closed: create a new one")
        check_ids(aggregate_id, command_id, correlation_id, expected_version)
        resolve_command_type(self.app, type(command))
        cid, key, value, headers = encode_command(
            self.app, aggregate_id, command, expected_version=expected_version,
            command_id=command_id, correlation_id=correlation_id,
            reply_partition=self.reply_partition, max_record_bytes=self.max_record_bytes,
            codec=self._codec,
        )
        future = ResultFuture(cid, aggregate_id)
        self._listener.register(future)  # before producing: the answer may be quick

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                settle(future, exc=CommandDeliveryError(cid, str(err)))

        while True:
            try:
                self._producer.produce(self.topics.commands, key=key, value=value,
                                       headers=headers, on_delivery=delivered)
                return future
            except BufferError:  # librdkafka's queue is full: let it drain
                self._producer.poll(0.05)
            except Exception as exc:
                from confluent_kafka import KafkaException

                future.cancel()  # the listener forgets it
                if not isinstance(exc, KafkaException):
                    raise
                # refused at once (e.g. a record over a limit set apart from the configuration)
                raise CommandDeliveryError(cid, str(exc.args[0] if exc.args else exc)) from None

    def send_many(self, commands: Iterable[Outgoing]) -> list[ResultFuture]:
        """Send several commands at once (in order); their futures, in the same order."""
        return [self.send(c.aggregate_id, c.command, c.expected_version, c.command_id,
                          c.correlation_id) for c in commands]

    def send_and_wait(self, aggregate_id: str, command: object,
                      expected_version: int | None = None, command_id: str | None = None,
                      correlation_id: str | None = None, *,
                      timeout: float | None = None) -> CommandResult:
        """Send and wait for the result; :class:`CommandTimeoutError` (with the command id to
        resend) after ``timeout`` seconds (default ``client.timeout_s``)."""
        future = self.send(aggregate_id, command, expected_version, command_id, correlation_id)
        return self.wait(future, timeout)

    def wait(self, future: ResultFuture, timeout: float | None = None) -> CommandResult:
        """The result of ``future``; on timeout the future is cancelled and forgotten."""
        try:
            return future.result(self.default_timeout if timeout is None else timeout)
        except TimeoutError:
            future.cancel()
            raise

    # ---- plumbing -------------------------------------------------------------------------

    def _decode_result(self, value: bytes) -> CommandResult:
        result = self._codec.decode(value)
        if not isinstance(result, CommandResult):
            raise CqrsError(f"results topic holds a {type(result).__name__}, not a CommandResult")
        return result

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.1)  # serves delivery reports

    def listener_stats(self) -> ListenerStats:
        """Records the results listener read, how many were this client's, its CPU time."""
        return self._listener.stats()

    def flush(self, timeout: float = 30.0) -> int:
        """Wait until Kafka has every command sent so far; the number still queued."""
        if self._producer is None:
            return 0  # closed: close() delivered everything already
        return int(self._producer.flush(timeout))

    def close(self, timeout: float = 30.0) -> None:
        """Deliver what is queued, stop the listener (pending futures fail), release Kafka."""
        if self._closed.is_set():
            return
        self._producer.flush(timeout)
        self._closed.set()
        self._poller.join(timeout=5)
        self._listener.close()
        with self._watcher_lock:
            watcher, self._outcomes = self._outcomes, None
        if watcher is not None:
            watcher.close()
        self._store.close()
        self._producer = None  # librdkafka lets go of the broker only when the handle is freed

    def __enter__(self) -> CommandClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CommandClient({self.app.name!r}, client_id={self.client_id!r}, "
                f"reply_partition={self.reply_partition})")
