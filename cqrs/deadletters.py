"""The command processor's dead letters: read them, and send them again once the cause is fixed.

A dead letter is the original command record (key, value, headers) plus ``cqrs.dlq.*`` headers
naming the stage, the error and where the record came from (see cqrs.processor.step). The
command's envelope is in its value (:class:`cqrs.envelope.CommandRecord`), or in its original
headers for records in the older header form. Retrying
sends the original command to the commands topic again under a *derived* command id,
``<original id>~retry@<dlq partition>:<dlq offset>``:

- a new id, because the processor remembers the original id with its ``failed`` result and
  would answer a plain resend with that result instead of running it;
- a derived id, so retrying the same dead letter twice (a re-run script, two operators) runs
  the command once: the processor de-duplicates the second retry.

The retried command keeps its correlation id and names the original as its causation id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from cqrs.config import CqrsConfig
from cqrs.envelope import HEADER_PREFIX, Envelope, Headers, from_kafka, to_kafka
from cqrs.errors import CqrsError
from cqrs.kafka_io import KafkaRecord, make_producer, read_to_end
from cqrs.processor.step import DLQ_PREFIX
from cqrs.retries import ATTEMPT_HEADER
from cqrs.topics import AppTopics

__all__ = [
    "DeadLetter",
    "DeadLetterError",
    "list_dead_letters",
    "parse_dead_letter",
    "retry_dead_letters",
    "retry_id",
    "retry_record",
]


class DeadLetterError(CqrsError, ValueError):
    """A dead letter that cannot be retried, or a position that names none."""


@attrs.frozen
class DeadLetter:
    """One record of an app's dead-letters topic, with its ``cqrs.dlq.*`` headers parsed."""

    partition: int  # where it sits in the dead-letters topic
    offset: int
    stage: str  # envelope | decode | unknown_type | unknown_aggregate | handler
    error_type: str
    error: str
    source_topic: str  # where the processor read it
    source_partition: int
    source_offset: int
    key: bytes | None  # the original record, untouched
    value: bytes | None
    headers: list[tuple[str, bytes]]  # the original headers (without cqrs.dlq.*)
    transient: bool = False  # a failure the app declares transient (cqrs.retries): retried
    attempt: int = 1  # which run of the command failed (1 = the first)
    final: bool = False  # transient, and the attempts are used up: the retry job parks it
    timestamp_ms: int = 0  # when the processor wrote it (the Kafka record's timestamp)

    @property
    def position(self) -> str:
        """``partition:offset`` in the dead-letters topic (what ``cqrs dlq retry`` takes)."""
        return f"{self.partition}:{self.offset}"

    def header(self, name: str) -> str | None:
        """The text of an original header, e.g. ``header("cqrs.command_id")``; None if absent."""
        for k, v in self.headers:
            if k == name:
                return v.decode("utf-8", "replace")
        return None

    @property
    def envelope(self) -> Envelope | None:
        """The original command's envelope, if it is readable."""
        try:
            return from_kafka(self.key, self.value, self.headers)[0]
        except CqrsError:
            return None

    @property
    def command_id(self) -> str | None:
        env = self.envelope
        if env is not None:
            return env.command_id or env.message_id
        return self.header(HEADER_PREFIX + "command_id") or self.header(HEADER_PREFIX + "message_id")

    @property
    def aggregate_id(self) -> str | None:
        return None if self.key is None else self.key.decode("utf-8", "replace")

    @property
    def message_type(self) -> str | None:
        env = self.envelope
        return env.message_type if env is not None else self.header(HEADER_PREFIX + "message_type")


def _int(text: str | None) -> int:
    try:
        return int(text or "")
    except ValueError:
        return -1


