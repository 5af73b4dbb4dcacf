"""The retry job's two halves, over the Cassandra tables of :mod:`cqrs.retrier.store`:

- :meth:`Retrier.ingest` records a micro-batch of dead letters (each letter's history row is
  inserted once, by a lightweight transaction; a transient letter with attempts left gets a
  due entry; one out of attempts is copied to the parked topic);
- :meth:`Retrier.deliver_due` is one round of the timer: read the due slice, claim each entry
  (``waiting -> delivering``, a lightweight transaction, written before producing), produce the
  command again, then mark it ``delivered`` and delete the entry.

A round that dies between the claim and the mark leaves ``delivering`` rows: the next round
looks for the record in the commands topic from the ends it noted before producing, and
produces it only if it is not there. So each due retry is delivered once, SIGKILL or not.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import attrs

from cqrs.app import App
from cqrs.config import CqrsConfig
from cqrs.deadletters import DeadLetter, parse_dead_letter
from cqrs.errors import CqrsError
from cqrs.kafka_io import KafkaRecord, OffsetReader, make_consumer, make_producer, take
from cqrs.retries import ATTEMPT_HEADER
from cqrs.retrier.plan import (
    PARKED, WAITING, bucket_of, classify, due_ms, letter_id, redelivery,
)
from cqrs.retrier.store import AttemptRow, DueEntry, RetryStore, now_ms
from cqrs.topics import AppTopics

__all__ = ["DeliverStats", "IngestStats", "Retrier", "RetrierError"]

DELIVERING = "delivering"
DELIVERED = "delivered"


class RetrierError(CqrsError, RuntimeError):
    """The retry job could not deliver or record something; it is retried on restart."""


@attrs.define
class IngestStats:
    letters: int = 0
    waiting: int = 0
    parked: int = 0
    seen_before: int = 0


@attrs.define
class DeliverStats:
    due: int = 0
    delivered: int = 0
    found_delivered: int = 0  # claimed by a round that died after producing
    stale: int = 0  # entries of retries delivered or parked already
    buckets_read: int = 0
    seconds: float = 0.0


class Retrier:
    """The retry job of one app, driver side."""

    def __init__(self, cfg: CqrsConfig, app: App, topics: AppTopics,
                 store: RetryStore | None = None) -> None:
        self.cfg = cfg
        self.app = app
        self.topics = topics
        self.store = store or RetryStore(cfg, topics.base)
        self.max_due = cfg.retrier.max_due_per_trigger
        self.bucket_s = cfg.retrier.bucket_s
        self._lock = threading.Lock()
        self._cursor: int | None = self.store.cursor()
        self._producer: Any = None
        self._offsets = {t: OffsetReader(cfg, t) for t in (topics.commands, topics.results)}

    @property
    def producer(self) -> Any:
        if self._producer is None:
            self._producer = make_producer(self.cfg)
        return self._producer

    def close(self) -> None:
        for reader in self._offsets.values():
            reader.close()
        self.store.close()

    # ---- ingest ----------------------------------------------------------------------------

    def ingest(self, records: Sequence[KafkaRecord]) -> IngestStats:
        """Record dead letters (idempotent: a replayed micro-batch changes nothing)."""
        letters = [d for d in map(parse_dead_letter, records)
                   if not d.source_topic or d.source_topic == self.topics.commands]
        stats = IngestStats(letters=len(letters))
        if not letters:
            return stats
        rows = [self._attempt_row(d) for d in letters]
        found = self.store.insert_attempts(rows)
        due: list[DueEntry] = []
        parked: list[DeadLetter] = []
        for d, row, (inserted, state, stored_due) in zip(letters, rows, found, strict=True):
            stats.seen_before += not inserted
            if state in (WAITING, DELIVERING) and stored_due is not None:
                due.append(DueEntry(bucket_of(stored_due, self.bucket_s), stored_due,
                                    row.command_id, row.attempt))
            if inserted and d.transient and d.final:
                parked.append(d)
        # the previous attempt failed again; the letter's row (a later letter's time wins)
        self.store.set_outcomes([(r.command_id, d.attempt - 1, "failed again")
                                 for d, r in zip(letters, rows, strict=True) if d.attempt > 1])
        self.store.put_letters([(r.command_id, d.timestamp_ms * 1000 + d.attempt,
                                 self._letter_columns(d, r))
                                for d, r in zip(letters, rows, strict=True)])
        stats.waiting, stats.parked = len(due), sum(1 for r in rows if r.state == PARKED)
        for d in parked:
            self.producer.produce(self.topics.parked, key=d.key, value=d.value,
                                  headers=_letter_headers(d))
        if parked and self.producer.flush(30):
            raise RetrierError(f"{len(parked)} parked letter(s) were not acknowledged by Kafka "
                               f"({self.topics.parked}) within 30 s")
        if due:
            with self._lock:  # add and lower the cursor together (see deliver_due)
                self.store.add_due(due)
                low = min(e.due_ms for e in due)
                if self._cursor is None or low < self._cursor:
                    self._cursor = low
                    self.store.save_cursor(low)
        return stats

    def _attempt_row(self, d: DeadLetter) -> AttemptRow:
        state = classify(d)
        return AttemptRow(
            command_id=letter_id(d), attempt=d.attempt, letter=d.position, failed_ms=d.timestamp_ms,
            stage=d.stage, error_type=d.error_type, error=d.error, command_type=d.message_type,
            aggregate_id=d.aggregate_id, final=d.final, state=state,
            due_ms=due_ms(self.app.retries, d) if state == WAITING else None,
            delivering_ms=None, delivered_ms=None,
            outcome=PARKED if d.transient and d.final else None, note=None,
            key=d.key, value=d.value, headers=list(d.headers), offsets=None)

    @staticmethod
    def _letter_columns(d: DeadLetter, row: AttemptRow) -> dict[str, Any]:
        columns: dict[str, Any] = dict(
            state=row.state, attempts=d.attempt, command_type=d.message_type,
            error_type=d.error_type, error=d.error, aggregate_id=d.aggregate_id,
            last_ms=d.timestamp_ms, due_ms=row.due_ms)
        if d.attempt == 1:
            columns["first_ms"] = d.timestamp_ms
        return columns

    # ---- the timer -------------------------------------------------------------------------

    def deliver_due(self, at_ms: int | None = None) -> DeliverStats:
        """One round: deliver what is due at ``at_ms`` (default: now)."""
        import time

        started = time.perf_counter()
        now = now_ms() if at_ms is None else at_ms
        stats = DeliverStats()
        with self._lock:
            previous = self._cursor
            if previous is None:
                return stats
            # below the new cursor every entry is read (and delivered below); ingest lowers it
            entries, self._cursor, stats.buckets_read = self.store.due(previous, now, self.max_due)
        stats.due = len(entries)
        try:
            self._deliver(entries, now, stats)
        except BaseException:
            with self._lock:
                self._cursor = min(previous, self._cursor if self._cursor is not None else previous)
            raise
        with self._lock:
            if self._cursor is not None:
                self.store.save_cursor(self._cursor)
        stats.seconds = time.perf_counter() - started
        return stats

    def _deliver(self, entries: Sequence[DueEntry], now: int, stats: DeliverStats) -> None:
        if not entries:
            return
        offsets = json.dumps({t: {str(p): hw for p, (_, hw) in r.watermarks().items()}
                              for t, r in self._offsets.items()})
        send: list[tuple[DueEntry, AttemptRow]] = []
        done: list[tuple[DueEntry, AttemptRow]] = []
        found = self.store.attempts_of([(e.command_id, e.attempt) for e in entries])
        for entry, row in zip(entries, found, strict=True):
            state = row.state if row is not None else None
            if row is not None and state == WAITING:
                applied, state = self.store.change_state(
                    entry.command_id, entry.attempt, WAITING, DELIVERING, delivering_ms=now,
                    offsets=offsets)
                if applied:
                    send.append((entry, row))
                    continue
                row = self.store.attempt(entry.command_id, entry.attempt)
            if row is not None and state == DELIVERING:  # a round died after claiming it
                if self._in_commands_topic(row):
                    done.append((entry, row))
                    stats.found_delivered += 1
                else:
                    send.append((entry, row))
                continue
            stats.stale += 1
            self.store.delete_due([entry])
        for _, row in send:
            key, value, headers = redelivery(row.key, row.value, row.headers or [], row.attempt + 1)
            self.producer.produce(self.topics.commands, key=key, value=value, headers=headers)
        left = self.producer.flush(30)
        if left:
            raise RetrierError(f"{left} retried command(s) were not acknowledged by Kafka "
                               f"({self.topics.commands}) within 30 s; the next round checks "
                               "the topic and sends what is missing")
        stats.delivered = len(send)
        self.store.finish_deliveries([(entry, now * 1000) for entry, _ in [*send, *done]], now)

    def _in_commands_topic(self, row: AttemptRow) -> bool:
        """Whether attempt ``row.attempt + 1`` of the command was produced after the ends noted
        in ``row.offsets``."""
        from confluent_kafka import TopicPartition

        if not row.offsets:
            return False
        starts = json.loads(row.offsets).get(self.topics.commands, {})
        ends = self._offsets[self.topics.commands].watermarks()
        wanted = str(row.attempt + 1).encode()
        consumer = make_consumer(self.cfg)
        try:
            todo = {int(p): hw for p, (_, hw) in ends.items() if hw > int(starts.get(str(p), 0))}
            if not todo:
                return False
            consumer.assign([TopicPartition(self.topics.commands, p, int(starts.get(str(p), 0)))
                             for p in todo])
            while todo:
                msgs = take(consumer, 1000, 1.0)
                if not msgs:
                    raise RetrierError(f"could not read {self.topics.commands} to check whether "
                                       f"retry {row.attempt + 1} of {row.command_id!r} was sent")
                for m in msgs:
                    if m.error() or m.partition() not in todo:
                        continue
                    if (m.key() == row.key and m.value() == row.value
                            and (ATTEMPT_HEADER, wanted) in list(m.headers() or [])):
                        return True
                    if m.offset() + 1 >= todo[m.partition()]:
                        del todo[m.partition()]
            return False
        finally:
            consumer.close()


def _letter_headers(d: DeadLetter) -> list[tuple[str, bytes]]:
    """A parked letter's headers: the original ones and its ``cqrs.dlq.*`` description."""
    from cqrs.processor.step import DLQ_PREFIX

    return [*d.headers, (f"{DLQ_PREFIX}stage", d.stage.encode()),
            (f"{DLQ_PREFIX}error_type", d.error_type.encode()),
            (f"{DLQ_PREFIX}error", d.error.encode(errors="replace")),
            (f"{DLQ_PREFIX}attempt", str(d.attempt).encode()),
            (f"{DLQ_PREFIX}letter", d.position.encode())]
