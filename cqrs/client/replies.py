"""Getting command results back to the client that sent the command.

Each client owns a *reply partition* of the command-results topic. It asks the processor to
answer there (header ``cqrs.reply_partition``, set by :func:`~cqrs.client.encoding.encode_command`)
and its listener reads only that partition, from the end offset taken before the first send,
matching record keys (command ids) against its pending futures. Results of other clients that
share the partition are skipped without being decoded. With ``reply_routing`` off (processors
that ignore the header) the listener reads every partition instead.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import attrs

from cqrs.client.errors import ClientClosedError, ClientError, CommandTimeoutError
from cqrs.config import CqrsConfig
from cqrs.kafka_io import make_consumer, take
from cqrs.results import CommandResult

__all__ = ["ListenerStats", "ReplyListener", "ResultFuture", "choose_reply_partition", "settle"]


def choose_reply_partition(client_id: str, partitions: int, configured: int = -1) -> int:
    """The results partition a client listens on: ``configured`` when >= 0, else a stable hash
    of ``client_id`` (CRC-32, the same on every platform) modulo ``partitions``."""
    if partitions <= 0:
        raise ClientError(f"the command-results topic has {partitions} partitions: create it first")
    if configured >= 0:
        if configured >= partitions:
            raise ClientError(
                f"client.reply_partition = {configured} but the command-results topic has only "
                f"{partitions} partitions (0..{partitions - 1}): pick one of those or -1"
            )
        return configured
    if not client_id:
        raise ClientError("a client id is needed to derive the reply partition")
    return zlib.crc32(client_id.encode("utf-8")) % partitions


class ResultFuture(Future):  # type: ignore[type-arg]
    """A :class:`concurrent.futures.Future` of a :class:`CommandResult` that knows its command.

    ``result(timeout)`` raises :class:`CommandTimeoutError` (a ``TimeoutError``) carrying the
    command id; cancel a future you stop waiting for, so the client forgets it.
    """

    def __init__(self, command_id: str, aggregate_id: str) -> None:
        super().__init__()
        self.command_id = command_id
        self.aggregate_id = aggregate_id

    def result(self, timeout: float | None = None) -> CommandResult:
        try:
            return super().result(timeout)  # type: ignore[no-any-return]
        except TimeoutError as exc:
            if isinstance(exc, CommandTimeoutError):
                raise
            raise CommandTimeoutError(self.command_id, self.aggregate_id, timeout or 0.0) from None

    def __repr__(self) -> str:
        return f"<ResultFuture {self.command_id!r} {self._state.lower()}>"  # type: ignore[attr-defined]


@attrs.frozen
class ListenerStats:
    """What a listener did: records read from Kafka, those that were its own, its thread's CPU."""

    partitions: tuple[int, ...]
    records_read: int
    records_matched: int
    cpu_seconds: float
    pending: int


class ReplyListener:
    """A thread reading results from some partitions of the results topic for pending futures."""

    def __init__(self, cfg: CqrsConfig, topic: str, start_offsets: Mapping[int, int],
                 decode: Callable[[bytes], Any], name: str = "cqrs-replies") -> None:
        """Read ``topic`` from ``start_offsets`` (partition -> offset): the end offsets taken
        before anything is sent, so that no result can be missed."""
        from confluent_kafka import TopicPartition

        self.topic = topic
        self.partitions = tuple(sorted(start_offsets))
        self._decode = decode
        self._pending: dict[bytes, list[ResultFuture]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._read = 0
        self._matched = 0
        self._cpu = 0.0
        self._consumer = make_consumer(cfg, group_id=f"{name}-unused", **{"fetch.wait.max.ms": 100})
        self._consumer.assign([TopicPartition(topic, p, off) for p, off in start_offsets.items()])
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def register(self, future: ResultFuture) -> None:
        """Wait for ``future.command_id``; call before the command is produced."""
        key = future.command_id.encode("utf-8")
        with self._lock:
            if self._stop.is_set():
                raise ClientClosedError("the command client is closed: create a new one")
            self._pending.setdefault(key, []).append(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future) -> None:  # type: ignore[type-arg]
        if not isinstance(future, ResultFuture):
            return
        key = future.command_id.encode("utf-8")
        with self._lock:
            waiting = self._pending.get(key)
            if waiting and future in waiting:
                waiting.remove(future)
                if not waiting:
                    del self._pending[key]

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.thread_time()
            try:
                messages = take(self._consumer, 1000, 0.1)
            except RuntimeError:  # consumer closed under us during shutdown
                break
            for msg in messages:
                if msg.error():
                    continue
                self._read += 1
                with self._lock:
                    waiting = self._pending.pop(msg.key(), None)
                if not waiting:
                    continue  # someone else's result (or a duplicate answer): not decoded
                self._matched += 1
                self._deliver(waiting, msg.value())
            self._cpu += time.thread_time() - started

    def _deliver(self, waiting: list[ResultFuture], value: bytes) -> None:
        try:
            result = self._decode(value)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting callers
            for f in waiting:
                settle(f, exc=exc)
            return
        for f in waiting:
            settle(f, result=result)

    def stats(self) -> ListenerStats:
        with self._lock:
            pending = sum(len(v) for v in self._pending.values())
        return ListenerStats(self.partitions, self._read, self._matched, self._cpu, pending)

    def close(self) -> None:
        """Stop the thread, close the consumer, fail the futures still waiting."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            waiting = [f for fs in self._pending.values() for f in fs]
            self._pending.clear()
        self._thread.join(timeout=10)
        self._consumer.close()
        for f in waiting:
            settle(f, exc=ClientClosedError(
                f"the client was closed before the result of command {f.command_id!r} arrived; "
                "resend it with the same command id from a new client"))


def settle(future: Future, *, result: Any = None, exc: BaseException | None = None) -> None:  # type: ignore[type-arg]
    """Complete ``future`` unless it is done already (cancelled by a caller who gave up)."""
    if future.done():
        return
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except Exception:  # noqa: BLE001 - InvalidStateError: completed concurrently
        pass
