"""A process manager's job: it serves the app's events topic as the processor serves its
commands, reacting to each event within milliseconds of its write.

One thread reads every partition of the events topic with librdkafka and, for each chunk of
records it gets (whatever arrived, up to ``max_events_per_chunk``), runs the
:class:`~cqrs.process.reactor.Reactor` on the events of the process manager's types, in log
order, then:

1. writes the commands (to the commands topic, derived ids), the conversation outcomes and
   the dead letters of failed reactions, and waits until Kafka acknowledged every one;
2. only then writes the changed instances (stateful process managers);
3. then records how far it got: the offsets are committed to Kafka under the process
   manager's consumer group (``cqrs-pm-<topic prefix><app>-<name>``, so Kafka's tools show its
   lag too).

A crash anywhere (SIGKILL included) restarts from the last committed offsets: the same
commands again, with the same ids, which the processor recognises (per process manager and
source aggregate, forever), and instances that skip the events they applied. One thread reacts
for a process manager, so an instance is never written by two tasks at once.

Why not a Spark query: the reactions always ran in the driver (a micro-batch's events were
collected there); Spark added the Kafka read and an offset checkpoint at the cost of a
micro-batch, 1-5 s on a busy machine, on every hop of a conversation. The handle this module
returns behaves as a streaming query where the runners need one (``cqrs run app`` supervises
it with the Spark queries, ``cqrs run process-manager`` serves it alone, without Spark).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from cqrs.budget import BudgetedThread, Watch
from cqrs.config import CqrsConfig
from cqrs.envelope import Headers, from_kafka, to_kafka
from cqrs.errors import CqrsError
from cqrs.loops import LoopQuery
from cqrs.process.reactor import Reactor, ReactorOutput, SourceEvent, process_manager_of
from cqrs.processor.step import DLQ_PREFIX
from cqrs.topics import AppTopics, ensure_topics, topics_for

if TYPE_CHECKING:
    from cqrs.app import App

__all__ = ["BatchReport", "ProcessManagerOptions", "ProcessManagerQuery", "ReactorRun",
           "checkpoint_for", "group_id_for", "start_process_manager"]


class DeliveryError(CqrsError, RuntimeError):
    """Kafka did not acknowledge a chunk's commands (the job fails; its restart reacts again)."""


class FetchError(CqrsError, RuntimeError):
    """The events topic could not be read."""


@attrs.frozen
class ProcessManagerOptions:
    app_ref: str  # "module:attribute" of the App
    name: str  # the process manager's name
    # the Spark checkpoint of releases before 0.2, whose offsets a first start takes over
    # (default: <checkpoint_dir>/<app>/process-managers/<name>)
    checkpoint: str | None = None
    max_events_per_chunk: int = 10_000  # records reacted to at once at most
    replay: bool = False  # react to the whole log again, from its start
    topics: AppTopics | None = None  # default: topics_for(app.name, kafka.topic_prefix)


@attrs.frozen
class BatchReport:
    events: int  # events read (the process manager's types only)
    reacted: int
    skipped: int  # applied by their instance before
    commands: int
    outcomes: int
    failures: int
    seconds: float
    cpu_s: float = 0.0  # CPU time of the reacting thread (librdkafka's own threads not counted)


def checkpoint_for(cfg: CqrsConfig, app_name: str, name: str) -> str:
    """Where releases before 0.2 kept a process manager's Spark checkpoint."""
    return cfg.spark.checkpoint_location(app_name, "process-managers", name)


def group_id_for(topics: AppTopics, name: str) -> str:
    """The Kafka consumer group a process manager commits its offsets under."""
    return f"cqrs-pm-{topics.base}-{name}"


_TYPE_HEADER = "cqrs.message_type"


def _wanted(headers: Headers | None, wanted: frozenset[bytes]) -> bool:
    """Whether a record's type header names a wanted type (records without one are read the
    slow way, and dead-lettered when unreadable)."""
    for k, v in headers or ():
        if k == _TYPE_HEADER:
            return v in wanted
    return True


