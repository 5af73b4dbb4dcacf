"""One Kafka partition's slice of a micro-batch, processed inside a Spark Python worker.

The Spark job's source (:mod:`cqrs.processor.source`) reads each slice from Kafka in the worker,
in offset order, and hands it here. For a slice:

1. group the commands by aggregate (a partition holds every command of its aggregates);
2. read the state of all the slice's aggregates at once: from this worker's cache when it
   processed the partition's previous commands itself, else from the state table (``IN``
   reads); commands at or below an aggregate's ``applied_offset`` were applied already (a
   re-run batch) and are skipped;
3. run the shared :class:`~cqrs.processor.step.AggregateStep` per aggregate;
4. write events, results and dead letters to Kafka and wait until every one is acknowledged;
5. only then write the new state rows (``USING TIMESTAMP`` their command count, so a stale
   writer cannot win), then remember them in the cache.

Because state is written after the records it explains, a crash anywhere re-runs the slice
from the old state and rewrites byte-identical records (Kafka may hold a record twice, never
a different one), or finds the state written and skips what it covers. Nothing reads a clock.
"""

from __future__ import annotations

import collections
import datetime as _dt
import gc
import time
from collections.abc import Sequence
from typing import Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.envelope import CONTENT_TYPE, MAX_AGGREGATE_ID_BYTES, Envelope, read_command
from cqrs.errors import CqrsError
from cqrs.processor.state_table import StateTable, StoredAggregate
from cqrs.processor.step import (
    RESULT_STATUS_HEADER, UNDECODED, AggregateStep, InputRecord, OutputRecord,
)
from cqrs.results import AggregateRecord

