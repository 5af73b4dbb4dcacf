"""Topic names (computed here and nowhere else) and their creation with the right settings."""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError

__all__ = ["SCHEMAS_TOPIC", "AppTopics", "InvalidTopicNameError", "delete_topics", "ensure_topics",
           "list_topics", "topic_settings", "topics_for", "wait_until_readable"]

SCHEMAS_TOPIC = "_cqrs_schemas"

_DAY_MS = 24 * 3600 * 1000


@attrs.frozen
class AppTopics:
    """The Kafka topics of one app. Commands, events and dead letters are keyed by aggregate id."""

    commands: str
    events: str
    results: str
    dead_letters: str
    schemas: str = SCHEMAS_TOPIC
    parked: str = ""  # dead letters the retry job gave up on (attempts used up)
    outcomes: str = ""  # ends of conversations, written by process managers (key: correlation)

    @property
    def base(self) -> str:
        """``<prefix><app>``: what names the app's other stores (e.g. its aggregate-state table)."""
        return self.commands.removesuffix(".commands")


_LEGAL = re.compile(r"[A-Za-z0-9._-]*")
_MAX_TOPIC = 249  # Kafka's limit on a topic name's length


class InvalidTopicNameError(CqrsError, ValueError):
    """A topic prefix or app name that cannot be part of a Kafka topic name."""


def topics_for(app_name: str, prefix: str = "") -> AppTopics:
    """The topics of an app; ``prefix`` (setting ``kafka.topic_prefix``) separates environments
    or test runs that share a cluster. Both may hold only what Kafka allows in a topic name
    (letters, digits, '.', '_', '-'), else :class:`InvalidTopicNameError` naming the value."""
    for what, value in (("kafka.topic_prefix", prefix), ("app name", app_name)):
        if not isinstance(value, str) or not _LEGAL.fullmatch(value):
            raise InvalidTopicNameError(
                f"{what} {value!r} cannot be part of a Kafka topic name: use letters, digits, "
                "'.', '_' and '-' only"
            )
    base = f"{prefix}{app_name}"
    topics = AppTopics(
        commands=f"{base}.commands",
        events=f"{base}.events",
        results=f"{base}.command-results",
        dead_letters=f"{base}.dead-letters",
        schemas=f"{prefix}{SCHEMAS_TOPIC}",
        parked=f"{base}.dead-letters.parked",
        outcomes=f"{base}.conversation-outcomes",
    )
    longest = max((n for n in attrs.astuple(topics) if n), key=len)
    if len(longest) > _MAX_TOPIC:
        raise InvalidTopicNameError(
            f"topic name {longest!r} is longer than Kafka's {_MAX_TOPIC} characters: shorten "
            "kafka.topic_prefix or the app name"
        )
    return topics


def topic_settings(cfg: CqrsConfig, topics: AppTopics) -> dict[str, dict[str, str]]:
    """The configuration of each topic the framework creates (``kafka.min_insync_replicas``
    joins every topic's when set)."""
    forever = {"retention.ms": "-1", "retention.bytes": "-1"}
    every = ({"min.insync.replicas": str(cfg.kafka.min_insync_replicas)}
             if cfg.kafka.min_insync_replicas > 0 else {})
    return {
        topics.commands: {"retention.ms": str(7 * _DAY_MS), **every},
        topics.events: {**forever, **every},  # the event log: never deleted
        topics.results: {"retention.ms": str(7 * _DAY_MS), **every},
        topics.dead_letters: {**forever, **every},
        **({topics.parked: {**forever, **every}} if topics.parked else {}),
        **({topics.outcomes: {"retention.ms": str(7 * _DAY_MS), **every}}
           if topics.outcomes else {}),
        topics.schemas: {"cleanup.policy": "compact", "retention.ms": "-1", **every},
    }


def ensure_topics(cfg: CqrsConfig, topics: AppTopics, partitions: int | None = None) -> list[str]:
    """Create the app's topics that do not exist yet, and wait until each has its partition
    leaders (readable and writable); returns the names created."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    from cqrs.kafka_io import make_admin

    admin = make_admin(cfg)
    try:
        existing = set(admin.list_topics(timeout=30).topics)
    except KafkaException as exc:
        raise CqrsError(
            f"cannot reach Kafka at {cfg.kafka.bootstrap_servers} to create topics: {exc}; "
            "is it running (`cqrs dev status`)?"
        ) from exc
    wanted = [
        NewTopic(name, 1 if name == topics.schemas else (partitions or cfg.kafka.default_partitions),
                 cfg.kafka.replication_factor, config=conf)
        for name, conf in topic_settings(cfg, topics).items() if name not in existing
    ]
    if not wanted:
        return []
    created = []
    for name, future in admin.create_topics(wanted).items():
        try:
            future.result(timeout=30)
            created.append(name)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise CqrsError(f"cannot create topic {name!r}: {exc}") from exc
    wait_until_readable(cfg, created)
    return created


def list_topics(cfg: CqrsConfig, prefix: str = "") -> set[str]:
    """The names of the cluster's topics that start with ``prefix``."""
    from confluent_kafka import KafkaException

    from cqrs.kafka_io import make_admin

    try:
        names = make_admin(cfg).list_topics(timeout=30).topics
    except KafkaException as exc:
        raise CqrsError(
            f"cannot reach Kafka at {cfg.kafka.bootstrap_servers} to list topics: {exc}; "
            "is it running (`cqrs dev status`)?"
        ) from exc
    return {name for name in names if name.startswith(prefix)}


def delete_topics(cfg: CqrsConfig, names: Iterable[str], timeout_s: float = 60.0) -> list[str]:
    """Delete the topics ``names`` (those already gone count as deleted); returns the names
    that could not be deleted, with nothing raised: clean-up code calls this on its way out.

    Throwaway topics must go: a broker keeps a file open for every partition it holds, and a
    dev broker that piled up tens of thousands of partitions from old test and benchmark runs
    stops with "Too many open files"."""
    from cqrs.kafka_io import make_admin

    wanted = sorted(set(names))
    if not wanted:
        return []
    admin = make_admin(cfg)  # must outlive its futures
    left = []
    for name, future in admin.delete_topics(wanted, operation_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except Exception as exc:  # best effort: report, never raise on the way out
            if "UNKNOWN_TOPIC_OR_PART" not in str(exc):
                left.append(name)
    return left


def wait_until_readable(cfg: CqrsConfig, names: list[str], timeout_s: float = 30.0) -> None:
    """Wait until each of the just-created topics ``names`` answers for its offsets.

    ``create_topics`` returns once the controller created a topic; the broker a reader asks
    next may not list it yet (on a cluster of several brokers, its metadata arrives a moment
    later: UNKNOWN_TOPIC_OR_PART, which a reader takes for a topic that does not exist), and a
    topic created a moment ago answers NOT_LEADER_FOR_PARTITION until its leaders are known
    (:func:`~cqrs.kafka_io.watermarks` retries that). Wait here, once, rather than in every
    first reader."""
    import time

    from cqrs.errors import TopicNotFoundError
    from cqrs.kafka_io import watermarks

    for name in names:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                watermarks(cfg, name)
                break
            except TopicNotFoundError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