class ReactorRun:
    """What a process manager keeps while it runs: the reactor, the codec bound to the schema
    store, the producer and the instance table. :meth:`run` reacts to a chunk of event records
    (the serving loop's, or a test's list)."""

    def __init__(self, cfg: CqrsConfig, app: App, name: str, topics: AppTopics) -> None:
        from cqrs.codec.kafka_schema_store import KafkaSchemaStore
        from cqrs.kafka_io import make_producer
        from cqrs.personal.stack import key_store_for

        self.cfg = cfg
        self.app = app
        self.topics = topics
        key_store = key_store_for(cfg, app)
        self._schemas = KafkaSchemaStore(cfg.kafka.bootstrap_servers, topics.schemas,
                                         cfg.kafka.client_options())
        self.codec = app.codec_for(self._schemas, key_store=key_store)
        self.reactor = Reactor(app, process_manager_of(app, name), self.codec,
                               cfg.kafka.max_record_bytes())
        self.producer = make_producer(cfg)
        self.wanted = frozenset(self.reactor.event_types)
        self._reacting = BudgetedThread(f"cqrs-reacting-{name}")
        self.wanted_headers = frozenset(t.encode() for t in self.wanted)
        self.table: Any = None
        self._deadlines: Any = None
        if self.reactor.stateful:
            from cqrs.process.instances import open_instance_table

            self.table = open_instance_table(cfg, self.codec, topics, name)

    def run(self, records: list[tuple[bytes | None, bytes | None, Headers, int, int]]) -> BatchReport:
        """React to a chunk of event records ``(key, value, headers, partition, offset)``: the
        commands, outcomes and dead letters are acknowledged by Kafka, then the instances
        written, before this returns. Records of other event types are passed over."""
        started, cpu_started = time.monotonic(), time.thread_time()
        records.sort(key=lambda r: (r[3], r[4]))
        sources: list[SourceEvent] = []
        unreadable: list[tuple[tuple[Any, ...], Exception]] = []
        wanted = self.wanted
        for rec in records:
            key, value, headers, partition, offset = rec
            if not _wanted(headers, self.wanted_headers):
                continue
            try:
                env, payload = from_kafka(key, value, headers)
                if env.message_type not in wanted:
                    continue
                sources.append(SourceEvent(env, self.codec.decode(payload), payload, partition, offset))
            except CqrsError as exc:
                unreadable.append((rec, exc))
        instances = self.table.read(self.reactor.keys(sources)) if self.table is not None else {}
        out = self._react(sources, instances)
        self._deliver(out, unreadable)
        if out.stored_deadlines:  # after the commands, before the instances (a re-run writes them again)
            self.deadlines().apply(out.stored_deadlines)
        if self.table is not None:
            self.table.write(out.instances)
        return BatchReport(len(sources), out.reacted, out.skipped, len(out.commands),
                           len(out.outcomes), len(out.failures) + len(unreadable),
                           time.monotonic() - started, time.thread_time() - cpu_started)

    def _react(self, sources: list[SourceEvent], instances: Mapping[str, Any]) -> ReactorOutput:
        """The reactor's run, in the reacting thread under the decision budget: a reaction
        past it fails (its event dead-lettered) and the chunk is reacted to again without it."""
        budget = self.cfg.processor.decision_budget_s
        if budget <= 0 or not sources:
            return self.reactor.run(sources, instances)
        timed_out: dict[int, float] = {}
        while True:
            watch = Watch()
            done, value = self._reacting.call(
                lambda w=watch: self.reactor.run(sources, instances, watch=w, timed_out=timed_out),
                watch, budget)
            if done:
                return value  # type: ignore[no-any-return]
            timed_out[next(n for n, src in enumerate(sources) if src is value)] = budget

    def deadlines(self) -> Any:
        """The app's deadline tables (opened when a reaction first schedules or cancels one)."""
        if self._deadlines is None:
            from cqrs.scheduler.store import open_deadline_store

            self._deadlines = open_deadline_store(self.cfg, self.topics.base)
        return self._deadlines

    def _deliver(self, out: ReactorOutput, unreadable: list[tuple[tuple[Any, ...], Exception]]) -> None:
        produce = self.producer.produce
        for c in out.commands:  # command records carry their envelope in the value
            produce(self.topics.commands, key=c.key, value=c.value)
        for o in out.outcomes:
            produce(self.topics.outcomes, key=o.correlation_id.encode(), value=self.codec.encode(o))
        name = self.reactor.pm.name
        for f in out.failures:
            src = f.source
            self._dead_letter(src.envelope.aggregate_id.encode(), None, src.partition, src.offset,
                              f.error_type, f"{name}: {f.message}", src)
        for rec, exc in unreadable:
            self._dead_letter(rec[0], rec[1], rec[3], rec[4], type(exc).__name__,
                              f"{name}: {exc}", None, rec[2])
        left = self.producer.flush(60)
        if left:
            raise DeliveryError(
                f"process manager {name!r}: Kafka did not acknowledge {left} records in 60 s "
                f"(is it reachable at {self.cfg.kafka.bootstrap_servers}?); the events are "
                "reacted to again when it restarts")

    def _dead_letter(self, key: bytes | None, value: bytes | None, partition: int, offset: int,
                     error_type: str, message: str, src: SourceEvent | None,
                     headers: Headers | None = None) -> None:
        if src is not None:
            key, value, headers = to_kafka(src.envelope, src.payload)
        dlq: Headers = [(k, v if v is not None else b"") for k, v in (headers or [])]
        dlq += [(f"{DLQ_PREFIX}stage", b"process_manager"),
                (f"{DLQ_PREFIX}error_type", error_type.encode()),
                (f"{DLQ_PREFIX}error", message.encode(errors="replace")[:4000]),
                (f"{DLQ_PREFIX}topic", self.topics.events.encode()),
                (f"{DLQ_PREFIX}partition", str(partition).encode()),
                (f"{DLQ_PREFIX}offset", str(offset).encode())]
        self.producer.produce(self.topics.dead_letters, key=key, value=value, headers=dlq)

    def close(self) -> None:
        self._reacting.close()
        self.producer.flush(30)
        close = getattr(self.producer, "close", None)  # newer confluent-kafka clients; older ones free it with the object
        if close is not None:
            close()
        self._schemas.close()
        if self.table is not None:
            self.table.close()
        if self._deadlines is not None:
            self._deadlines.close()