def parse_dead_letter(rec: KafkaRecord) -> DeadLetter:
    """A :class:`DeadLetter` from a record of the dead-letters topic."""
    dlq: dict[str, str] = {}
    original: list[tuple[str, bytes]] = []
    for k, v in rec.headers:
        if k.startswith(DLQ_PREFIX):
            dlq[k[len(DLQ_PREFIX):]] = (v or b"").decode("utf-8", "replace")
        else:
            original.append((k, v or b""))
    return DeadLetter(
        partition=rec.partition, offset=rec.offset,
        stage=dlq.get("stage", "?"), error_type=dlq.get("error_type", "?"), error=dlq.get("error", ""),
        source_topic=dlq.get("topic", ""), source_partition=_int(dlq.get("partition")),
        source_offset=_int(dlq.get("offset")),
        key=rec.key, value=rec.value, headers=original,
        transient=dlq.get("transient") == "1", attempt=max(1, _int(dlq.get("attempt"))),
        final=dlq.get("final") == "1", timestamp_ms=rec.timestamp_ms,
    )


def list_dead_letters(cfg: CqrsConfig, topics: AppTopics) -> list[DeadLetter]:
    """Every dead letter of the app, in (partition, offset) order."""
    records = read_to_end(cfg, [topics.dead_letters])
    return sorted((parse_dead_letter(r) for r in records), key=lambda d: (d.partition, d.offset))


def retry_id(dead: DeadLetter) -> str:
    """The command id a retry of ``dead`` carries (the same for every retry of it)."""
    if dead.command_id is None:
        raise DeadLetterError(
            f"dead letter {dead.position} ({dead.stage}: {dead.error_type}) has no readable command "
            "id, so it was not sent through the cqrs client: fix the producer, it cannot be retried"
        )
    return f"{dead.command_id}~retry@{dead.position}"


def retry_record(dead: DeadLetter) -> tuple[bytes | None, bytes | None, Headers]:
    """``(key, value, headers)`` of the command that retries ``dead`` (in the form it came in)."""
    env = dead.envelope
    # a retry job's attempt header belongs to the original id's attempts, not to this new id
    kept = [(k, v) for k, v in dead.headers if k != ATTEMPT_HEADER]
    if env is not None and not kept:  # a command record: the ids are in its value
        new = retry_id(dead)
        payload = from_kafka(dead.key, dead.value, dead.headers)[1]
        return to_kafka(attrs.evolve(env, message_id=new, command_id=new,
                                     causation_id=env.command_id or env.message_id), payload)
    new_id = retry_id(dead).encode()
    original_id = (dead.command_id or "").encode()
    replaced = {HEADER_PREFIX + "command_id": new_id, HEADER_PREFIX + "message_id": new_id,
                HEADER_PREFIX + "causation_id": original_id}
    headers: Headers = [(k, v) for k, v in kept if k not in replaced]
    headers += list(replaced.items())
    return dead.key, dead.value, headers


def retry_dead_letters(
    cfg: CqrsConfig, topics: AppTopics, dead_letters: Sequence[DeadLetter],
    positions: Iterable[str] | None = None,
) -> list[str]:
    """Send the dead letters at ``positions`` (``"partition:offset"``; None: all of them) to
    the commands topic again; returns the retry command ids, in order."""
    by_position = {d.position: d for d in dead_letters}
    if positions is None:
        chosen = list(dead_letters)
    else:
        chosen = []
        for pos in positions:
            if pos not in by_position:
                known = ", ".join(list(by_position)[:10]) or "none"
                raise DeadLetterError(
                    f"no dead letter at {pos!r} in {topics.dead_letters} (positions are "
                    f"partition:offset; known: {known}): see `cqrs dlq list`"
                )
            chosen.append(by_position[pos])
    foreign = [d.position for d in chosen if d.source_topic and d.source_topic != topics.commands]
    if foreign:
        raise DeadLetterError(
            f"dead letters {foreign} did not come from {topics.commands}: only commands are retried here"
        )
    records = [(retry_id(d), retry_record(d)) for d in chosen]  # all checked before one is sent
    producer = make_producer(cfg)
    for _, (key, value, headers) in records:
        producer.produce(topics.commands, key=key, value=value, headers=headers)
    left = producer.flush(30)
    if left:
        raise CqrsError(f"{left} retried command(s) were not acknowledged by Kafka within 30 s: "
                        "run the retry again (retries of the same dead letter run once)")
    return [new_id for new_id, _ in records]
