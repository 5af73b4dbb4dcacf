"""The whole app in one process: commands, process managers, deadlines, retries and read models,
driven by the very modules the real jobs call, on in-memory topics and a virtual clock.

>>> runner = LocalRunner(app)
>>> started = runner.send_and_wait("book-1", RequestLoan("ann"))
>>> outcome, event = runner.wait_conversation(started.command_id)
>>> runner.advance(timedelta(minutes=15))          # deadlines and retries due by then fire

What runs, and with what:

- **commands** are encoded by the client's :func:`~cqrs.client.encode_command` (the Avro codec,
  so a schema problem shows here first) and routed to a partition of an in-memory commands
  topic by the key's murmur2 hash, as Kafka's clients route them;
- the **processor** is :class:`~cqrs.processor.step.AggregateStep`, per aggregate, in offset
  order, with its dedup, expected versions, dead letters and the output limits;
- **process managers** are :class:`~cqrs.process.reactor.Reactor` over the events, with their
  instances in memory (derived command ids, correlation and causation, conversation outcomes);
- **deadlines** are what the step and the reactor decide (:mod:`cqrs.scheduler.records`), kept
  by :class:`~cqrs.testing.deadlines.PendingDeadlines` and fired from the stored command record
  when the clock passes them;
- **retries** follow the app's :class:`~cqrs.retries.RetryPolicy` through the retry job's own
  plan (:mod:`cqrs.retrier.plan`): a transient failure's dead letter is delivered again when
  its backoff is over on the virtual clock, then parked;
- **read models** are the projections' own code into a SQLite store when the runner is given
  ``read_models=projections.LocalReadModels(app)`` (the core does not import ``projections``:
  anything with ``apply(records)`` taking the events topic's records will do).

Time moves only when the test says so (:meth:`advance`); nothing sleeps. Which partition or
job goes next is drawn from ``random.Random(seed)``, and the command ids :meth:`send` makes up
come from the seed too, so a run is reproducible, ids and interleaving alike; the default seed
is 0.
"""

from __future__ import annotations

import datetime as _dt
import random
from collections.abc import Sequence
from typing import Any

import attrs

from cqrs.app import App
from cqrs.client.encoding import encode_command
from cqrs.collector import paused
from cqrs.deadletters import DeadLetter, parse_dead_letter
from cqrs.envelope import from_kafka
from cqrs.history import HistoryReader, MemoryHistoryTable, rows_from_records
from cqrs.kafka_io import KafkaRecord, murmur2_partition
from cqrs.process.reactor import Instance, Reactor, SourceEvent
from cqrs.processor.partition import group_by_aggregate, key_changed, state_key_id
from cqrs.processor.step import UNDECODED, AggregateStep, DedupPolicy, OutputRecord
from cqrs.results import AggregateRecord, CommandResult, ConversationOutcome
from cqrs.retrier.plan import WAITING, classify, due_ms, redelivery
from cqrs.testing.deadlines import PendingDeadlines, advance_clock, aware
from cqrs.topics import topics_for

__all__ = ["LocalRunner", "RunnerError", "uuid4_text"]

DEFAULT_START = _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)
MAX_STEPS = 1_000_000  # records a run() handles at most before it calls it a loop


class RunnerError(AssertionError):
    """The in-process app could not do what the test asked (an answer that never came, a loop)."""


def uuid4_text(bits: int) -> str:
    """``str(uuid.UUID(int=bits, version=4))`` for 128 random ``bits``, without the UUID object
    (its ``__init__`` and ``__str__`` cost ~1.5 us a command)."""
    bits = bits & _NOT_VERSION_BITS | _VERSION_4_BITS
    h = f"{bits:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# the variant bits (10) and the version nibble (4) of a random UUID, as uuid.UUID(version=4)
_NOT_VERSION_BITS = ~((0xC000 << 48) | (0xF000 << 64)) & ((1 << 128) - 1)
_VERSION_4_BITS = (0x8000 << 48) | (4 << 76)

_Record = tuple[bytes, bytes, tuple[tuple[str, bytes], ...], int]  # key, value, headers, offset


@attrs.frozen
class _Retry:
    due_ms: int
    letter: DeadLetter


