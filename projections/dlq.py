"""The projections' dead-letter topic: events a handler failed on, and the events of their
aggregates parked behind them (key = aggregate id, so they stay in order per aggregate).

``cqrs projections dlq <app> list`` shows them; ``replay`` folds them, with the handlers as they
are now, onto the parked views and clears the parking mark when every event applies. Replaying is
idempotent: run it again after fixing more, or when the projector parked more meanwhile. The
projector also replays a parked view's letters by itself after a backoff
(:mod:`projections.dlq_retry`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from cqrs.config import CqrsConfig
from projections.apply import BatchStats, Target, apply_batch
from projections.fold import Decode
from projections.records import DeadLetter, EventRecord
from projections.store import ProjectionStore

__all__ = [
    "DeadLetterEntry",
    "ReplayReport",
    "dead_letter_topic",
    "ensure_dead_letter_topic",
    "from_dlq_record",
    "read_dead_letters",
    "replay_dead_letters",
    "to_dlq_record",
]

_H = "cqrs.dlq."


def dead_letter_topic(app_name: str, prefix: str = "") -> str:
    """The projections' dead-letter topic of an app (``kafka.topic_prefix`` first)."""
    return f"{prefix}{app_name}.projection-dead-letters"


def ensure_dead_letter_topic(cfg: CqrsConfig, topic: str) -> None:
    """Create the dead-letter topic unless it exists, and wait until it answers for its offsets:
    the projector reads its ends right after (on a cluster, the broker it asks may not know a
    topic the controller created a moment ago, and the projector took it for missing)."""
    from confluent_kafka.admin import NewTopic

    from cqrs.kafka_io import make_admin
    from cqrs.topics import wait_until_readable

    admin = make_admin(cfg)
    if topic in admin.list_topics(timeout=30).topics:
        wait_until_readable(cfg, [topic])  # (another projector may have created it a moment ago)
        return
    every = ({"min.insync.replicas": str(cfg.kafka.min_insync_replicas)}
             if cfg.kafka.min_insync_replicas > 0 else {})
    futures = admin.create_topics([NewTopic(topic, cfg.kafka.default_partitions,
                                            cfg.kafka.replication_factor,
                                            config={"retention.ms": "-1", **every})])
    for future in futures.values():
        try:
            future.result(timeout=30)
        except Exception as exc:  # noqa: BLE001 - created meanwhile by another process is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    wait_until_readable(cfg, [topic])


@attrs.frozen
class DeadLetterEntry:
    projection: str
    letter: DeadLetter


def to_dlq_record(projection: str, dl: DeadLetter) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """``(key, value, headers)``: the event as it was, plus why and where it came from."""
    r = dl.record
    headers = [
        ("cqrs.kind", b"event"),
        ("cqrs.aggregate_type", r.aggregate_type.encode()),
        ("cqrs.message_type", r.message_type.encode()),
        ("cqrs.version", str(r.version).encode()),
        ("cqrs.timestamp", r.timestamp.encode()),
        (_H + "projection", projection.encode()),
        (_H + "reason", dl.reason.encode()),
        (_H + "error", dl.error.encode()[:4000]),
        (_H + "parked_at", str(dl.parked_at).encode()),
        (_H + "partition", str(r.partition).encode()),
        (_H + "offset", str(r.offset).encode()),
    ]
    return r.aggregate_id.encode(), r.value, headers


def from_dlq_record(key: bytes, value: bytes, headers: Iterable[tuple[str, bytes | None]]) -> DeadLetterEntry:
    h = {k: (v or b"").decode() for k, v in headers}
    record = EventRecord(key.decode(), h["cqrs.aggregate_type"], h["cqrs.message_type"],
                         int(h["cqrs.version"]), bytes(value), h["cqrs.timestamp"],
                         int(h[_H + "partition"]), int(h[_H + "offset"]))
    letter = DeadLetter(record, h[_H + "reason"], h[_H + "error"],  # type: ignore[arg-type]
                        int(h[_H + "parked_at"]))
    return DeadLetterEntry(h[_H + "projection"], letter)


def read_dead_letters(cfg: CqrsConfig, topic: str) -> list[DeadLetterEntry]:
    """Every dead letter in the topic, in topic order (empty if the topic does not exist)."""
    from cqrs.errors import CqrsError
    from cqrs.kafka_io import read_to_end

    try:
        records = read_to_end(cfg, [topic])
    except CqrsError as exc:
        if "does not exist" in str(exc):
            return []
        raise
    return [from_dlq_record(r.key or b"", r.value or b"", r.headers) for r in records]


@attrs.frozen
class ReplayReport:
    projection: str
    aggregates: int
    events: int
    still_parked: int
    failed: tuple[DeadLetter, ...] = ()  # the letters still not applied, the failing one first


def replay_dead_letters(store: ProjectionStore, target: Target, letters: Sequence[DeadLetter],
                        decode: Decode) -> ReplayReport:
    """Fold one projection's dead letters onto its views with today's handlers; un-park the
    aggregates whose events all apply (those still failing stay parked)."""
    still: list[DeadLetter] = []
    stats: BatchStats = apply_batch(store, target, [dl.record for dl in letters], decode,
                                    still.extend, unpark=True)
    parked = len({dl.record.aggregate_id for dl in still})
    return ReplayReport(target.projection.name, stats.aggregates, stats.events, parked,
                        tuple(still))


DeadLetterSink = Callable[[str, Sequence[DeadLetter]], Any]
__all__ += ["DeadLetterSink"]
