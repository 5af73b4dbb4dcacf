"""What operators do with letters (``cqrs dlq`` and ``/dead-letters`` of ``cqrs serve``): list
them with counts, show one's history with the outcome of each retry, retry, park or purge.

The outcome of a retry is read where it is: "failed again" / "parked" from the next dead letter
(the job writes it), "accepted" / "rejected" / "failed" from the results topic (key = command
id), looked up from the topic ends noted when the retry was sent and kept once found.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from cqrs.app import App
from cqrs.config import CqrsConfig
from cqrs.deadletters import DeadLetter, DeadLetterError, retry_id, retry_record
from cqrs.errors import CqrsError
from cqrs.kafka_io import make_consumer, make_producer, take, watermarks
from cqrs.retrier.plan import DONE, PARKED, WAITING, LetterFilter, bucket_of
from cqrs.retrier.store import AttemptRow, DueEntry, LetterRow, RetryStore, now_ms
from cqrs.topics import AppTopics

__all__ = [
    "LetterListing",
    "UnknownLetterError",
    "find_result",
    "letter_history",
    "list_letters",
    "park_letters",
    "purge_letters",
    "record_manual_retry",
    "retry_letters",
]


class UnknownLetterError(CqrsError, KeyError):
    """No letter has this command id in the retry tables."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@attrs.frozen
class LetterListing:
    letters: list[LetterRow]  # the letters matching the filter, oldest failure first
    counts: dict[str, int]  # letters per state (the other filters applied)


def list_letters(store: RetryStore, flt: LetterFilter, at_ms: int | None = None) -> LetterListing:
    now = now_ms() if at_ms is None else at_ms
    rows = store.letters()
    others = attrs.evolve(flt, state=None)
    counts = collections.Counter(r.state for r in rows if others.matches(
        state=r.state, command_type=r.command_type, error_type=r.error_type,
        first_ms=r.first_ms or r.last_ms or 0, now_ms=now))
    chosen = [r for r in rows if flt.matches(
        state=r.state, command_type=r.command_type, error_type=r.error_type,
        first_ms=r.first_ms or r.last_ms or 0, now_ms=now)]
    chosen.sort(key=lambda r: (r.first_ms or r.last_ms or 0, r.command_id))
    return LetterListing(chosen, {s: counts.get(s, 0) for s in (WAITING, PARKED, DONE)})


def _letter(store: RetryStore, command_id: str) -> tuple[LetterRow, list[AttemptRow]]:
    row = store.letter(command_id)
    attempts = store.attempts(command_id)
    if row is None or not attempts:
        raise UnknownLetterError(
            f"no letter with command id {command_id!r} for app {store.app!r}: see `cqrs dlq list "
            "APP --state all` (is `cqrs run retrier` running? it records the letters)")
    return row, attempts


def find_result(cfg: CqrsConfig, app: App, topic: str, command_id: str,
                starts: dict[str, int] | None) -> Any:
    """The :class:`~cqrs.results.CommandResult` of ``command_id`` in ``topic`` written after
    the offsets ``starts`` (partition -> offset; None: from the beginning), or None."""
    from confluent_kafka import TopicPartition

    ends = {p: hw for p, (_, hw) in watermarks(cfg, topic).items()}
    todo = {p: hw for p, hw in ends.items() if hw > int((starts or {}).get(str(p), 0))}
    if not todo:
        return None
    consumer = make_consumer(cfg)
    key = command_id.encode()
    try:
        consumer.assign([TopicPartition(topic, p, int((starts or {}).get(str(p), 0))) for p in todo])
        while todo:
            msgs = take(consumer, 1000, 2.0)
            if not msgs:
                break
            for m in msgs:
                if m.error() or m.partition() not in todo:
                    continue
                if m.key() == key and m.value() is not None:
                    return app.codec.decode(m.value())
                if m.offset() + 1 >= todo[m.partition()]:
                    del todo[m.partition()]
        return None
    finally:
        consumer.close()


def letter_history(cfg: CqrsConfig, app: App, topics: AppTopics, store: RetryStore,
                   command_id: str) -> dict[str, Any]:
    """A letter and every attempt, as JSON-ready data; outcomes still unknown are looked up
    in the results topic (and kept)."""
    row, attempts = _letter(store, command_id)
    history = []
    for a in attempts:
        outcome = a.outcome
        if outcome is None and a.state in ("delivered", "retried"):
            asked = a.note if a.state == "retried" and a.note else a.command_id
            starts = json.loads(a.offsets).get(topics.results) if a.offsets else None
            result = find_result(cfg, app, topics.results, asked, starts)
            if result is not None:
                outcome = result.status
                store.set_attempt(a.command_id, a.attempt, outcome=outcome)
        history.append({
            "attempt": a.attempt, "failed_at_ms": a.failed_ms, "stage": a.stage,
            "error_type": a.error_type, "error": a.error, "letter": a.letter, "state": a.state,
            "due_ms": a.due_ms, "delivered_at_ms": a.delivered_ms,
            "retry_outcome": outcome or ("pending" if a.state in ("delivered", "retried")
                                         else None),
            "retry_command_id": a.note if a.state == "retried" else None,
        })
    return {**_letter_json(row), "history": history}


