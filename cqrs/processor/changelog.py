"""The aggregate-state changelog: the processor's state rows in a compacted Kafka topic instead
of Cassandra (``[processor] state_store = "kafka"``), as Kafka Streams keeps a store's changes.

A row in Cassandra cost ~31-36 us of CPU all processes counted, a changelog record ~6
(``bench/state_store.py``), and the driver's reactor thread took the worker's interpreter lock
from the decisions besides. The price: a changelog cannot be read by key. So a worker holds
every state of the partitions it serves (packed, see
:class:`~cqrs.processor.partition.States`), and a worker that takes a partition over (its
recorded position is not the worker's own) first *restores* it: reads the partition's records
from the start, keeping per aggregate the one that absorbed the most commands. An aggregate a
worker does not hold then does not exist: no read at all for a new one, where the table was
asked for each.

One topic per state generation (``<prefix><app>.state.g<n>``), as many partitions as the
commands topic: a row goes to its commands partition (``source_partition``), so a partition's
states are one partition of the changelog. Key: ``<aggregate type> NUL <aggregate id>``; value:
the packed row (:meth:`~cqrs.processor.state_table.StoredAggregate.packed`).

The fence. In Cassandra a stale writer loses to the row's ``USING TIMESTAMP`` (its command
count); a compacted topic keeps the *last* record of a key instead, so there a stale writer
must not be able to write at all. Each partition's rows are written in Kafka transactions of a
producer whose ``transactional.id`` names the partition: a worker restoring a partition first
starts that producer, which fences any other (a worker whose task ran on past its lease: its
commit fails, its open transaction is aborted), then reads the partition with
``isolation.level=read_committed`` to its end. So the committed records of a key only ever grow
in command count, and compaction, which keeps the last, keeps the newest.

Rows stay ordered after the records they explain (the worker writes them once Kafka
acknowledged those, :meth:`~cqrs.processor.partition.Worker.finish_sent`). A transaction spans
the rows of several slices: it is committed when the worker settles its writes before
recording a position (so a position never stands past committed rows) and otherwise at most
every :data:`COMMIT_EVERY_S`; the partitions' commits run at once, each waiting a few
milliseconds for the transaction coordinator.

Positions, share claims and deadlines stay in Cassandra (:class:`StateTable`), a row per
partition or due time rather than per aggregate. State queries (:class:`ChangelogView`) read
the topic to its end and keep what they read.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from cqrs.config import CqrsConfig
from cqrs.errors import ConfigError, CqrsError
from cqrs.processor.state_table import StateTable, StoredAggregate
from cqrs.topics import AppTopics

__all__ = ["COMMIT_EVERY_S", "STATE_STORES", "ChangelogError", "ChangelogView", "StateChangelog",
           "changelog_key", "check_state_store", "changelog_topic", "ensure_changelog", "packed_commands",
           "reset_changelog", "split_changelog_key", "uses_changelog", "write_rebuilt"]

STATE_STORES = ("cassandra", "kafka")
# the longest an open transaction of state rows stays open between two settles (a task's end);
# well under the producer's transaction.timeout.ms (60 s), past which the broker aborts it
COMMIT_EVERY_S = 5.0
RESTORE_TIMEOUT_S = 300.0
_COMMANDS = struct.Struct(">q")
_COMMANDS_AT = 22  # where a packed row's command count is (see state_table._PACKED)


class ChangelogError(CqrsError, RuntimeError):
    """The aggregate-state changelog cannot be written or read."""


def uses_changelog(cfg: CqrsConfig) -> bool:
    """Whether ``[processor] state_store`` puts the states in a changelog (else Cassandra)."""
    store = cfg.processor.state_store
    if store not in STATE_STORES:
        raise ConfigError(f"processor.state_store = {store!r}: use one of {list(STATE_STORES)} "
                          "(CQRS_PROCESSOR_STATE_STORE)")
    return store == "kafka"


def changelog_topic(base: str, generation: int) -> str:
    """``<prefix><app>.state.g<n>``: the changelog of a state generation."""
    return f"{base}.state.g{generation}"


def changelog_key(aggregate_type: str, aggregate_id: str) -> bytes:
    return f"{aggregate_type}\x00{aggregate_id}".encode("utf-8")


def split_changelog_key(raw: bytes) -> tuple[str, str]:
    """``(aggregate type, aggregate id)`` of a changelog record's key."""
    agg_type, sep, agg_id = raw.decode("utf-8").partition("\x00")
    if not sep:
        raise ChangelogError(f"changelog key {raw[:80]!r} is not '<type> NUL <id>': was the topic "
                             "written by something other than the processor?")
    return agg_type, agg_id


def packed_commands(blob: bytes) -> int:
    """The command count of a packed row (which record of a key is the newest)."""
    return int(_COMMANDS.unpack_from(blob, _COMMANDS_AT)[0])