__all__ = [
    "STATS_FIELDS",
    "FetchError",
    "ProduceError",
    "SliceStats",
    "StateCache",
    "Worker",
    "process_slice",
    "read_envelope",
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
    state_reads: int = 0
    fetch_s: float = 0.0  # reading the slice from Kafka (set by the caller that fetched it)
    read_s: float = 0.0
    step_s: float = 0.0
    produce_s: float = 0.0
    write_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the worker for the slice (the phases above are wall time)

    def add(self, other: SliceStats) -> None:
        for f in attrs.fields(SliceStats):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


STATS_FIELDS = tuple(f.name for f in attrs.fields(SliceStats))


@attrs.define
class _Cached:
    stored: StoredAggregate
    record: AggregateRecord
    decoded: Any  # the aggregate object, or UNDECODED


class StateCache:
    """The states a worker wrote, per commands-topic partition, valid for a slice only when the
    slice starts where the worker's last slice of that partition ended (nobody else can have
    applied commands of the partition in between). Bounded: least recently used go first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._parts: dict[Any, tuple[int, collections.OrderedDict[tuple[str, str], _Cached]]] = {}

    def take(self, part: Any, first_offset: int) -> collections.OrderedDict[tuple[str, str], _Cached]:
        """The partition's cached states if valid for a slice starting at ``first_offset``;
        else an empty cache (the stale one is dropped)."""
        found = self._parts.pop(part, None)
        if found is not None and found[0] == first_offset:
            return found[1]
        return collections.OrderedDict()

    def put(self, part: Any, next_offset: int,
            entries: collections.OrderedDict[tuple[str, str], _Cached]) -> None:
        if self.capacity <= 0:
            return
        total = sum(len(e) for _, e in self._parts.values()) + len(entries)
        while total > self.capacity and entries:
            entries.popitem(last=False)
            total -= 1
        while total > self.capacity and self._parts:
            _, (_, other) = self._parts.popitem()
            total -= len(other)
        self._parts[part] = (next_offset, entries)

    def drop(self, part: Any) -> None:
        self._parts.pop(part, None)


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
    """What a Python worker builds once per processor: the app's step, its Kafka producer, the
    state table and the state cache."""

    def __init__(self, cfg: CqrsConfig, step: AggregateStep, table: StateTable, generation: int,
                 producer: Any) -> None:
        self.cfg = cfg
        self.step = step
        self.table = table
        self.generation = generation
        self.producer = producer
        self.cache = StateCache(cfg.processor.state_cache_aggregates)
        self.consumer: Any = None
        self.errors: list[str] = []

    def fetch(self, topic: str, ranges: dict[int, tuple[int, int]], timeout_s: float = 120.0,
              ) -> dict[int, list[tuple[bytes | None, bytes | None, Any, int]]]:
        """The records of ``topic`` at ``{partition: (start, end)}`` offsets (end exclusive), per
        partition as (key, value, headers, offset) in offset order: one consumer (librdkafka,
        no group) assigned to every range at once."""
        from confluent_kafka import TopicPartition

        if self.consumer is None:
            from cqrs.kafka_io import make_consumer

            self.consumer = make_consumer(self.cfg, **{"fetch.wait.max.ms": 10,
                                                      "enable.partition.eof": False})
        consumer = self.consumer
        out: dict[int, list[tuple[bytes | None, bytes | None, Any, int]]] = {p: [] for p in ranges}
        waiting = {p: r for p, r in ranges.items() if r[1] > r[0]}
        if not waiting:
            return out
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in waiting.items()])
        deadline = time.monotonic() + timeout_s
        try:
            while waiting:
                left = sum(end - start - len(out[p]) for p, (start, end) in waiting.items())
                for msg in consumer.consume(max(1, min(left, 100_000)), 0.5):
                    err = msg.error()
                    if err is not None:
                        raise FetchError(f"reading {topic}[{msg.partition()}]: {err}")
                    p, offset = msg.partition(), msg.offset()
                    if p in waiting and offset < waiting[p][1]:
                        out[p].append((msg.key(), msg.value(), msg.headers(), offset))
                for p in [p for p, (_, end) in waiting.items()
                          if (out[p] and out[p][-1][3] >= end - 1) or self._position(topic, p) >= end]:
                    del waiting[p]  # complete (a gap at its end, e.g. a transaction marker, too)
                if waiting and time.monotonic() > deadline:
                    raise FetchError(
                        f"could not read {topic} offsets {waiting} within {timeout_s:.0f} s: is "
                        f"Kafka at {self.cfg.kafka.bootstrap_servers} reachable and the topic intact?")
        finally:
            consumer.unassign()
        return out

    def _position(self, topic: str, partition: int) -> int:
        from confluent_kafka import TopicPartition

        return int(self.consumer.position([TopicPartition(topic, partition)])[0].offset)

    def on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def produce(self, records: Sequence[OutputRecord]) -> None:
        """Write ``records`` in order and wait until Kafka acknowledged every one."""
        produce, poll = self.producer.produce, self.producer.poll
        for rec in records:
            while True:
                try:
                    if rec.partition is None:
                        produce(rec.topic, rec.value, rec.key, headers=rec.headers)
                    else:
                        produce(rec.topic, rec.value, rec.key, rec.partition, headers=rec.headers)
                    break
                except BufferError:  # the local queue is full: let librdkafka send some
                    poll(0.05)
        left = self.producer.flush(120)
        if left or self.errors:
            errors, self.errors = self.errors[:5], []
            raise ProduceError(
                f"Kafka did not acknowledge {left} of {len(records)} records"
                + (f" ({'; '.join(errors)})" if errors else "")
                + f" within 120 s: is {self.cfg.kafka.bootstrap_servers} reachable? The batch "
                "is retried and rewrites the same records")


def _count(stats: SliceStats, out: Sequence[OutputRecord], events: str, results: str,
           dead_letters: str) -> None:
    by_topic = collections.Counter(r.topic for r in out)
    stats.events, stats.dead_letters = by_topic[events], by_topic[dead_letters]
    if by_topic[results]:
        statuses = collections.Counter(r.headers[RESULT_STATUS_HEADER][1] for r in out
                                       if r.topic == results)
        stats.accepted, stats.rejected, stats.failed = (
            statuses[b"accepted"], statuses[b"rejected"], statuses[b"failed"])


def process_slice(worker: Worker, topic: str, partition: int,
                  messages: Sequence[tuple[bytes | None, bytes | None, Any, int]]) -> SliceStats:
    """Process one Kafka partition's slice of a micro-batch: ``messages`` are its records as
    (key, value, headers, offset), in offset order."""
    stats = SliceStats(commands=len(messages))
    if not messages:
        return stats
    cpu_started = time.process_time()
    # a slice allocates tens of objects per command; the collector's passes over them (and over
    # the cached states) cost ~15 % of the slice, and nothing here makes reference cycles
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _process(worker, topic, partition, messages, stats, cpu_started)
    finally:
        if collecting:
            gc.enable()


def _process(worker: Worker, topic: str, partition: int,
             messages: Sequence[tuple[bytes | None, bytes | None, Any, int]], stats: SliceStats,
             cpu_started: float) -> SliceStats:
    # 1. group by aggregate, in offset order
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

    first_offset, next_offset = messages[0][3], messages[-1][3] + 1
    part = (worker.table.app_name, worker.generation, topic, partition)
    cache = worker.cache.take(part, first_offset)

    # 2. state of every aggregate of the slice: cache, else the table
    t0 = time.perf_counter()
    wanted = [k for k in groups if k[1] is not None and k not in cache]
    stats.cache_hits = len(groups) - len(wanted) - (1 if (None, None) in groups else 0)
    stored: dict[tuple[str, str], StoredAggregate] = {}
    if wanted:
        stored = worker.table.read(worker.generation, sorted({k[1] for k in wanted}))
        stats.state_reads = len(wanted)
    t1 = time.perf_counter()
    stats.read_s = t1 - t0

    # 3. the step, per aggregate
    step = worker.step
    out: list[OutputRecord] = []
    rows: list[StoredAggregate] = []
    for (agg_type, agg_id), records in groups.items():
        if agg_id is None or agg_type is None:
            out.extend(step.apply(None, None, None, records).out)
            continue
        stats.aggregates += 1
        hit = cache.get((agg_type, agg_id))
        if hit is not None:
            row, record, decoded = hit.stored, hit.record, hit.decoded
        else:
            row = stored.get((agg_type, agg_id))
            record = None if row is None else step.load_state(row.record)
            decoded = UNDECODED
        if row is not None:
            fresh = [r for r in records
                     if r.partition != row.source_partition or r.offset > row.applied_offset]
            stats.skipped += len(records) - len(fresh)
            records = fresh
            if not records:
                continue
        result = step.apply(agg_type, agg_id, record, records, decoded)
        out.extend(result.out)
        if result.record is None:
            continue
        last = records[-1]
        new_row = StoredAggregate(
            agg_id, agg_type, result.record.version, result.record.deleted,
            step.dump_state(result.record), last.partition, last.offset,
            (row.commands if row is not None else 0) + len(records))
        rows.append(new_row)
        cache[(agg_type, agg_id)] = _Cached(new_row, result.record, result.state)
        cache.move_to_end((agg_type, agg_id))
    t2 = time.perf_counter()
    stats.step_s = t2 - t1
    stats.records = len(out)
    _count(stats, out, step.topics.events, step.topics.results, step.topics.dead_letters)

    # 4. records first, 5. then the state they explain
    try:
        worker.produce(out)
        t3 = time.perf_counter()
        stats.produce_s = t3 - t2
        worker.table.write(worker.generation, rows)
        stats.write_s = time.perf_counter() - t3
    except Exception:
        worker.cache.drop(part)
        raise
    worker.cache.put(part, next_offset, cache)
    stats.cpu_s = time.process_time() - cpu_started
    return stats