class LocalRunner:
    """An app with its processor, process managers, scheduler, retry job and projectors, in
    this process (see the module doc)."""

    def __init__(self, app: App, *, partitions: int = 4, start: _dt.datetime = DEFAULT_START,
                 seed: int = 0, dedup: DedupPolicy = DedupPolicy(), read_models: Any = None) -> None:
        self.app = app
        self.codec = app.codec
        self.topics = topics_for(app.name)
        self.partitions = partitions
        self.clock = aware(start)
        self._clock_at: _dt.datetime | None = None  # the clock _clock_ms was worked out for
        self._clock_ms = 0
        self.random = random.Random(seed)
        self._ids = random.Random(f"command ids {seed}")  # ids reproducible too, from the seed
        self.step = AggregateStep(app, self.codec, self.topics, dedup,
                                  results_partitions=partitions)
        self.reactors = [Reactor(app, pm) for pm in app.process_managers]
        self._commands: list[list[_Record]] = [[] for _ in range(partitions)]
        self._next_offset = [0] * partitions
        self._applied = [0] * partitions  # next offset the processor takes, per partition
        self._waiting = 0  # commands on the topic the processor has not taken yet
        self._states: dict[tuple[str, str], AggregateRecord] = {}
        # the aggregate objects the step gave back, as the serving task caches them (saves a
        # decode of the snapshot per command; the step never mutates them)
        self._objects: dict[tuple[str, str], Any] = {}
        # for an app with personal fields: the key each object's subject had when it was decided
        # (an object whose subject was forgotten since is decoded again, as the worker does)
        self._key_ids: dict[tuple[str, str], bytes | None] = {}
        self._partition_of: dict[bytes, int] = {}  # key: partition (murmur2 costs ~2 us)
        self._instances: dict[str, dict[str, Instance]] = {r.pm.name: {} for r in self.reactors}
        self._events: list[_Record] = []
        self._event_times: list[int] = []  # when each event was written, ms (the virtual clock)
        self._reacted = {r.pm.name: 0 for r in self.reactors}  # next event each one reads
        self._projected = 0
        self._results: dict[str, bytes] = {}  # the first answer of each command id, encoded
        self._answers: list[bytes] = []  # every answer, in the order written
        self.dead_letters: list[DeadLetter] = []
        self.reaction_failures: list[Any] = []  # ReactionFailure: the event dead-lettered
        self.parked: list[DeadLetter] = []
        self.outcomes: dict[str, ConversationOutcome] = {}  # the first, per correlation id
        self.deadlines = PendingDeadlines()
        self._retries: list[_Retry] = []
        self.read_models = read_models  # e.g. projections.LocalReadModels(app)

    # ---- the client's vocabulary ----------------------------------------------------------------

    def send(self, aggregate_id: str, command: object, expected_version: int | None = None,
             command_id: str | None = None, correlation_id: str | None = None) -> str:
        """Put ``command`` on the commands topic, as a client does (stamped with the clock);
        its id. Nothing runs until :meth:`run` (or a ``*_and_wait``)."""
        cid, key, value, headers = encode_command(
            self.app, aggregate_id, command, expected_version=expected_version,
            command_id=command_id or uuid4_text(self._ids.getrandbits(128)),
            correlation_id=correlation_id, timestamp=self.clock)
        self._produce_command(key, value, headers)
        return cid

    def send_and_wait(self, aggregate_id: str, command: object, expected_version: int | None = None,
                      command_id: str | None = None, correlation_id: str | None = None) -> CommandResult:
        """:meth:`send`, then run until its answer is there; the answer."""
        cid = self.send(aggregate_id, command, expected_version, command_id, correlation_id)
        self.run()
        return self.result(cid)

    def result(self, command_id: str) -> CommandResult:
        """The (first) answer to a command id."""
        found = self._results.get(command_id)
        if found is None:
            raise RunnerError(
                f"no answer to command {command_id!r}: it waits for a retry or a deadline "
                "(advance the clock) or was never sent")
        return self.codec.decode(found)  # type: ignore[no-any-return]

    def answers(self) -> list[CommandResult]:
        """Every answer written, in order (a command answered again appears again)."""
        return [self.codec.decode(v) for v in self._answers]

    def wait_conversation(self, correlation_id: str) -> tuple[ConversationOutcome, Any]:
        """Run until the conversation ended; ``(outcome, event)`` as the client returns them."""
        self.run()
        outcome = self.outcomes.get(correlation_id)
        if outcome is None:
            raise RunnerError(
                f"conversation {correlation_id!r} has not ended: no completes_on event yet (it "
                "may wait for a deadline or a retry: advance the clock)")
        return outcome, self.codec.decode(outcome.payload)

    def state(self, aggregate_id: str, aggregate_type: str | type | None = None) -> Any:
        """The aggregate as the processor keeps it (None: it does not exist)."""
        record = self._record(aggregate_id, aggregate_type)
        if record is None or record.snapshot is None:
            return None
        return self.codec.decode(record.snapshot)

    def version(self, aggregate_id: str, aggregate_type: str | type | None = None) -> int:
        record = self._record(aggregate_id, aggregate_type)
        return 0 if record is None else record.version

    def read_model(self) -> Any:
        """A reader of the read models (:meth:`projections.LocalReadModels.reader`)."""
        if self.read_models is None:
            raise RunnerError(
                f"this runner folds no read model: pass read_models=LocalReadModels(app) (from "
                f"projections) to LocalRunner to run {self.app.name!r}'s projections")
        return self.read_models.reader()

    def events(self, aggregate_id: str | None = None) -> list[Any]:
        """The events written so far (of one aggregate, when given), decoded, in log order."""
        out = []
        for key, value, headers, _ in self._events:
            env, payload = from_kafka(key, value, headers)
            if aggregate_id is None or env.aggregate_id == aggregate_id:
                out.append(self.codec.decode(payload))
        return out

    def event_records(self) -> list[KafkaRecord]:
        """The events topic's records so far, in log order (one partition here), each stamped
        with the virtual clock's time when the processor wrote it, as Kafka stamps a record."""
        return [KafkaRecord(self.topics.events, 0, offset, key, value, list(headers), ms)
                for (key, value, headers, offset), ms in zip(self._events, self._event_times,
                                                             strict=True)]

    def history(self) -> HistoryReader:
        """A :class:`~cqrs.history.HistoryReader` of the events written so far: the rows the
        history job would write, in memory; times in the future are those after the clock."""
        table = MemoryHistoryTable(self.topics.base)
        table.write(rows_from_records(self.event_records()))
        return HistoryReader(self.app, table=table, codec=self.codec, clock=lambda: self.clock)

    # ---- time and work ----------------------------------------------------------------------------

    def advance(self, by: _dt.timedelta) -> None:
        """Move the clock ``by`` on: what is due by then (deadlines, retries) fires at its own
        time, earliest first, each followed by everything it sets off."""
        until = advance_clock(self.clock, by)
        self.run()
        while True:
            deadline = next(iter(self.deadlines.due(until)), None)
            retry = min(self._retries, key=lambda r: r.due_ms, default=None)
            retry_at = None if retry is None else _dt.datetime.fromtimestamp(
                retry.due_ms / 1000, _dt.timezone.utc)
            if retry is not None and retry_at is not None and retry_at > until:
                retry = None
            if deadline is None and retry is None:
                break
            if retry is not None and retry_at is not None and (
                    deadline is None or deadline.due is None or retry_at < deadline.due):
                self.clock = max(self.clock, retry_at)
                self._retries.remove(retry)
                self._redeliver(retry.letter)
            else:
                assert deadline is not None and deadline.due is not None
                self.clock = max(self.clock, deadline.due)
                self.deadlines.pop_due(deadline.due)
                self._produce_command(deadline.key or b"", deadline.value or b"", [])
            self.run()
        self.clock = until

    def run(self) -> None:
        """Process everything there is to process: commands, reactions, projections, in an
        order drawn from the runner's seed, until nothing is left (the clock stands still).

        Without cycle collection meanwhile, as a serving task decides its slices (the collector's
        passes over the records kept so far cost ~10 % of a long run; nothing here makes cycles)."""
        with paused():
            self._run()

    def _run(self) -> None:
        commands, applied, reactors = self._commands, self._applied, self.reactors
        for _ in range(MAX_STEPS):
            # nothing waits (what a send_and_wait's second look finds): no jobs to list
            if self._waiting == 0 and (not reactors or all(
                    self._reacted[r.pm.name] >= len(self._events) for r in reactors)) and (
                    self.read_models is None or self._projected >= len(self._events)):
                return
            jobs: list[tuple[str, Any]] = [("command", p) for p in range(self.partitions)
                                           if applied[p] < len(commands[p])]
            jobs += [("react", r) for r in reactors
                     if self._reacted[r.pm.name] < len(self._events)]
            if self.read_models is not None and self._projected < len(self._events):
                jobs.append(("project", None))
            kind, what = jobs[0] if len(jobs) == 1 else self.random.choice(jobs)
            if kind == "command":
                self._process_partition(what)
            elif kind == "react":
                self._react(what)
            else:
                self._project()
        raise RunnerError(f"still busy after {MAX_STEPS:,} steps: do commands send each other "
                          "in a loop?")

    # ---- the jobs --------------------------------------------------------------------------------

    def _produce_command(self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]]) -> None:
        p = self._partition_of.get(key)
        if p is None:
            p = self._partition_of[key] = murmur2_partition(key, self.partitions)
        # plain tuples of bytes: the garbage collector stops tracking them (a test's long run
        # keeps every record; tracked containers cost every full collection ~10% of the time)
        self._commands[p].append((key, value, tuple(headers), self._next_offset[p]))
        self._next_offset[p] += 1
        self._waiting += 1

    def _record(self, aggregate_id: str, aggregate_type: str | type | None) -> AggregateRecord | None:
        if aggregate_type is None:
            found = [r for (t, i), r in self._states.items() if i == aggregate_id]
            if len(found) > 1:
                raise RunnerError(f"{aggregate_id!r} exists under several aggregate types: name one")
            return found[0] if found else None
        name = aggregate_type if isinstance(aggregate_type, str) else \
            self.app.model.entry(aggregate_type).type_name
        return self._states.get((name, aggregate_id))

    def _process_partition(self, partition: int) -> None:
        """Every command waiting on the partition, as a serving task takes a chunk: grouped by
        aggregate in offset order, one step per aggregate."""
        waiting = self._commands[partition][self._applied[partition]:]
        self._applied[partition] += len(waiting)
        self._waiting -= len(waiting)
        groups = group_by_aggregate(self.topics.commands, partition, waiting)
        for (agg_type, agg_id), records in groups.items():
            if agg_type is None or agg_id is None:  # the step dead-letters what it cannot place
                self._write(self.step.apply(None, None, None, records).out)
                continue
            key = (agg_type, agg_id)
            decoded = self._objects.get(key, UNDECODED)
            personal = self.codec.personal
            if personal and decoded is not UNDECODED and \
                    key_changed(self.step, decoded, self._key_ids.get(key)):
                decoded = UNDECODED  # holds a forgotten subject's values in clear
            result = self.step.apply(agg_type, agg_id, self._states.get(key), records, decoded)
            if result.record is not None:
                self._states[key] = result.record
                self._objects[key] = result.state
                if personal:
                    self._key_ids[key] = state_key_id(self.step, {}, result.state)
            self._write(result.out)
            if result.deadlines:
                self.deadlines.apply(result.deadlines)

    def _now_ms(self) -> int:
        """The clock in ms (worked out again only when the clock was moved)."""
        if self.clock is not self._clock_at:
            self._clock_at, self._clock_ms = self.clock, int(self.clock.timestamp() * 1000)
        return self._clock_ms

    def _write(self, out: Sequence[OutputRecord]) -> None:
        events, results = self.topics.events, self.topics.results
        for r in out:
            if r.topic == events:
                self._events.append((r.key or b"", r.value or b"", tuple(r.headers or ()),
                                     len(self._events)))
                self._event_times.append(self._now_ms())
            elif r.topic == results:  # decoded when asked for
                self._answers.append(r.value or b"")
                self._results.setdefault((r.key or b"").decode(), r.value or b"")
            elif r.topic == self.topics.dead_letters:
                self._dead_letter(r)

    def _dead_letter(self, r: OutputRecord) -> None:
        letter = parse_dead_letter(KafkaRecord(
            self.topics.dead_letters, 0, len(self.dead_letters), r.key, r.value,
            [(k, v or b"") for k, v in r.headers or []], self._now_ms()))
        self.dead_letters.append(letter)
        if letter.source_topic and letter.source_topic != self.topics.commands:
            return
        if classify(letter) == WAITING:
            self._retries.append(_Retry(due_ms(self.app.retries, letter), letter))
        elif letter.transient:
            self.parked.append(letter)

    def _redeliver(self, letter: DeadLetter) -> None:
        key, value, headers = redelivery(letter.key, letter.value, letter.headers, letter.attempt + 1)
        self._produce_command(key or b"", value or b"", headers)

    def _react(self, reactor: Reactor) -> None:
        name = reactor.pm.name
        key, value, headers, offset = self._events[self._reacted[name]]
        self._reacted[name] += 1
        env, payload = from_kafka(key, value, headers)
        if env.message_type not in reactor.event_types:
            return
        sources = [SourceEvent(env, self.codec.decode(payload), payload, 0, offset)]
        instances = self._instances[name]
        out = reactor.run(sources, {k: instances.get(k) for k in reactor.keys(sources)})
        for c in out.commands:
            self._produce_command(c.key, c.value, ())
        for o in out.outcomes:
            self.outcomes.setdefault(o.correlation_id, o)
        self.reaction_failures.extend(out.failures)  # the real job dead-letters them
        self.deadlines.apply(out.stored_deadlines)
        for k, inst in out.instances.items():
            instances[k] = inst

    def _project(self) -> None:
        """Every event not folded yet, as one batch of the projector."""
        records = self._events[self._projected:]
        self._projected += len(records)
        self.read_models.apply(records)