CHUNK_POLL_S = 0.1  # how long the loop waits for a record before it looks at the clock
PROGRESS_S = 1.0  # a progress report at most this often while events come
IDLE_PROGRESS_S = 10.0  # and this often when none do
PARTITIONS_CHECK_S = 30.0  # how often the events topic is asked whether it has new partitions


def _checkpoint_offsets(checkpoint: str | None, topic: str) -> dict[int, int]:
    """The offsets of the last committed micro-batch of a local Spark checkpoint of an earlier
    release (``offsets/N``, its last line ``{topic: {partition: offset}}``), else nothing."""
    if not checkpoint or ("://" in checkpoint and not checkpoint.startswith("file:")):
        return {}
    root = Path(checkpoint.removeprefix("file:"))
    commits = [int(p.name) for p in (root / "commits").glob("*") if p.name.isdigit()]
    if not commits:
        return {}
    try:
        last = (root / "offsets" / str(max(commits))).read_text().strip().splitlines()[-1]
        found = json.loads(last).get(topic, {})
        return {int(p): int(o) for p, o in found.items()}
    except (OSError, ValueError, AttributeError):
        return {}


class ProcessManagerQuery(LoopQuery):
    """A running process manager (see :class:`~cqrs.loops.LoopQuery` for its query face), with
    :meth:`positions` and :meth:`processAllAvailable`."""

    def __init__(self, cfg: CqrsConfig, app: App, opts: ProcessManagerOptions, topics: AppTopics, *,
                 available_now: bool,
                 on_batch: Callable[[int, BatchReport], None] | None,
                 on_progress: Callable[[str, Mapping[str, Any]], None] | None) -> None:
        super().__init__(f"cqrs-process-manager-{app.name}-{opts.name}", on_progress)
        self.cfg = cfg
        self.app = app
        self.opts = opts
        self.topics = topics
        self.group_id = group_id_for(topics, opts.name)
        self._available_now = available_now
        self._on_batch = on_batch
        self._positions: dict[int, int] = {}  # next offset to read, per partition
        self._lock = threading.Lock()
        self._chunks = 0

    def positions(self) -> dict[int, int]:
        """The next offset to read of each events partition (what it reacted to so far)."""
        with self._lock:
            return dict(self._positions)

    def processAllAvailable(self, timeout: float = 600.0) -> None:  # noqa: N802
        """Wait until everything the events topic holds now is reacted to."""
        from cqrs.kafka_io import watermarks

        self._started.wait(timeout)
        target = {p: high for p, (_, high) in watermarks(self.cfg, self.topics.events).items()}
        deadline = time.monotonic() + timeout
        while True:
            if self._error is not None:
                raise self._error
            pos = self.positions()
            if all(pos.get(p, 0) >= high for p, high in target.items() if high > 0):
                return
            if not self.isActive or time.monotonic() > deadline:
                raise FetchError(f"{self.name} stopped or fell behind before reaching {target} "
                                 f"(at {pos})")
            time.sleep(0.02)

    # ---- the loop ---------------------------------------------------------------------------

    def _start_offsets(self, consumer: Any, partitions: Sequence[int]) -> dict[int, int]:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        topic = self.topics.events
        if self.opts.replay:
            return dict.fromkeys(partitions, OFFSET_BEGINNING)
        committed = {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(topic, p) for p in partitions], timeout=30)}
        if all(o < 0 for o in committed.values()):  # never committed: an older release's?
            old = _checkpoint_offsets(
                self.opts.checkpoint or checkpoint_for(self.cfg, self.app.name, self.opts.name), topic)
            committed.update({p: o for p, o in old.items() if p in committed})
        return {p: (o if o >= 0 else OFFSET_BEGINNING) for p, o in committed.items()}

    def _open_run(self) -> Any:
        """What handles a chunk of records (``run(records) -> BatchReport`` and ``close()``)."""
        return ReactorRun(self.cfg, self.app, self.opts.name, self.topics)

    def _record(self, m: Any) -> tuple[Any, ...]:
        """The tuple :meth:`_open_run`'s ``run`` takes for one consumed message."""
        return (m.key(), m.value(), m.headers() or [], m.partition(), m.offset())

    def _serve(self) -> None:
        from confluent_kafka import TopicPartition

        from cqrs.kafka_io import make_consumer, take, watermarks

        topic = self.topics.events
        run = self._open_run()
        consumer = make_consumer(self.cfg, self.group_id, **{
            "fetch.wait.max.ms": 100, "enable.partition.eof": False})
        try:
            marks = watermarks(self.cfg, topic)
            start = self._start_offsets(consumer, sorted(marks))
            consumer.assign([TopicPartition(topic, p, o) for p, o in start.items()])
            with self._lock:
                self._positions = {p: max(o, marks[p][0]) for p, o in start.items()}
            target = ({p: high for p, (_, high) in marks.items()} if self._available_now else None)
            self._ready()
            last = self._loop(run, consumer, target, take)
            self._commit(consumer, asynchronous=False)
            if last.records:
                self._progress(last, time.monotonic())
        finally:
            consumer.close()
            run.close()

    def _loop(self, run: Any, consumer: Any, target: dict[int, int] | None,
              take: Callable[..., list[Any]]) -> _Period:
        """React until stopped (or, with ``target``, until it is reached); returns what was done
        since the last progress report."""
        from confluent_kafka import KafkaError

        topic = self.topics.events
        period = _Period()
        checked = time.monotonic()
        while not self._stop.is_set():
            if target is not None and all(self._positions.get(p, 0) >= high
                                          for p, high in target.items()):
                return period
            msgs = take(consumer, self.opts.max_events_per_chunk, CHUNK_POLL_S)
            if msgs:
                records: list[tuple[Any, ...]] = []
                moved: dict[int, int] = {}
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001
                            continue
                        raise FetchError(f"reading {topic}[{m.partition()}]: {err}")
                    p, offset = m.partition(), m.offset()
                    if target is not None and offset >= target.get(p, 0):
                        continue  # --available-now: what came after the start waits
                    moved[p] = offset + 1
                    records.append(self._record(m))
                report = run.run(records) if records else None
                with self._lock:
                    self._positions.update(moved)
                self._commit(consumer, asynchronous=True)
                period.add(len(msgs), report)
                if report is not None and report.events:
                    self._chunks += 1
                    if self._on_batch is not None:
                        self._on_batch(self._chunks, report)
            elif target is not None:  # a gap at a partition's end (a transaction marker) too
                self._positions_from(consumer, target)
            now = time.monotonic()
            if now - period.started >= (PROGRESS_S if period.records else IDLE_PROGRESS_S):
                self._progress(period, now)
                period = _Period()
            if now - checked > PARTITIONS_CHECK_S:
                checked = now
                self._follow_new_partitions(consumer)
        return period

    def _positions_from(self, consumer: Any, target: dict[int, int]) -> None:
        """Positions as the consumer has them, up to ``target`` (records past it were not
        reacted to, so they must not be committed)."""
        from confluent_kafka import TopicPartition

        with self._lock:
            asked = [TopicPartition(self.topics.events, p) for p in self._positions]
        for tp in consumer.position(asked):
            if tp.offset >= 0:
                with self._lock:
                    p = tp.partition
                    self._positions[p] = max(self._positions.get(p, 0),
                                             min(tp.offset, target.get(p, 0)))

    def _follow_new_partitions(self, consumer: Any) -> None:
        """Read partitions added to the events topic since the start, from their beginning."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        from cqrs.kafka_io import watermarks

        marks = watermarks(self.cfg, self.topics.events)
        new = [p for p in marks if p not in self._positions]
        if new:
            consumer.incremental_assign([TopicPartition(self.topics.events, p, OFFSET_BEGINNING)
                                         for p in new])
            with self._lock:
                self._positions.update({p: marks[p][0] for p in new})

    def _commit(self, consumer: Any, asynchronous: bool) -> None:
        from confluent_kafka import TopicPartition

        with self._lock:
            offsets = [TopicPartition(self.topics.events, p, o) for p, o in self._positions.items()
                       if o >= 0]
        if offsets:
            consumer.commit(offsets=offsets, asynchronous=asynchronous)

    def _progress(self, period: _Period, now: float) -> None:
        self._report_period(period, now, period.events, reactions=period.reacted,
                            commands=period.commands, outcomes=period.outcomes,
                            failures=period.failures, cpuSeconds=period.cpu_s)

    def _report_period(self, period: Any, now: float, rows: int, **extra: Any) -> None:
        """A progress report shaped as Spark's (rows read, rates, time, the positions as the
        source's end offsets), with a job's own figures (``extra``)."""
        elapsed = max(now - period.started, 1e-6)
        busy = max(period.busy_s, 1e-6)
        self._report({
            "batchId": self._chunks, "numInputRows": rows,
            "inputRowsPerSecond": rows / elapsed,
            "processedRowsPerSecond": period.events / busy if period.events else 0.0,
            "durationMs": {"triggerExecution": period.busy_s * 1000.0},
            "sources": [{"description": f"events topic {self.topics.events}",
                         "endOffset": {self.topics.events: {str(p): o for p, o in
                                                            self.positions().items()}}}],
            **extra,
        })


@attrs.define
class _Period:
    """What the loop did since its last progress report."""

    started: float = attrs.field(factory=time.monotonic)
    records: int = 0
    events: int = 0
    reacted: int = 0
    commands: int = 0
    outcomes: int = 0
    failures: int = 0
    busy_s: float = 0.0
    cpu_s: float = 0.0

    def add(self, records: int, report: BatchReport | None) -> None:
        self.records += records
        if report is not None:
            self.events += report.events
            self.reacted += report.reacted
            self.commands += report.commands
            self.outcomes += report.outcomes
            self.failures += report.failures
            self.busy_s += report.seconds
            self.cpu_s += report.cpu_s


def start_process_manager(cfg: CqrsConfig, opts: ProcessManagerOptions, *,
                          available_now: bool = False,
                          on_batch: Callable[[int, BatchReport], None] | None = None,
                          on_progress: Callable[[str, Mapping[str, Any]], None] | None = None,
                          ) -> ProcessManagerQuery:
    """Start one process manager serving the app's events topic (see the module doc).

    ``available_now``: react to what the topic holds now, then stop. ``on_batch`` is called
    after each chunk that held events of the process manager's types, ``on_progress`` (with the
    handle's id and a progress record shaped as Spark's) once a second while events come and
    every ten seconds when none do."""
    from cqrs.loading import load_app
    from cqrs.processor.job import publish_app_schemas

    app = load_app(opts.app_ref)
    process_manager_of(app, opts.name)  # a clear error before anything starts
    topics = opts.topics or topics_for(app.name, cfg.kafka.topic_prefix)
    ensure_topics(cfg, topics)
    publish_app_schemas(cfg, topics, app)
    query = ProcessManagerQuery(cfg, app, opts, topics, available_now=available_now,
                                on_batch=on_batch, on_progress=on_progress)
    query.start()
    return query