def _letter_json(row: LetterRow) -> dict[str, Any]:
    return attrs.asdict(row)


def _latest(store: RetryStore, command_id: str) -> AttemptRow:
    return _letter(store, command_id)[1][-1]


def _op_us(a: AttemptRow) -> int:
    """The write timestamp of an operator's change: now, and after the letter's own writes
    even when its time is ahead of this machine's clock."""
    return max(now_ms(), (a.failed_ms or 0) + 1) * 1000


def _dead_letter(topics: AppTopics, a: AttemptRow) -> DeadLetter:
    partition, _, offset = (a.letter or "-1:-1").partition(":")
    return DeadLetter(int(partition), int(offset), a.stage or "?", a.error_type or "?",
                      a.error or "", topics.commands, -1, -1, a.key, a.value, list(a.headers or []),
                      transient=False, attempt=a.attempt, final=bool(a.final),
                      timestamp_ms=a.failed_ms or 0)


def retry_letters(cfg: CqrsConfig, topics: AppTopics, store: RetryStore,
                  command_ids: Sequence[str]) -> list[str]:
    """Retry letters now: a waiting one is made due now (the job delivers it, same command
    id); a parked one is sent again under a derived command id (the processor remembers the
    original's ``failed`` answer), like ``cqrs dlq retry PARTITION:OFFSET``. One line each."""
    chosen = [_latest(store, cid) for cid in command_ids]  # every id checked before acting
    lines = []
    now = now_ms()
    for a in chosen:
        if a.state in (WAITING, "delivering"):
            due = now + 1000  # after the running job's last read
            store.set_attempt(a.command_id, a.attempt, due_ms=due)
            store.add_due([DueEntry(bucket_of(due, store.bucket_s), due, a.command_id, a.attempt)])
            store.put_letter(a.command_id, _op_us(a), due_ms=due)
            lines.append(f"{a.command_id}: attempt {a.attempt + 1} due now (the retry job sends it)")
        elif a.state == PARKED:
            new_id = _send_derived(cfg, topics, _dead_letter(topics, a))
            record_manual_retry(store, a.command_id, a.attempt, new_id, cfg, topics)
            lines.append(f"{a.command_id}: sent again as {new_id}")
        else:
            lines.append(f"{a.command_id}: not retried, its last attempt is {a.state} already")
    return lines


def _send_derived(cfg: CqrsConfig, topics: AppTopics, dead: DeadLetter) -> str:
    new_id = retry_id(dead)
    key, value, headers = retry_record(dead)
    producer = make_producer(cfg)
    producer.produce(topics.commands, key=key, value=value, headers=headers)
    if producer.flush(30):
        raise DeadLetterError(f"the retry {new_id} was not acknowledged by Kafka within 30 s: "
                              "retry again (a retry of the same letter runs once)")
    return new_id


def record_manual_retry(store: RetryStore, command_id: str, attempt: int, new_id: str,
                        cfg: CqrsConfig | None = None, topics: AppTopics | None = None) -> None:
    """Note that an operator sent ``command_id`` again as ``new_id``: the letter is done and
    ``cqrs dlq show`` finds the retry's result."""
    offsets = None
    if cfg is not None and topics is not None:
        offsets = json.dumps({topics.results: {str(p): 0 for p in watermarks(cfg, topics.results)}})
    store.set_attempt(command_id, attempt, state="retried", note=new_id, offsets=offsets)
    failed = store.attempt(command_id, attempt)
    store.put_letter(command_id, _op_us(failed) if failed else now_ms() * 1000, state=DONE)


def park_letters(cfg: CqrsConfig, topics: AppTopics, store: RetryStore,
                 command_ids: Sequence[str]) -> list[str]:
    """Stop retrying waiting letters: parked (and copied to the parked topic)."""
    chosen = [_latest(store, cid) for cid in command_ids]
    lines = []
    producer = None
    for a in chosen:
        applied, state = store.change_state(a.command_id, a.attempt, WAITING, PARKED,
                                            outcome=PARKED)
        if not applied:
            lines.append(f"{a.command_id}: not parked, its last attempt is {state}")
            continue
        store.put_letter(a.command_id, _op_us(a), state=PARKED)
        producer = producer or make_producer(cfg)
        producer.produce(topics.parked, key=a.key, value=a.value, headers=list(a.headers or []))
        lines.append(f"{a.command_id}: parked")
    if producer is not None and producer.flush(30):
        raise CqrsError(f"parked letters were not acknowledged by Kafka ({topics.parked}) in 30 s")
    return lines


def purge_letters(store: RetryStore, command_ids: Iterable[str]) -> int:
    """Forget letters (row, history, due entry); returns how many."""
    n = 0
    for cid in command_ids:
        store.purge(cid)
        n += 1
    return n
