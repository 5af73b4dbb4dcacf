"""A task of the command processor, inside a Spark Python worker.

The Spark job's source (:mod:`cqrs.processor.source`) hands each task whole partitions of the
commands topic with the offset range Spark planned; :func:`run_task` reads them with librdkafka
and processes what it reads in chunks, all of the task's partitions at once
(:func:`process_slices`):

1. group the commands by aggregate (a partition holds every command of its aggregates);
2. read the state of all the chunk's aggregates at once: from this worker's cache (decoded,
   else packed as written: :class:`States`) when it processed the partition's previous
   commands itself, else from the state table (``IN`` reads); commands at or below an
   aggregate's ``applied_offset`` were applied already (a re-run batch) and are skipped.
   An app with personal fields then asks the key store for the keys of all the chunk's data
   subjects at once, and drops the cached states of subjects forgotten since
   (:func:`_batch_keys`);
3. run the shared :class:`~cqrs.processor.step.AggregateStep` per aggregate;
4. write events, results and dead letters to Kafka and wait until every one is acknowledged;
5. only then write the new state rows (``USING TIMESTAMP`` their command count, so a stale
   writer cannot win), and remember them in the cache.

Because state is written after the records it explains, a crash anywhere re-runs the chunk
from the old state and rewrites byte-identical records (Kafka may hold a record twice, never
a different one), or finds the state written and skips what it covers. Nothing reads a clock.

After the planned range a task may *serve*: go on with commands as they arrive until its time
is up, so they do not wait for the next micro-batch. At its end it records per partition how
far it got (the position) and which worker it ran in; the next task starts there, and a worker
trusts its cache of a partition only while that position is its own. Between two micro-batches
a :class:`Bridge` of the worker serves on, until the next task of the worker takes over.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as _dt
import gc
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.envelope import CONTENT_TYPE, MAX_AGGREGATE_ID_BYTES, Envelope, read_command
from cqrs.errors import CqrsError
from cqrs.budget import Watch
from cqrs.personal.keys import KeyCache
from cqrs.processor.changelog import StateChangelog, uses_changelog
from cqrs.processor.lanes import (
    Decider, Item, Lane, Lanes, apply_item, decide_items, unpacked_state,
)
from cqrs.processor.state_table import HELD_MARK, Position, StateTable, StoredAggregate, bridged
from cqrs.processor.step import (
    UNDECODED, AggregateStep, InputRecord, OutputRecord, StepResult,
)
from cqrs.results import AggregateRecord
from cqrs.scheduler.records import StoredDeadline

__all__ = [
    "STATS_FIELDS",
    "FetchError",
    "ProduceError",
    "SliceStats",
    "StateCache",
    "States",
    "Worker",
    "group_by_aggregate",
    "process_slice",
    "process_slices",
    "read_envelope",
    "run_task",
]


class FetchError(CqrsError, RuntimeError):
    """A slice of the commands topic could not be read (the task fails and is retried)."""


class ProduceError(CqrsError, RuntimeError):
    """Kafka did not acknowledge every record of a slice (the task fails and is retried)."""


@attrs.define
class SliceStats:
    """What one slice did, summed over a micro-batch by the driver."""

    commands: int = 0
    skipped: int = 0  # applied by an earlier run of the same batch
    aggregates: int = 0
    records: int = 0  # events, results and dead letters written
    events: int = 0
    accepted: int = 0  # results written, by status (a duplicate's answer counts again)
    rejected: int = 0
    failed: int = 0
    dead_letters: int = 0
    cache_hits: int = 0
    store_hits: int = 0  # states found packed in the worker's store (not decoded, not read)
    state_reads: int = 0
    restored: int = 0  # states read from the changelog, restoring partitions taken over
    subject_keys: int = 0  # data subjects whose keys were looked up at once, before deciding
    stale_states: int = 0  # cached states dropped: their subject's key changed (forgotten)
    deadlines_scheduled: int = 0  # deadline changes written (after the records explaining them)
    deadlines_cancelled: int = 0
    set_aside: int = 0  # aggregates whose decision ran long, set aside in lanes of their own
    timed_out: int = 0  # commands whose decision ran past the budget, answered failed
    lanes_open: int = 0  # at the end of a task: lanes of its partitions still deciding
    longest_decision_s: float = 0.0  # at the end of a task: the longest decision running
    longest_decision: str = ""  # ... which one: aggregate and command id
    bridged: int = 0  # commands a bridge decided between two tasks (counted with the next task)
    bridge_wait_s: float = 0.0  # waiting for another worker's bridge to end, at a task's start
    fetch_s: float = 0.0  # reading the slice from Kafka (set by the caller that fetched it)
    read_s: float = 0.0
    step_s: float = 0.0
    produce_s: float = 0.0
    write_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the worker for the slice (the phases above are wall time)

    def add(self, other: SliceStats) -> None:
        for f in attrs.fields(SliceStats):
            if f.name not in _LONGEST:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        if other.longest_decision_s > self.longest_decision_s:
            self.longest_decision_s, self.longest_decision = (other.longest_decision_s,
                                                              other.longest_decision)


_LONGEST = ("longest_decision_s", "longest_decision")  # the greater of two, not their sum


STATS_FIELDS = tuple(f.name for f in attrs.fields(SliceStats))


@attrs.define
class _Cached:
    stored: StoredAggregate
    record: AggregateRecord
    decoded: Any  # the aggregate object, or UNDECODED
    # the id of the key its subject had when it was decided (an aggregate with personal
    # fields; None: not known, or none), that subject, and the key cache's drops then (see
    # KeyCache.drops): see _batch_keys
    key_id: bytes | None = None
    subject: str | None = None
    drops: int | None = None


class States(collections.OrderedDict[tuple[str, str], _Cached]):
    """The cached states of one commands-topic partition, least recently used first; and in
    :attr:`packed`, those evicted from it, as the rows the worker wrote them
    (:meth:`~cqrs.processor.state_table.StoredAggregate.packed`, a few hundred bytes each
    instead of a decoded aggregate's few thousand), oldest first. A state is in one or the
    other, never both: a slice takes it out of the packed ones to decide on it.

    ``vouched``: for an app with personal fields, the key cache's drops count (see
    :attr:`~cqrs.personal.keys.KeyCache.drops`) under which every state here whose subject has
    a key was decided or checked, with that key's id; None when not known (an empty cache, a
    state back from a lane, one decided without its key id). While the key cache's count is
    still that one (and its forget check is recent), no state here needs a check: a slice
    skips them all in one compare (:func:`_batch_keys`)."""

    vouched: int | None = None

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.packed: dict[tuple[str, str], bytes] = {}
        self.packed_bytes = 0  # their lengths, plus PACKED_OVERHEAD each

    def keep(self, key: tuple[str, str], stored: StoredAggregate) -> None:
        """Keep ``stored`` (a state evicted from the decoded ones) packed."""
        blob = stored.packed()
        old = self.packed.pop(key, None)
        if old is not None:
            self.packed_bytes -= len(old) + PACKED_OVERHEAD
        self.packed[key] = blob
        self.packed_bytes += len(blob) + PACKED_OVERHEAD

    def take_packed(self, key: tuple[str, str]) -> bytes | None:
        """The packed state of ``key`` as kept, taken out of the packed ones (None: not kept)."""
        blob = self.packed.pop(key, None)
        if blob is not None:
            self.packed_bytes -= len(blob) + PACKED_OVERHEAD
        return blob

    def unpack(self, key: tuple[str, str]) -> StoredAggregate | None:
        """The packed state of ``key``, taken out of the packed ones (None: not kept)."""
        blob = self.take_packed(key)
        return None if blob is None else StoredAggregate.unpacked(key[1], key[0], blob)

    def forget(self, key: tuple[str, str]) -> None:
        """Neither the decoded nor the packed state of ``key`` (a lane has it now)."""
        self.pop(key, None)
        if self.packed:
            self.unpack(key)

    def shed(self, over: int) -> int:
        """Drop the oldest packed states until ``over`` bytes are freed; the bytes freed."""
        freed = 0
        packed = self.packed
        while freed < over and packed:
            freed += len(packed.pop(next(iter(packed)))) + PACKED_OVERHEAD
        self.packed_bytes -= freed
        return freed


# one in this many states read while the decoded cache is full is kept decoded (StateCache.admits)
ADMIT_EVERY = 16

# what a packed state holds in memory beyond its bytes: the bytes object's header, its share of
# the dict, the key (a tuple of the type and id strings)
PACKED_OVERHEAD = 200


class StateCache:
    """The states a worker wrote, per commands-topic partition, valid for a slice only when the
    slice starts where the worker's last slice of that partition ended (nobody else can have
    applied commands of the partition in between): the worker's local state store. Bounded:
    ``capacity`` decoded states, ``store_bytes`` of packed ones (see :class:`States`).
    Partitions the running task does not serve go first, the one put longest ago first (most
    likely another worker's by now); then the least recently used decoded states of the
    partition being put are packed, and its oldest packed ones dropped."""

    def __init__(self, capacity: int, store_bytes: int = 0, hold_all: bool = False) -> None:
        self.capacity = capacity
        self.store_bytes = store_bytes
        # keep every state of a partition (packed beyond ``capacity``), dropping none: the
        # states are in a changelog, which cannot be read by key (see cqrs.processor.changelog)
        self.hold_all = hold_all
        self.serving: set[Any] = set()  # partitions of the running task: evicted last
        self._parts: dict[Any, tuple[int, States]] = {}
        self._misses = 0  # states read while the decoded ones were full (see admits)

    def room(self, taken: int) -> int:
        """How many more states can be kept decoded, ``taken`` states of the running slices
        counted (out of the cache meanwhile); unbounded when an evicted state is not kept
        packed (it would be lost: :meth:`admits` does not apply)."""
        if self.store_bytes <= 0 and not self.hold_all:
            return sys.maxsize
        return self.capacity - taken - sum(len(e) for _, e in self._parts.values())

    def admits(self) -> bool:
        """Whether a state read from the packed store (or the table) while the decoded states
        are full is kept decoded, evicting the least recently used: one in
        :data:`ADMIT_EVERY`. Admitting every one (plain LRU) made a sweep over more aggregates
        than the cache holds (a large key space, a command or two each) replace every
        decoded state by one not needed again soon: no state was ever found decoded, and
        each was decoded, cached, evicted and packed for nothing. So a sweep keeps most of
        the decoded states it finds (a million aggregates on two workers: ~16 % of the
        commands find theirs decoded, against none), and an aggregate that keeps getting
        commands is kept decoded after ~:data:`ADMIT_EVERY` of them."""
        self._misses += 1
        return self._misses % ADMIT_EVERY == 0

    def take(self, part: Any, first_offset: int) -> States:
        """The partition's cached states if valid for a slice starting at ``first_offset``;
        else an empty cache (the stale one is dropped)."""
        found = self._parts.pop(part, None)
        if found is not None and found[0] == first_offset:
            return found[1]
        return States()

    def put(self, part: Any, next_offset: int, entries: States) -> None:
        if self.capacity <= 0 and not self.hold_all:
            return
        self._parts.pop(part, None)
        total = sum(len(e) for _, e in self._parts.values()) + len(entries)
        packed = sum(e.packed_bytes for _, e in self._parts.values())
        if total > self.capacity:  # partitions the running task does not serve, oldest first
            for other in [p for p in self._parts if p not in self.serving]:
                if self.hold_all:  # packed, not dropped
                    older = self._parts[other][1]
                    while total > self.capacity and older:
                        key, evicted = older.popitem(last=False)
                        older.keep(key, evicted.stored)
                        total -= 1
                else:
                    gone = self._parts.pop(other)[1]
                    total -= len(gone)
                    packed -= gone.packed_bytes
                if total <= self.capacity:
                    break
        keep = self.store_bytes > 0 or self.hold_all
        while total > self.capacity and entries:
            key, evicted = entries.popitem(last=False)
            if keep:
                entries.keep(key, evicted.stored)
            total -= 1
        over = packed + entries.packed_bytes - self.store_bytes
        if over > 0 and not self.hold_all:
            for other in [p for p in self._parts if p not in self.serving]:
                over -= self._parts[other][1].shed(over)
                if over <= 0:
                    break
            if over > 0:
                entries.shed(over)
        self._parts[part] = (next_offset, entries)

    def drop(self, part: Any) -> None:
        self._parts.pop(part, None)

    def clear(self) -> None:
        self._parts.clear()

    def next_offset(self, part: Any) -> int | None:
        """Where the cached states of the partition stand (None: nothing cached)."""
        found = self._parts.get(part)
        return None if found is None else found[0]

    def entries(self, part: Any) -> States | None:
        """The partition's cached states, kept between slices (None: nothing cached)."""
        found = self._parts.get(part)
        return None if found is None else found[1]

    def rewind(self, part: Any, next_offset: int) -> None:
        """The partition's next slice starts at ``next_offset``, before where its last slice
        ended (a lane holds commands there): the states stay valid, those of aggregates that
        applied commands after it say so (their ``applied_offset``)."""
        found = self._parts.get(part)
        if found is not None:
            self._parts[part] = (next_offset, found[1])


_REQUIRED = ("cqrs.message_id", "cqrs.message_type", "cqrs.kind", "cqrs.aggregate_type",
             "cqrs.timestamp")
_KINDS = {b"command": "command", b"event": "event"}
_CONTENT_TYPE = CONTENT_TYPE.encode()


def _optional_int(raw: bytes | None) -> int | None:
    return None if raw is None else int(raw)


def _optional_str(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8")


def read_envelope(aggregate_id: str, headers: Sequence[tuple[str, bytes | None]] | None) -> Envelope | None:
    """The envelope of a well-formed command record in the older header form (see
    :mod:`cqrs.envelope`), or ``None`` when anything is missing or malformed: the step then reads the record with :func:`cqrs.envelope.from_kafka`, whose error
    names the problem. A cheaper twin of ``from_kafka`` for the hot path (no error texts)."""
    found = dict(headers or ())
    try:
        message_id, message_type, kind, aggregate_type, ts_raw = (found[n] for n in _REQUIRED)
        if found.get("content-type", _CONTENT_TYPE) != _CONTENT_TYPE:
            return None
        ts = _dt.datetime.fromisoformat(ts_raw.decode("utf-8"))  # type: ignore[union-attr]
        if ts.tzinfo is None:
            return None
        return Envelope(
            message_id.decode("utf-8"), message_type.decode("utf-8"), _KINDS[kind],  # type: ignore[union-attr,index]
            aggregate_type.decode("utf-8"), aggregate_id, ts,  # type: ignore[union-attr]
            version=_optional_int(found.get("cqrs.version")),
            expected_version=_optional_int(found.get("cqrs.expected_version")),
            command_id=_optional_str(found.get("cqrs.command_id")),
            correlation_id=_optional_str(found.get("cqrs.correlation_id")),
            causation_id=_optional_str(found.get("cqrs.causation_id")),
            reply_partition=_optional_int(found.get("cqrs.reply_partition")))
    except (KeyError, AttributeError, ValueError, TypeError):  # UnicodeDecodeError is a ValueError
        return None


class Worker:
    """What a Python worker builds once per processor: the app's step, its Kafka producer and
    consumer, the state table, the state cache and the token it signs its positions with."""

    def __init__(self, cfg: CqrsConfig, step: AggregateStep, table: StateTable, generation: int,
                 producer: Any) -> None:
        self.cfg = cfg
        self.step = step
        self.table = table
        self.generation = generation
        self.producer = producer
        # with the state in a changelog, a worker holds every state of its partitions: none
        # is shed, as none could be read back (see cqrs.processor.changelog)
        self.changelog = StateChangelog(cfg, table.app_name, generation) \
            if table is not None and uses_changelog(cfg) else None
        self.cache = StateCache(cfg.processor.state_cache_aggregates,
                                cfg.processor.state_store_mib << 20, self.changelog is not None)
        self.token = uuid.uuid4().hex  # names this worker in the positions it writes
        # state writes started, with the cached partitions and aggregate ids they cover
        self.in_flight: list[tuple[Callable[[], object], list[tuple[Any, ...]], set[str]]] = []
        # the last slices' rows and deadlines, whose records are sent but not yet known to be
        # acknowledged
        self.sent: tuple[list[StoredAggregate], list[tuple[Any, ...]], set[str], int,
                         list[StoredDeadline]] | None = None
        self._deadline_store: Any = None
        self.consumer: Any = None
        self.errors: list[str] = []
        self.lanes = Lanes()  # aggregates set aside (see cqrs.processor.lanes)
        self.bridge: Bridge | None = None  # serving on after the last task (see Bridge)
        # the topic and {partition: next offset} a bridge taken over left its consumer assigned at
        self.assigned: tuple[str, dict[int, int]] | None = None
        self.personal_types = step.codec.personal_types  # classes with personal fields
        self._decider: Decider | None = None

    def decider(self) -> Decider:
        """The thread that decides slices while the task's thread watches."""
        if self._decider is None:
            self._decider = Decider(self.step)
        return self._decider

    def replace_decider(self) -> Decider:
        """A new decider: the current one's thread now serves a lane."""
        if self._decider is not None:
            self._decider.retired = True
        self._decider = Decider(self.step)
        return self._decider

    def settle(self, keep: int = 0) -> None:
        """Wait for the oldest state writes until at most ``keep`` are in flight (none: every
        row written is then durable, the changelog's transactions committed). A write that
        failed drops the cached states of every partition in flight, and raises."""
        while len(self.in_flight) > keep:
            writing = self.in_flight[0][0]
            try:
                writing()
            except Exception:
                self.abandon()
                raise
            self.in_flight.pop(0)
        if keep == 0 and self.changelog is not None:
            try:
                self.changelog.commit()
            except Exception:
                self.abandon()
                raise

    def restore(self, part: tuple[Any, ...]) -> States:
        """A partition's states from the changelog, once this worker's own writes are
        committed: the cache of a partition taken over (see :mod:`cqrs.processor.changelog`)."""
        assert self.changelog is not None
        self.finish_sent()
        self.settle()
        found = self.changelog.restore(part[3])
        states = States()
        states.packed = found
        states.packed_bytes = sum(len(b) for b in found.values()) + PACKED_OVERHEAD * len(found)
        return states

    def finish_sent(self) -> None:
        """Wait until Kafka acknowledged the records of the last slices sent, then start
        writing the state rows they explain (see :func:`process_slices`)."""
        if self.sent is None:
            return
        rows, parts, ids, count, deadlines = self.sent
        try:
            self.confirm(count)
            if deadlines:  # after the records that explain them, in order, before the rows
                self.deadline_store().apply(deadlines)
            writing = self.changelog.start_writing(rows) if self.changelog is not None \
                else self.table.start_writing(self.generation, rows)
        except Exception:
            self.abandon()
            raise
        self.sent = None
        self.in_flight.append((writing, parts, ids))
        self.settle(MAX_WRITES_IN_FLIGHT)

    def deadline_store(self) -> Any:
        """The app's deadline tables, on the state table's Cassandra session (opened when a
        decision first schedules or cancels one)."""
        if self._deadline_store is None:
            from cqrs.scheduler.store import DeadlineStore

            self._deadline_store = DeadlineStore(self.table.cassandra, self.step.topics.base,
                                                 self.cfg.scheduler.bucket_s)
        return self._deadline_store

    def unwritten(self, ids: set[str]) -> bool:
        """Whether a row of one of these aggregate ids is sent or in flight, not yet written:
        the table may still hold an older one."""
        pending = [self.sent[2]] if self.sent is not None else []
        pending += [w[2] for w in self.in_flight]
        return any(not p.isdisjoint(ids) for p in pending)

    def abandon(self) -> None:
        """Forget the state rows sent and in flight (they may still land: each explains records
        Kafka acknowledged) and the cached states they cover."""
        for _, parts, _ in self.in_flight:
            for part in parts:
                self.cache.drop(part)
        self.in_flight.clear()
        if self.changelog is not None:  # uncommitted rows: every partition is restored again
            self.changelog.abandon()
            self.cache.clear()
        if self.sent is not None:
            for part in self.sent[1]:
                self.cache.drop(part)
            self.sent = None

    def _consumer(self) -> Any:
        if self.consumer is None:
            from cqrs.kafka_io import make_consumer

            self.consumer = make_consumer(self.cfg, **{"fetch.wait.max.ms": 10,
                                                      "enable.partition.eof": False})
        return self.consumer

    def part(self, topic: str, partition: int) -> tuple[Any, ...]:
        """The key of a partition's states in this worker's cache."""
        return (self.table.app_name, self.generation, topic, partition)

    def _position(self, topic: str, partition: int) -> int:
        from confluent_kafka import TopicPartition

        return int(self.consumer.position([TopicPartition(topic, partition)])[0].offset)

    def on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def send(self, records: Sequence[OutputRecord]) -> None:
        """Hand ``records`` to the producer, in order (:meth:`confirm` waits for them)."""
        produce, poll = self.producer.produce, self.producer.poll
        for rec in records:
            while True:
                try:
                    if rec.headers:
                        if rec.partition is None:
                            produce(rec.topic, rec.value, rec.key, headers=rec.headers)
                        else:
                            produce(rec.topic, rec.value, rec.key, rec.partition, headers=rec.headers)
                    elif rec.partition is None:  # a result record
                        produce(rec.topic, rec.value, rec.key)
                    else:
                        produce(rec.topic, rec.value, rec.key, rec.partition)
                    break
                except BufferError:  # the local queue is full: let librdkafka send some
                    poll(0.05)

    def confirm(self, count: int) -> None:
        """Wait until Kafka acknowledged every record sent (``count`` of them, for the error)."""
        left = self.producer.flush(120)
        if left or self.errors:
            errors, self.errors = self.errors[:5], []
            raise ProduceError(
                f"Kafka did not acknowledge {left} of {count} records"
                + (f" ({'; '.join(errors)})" if errors else "")
                + f" within 120 s: is {self.cfg.kafka.bootstrap_servers} reachable? The batch "
                "is retried and rewrites the same records")


def _count(stats: SliceStats, out: Sequence[OutputRecord], events: str, results: str,
           dead_letters: str) -> None:
    by_topic = collections.Counter(r.topic for r in out)
    stats.events, stats.dead_letters = by_topic[events], by_topic[dead_letters]
    if by_topic[results]:
        statuses = collections.Counter(r.status for r in out if r.topic == results)
        stats.accepted, stats.rejected, stats.failed = (
            statuses["accepted"], statuses["rejected"], statuses["failed"])


Message = tuple[bytes | None, bytes | None, Any, int]


def process_slice(worker: Worker, topic: str, partition: int, messages: Sequence[Message],
                  start_offset: int | None = None) -> SliceStats:
    """Process one Kafka partition's slice of a micro-batch: ``messages`` are its records as
    (key, value, headers, offset), in offset order; ``start_offset``: where the slice was read
    from (default: the first record's offset; later when the partition has a gap there)."""
    return process_slices(worker, topic, {partition: (messages, start_offset)})


def process_slices(worker: Worker, topic: str,
                   slices: dict[int, tuple[Sequence[Message], int | None]],
                   wait: bool = True, serving: set[int] | None = None) -> SliceStats:
    """Process slices of several partitions as one: each partition's commands as
    :func:`process_slice` does, then every record written to Kafka at once, then every state
    row (one wait for Kafka and one for Cassandra, whatever the number of partitions).

    ``wait=False``: return once the records are handed to the producer. Their state rows are
    written once Kafka acknowledged them, which the next call (or :meth:`Worker.finish_sent`)
    waits for after deciding its own slices: deciding overlaps Kafka's round trip and
    Cassandra's. :meth:`Worker.settle` waits for the rows. A slice that needs an aggregate
    whose row is not written yet (and no longer cached) waits for it before reading.

    What the lanes of the ``serving`` partitions (default: the slices') decided is written
    with the slices (see :mod:`cqrs.processor.lanes`); with no slice, only that."""
    stats = SliceStats()
    slices = {p: sl for p, sl in slices.items() if sl[0]}
    lanes = worker.lanes.of_partitions(set(slices) if serving is None else serving) \
        if worker.lanes else []
    if not slices and not lanes:
        return stats
    cpu_started = time.process_time()
    # a slice allocates tens of objects per command; the collector's passes over them (and over
    # the cached states) cost ~15 % of the slice, and nothing here makes reference cycles
    collecting = gc.isenabled()
    gc.disable()
    try:
        from_lanes, back = _collect_lanes(worker, lanes, stats)
        grouped = [_group(worker, topic, p, messages, stats, start)
                   for p, (messages, start) in slices.items()]
        _return_from_lanes(worker, grouped, back)
        if worker.lanes:
            _route_to_lanes(worker, grouped)
        # 2. state of every aggregate of the slices: the cache (decoded, else packed: as if
        # read), else the table (one read)
        t0 = time.perf_counter()
        # (kept packed, to be decided on as such, when the step can: see _decide's prepare)
        stored: dict[tuple[str, str], StoredAggregate | bytes] = {}
        packs = worker.step.packs
        for g in grouped:
            if g.cache.packed:
                take = g.cache.take_packed if packs else g.cache.unpack
                decoded = g.cache
                for k in g.groups:
                    if k not in decoded and (found := take(k)) is not None:  # type: ignore[arg-type]
                        stored[k] = found  # type: ignore[index]
        stats.store_hits += len(stored)
        # with a changelog, the cache holds every state of the partition: the rest are new
        wanted = set() if worker.changelog is not None else \
            {k[1] for g in grouped for k in g.groups
             if k[1] is not None and k[0] is not None and k not in g.cache and k not in stored}
        if wanted and worker.unwritten(wanted):  # the table may hold an older row of one
            worker.finish_sent()
            worker.settle()
        if wanted:  # of an id, the types the store had are the store's
            for k, row in worker.table.read(worker.generation, sorted(wanted)).items():
                stored.setdefault(k, row)
        stats.state_reads += len(wanted)
        loaded: dict[tuple[str, str], AggregateRecord] = {}
        keys: dict[str, Any] | None = None
        drops: int | None = None
        if worker.step.codec.personal:  # the data subjects' keys at once, and a forget seen
            keys, stale, drops = _batch_keys(worker, grouped, stored, loaded, stats)
            if stale and worker.changelog is not None:  # their rows, kept packed: as if read
                for g in grouped:
                    for k in g.groups:
                        if k[1] in stale and (row := g.cache.unpack(k)) is not None:  # type: ignore[arg-type]
                            stored[k] = row  # type: ignore[index]
            elif stale:  # their states again from the table, which reads them as forgotten
                if worker.unwritten(stale):
                    worker.finish_sent()
                    worker.settle()
                stored.update(worker.table.read(worker.generation, sorted(stale)))
                stats.state_reads += len(stale)
        stats.read_s += time.perf_counter() - t0
        pending = _decide(worker, grouped, stored, stats, loaded, keys, drops)
        # the lanes' records and rows first: a lane that emptied in _collect_lanes gave its
        # state back to the cache, and this slice may have decided its aggregate's next
        # commands on it (written after them, its events and row came after newer ones)
        _write(worker, from_lanes + pending, stats, wait)
        stats.cpu_s = time.process_time() - cpu_started
        return stats
    finally:
        if collecting:
            gc.enable()


def _batch_keys(worker: Worker, grouped: list[_Grouped],
                stored: dict[tuple[str, str], StoredAggregate],
                loaded: dict[tuple[str, str], AggregateRecord], stats: SliceStats,
                ) -> tuple[dict[str, Any], set[str], int | None]:
    """For an app with personal fields: the keys of the slices' data subjects, asked of the key
    store at once (:meth:`~cqrs.personal.keys.KeyStore.prefetch`), so that decoding and
    encoding the slices finds every key in the cache: the subjects of the commands (read
    without opening them), of the cached states to check and of the state rows read
    (``loaded`` gets the rows' records, decoded once for the step).

    A cached state is kept decoded, so it holds its personal values in clear: one whose
    subject's key is not the key it was decided with (the subject was forgotten, and the
    key cache has noticed: within ``[personal_data] key_cache_seconds``) is dropped from the
    cache; the ids of those aggregates are returned, to read their rows again (which read
    their personal fields as the replacement), so that their old values are never sealed
    again under the subject's new key.

    The usual case costs one compare per partition: the key cache dropped no key since every
    state cached was decided or checked, and its forget check is recent (:attr:`States.vouched`).
    Else, while that check is recent, every state of the partition is checked once (those of
    the slice with the keys asked for, the others against the key cache alone: one that does
    not hold the state's key is dropped, to be read again when needed) and the partition's
    cache is vouched for again; while it is not recent, the states of the slice are checked."""
    step = worker.step
    codec = step.codec
    peek, subject_of = codec.peek_subject, codec.subject_of
    # a cached state whose key the key cache loaded less than half its TTL ago, and holds
    # still, needs neither the look-up nor the check (what prefetch would find): a dict look-up;
    # none at all while the cache's forget check is recent and it dropped no key since the
    # state was decided (its drops count, read after that check)
    recent = codec.key_store.recent_key_id if isinstance(codec.key_store, KeyCache) else None
    loaded_after = codec.key_store.fresh_after() if recent is not None else 0.0
    drops = codec.key_store.drops if recent is not None else None
    vouched = drops if loaded_after == float("-inf") else None
    personal = worker.personal_types  # the commands' own: read only those with personal fields
    payloads: list[bytes] = []
    subjects: set[str] = set()
    held: list[tuple[_Grouped, tuple[str, str], str, _Cached]] = []
    for g in grouped:
        cache, groups = g.cache, g.groups
        if personal:
            payloads += [rec.payload for records in groups.values() for rec in records
                         if (env := rec.envelope) is not None and env.message_type in personal
                         and rec.payload is not None]
        if vouched is not None and cache.vouched == vouched:
            continue  # the usual case: nothing dropped since every state here was vouched for
        whole = vouched is not None  # every state of the partition, else those of the slice
        for key in list(cache) if whole else [k for k in groups if k in cache]:
            hit = cache[key]
            if hit.key_id is not None and (hit.drops == vouched and vouched is not None or
                                           recent is not None and
                                           recent(hit.subject, loaded_after) == hit.key_id):
                continue
            if (subject := subject_of(hit.decoded)) is None:
                continue
            if key in groups:
                subjects.add(subject)
                held.append((g, key, subject, hit))
            else:  # not needed now: read again when it is
                _forget_decoded(worker, cache, key, hit)
        if whole:
            cache.vouched = vouched  # once the held states are checked, below
    for key, row in stored.items():  # the states not cached: their rows
        if any(key in g.groups and key not in g.cache for g in grouped):
            record = loaded[key] = step.load_state(row.record)
            if record.snapshot is not None and (subject := peek(record.snapshot)) is not None:
                subjects.add(subject)
    if payloads:
        subjects |= codec.subjects_in(payloads)
    if not subjects:
        return {}, set(), drops
    keys = step.codec.key_store.prefetch(subjects) if step.codec.key_store is not None else {}
    stats.subject_keys += len(subjects)
    stale: set[str] = set()
    for g, key, subject, hit in held:
        if key_changed(step, hit.decoded, hit.key_id, keys, subject):
            _forget_decoded(worker, g.cache, key, hit)
            stale.add(key[1])
    stats.stale_states += len(stale)
    return keys, stale, drops


def _forget_decoded(worker: Worker, cache: States, key: tuple[str, str], hit: _Cached) -> None:
    """Drop a decoded state whose values may be in clear under a forgotten subject's key: read
    again from its row when needed (with a changelog, the row as written, kept packed: sealed
    under the old key, it decodes as forgotten)."""
    del cache[key]
    if worker.changelog is not None:
        cache.keep(key, hit.stored)


def _collect_lanes(worker: Worker, lanes: list[Lane], stats: SliceStats,
                   ) -> tuple[list[_Pending], list[tuple[Lane, _Cached | None]]]:
    """What the lanes decided since the last call, to write, and the lanes now empty with the
    state their aggregate goes back to the cache with. A decision past the budget is
    abandoned here (see :meth:`Lane.check_budget`)."""
    step, budget, now = worker.step, worker.cfg.processor.decision_budget_s, time.monotonic()
    out: list[_Pending] = []
    back: list[tuple[Lane, _Cached | None]] = []
    for lane in lanes:
        with lane.lock:
            if lane.check_budget(step, budget, now):
                stats.timed_out += 1
            if lane.error is not None:  # the step's bug, not a handler's: fail the task, and
                del worker.lanes.by_key[lane.key]  # decide its commands again when it re-runs
                raise lane.error
            done, lane.done = lane.done, []
            empty = lane.thread is None and not lane.queue and not lane.inflight
        agg_type, agg_id = lane.key
        records: list[OutputRecord] = []
        rows: list[StoredAggregate] = []
        deadlines: list[StoredDeadline] = []
        for result, applied in done:
            records.extend(result.out)
            deadlines.extend(result.deadlines)
            if result.record is None or not applied:
                continue
            lane.commands += len(applied)
            last = applied[-1]
            lane.row = StoredAggregate(agg_id, agg_type, result.record.version, result.record.deleted,
                                       step.dump_state(result.record), last.partition, last.offset,
                                       lane.commands)
            rows.append(lane.row)
        if records or rows or deadlines:
            out.append(_Pending(worker.part(step.topics.commands, lane.partition), -1, None,
                                records, rows, deadlines))
        if empty:
            del worker.lanes.by_key[lane.key]
            cached = None if lane.row is None or lane.record is None else \
                _Cached(lane.row, lane.record, lane.decoded)
            back.append((lane, cached))
    return out, back


def _report_lanes(worker: Worker, partitions: set[int], stats: SliceStats) -> None:
    """The lanes still deciding at the end of a task, and the longest decision among them."""
    now = time.monotonic()
    for lane in worker.lanes.of_partitions(partitions):
        stats.lanes_open += 1
        rec, since = lane.watch.record, lane.watch.since
        if rec is not None and now - since > stats.longest_decision_s:
            env = rec.envelope
            cid = None if env is None else env.command_id or env.message_id
            stats.longest_decision_s = now - since
            stats.longest_decision = f"{lane.key[0]} {lane.key[1][:80]!r}, command {cid!r}"


def _return_from_lanes(worker: Worker, grouped: list[_Grouped],
                       back: list[tuple[Lane, _Cached | None]]) -> None:
    """Emptied lanes: their aggregates' states into their partitions' caches."""
    for lane, cached in back:
        if cached is None:
            continue
        part = worker.part(worker.step.topics.commands, lane.partition)
        cache = next((g.cache for g in grouped if g.part == part), None)
        if cache is None:
            cache = worker.cache.entries(part)
        if cache is not None:
            cache.forget(lane.key)
            cache[lane.key] = cached
            cache.vouched = None  # its key id is not known


def _route_to_lanes(worker: Worker, grouped: list[_Grouped]) -> None:
    """Commands of aggregates set aside go to the end of their lanes (in offset order), not to
    the step; those a lane had already (read again after a held position) are dropped."""
    for g in grouped:
        for key in [k for k in g.groups if k in worker.lanes.by_key]:
            lane = worker.lanes.by_key[key]
            records = [r for r in g.groups.pop(key) if r.offset > lane.taken]
            if not records:
                continue
            with lane.lock:
                lane.queue.extend(records)
                lane.taken = records[-1].offset
                if lane.thread is None and lane.error is None:
                    lane.start(worker.step)


@attrs.define
class _Pending:
    """A partition's slice, decided: its records and rows still to write."""

    part: tuple[Any, ...]
    next_offset: int
    cache: States | None  # None: a lane's
    out: list[OutputRecord]
    rows: list[StoredAggregate]
    deadlines: list[StoredDeadline]


def _write(worker: Worker, pending: list[_Pending], stats: SliceStats, wait: bool) -> None:
    """4. records first, 5. then the state they explain; then the cache."""
    out = [r for p in pending for r in p.out]
    rows = [r for p in pending for r in p.rows]
    deadlines = [d for p in pending for d in p.deadlines]
    if deadlines:
        stats.deadlines_scheduled = sum(1 for d in deadlines if d.due_ms is not None)
        stats.deadlines_cancelled = len(deadlines) - stats.deadlines_scheduled
    stats.records = len(out)
    step = worker.step
    _count(stats, out, step.topics.events, step.topics.results, step.topics.dead_letters)
    parts = list({p.part: None for p in pending})
    ids = {r.aggregate_id for r in rows}
    t2 = time.perf_counter()
    worker.finish_sent()  # the previous slices' records: acknowledged by now, mostly
    t3 = time.perf_counter()
    stats.write_s += t3 - t2
    try:
        worker.send(out)
    except Exception:
        for part in parts:
            worker.cache.drop(part)
        raise
    for p in pending:
        if p.cache is not None:
            worker.cache.put(p.part, p.next_offset, p.cache)
    worker.sent = (rows, parts, ids, len(out), deadlines)
    t4 = time.perf_counter()
    stats.produce_s += t4 - t3
    if wait:
        worker.finish_sent()
        worker.settle()
        t5 = time.perf_counter()
        stats.write_s += t5 - t4  # the wait for Kafka's acknowledgements, then for the rows


@attrs.define
class _Grouped:
    part: tuple[Any, ...]
    next_offset: int
    cache: States
    groups: dict[tuple[str | None, str | None], list[InputRecord]]


def group_by_aggregate(topic: str, partition: int, messages: Sequence[Message],
                       ) -> dict[tuple[str | None, str | None], list[InputRecord]]:
    """A partition's records ``(key, value, headers, offset)`` as the step's input, grouped by
    ``(aggregate type, id)`` in offset order; a record whose aggregate cannot be told goes to
    ``(None, None)`` (the step dead-letters it). The Spark task and the in-process runner both
    group a chunk with this."""
    groups: dict[tuple[str | None, str | None], list[InputRecord]] = {}
    for key, value, headers, offset in messages:
        try:  # no key, an empty one or one over Cassandra's limit: the step dead-letters it
            agg_id = key.decode("utf-8") if key and len(key) <= MAX_AGGREGATE_ID_BYTES else None
        except UnicodeDecodeError:
            agg_id = None
        env = payload = None
        if agg_id is not None and value is not None:
            found = read_command(agg_id, value)  # a command record: the envelope in the value
            if found is not None:
                env, payload = found
            elif headers:  # the older form, with the envelope in headers
                env = read_envelope(agg_id, headers)
                payload = None if env is None else value
        rec = InputRecord(key, value, headers or [], partition, offset, topic, env, payload)
        if env is not None:
            groups.setdefault((env.aggregate_type, agg_id), []).append(rec)
        else:  # the step reads it the slow way: by its type header, if it has one
            agg_type = dict(headers or ()).get("cqrs.aggregate_type")
            try:
                group = (agg_type.decode("utf-8") if agg_type is not None else None, agg_id)
            except UnicodeDecodeError:
                group = (None, agg_id)
            groups.setdefault(group if None not in group else (None, None), []).append(rec)
    return groups


def _group(worker: Worker, topic: str, partition: int, messages: Sequence[Message],
           stats: SliceStats, start_offset: int | None) -> _Grouped:
    """1. of the module doc for one partition's slice, with the worker's cache of it."""
    stats.commands += len(messages)
    groups = group_by_aggregate(topic, partition, messages)  # 1. in offset order
    first_offset, next_offset = messages[0][3], messages[-1][3] + 1
    if start_offset is not None:
        first_offset = start_offset
    part = worker.part(topic, partition)
    valid = worker.cache.next_offset(part) == first_offset
    cache = worker.cache.take(part, first_offset)  # its hits are counted in _decide
    if worker.changelog is not None and not valid:
        cache = worker.restore(part)
        stats.restored += len(cache.packed)
    return _Grouped(part, next_offset, cache, groups)


def _decide(worker: Worker, grouped: list[_Grouped],
            stored: dict[tuple[str, str], StoredAggregate], stats: SliceStats,
            loaded: dict[tuple[str, str], AggregateRecord] | None = None,
            keys: dict[str, Any] | None = None, drops: int | None = None) -> list[_Pending]:
    """3. of the module doc for the partitions' slices: the step per aggregate, in the worker's
    decider thread while this one watches for a decision that runs long (that aggregate is set
    aside in a lane of its own: :mod:`cqrs.processor.lanes`); then rows and cache, here."""
    t1 = time.perf_counter()
    step = worker.step
    outs: list[list[OutputRecord]] = [[] for _ in grouped]
    items: list[Item] = []
    for i, g in enumerate(grouped):
        for key, records in g.groups.items():
            if key[0] is None or key[1] is None:  # dead-lettered by the step, at once
                outs[i].extend(step.apply(None, None, None, records).out)
            else:
                items.append(Item(i, key, records))
    hits = skipped = 0
    packs = step.packs

    room = worker.cache.room(sum(len(g.cache) for g in grouped))

    def prepare(item: Item) -> bool:
        """The item's state (cache, else the row read), without the commands it applied; and
        whether its new state is kept decoded. A state read from the packed store or the table
        while the decoded ones are full is kept packed unless the cache admits it
        (:meth:`StateCache.admits`); one kept packed is decided on its packed row (see
        :func:`~cqrs.processor.lanes.apply_item`)."""
        nonlocal hits, skipped, room
        hit = grouped[item.slice_index].cache.get(item.key)
        source: int | None = None
        applied = -1
        if hit is not None:
            hits += 1
            item.row, item.record, item.decoded = hit.stored, hit.record, hit.decoded
            item.cached = hit
            source, applied = hit.stored.source_partition, hit.stored.applied_offset
        else:
            if room > 0:
                room -= 1
            else:
                item.keep_decoded = worker.cache.admits()
            row = stored.get(item.key)
            if not item.keep_decoded and packs and row is not None:  # decided as it is kept
                item.packed = row if type(row) is bytes else row.packed()  # (a row read)
                source, applied = StoredAggregate.applied_in(item.packed)
                row = None
            elif type(row) is bytes:
                row = StoredAggregate.unpacked(item.key[1], item.key[0], row)
            if row is not None:
                source, applied = row.source_partition, row.applied_offset
            item.row = row  # type: ignore[assignment]
            found = loaded.get(item.key) if loaded else None
            item.record = found if found is not None else \
                None if row is None else step.load_state(row.record)  # type: ignore[union-attr]
            item.decoded = UNDECODED
        if source is not None:
            fresh = [r for r in item.records if r.partition != source or r.offset > applied]
            skipped += len(item.records) - len(fresh)
            item.records = fresh
        return bool(item.records)

    laned: list[Item] = []

    def set_aside(item: Item, watch: Watch, thread: Any) -> Lane:
        g = grouped[item.slice_index]
        # (an item decided on its packed row: its state from that, whatever the decider's
        # thread has set meanwhile)
        row, record, decoded = (item.row, item.record, item.decoded) if item.packed is None \
            else unpacked_state(step, item)
        lane = Lane(item.key, g.part[3], row, record, decoded, watch, thread, list(item.records))
        worker.lanes.by_key[item.key] = lane
        # the lane has its state now: out of the cache once the decider is done (its finish
        # changes the cache meanwhile, and the two would race on the packed store's count)
        laned.append(item)
        return lane

    pending = [_Pending(g.part, g.next_offset, g.cache, outs[i], [], []) for i, g in enumerate(grouped)]

    def finish(item: Item) -> None:
        """A decision into its slice's records and rows and its state into the cache, right
        after it is made (the decider's thread), in the items' order: the state it replaces
        is freed at once, and the next decision's objects take that memory while it is still
        in the CPU's caches (deciding them all first, then this, put every one of a slice's
        new objects in fresh memory); decoded or packed as ``prepare`` said."""
        result: StepResult | None = item.result
        if result is None:
            return
        slot = pending[item.slice_index]
        slot.out.extend(result.out)
        if result.deadlines:
            slot.deadlines.extend(result.deadlines)
        cache = slot.cache
        assert cache is not None
        if result.row is not None:  # decided on its packed row: the new one, packed
            slot.rows.append(result.row)
            cache.keep(item.key, result.row)
            item.packed = item.result = None
            return
        if result.record is None:
            return
        agg_type, agg_id = item.key
        last, row = item.records[-1], item.row
        new_row = StoredAggregate(
            agg_id, agg_type, result.record.version, result.record.deleted,
            step.dump_state(result.record), last.partition, last.offset,
            (row.commands if row is not None else 0) + len(item.records))
        slot.rows.append(new_row)
        if not item.keep_decoded:
            cache.keep(item.key, new_row)
        else:
            key_id = subject = None
            if keys is not None and (subject := step.codec.subject_of(result.state)) is not None:
                hit = item.cached  # checked by _batch_keys for this slice: still its subject's key
                key_id = hit.key_id if hit is not None and hit.subject == subject and \
                    hit.key_id is not None else state_key_id(step, keys, result.state, subject)
            cache[item.key] = _Cached(new_row, result.record, result.state, key_id, subject, drops)
            cache.move_to_end(item.key)
            if drops != cache.vouched or key_id is None and subject is not None:
                cache.vouched = None
        # the state it replaces goes now (the cache held it, and this item)
        item.row = item.record = item.decoded = item.cached = item.result = item.packed = None

    slow_s = worker.cfg.processor.slow_decision_s
    if slow_s > 0:
        try:
            stats.set_aside += decide_items(worker.decider, worker.replace_decider, items,
                                            prepare, set_aside, slow_s, finish)
        finally:
            for item in laned:
                grouped[item.slice_index].cache.forget(item.key)
    else:  # no lanes: decided here, one after the other
        for item in items:
            if prepare(item):
                item.result = apply_item(step, item, None)
                finish(item)
    stats.aggregates += len(items)
    stats.cache_hits += hits
    stats.skipped += skipped
    stats.step_s += time.perf_counter() - t1
    return pending


def state_key_id(step: AggregateStep, keys: dict[str, Any], state: Any,
                 subject: str | None = None) -> bytes | None:
    """The id of the key ``state`` (an aggregate with personal fields) was sealed with: its
    subject's key as the slice's look-up found it (the key cache's, for a subject that first
    appeared in the decision). Kept with a cached decoded state, which holds its personal
    values in clear, to tell whether its subject was forgotten since (:func:`key_changed`).
    ``subject``: the state's, when the caller has it."""
    subject = subject or step.codec.subject_of(state)
    if subject is None or step.codec.key_store is None:
        return None
    key = keys.get(subject) or step.codec.key_store.get(subject)
    return None if key is None else key.key_id


def key_changed(step: AggregateStep, state: Any, key_id: bytes | None,
                keys: dict[str, Any] | None = None, subject: str | None = None) -> bool:
    """Whether the subject of the decoded ``state``, sealed with ``key_id``
    (:func:`state_key_id`), has no key or another one now (forgotten): the state must then be
    read again from its record, which opens its personal fields as the replacement, so that
    its old values are never sealed again under a new key. ``keys``: the batch's look-up;
    ``subject``: the state's, when the caller has it."""
    subject = subject or step.codec.subject_of(state)
    if subject is None or step.codec.key_store is None:
        return False
    now = keys.get(subject) if keys else None
    if now is None:
        now = step.codec.key_store.get(subject)
    return now is None or now.key_id != key_id


MAX_WRITES_IN_FLIGHT = 4  # state writes a serving task lets run behind its decisions
CHUNK = 20_000  # records taken from the consumer at once (a slice per partition among them)
POLL_S = 0.05  # how long a serving task waits for a record before it looks at the clock
MIN_CHUNK = 500  # records a serving task takes at least, however close its deadline
FIRST_GUESS_S = 60e-6  # a command's wall time in a task, until its first chunk tells


def run_task(worker: Worker, topic: str, ranges: dict[int, tuple[int, int]],
             serve_until: float | None = None, timeout_s: float = 120.0,
             positions: dict[int, Position] | None = None,
             stopping: Callable[[], bool] | None = None) -> SliceStats:
    """One task of a micro-batch: the planned ``{partition: (start, end)}`` ranges, then, until
    ``serve_until`` (``time.monotonic()``; None: not at all), whatever else arrives on those
    partitions, as it arrives.

    A partition is read from its recorded position when that is further than the planned start
    (a task of an earlier batch served those commands). The worker keeps its cached states of a
    partition only while the recorded position is the one it wrote itself: else another worker
    applied commands since. At the end the task records how far it got on each partition.
    ``positions``: the recorded ones, when the caller has just read them. ``stopping``: true
    once the processor is stopping (serving then ends at once, and no bridge follows).

    A serving task leaves a :class:`Bridge` serving on (``[processor] bridge_seconds``), which
    the next task of this worker takes over first; a task of another worker waits for it.
    """
    carried = _take_over(worker, topic)  # the bridge left by the last task, if any: stopped first
    _LATE_COLLECTION.wait()  # the last task's, if it still runs: it re-enables the collector
    collecting = gc.isenabled() or _LATE_COLLECTION.owed
    gc.disable()  # see process_slices; here it is the cached states the collector would walk
    try:
        stats = _run_task(worker, topic, ranges, serve_until, timeout_s, positions, stopping,
                          carried)
    finally:
        if collecting:
            if worker.bridge is not None:  # it runs the collection when it ends, if not taken over
                _LATE_COLLECTION.owed = True
            else:
                _LATE_COLLECTION.owed = False
                if gc.get_count()[0] >= GC_DEBT_OBJECTS:
                    _LATE_COLLECTION.defer()
                _LATE_COLLECTION.start()
    return stats


class _LateCollection:
    """The collection a task owes, run once the task has returned.

    What a task leaves lives on (the cache, mostly): the collector must not walk it again and
    again, so it is frozen, after the young garbage (reference cycles: 4,000-39,000
    unreachable objects a task, measured at 100,000 aggregates) is collected. That collection
    takes 0.05-0.35 s; at the end of the task it held up the micro-batch, whose other tasks
    and the next batch waited for it.
    Run a moment later in a thread, it overlaps the driver's work between batches (the worker
    waits for its next task meanwhile); a task that starts before it finished waits for it.
    A task that leaves a bridge collects and freezes its young objects itself first (one
    that ends with more than :data:`GC_DEBT_OBJECTS` of them freezes them uncollected, as
    :meth:`defer` does; when a reclaim is due it leaves no bridge); the collector then stays
    off while the bridge serves and its re-enabling is ``owed``: the bridge runs the late collection when
    it ends, unless a task took it over (that task then owes it).

    But PySpark's daemon collects fully between two tasks of a worker (``daemon.py``), at once:
    over the 350,000-530,000 young objects a throughput task leaves at 300,000 aggregates, that
    took the worker 0.33-0.58 s of CPU a task (~15 % of its time). A task that ends with more
    than :data:`GC_DEBT_OBJECTS` of them (:meth:`defer`) freezes them all, uncollected: its
    garbage (reference cycles of the Cassandra driver's request futures, 5,000-12,000 objects
    a task, ~1 MB) is frozen with them, and reclaimed every :data:`RECLAIM_AFTER_DEFERRED`
    such tasks by a full collection of everything, in the late collection's thread."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self.owed = False
        self.deferred = 0  # tasks whose young objects were frozen uncollected since a reclaim

    def defer(self) -> None:
        """Freeze the young objects now, uncollected (see the class doc)."""
        gc.freeze()
        self.deferred += 1

    def start(self) -> None:
        reclaim = self.deferred >= RECLAIM_AFTER_DEFERRED
        if reclaim:
            self.deferred = 0
        self._thread = threading.Thread(target=self._run, args=(reclaim,),
                                        name="cqrs-late-collection", daemon=True)
        self._thread.start()

    @staticmethod
    def _run(reclaim: bool = False) -> None:
        time.sleep(LATE_COLLECTION_DELAY_S)  # let the task's answer reach Spark first
        if reclaim:  # the garbage frozen with deferred tasks' objects: everything walked once
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)  # young garbage first: what the task leaves is frozen
        gc.freeze()
        gc.enable()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


_LATE_COLLECTION = _LateCollection()
LATE_COLLECTION_DELAY_S = 0.02
BRIDGE_STOP_EARLY_S = 0.2  # a bridge stops serving this long before its lease ends
# young objects (gc.get_count()[0]) past which a task's objects are frozen uncollected (see
# _LateCollection.defer), before its bridge starts or after it returned; below it, the task
# collects them before its bridge starts (5-24 ms for the 12,000-15,000 of a 500/s run's task)
GC_DEBT_OBJECTS = 100_000
# tasks frozen uncollected (see _LateCollection.defer) between two full collections: ~1 MB of
# garbage each, against a full collection of the worker's heap (~0.5-1.5 s of CPU with a
# million states) each time
RECLAIM_AFTER_DEFERRED = 32
LEASE_MARGIN_S = 2.0  # a task of another worker waits this long past a bridge's lease (a bridge
# settling on a loaded machine can take longer than 0.5 s, and a task going on decides again)
LEASE_POLL_S = 0.02


@attrs.define
class _Serving:
    """What a task (and the bridge after it) knows of its partitions while serving them."""

    topic: str
    consumer: Any
    nxt: dict[int, int]  # the next offset to process, per partition
    ends: dict[int, int]  # the planned ends
    waiting: set[int]  # partitions whose planned range is not processed yet
    served: set[int]
    per_command: float = FIRST_GUESS_S  # wall time a command takes here, from the chunks so far


def _serve(worker: Worker, sv: _Serving, serve_until: float | None, deadline: float,
           timeout_s: float, stats: SliceStats, stop: Callable[[], bool] | None) -> None:
    """Process the planned ranges, then serve what arrives until ``serve_until`` (or ``stop``)."""
    from cqrs.kafka_io import take

    topic, consumer, nxt, ends, waiting, served = (sv.topic, sv.consumer, sv.nxt, sv.ends,
                                                   sv.waiting, sv.served)
    while True:
        f0 = time.perf_counter()
        limit = CHUNK
        if not waiting and serve_until is not None:
            # serving: take what can be done by the deadline, so the batch's tasks end
            # together (one that ran over would hold up the next batch, the others idle)
            left = serve_until - time.monotonic()
            limit = max(MIN_CHUNK, min(CHUNK, int(left / sv.per_command)))
        got: dict[int, list[tuple[bytes | None, bytes | None, Any, int]]] = {}
        for msg in take(consumer, limit, POLL_S):
            err = msg.error()
            if err is not None:
                raise FetchError(f"reading {topic}[{msg.partition()}]: {err}")
            p, offset = msg.partition(), msg.offset()
            if p in nxt and offset >= nxt[p] and (serve_until is not None or offset < ends[p]):
                got.setdefault(p, []).append((msg.key(), msg.value(), msg.headers(), offset))
        stats.fetch_s += time.perf_counter() - f0
        if got:
            c0 = time.perf_counter()
            stats.add(process_slices(worker, topic, {p: (m, nxt[p]) for p, m in got.items()},
                                     wait=False, serving=served))
            taken = sum(len(m) for m in got.values())
            if taken >= MIN_CHUNK:  # a few commands' time is mostly a chunk's fixed costs
                sv.per_command = (sv.per_command + (time.perf_counter() - c0) / taken) / 2
            for p, messages in got.items():
                nxt[p] = messages[-1][3] + 1
        else:  # nothing came: write what the last slices (and the lanes) decided meanwhile
            w0 = time.perf_counter()
            if worker.lanes:
                stats.add(process_slices(worker, topic, {}, wait=False, serving=served))
            worker.finish_sent()
            stats.write_s += time.perf_counter() - w0
        for p in list(waiting):
            if nxt[p] >= ends[p] or worker._position(topic, p) >= ends[p]:
                waiting.discard(p)  # a gap at its end (e.g. a transaction marker) too
        now = time.monotonic()
        if not waiting and (serve_until is None or now >= serve_until or
                            stop is not None and stop()):
            break
        if waiting and now > deadline:
            raise FetchError(
                f"could not read {topic} offsets {sorted(waiting)} up to "
                f"{ {p: ends[p] for p in waiting} } within {timeout_s:.0f} s: is Kafka at "
                f"{worker.cfg.kafka.bootstrap_servers} reachable and the topic intact?")


def _settle_served(worker: Worker, sv: _Serving, stats: SliceStats) -> None:
    """Write whatever the served partitions' slices and lanes decided, and wait for it."""
    w0 = time.perf_counter()
    if worker.lanes:
        stats.add(process_slices(worker, sv.topic, {}, wait=False, serving=sv.served))
    worker.finish_sent()
    worker.settle()
    stats.write_s += time.perf_counter() - w0


def _positions_reached(worker: Worker, sv: _Serving, start: dict[int, int]) -> dict[int, Position]:
    """Where the served partitions stand: a lane's first held command, else how far the
    task got (only partitions that moved past ``start``)."""
    moved = {}
    for p in sv.served:
        held = worker.lanes.first_held(p) if worker.lanes else None
        if held is not None and held < sv.nxt[p]:  # a lane holds commands from there on
            worker.cache.rewind(worker.part(sv.topic, p), held)
            moved[p] = Position(held, worker.token + HELD_MARK)
        elif sv.nxt[p] > start.get(p, -1):
            moved[p] = Position(sv.nxt[p], worker.token)
    return moved


class Bridge:
    """A serving task's work, going on in a thread of its worker after the task returned, so
    that commands arriving between two micro-batches (Spark commits one, plans the next and
    starts its tasks: 0.15-0.9 s on 2 cores) are not held up by the boundary.

    The task records its partitions' positions *bridged* (:func:`~cqrs.processor.state_table.bridged`:
    its worker may serve past them until the lease ends). The next task of this worker stops
    the bridge first and goes on from where the bridge got, with its cached states
    (:func:`_take_over`); a task of another worker waits until the bridge recorded its final
    positions, or its lease ended (:func:`_wait_for_bridges`). The bridge stops serving
    :data:`BRIDGE_STOP_EARLY_S` before its lease, once the processor is stopping, or when taken
    over; then it writes and waits for what it decided, and records plain positions.
    Overlapping a late bridge is harmless: the state rows' fence makes a second writer of the
    same commands write the same records (see the module doc)."""

    def __init__(self, worker: Worker, sv: _Serving, until: float,
                 stopping: Callable[[], bool] | None) -> None:
        self.worker, self.sv, self.until = worker, sv, until
        self.stopping = stopping
        self.stats = SliceStats()
        self.final: dict[int, Position] = {}  # the positions it recorded at its end
        self.error: BaseException | None = None
        self.taken = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cqrs-bridge", daemon=True)

    def _stop(self) -> bool:
        return self.taken.is_set() or (self.stopping is not None and self.stopping())

    def _run(self) -> None:
        worker, sv = self.worker, self.sv
        try:
            _serve(worker, sv, self.until, float("inf"), 0.0, self.stats, self._stop)
            _settle_served(worker, sv, self.stats)
            self.final = _positions_reached(worker, sv, {})  # every served one: none bridged
            worker.table.write_positions(worker.generation, sv.topic, self.final)
        except BaseException as exc:  # the next task of this worker raises nothing: it starts over
            worker.abandon()
            self.final = {}
            self.error = exc
        finally:
            if self.taken.is_set() and self.error is None:  # the task taking over may go on with it
                worker.assigned = (sv.topic, {p: sv.nxt[p] for p in sv.served})
            else:
                with contextlib.suppress(Exception):
                    sv.consumer.unassign()
            if not self.taken.is_set() and _LATE_COLLECTION.owed:
                _LATE_COLLECTION.owed = False
                _LATE_COLLECTION.start()


def _take_over(worker: Worker, topic: str) -> tuple[SliceStats, dict[int, Position]]:
    """Stop the worker's bridge, if any, and wait for it: what it did (counted with the task
    taking over) and the positions of ``topic`` it recorded (none when it failed: the task
    then trusts no cache of its partitions, which the failure dropped)."""
    bridge, worker.bridge = worker.bridge, None
    if bridge is None:
        return SliceStats(), {}
    bridge.taken.set()
    bridge.thread.join()
    bridge.stats.bridged = bridge.stats.commands
    if bridge.error is not None:
        print(f"cqrs processor: the bridge of {bridge.sv.topic} {sorted(bridge.sv.served)} failed "
              f"({type(bridge.error).__name__}: {bridge.error}); this task starts from the "
              "recorded positions", file=sys.stderr, flush=True)
    return bridge.stats, bridge.final if bridge.sv.topic == topic else {}


def _wait_for_bridges(worker: Worker, topic: str, ranges: dict[int, tuple[int, int]],
                      positions: dict[int, Position]) -> dict[int, Position]:
    """The positions once no partition of ``ranges`` is bridged by another worker (its bridge
    recorded a plain position, or its lease and :data:`LEASE_MARGIN_S` passed)."""
    while True:
        now = time.time()
        leases = {p: until for p in ranges if (pos := positions.get(p)) is not None and
                  (until := pos.lease_until) is not None and pos.owner != worker.token}
        if all(now >= until + LEASE_MARGIN_S for until in leases.values()):
            if leases:  # bridged still: their bridges ended without recording it
                print(f"cqrs processor: {topic} {sorted(leases)}: another worker's bridge recorded no end "
                      f"within its lease + {LEASE_MARGIN_S} s; this task goes on from its last "
                      "recorded positions (what the bridge decided since is decided again, "
                      "with the same records)", file=sys.stderr, flush=True)
            return positions
        time.sleep(LEASE_POLL_S)
        positions = worker.table.positions(worker.generation, topic)


def _run_task(worker: Worker, topic: str, ranges: dict[int, tuple[int, int]],
              serve_until: float | None, timeout_s: float,
              positions: dict[int, Position] | None, stopping: Callable[[], bool] | None,
              carried: tuple[SliceStats, dict[int, Position]]) -> SliceStats:
    from confluent_kafka import TopicPartition

    stats = carried[0]
    started = time.perf_counter()
    if positions is None:
        positions = worker.table.positions(worker.generation, topic)
    waited = time.perf_counter()
    positions = _wait_for_bridges(worker, topic, ranges, {**positions, **carried[1]})
    stats.bridge_wait_s = time.perf_counter() - waited
    start: dict[int, int] = {}
    worker.cache.serving = {worker.part(topic, p) for p in ranges}
    for p, (planned, _) in ranges.items():
        pos = positions.get(p)
        if pos is None or pos.owner != worker.token or worker.cache.next_offset(worker.part(topic, p)) != pos.next_offset:
            worker.cache.drop(worker.part(topic, p))
            worker.lanes.drop_partition(p)  # another worker applied commands since: start over
        # a held position stands at a lane's first command, maybe before Spark's plan
        start[p] = planned if pos is None else pos.next_offset if pos.held else \
            max(planned, pos.next_offset)
    ends = {p: end for p, (_, end) in ranges.items()}
    nxt = dict(start)
    waiting = {p for p in ranges if nxt[p] < ends[p]}
    consumer = worker._consumer()
    if not waiting and serve_until is None:
        if worker.assigned is not None:
            consumer.unassign()
            worker.assigned = None
        return stats
    # the bridge just taken over leaves its consumer assigned where it got: a new assignment
    # would make librdkafka start the partitions' fetches over (commands waited ~0.2 s)
    if worker.assigned != (topic, nxt):
        consumer.assign([TopicPartition(topic, p, nxt[p]) for p in ranges])
    worker.assigned = None
    sv = _Serving(topic, consumer, nxt, ends, waiting, set(ranges))
    stats.fetch_s += time.perf_counter() - started - stats.bridge_wait_s
    bridge_s = worker.cfg.processor.bridge_seconds
    bridging = False
    try:
        _serve(worker, sv, serve_until, time.monotonic() + timeout_s, timeout_s, stats, stopping)
        _settle_served(worker, sv, stats)
        # a bridge defers the task's collection (see _LateCollection). A task that leaves many
        # young objects bridges too, freezing them uncollected: a throughput task that ended
        # before the batch's others kept its worker idle until the next batch (~1-2 s of a
        # core a boundary at a million aggregates). But every RECLAIM_AFTER_DEFERRED such tasks
        # one boundary goes unbridged, so the late collection reclaims what was frozen (a
        # bridge keeps the collector off).
        in_debt = gc.get_count()[0] >= GC_DEBT_OBJECTS
        bridging = (serve_until is not None and bridge_s > 0 and not worker.lanes and
                    not (stopping is not None and stopping()) and
                    (not in_debt or _LATE_COLLECTION.deferred < RECLAIM_AFTER_DEFERRED))
    except BaseException:
        worker.abandon()
        raise
    finally:
        if not bridging:
            consumer.unassign()
    if worker.lanes:
        _report_lanes(worker, sv.served, stats)
    moved = _positions_reached(worker, sv, start)
    if bridging:  # every partition, so that a task of another worker waits for the bridge
        lease = time.time() + bridge_s
        moved = {p: Position(nxt[p], bridged(worker.token, lease)) for p in ranges}
    try:
        if moved:
            worker.table.write_positions(worker.generation, topic, moved)
    except BaseException:
        if bridging:
            consumer.unassign()
        raise
    if bridging:
        # PySpark's daemon collects fully between two tasks of a worker (daemon.py), holding
        # the GIL: over a task's young objects that stalled the bridge 0.1-0.4 s. Collected
        # and frozen here (a few milliseconds for a task that left few, see GC_DEBT_OBJECTS;
        # those of one that left many are frozen uncollected), they leave that collection
        # nothing to walk.
        g0 = time.perf_counter()
        if in_debt:
            _LATE_COLLECTION.defer()
        else:
            gc.collect()
            gc.freeze()
        stats.write_s += time.perf_counter() - g0
        sv.ends, sv.waiting = dict(nxt), set()
        worker.bridge = Bridge(worker, sv, time.monotonic() + bridge_s - BRIDGE_STOP_EARLY_S,
                               stopping)
        worker.bridge.thread.start()
    return stats