def ensure_changelog(cfg: CqrsConfig, base: str, generation: int, partitions: int) -> str:
    """Create the generation's changelog topic if it does not exist (compacted, ``partitions``
    partitions: the commands topic's); its name. An existing one with another partition count
    is refused: its rows would be in the wrong partitions."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    from cqrs.kafka_io import make_admin
    from cqrs.topics import wait_until_readable

    topic = changelog_topic(base, generation)
    admin = make_admin(cfg)
    meta = admin.list_topics(timeout=30)
    found = meta.topics.get(topic)
    if found is not None and found.error is None:
        if len(found.partitions) != partitions:
            raise ChangelogError(
                f"state changelog {topic!r} has {len(found.partitions)} partitions, the commands "
                f"topic {partitions}: a changelog partition holds one commands partition's "
                "states. Rebuild the state into a new generation (`cqrs rebuild-state`)")
        return topic
    conf = {"cleanup.policy": "compact", "retention.ms": "-1"}
    if cfg.kafka.min_insync_replicas > 0:
        conf["min.insync.replicas"] = str(cfg.kafka.min_insync_replicas)
    future = admin.create_topics([NewTopic(topic, partitions, cfg.kafka.replication_factor,
                                           config=conf)])[topic]
    try:
        future.result(timeout=30)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise ChangelogError(f"cannot create the state changelog {topic!r}: {exc}") from exc
    wait_until_readable(cfg, [topic])
    return topic


def _produce_row(producer: Any, topic: str, row: StoredAggregate, partition: int) -> None:
    """Hand one state row to ``producer`` for the changelog partition, waiting while its local
    queue is full."""
    while True:
        try:
            producer.produce(topic, row.packed(), changelog_key(row.aggregate_type, row.aggregate_id),
                             partition)
            return
        except BufferError:  # let librdkafka send some
            producer.poll(0.05)


def reset_changelog(cfg: CqrsConfig, base: str, generation: int, partitions: int,
                    timeout_s: float = 120.0) -> str:
    """The generation's changelog topic, empty: deleted if it exists (what a failed earlier
    rebuild into it left), then created as :func:`ensure_changelog` does; its name."""
    from cqrs.topics import delete_topics, list_topics

    topic = changelog_topic(base, generation)
    deadline = time.monotonic() + timeout_s
    if topic in list_topics(cfg, topic):
        left = delete_topics(cfg, [topic], timeout_s)
        while not left and topic in list_topics(cfg, topic) and time.monotonic() < deadline:
            time.sleep(0.5)  # deleted, still listed until the controller is done with it
        if left or topic in list_topics(cfg, topic):
            raise ChangelogError(f"cannot delete the state changelog {topic!r} of an earlier "
                                 f"attempt at {cfg.kafka.bootstrap_servers} within {timeout_s:.0f} s")
    while True:
        try:
            return ensure_changelog(cfg, base, generation, partitions)
        except ChangelogError:  # just deleted: the broker may refuse its name for a moment
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def write_rebuilt(cfg: CqrsConfig, topic: str, partitions: int,
                  rows: Iterable[StoredAggregate]) -> int:
    """Write rebuilt state rows (``cqrs rebuild-state``) into the changelog ``topic`` of a
    generation no processor runs on yet, each into its aggregate's commands partition (where
    the processor's workers restore it from: the partition Kafka's partitioner gives its id,
    of ``partitions``); waits until every one is acknowledged; how many."""
    from cqrs.kafka_io import make_producer, murmur2_partition

    errors: list[str] = []
    producer = make_producer(cfg, **{
        "linger.ms": 20, "batch.size": 1 << 20, "compression.type": "lz4",
        "on_delivery": lambda err, _msg: errors.append(str(err)) if err is not None else None})
    count = 0
    for row in rows:
        count += 1
        p = murmur2_partition(row.aggregate_id.encode("utf-8"), partitions)
        if row.applied_offset >= 0 and row.source_partition != p:
            raise ChangelogError(
                f"aggregate {row.aggregate_type} {row.aggregate_id!r} answered its last command in "
                f"commands partition {row.source_partition}, and its id belongs to partition {p} "
                f"of {partitions}: was the commands topic's partition count changed?")
        _produce_row(producer, topic, row, p)
    left = producer.flush(120)
    if left or errors:
        raise ChangelogError(
            f"Kafka did not acknowledge {left} of {count} rebuilt state rows of {topic!r}"
            + (f" ({'; '.join(errors[:5])})" if errors else "") + ": run rebuild-state again")
    return count


def check_state_store(cfg: CqrsConfig, table: StateTable, topics: AppTopics, generation: int) -> None:
    """Before a processor starts on ``generation``: with ``state_store = "kafka"``, create its
    changelog, unless the generation already has positions without one (its states are in
    the Cassandra table); with ``"cassandra"``, refuse a generation that has a changelog (its
    states are there). Switching stores moves no state: a processor would start from none."""
    from cqrs.topics import list_topics

    topic = changelog_topic(topics.base, generation)
    exists = topic in list_topics(cfg, topic)
    if uses_changelog(cfg):
        if not exists and table.positions(generation, topics.commands):
            raise ChangelogError(
                f"state generation {generation} of {topics.base!r} is in the Cassandra state table "
                "(it has positions and no changelog topic), and processor.state_store = 'kafka': "
                "switching stores moves no state. Keep state_store = 'cassandra' for this app")
        from cqrs.kafka_io import watermarks

        ensure_changelog(cfg, topics.base, generation, len(watermarks(cfg, topics.commands)))
    elif exists:
        raise ChangelogError(
            f"state generation {generation} of {topics.base!r} is in the changelog {topic!r}, and "
            "processor.state_store = 'cassandra': switching stores moves no state. Set "
            "state_store = 'kafka' (CQRS_PROCESSOR_STATE_STORE) for this app")


def _read_partitions(cfg: CqrsConfig, topic: str, partitions: Sequence[int] | None,
                     starts: dict[int, int], timeout_s: float,
                     ) -> Iterator[tuple[int, int, bytes, bytes]]:
    """``(partition, offset, key, value)`` of the committed records of ``topic``'s
    ``partitions`` (None: all) from ``starts`` (default: the beginning) to their ends as of
    this call; raises when not done within ``timeout_s``."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from cqrs.kafka_io import make_consumer, take

    consumer = make_consumer(cfg, **{"isolation.level": "read_committed",
                                     "enable.partition.eof": False,
                                     "fetch.max.bytes": 64 << 20,
                                     "max.partition.fetch.bytes": 16 << 20})
    try:
        if partitions is None:
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or meta.error is not None:
                raise ChangelogError(f"state changelog {topic!r} does not exist at "
                                     f"{cfg.kafka.bootstrap_servers}")
            partitions = sorted(meta.partitions)
        ends: dict[int, int] = {}
        assign = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            start = max(low, starts.get(p, low))
            if high > start:
                ends[p] = high
                assign.append(TopicPartition(topic, p, start if start > low else OFFSET_BEGINNING))
        if not assign:
            return
        consumer.assign(assign)
        deadline = time.monotonic() + timeout_s
        while ends:
            batch = take(consumer, 10_000, 0.2)
            for msg in batch:
                if msg.error() is not None:
                    continue
                yield msg.partition(), msg.offset(), msg.key(), msg.value()
            if not batch or len(batch) < 10_000:  # the last offsets may be transaction markers
                for tp in consumer.position([TopicPartition(topic, p) for p in ends]):
                    if tp.offset >= ends[tp.partition]:
                        del ends[tp.partition]
            for msg in batch[-1:]:
                if msg.error() is None and msg.offset() + 1 >= ends.get(msg.partition(), 1 << 62):
                    ends.pop(msg.partition(), None)
            if ends and time.monotonic() > deadline:
                raise ChangelogError(
                    f"reading state changelog {topic!r} partitions {sorted(ends)} to their ends "
                    f"took over {timeout_s:.0f} s: is Kafka at {cfg.kafka.bootstrap_servers} "
                    "healthy?")
    finally:
        consumer.close()


def _newest(found: dict[tuple[str, str], bytes], key: bytes, value: bytes | None) -> None:
    """Keep in ``found`` the record of the most commands of each key."""
    if value is None:
        return
    k = split_changelog_key(key)
    old = found.get(k)
    if old is None or packed_commands(value) >= packed_commands(old):
        found[k] = value


class StateChangelog:
    """A worker's writer of one state generation's changelog, and its restores: a
    transactional producer per partition it restored, a transaction open per partition between
    commits."""

    def __init__(self, cfg: CqrsConfig, base: str, generation: int) -> None:
        self.cfg = cfg
        self.base = base
        self.generation = generation
        self.topic = changelog_topic(base, generation)
        self._producers: dict[int, Any] = {}
        self._open: set[int] = set()  # partitions with a transaction open
        self._opened_at = 0.0  # when the oldest open transaction began
        self._pool: Any = None  # commits the partitions' transactions at once
        self.restored_rows = 0
        self.restore_s = 0.0

    def _transactional_id(self, partition: int) -> str:
        return f"cqrs-state.{self.topic}.{partition}"

    def restore(self, partition: int) -> dict[tuple[str, str], bytes]:
        """Take the partition over: fence its other writers (this worker's own earlier producer
        too: its open transaction is aborted), then read its committed rows; the packed row of
        each aggregate."""
        from cqrs.kafka_io import make_producer

        t0 = time.perf_counter()
        old = self._producers.pop(partition, None)
        self._open.discard(partition)
        if old is not None:
            old.flush(5)
        producer = make_producer(self.cfg, **{
            "transactional.id": self._transactional_id(partition), "linger.ms": 5,
            "batch.size": 1 << 20, "compression.type": "lz4"})
        try:
            producer.init_transactions(60)
        except Exception as exc:
            raise ChangelogError(
                f"cannot take over state changelog {self.topic!r} partition {partition} (its "
                f"transactional producer did not start: {exc}); the task is retried") from exc
        self._producers[partition] = producer
        found: dict[tuple[str, str], bytes] = {}
        for _, _, key, value in _read_partitions(self.cfg, self.topic, [partition], {},
                                                 RESTORE_TIMEOUT_S):
            _newest(found, key, value)
        self.restored_rows += len(found)
        self.restore_s += time.perf_counter() - t0
        return found

    def start_writing(self, rows: Sequence[StoredAggregate]) -> Callable[[], object]:
        """Produce ``rows`` into their partitions' open transactions; what this returns commits
        them once :data:`COMMIT_EVERY_S` passed since the oldest began (see :meth:`commit`)."""
        if not rows:
            return list
        now = time.monotonic()
        topic = self.topic
        for row in rows:
            p = row.source_partition
            producer = self._producers.get(p)
            if producer is None:
                raise ChangelogError(
                    f"state row of aggregate {row.aggregate_type} {row.aggregate_id!r} is for "
                    f"changelog partition {p}, which this worker did not restore: the worker "
                    "serves only partitions it took over (a bug: please report it)")
            if p not in self._open:
                if not self._open:
                    self._opened_at = now
                producer.begin_transaction()
                self._open.add(p)
            _produce_row(producer, topic, row, p)
        return self._commit_due

    def _commit_due(self) -> None:
        if self._open and time.monotonic() - self._opened_at >= COMMIT_EVERY_S:
            self.commit()

    def commit(self) -> None:
        """Commit every open transaction, the partitions' at once (a commit waits a few
        milliseconds for the coordinator, with the interpreter lock released): the rows written
        so far are then what a restore reads. A fenced producer (another worker took its
        partition over) raises."""
        partitions, self._open = sorted(self._open), set()
        if not partitions:
            return
        if len(partitions) == 1:
            failures = [self._commit_one(partitions[0])]
        else:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(8, thread_name_prefix="cqrs-state-commit")
            failures = list(self._pool.map(self._commit_one, partitions))
        for p, exc in zip(partitions, failures, strict=True):
            if exc is not None:
                self._producers.pop(p, None)
                raise ChangelogError(
                    f"committing state rows to {self.topic!r} partition {p} failed ({exc}): "
                    "another worker took the partition over, or Kafka is unreachable; the task "
                    "is retried from the recorded positions") from exc

    def _commit_one(self, partition: int) -> BaseException | None:
        try:
            self._producers[partition].commit_transaction(120)
            return None
        except Exception as exc:  # noqa: BLE001 - raised by commit, naming the partition
            return exc

    def abandon(self) -> None:
        """Drop every producer (their open transactions are aborted when the partitions are
        restored again, by whoever restores them)."""
        for producer in self._producers.values():
            producer.flush(1)
        self._producers.clear()
        self._open.clear()

    def close(self) -> None:
        self.abandon()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


class ChangelogView:
    """What state queries read of a changelog: its records up to the end as of the last
    :meth:`catch_up`, the newest per aggregate (kept between calls: a call reads only what
    was written since)."""

    def __init__(self, cfg: CqrsConfig, topic: str) -> None:
        self.cfg = cfg
        self.topic = topic
        self._next: dict[int, int] = {}
        self._rows: dict[str, dict[str, bytes]] = {}  # id -> type -> packed row

    def catch_up(self) -> None:
        for p, offset, key, value in _read_partitions(self.cfg, self.topic, None, self._next,
                                                      RESTORE_TIMEOUT_S):
            self._next[p] = offset + 1
            if value is None:
                continue
            agg_type, agg_id = split_changelog_key(key)
            types = self._rows.setdefault(agg_id, {})
            old = types.get(agg_type)
            if old is None or packed_commands(value) >= packed_commands(old):
                types[agg_type] = value

    def get(self, aggregate_id: str) -> list[StoredAggregate]:
        """The rows of ``aggregate_id`` (one per type it exists under)."""
        self.catch_up()
        return [StoredAggregate.unpacked(aggregate_id, agg_type, blob)
                for agg_type, blob in self._rows.get(aggregate_id, {}).items()]

    def scan(self) -> Iterator[StoredAggregate]:
        self.catch_up()
        for agg_id, types in list(self._rows.items()):
            for agg_type, blob in types.items():
                yield StoredAggregate.unpacked(agg_id, agg_type, blob)
