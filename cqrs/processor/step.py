"""One aggregate's share of a micro-batch, as plain Python: records in, state and records out.

The Spark job (:mod:`cqrs.processor.job`) only groups records by aggregate and hands each group
to :meth:`AggregateStep.run`; everything else happens here, so it is tested without Spark:

1. sort the aggregate's command records by (partition, offset): a shuffle does not keep order;
2. read each envelope and payload; what cannot be read goes to the dead-letter topic (with a
   ``failed`` result when the command id is known, so no sender waits forever);
3. drop command ids seen before (in state or earlier in the batch): their first result is
   written again, nothing runs twice;
4. run the shared decision function once for the remaining commands;
5. write events, one result per command, and dead letters for handler crashes; a crash the
   app declares transient (:mod:`cqrs.retries`) gets no result and is not remembered until its
   attempts are used up, so the retry job can run the same command id again;
6. return the new :class:`~cqrs.results.AggregateRecord` (version, snapshot, recent ids).

Everything written is a pure function of (state, records): a re-run micro-batch rewrites
byte-identical records. No clock is read; de-duplication is windowed by command timestamps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from cqrs.app import App
from cqrs.codec.registry import Codec
from cqrs.domain.decision import Accepted, CommandInput, Failed, RejectedOutcome, decide
from cqrs.domain.process import DERIVED_PREFIX, parse_derived_id
from cqrs.envelope import Envelope, Headers, event_to_kafka, from_kafka
from cqrs.errors import CqrsError
from cqrs.results import (
    ACCEPTED, FAILED, REJECTED, AggregateRecord, CommandResult, SeenCommand, expand_seen,
    kept_indices, seen_command,
)
from cqrs.retries import ATTEMPT_HEADER
from cqrs.scheduler.records import StoredDeadline, stored_deadline
from cqrs.topics import AppTopics

__all__ = ["DUPLICATE_HEADER", "UNDECODED", "AggregateStep", "DedupPolicy", "InputRecord", "OutputRecord",
           "StepResult"]

DLQ_PREFIX = "cqrs.dlq."
# the one header a result record can carry: on the answer to a command id seen before (the first
# answer again, as a retried send or a process manager's replay gets it)
DUPLICATE_HEADER: tuple[str, bytes] = ("cqrs.duplicate", b"1")


@attrs.define(slots=True)
class InputRecord:
    """A command record as read from Kafka (not frozen, never changed: made once per command,
    and a frozen class's ``__init__`` costs ~3x). ``envelope`` and ``payload``, when given, are the
    record's envelope and command payload already read by the caller (the processor's hot path,
    :func:`cqrs.envelope.read_command`): the step then trusts them instead of reading the record
    again; ``key``, ``value`` and ``headers`` are what it copies into dead letters."""

    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    partition: int
    offset: int
    topic: str = ""
    envelope: Envelope | None = None
    payload: bytes | None = None


@attrs.define(slots=True)
class StepResult:
    """What :meth:`AggregateStep.apply` returns: the record to store (``None``: unchanged), the
    aggregate object it holds (to cache, never mutated by later steps) and the records to write."""

    record: AggregateRecord | None
    state: Any
    out: list[OutputRecord]
    # deadlines scheduled and cancelled, to write once the records are acknowledged
    deadlines: list[StoredDeadline] = attrs.field(factory=list)


class _Undecoded:
    """Marks that the caller has no decoded aggregate object: decode the snapshot."""


UNDECODED: Any = _Undecoded()


@attrs.define(slots=True)
class OutputRecord:
    """A record to write: the Kafka sink's topic, key, value, headers and partition columns
    (``partition`` None: the producer's partitioner picks it from the key). Not frozen, never
    changed: two per command, and a frozen class's ``__init__`` costs ~3x."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    partition: int | None = None
    status: str | None = None  # a result record's status (its value holds it too), for the counts


@attrs.frozen
class DedupPolicy:
    """How long a command id is remembered per aggregate: a time window and a count."""

    window_ms: int = 24 * 3600 * 1000
    max_per_aggregate: int = 1000


@attrs.define(slots=True)
class _Pending:
    record: InputRecord
    envelope: Envelope
    command: Any


class AggregateStep:
    """Applies one aggregate's commands of a micro-batch (see the module doc)."""

    def __init__(self, app: App, codec: Codec, topics: AppTopics, dedup: DedupPolicy = DedupPolicy(),
                 results_partitions: int | None = None):
        self.app = app
        self.codec = codec
        self.topics = topics
        self.dedup = dedup
        # partitions of the results topic: a command's reply partition is honoured below it
        self.results_partitions = results_partitions
        self._route = app.model.route  # checks the commands a handler schedules

    # ---- state ------------------------------------------------------------------------------

    def load_state(self, blob: bytes | None) -> AggregateRecord:
        return AggregateRecord() if blob is None else self.codec.decode(blob)

    def dump_state(self, record: AggregateRecord) -> bytes:
        return self.codec.encode(record)

    # ---- the step ---------------------------------------------------------------------------

    def run(
        self,
        aggregate_type: str | None,
        aggregate_id: str | None,
        state: AggregateRecord | None,
        records: Iterable[InputRecord],
    ) -> tuple[AggregateRecord | None, list[OutputRecord]]:
        """The new state (None: unchanged) and the records to write, in order."""
        result = self.apply(aggregate_type, aggregate_id, state, records)
        return result.record, result.out

    def apply(
        self,
        aggregate_type: str | None,
        aggregate_id: str | None,
        state: AggregateRecord | None,
        records: Iterable[InputRecord],
        decoded: Any = UNDECODED,
    ) -> StepResult:
        """:meth:`run`, also taking and giving the aggregate object (``decoded``: the object
        ``state.snapshot`` holds, when the caller has it, saving a decode)."""
        ordered = list(records)
        if any(ordered[i].offset > ordered[i + 1].offset or
               ordered[i].partition != ordered[i + 1].partition for i in range(len(ordered) - 1)):
            ordered.sort(key=lambda r: (r.partition, r.offset))  # a shuffle's order: restore it
        out: list[OutputRecord] = []
        if aggregate_type is None or aggregate_id is None:
            for rec in ordered:
                try:  # for the error that names the problem
                    from_kafka(rec.key, rec.value, rec.headers)
                except CqrsError as exc:
                    out.append(self._dead_letter(rec, "envelope", type(exc).__name__, str(exc)))
                    continue
                out.append(self._dead_letter(rec, "envelope", "MissingHeaderError",
                                             "record has no key (aggregate id) or no "
                                             "aggregate type"))
            return StepResult(None, decoded, out)
        try:
            entry = self.app.model.entry(aggregate_type)
        except CqrsError as exc:
            for rec in ordered:
                try:
                    env: Envelope | None = from_kafka(rec.key, rec.value, rec.headers)[0]
                except CqrsError:
                    env = None
                out.extend(self._unreadable(rec, "unknown_aggregate", exc, env))
            return StepResult(None, decoded, out)

        current = state if state is not None else AggregateRecord()
        seen = set(current.seen_command_ids())
        # commands of process managers: recognised by their stream's mark, forever
        positions = current.stream_positions() if current.streams else None
        retrying = current.retrying_ids() if current.retrying else None
        streams_changed = False
        pending: list[_Pending] = []
        duplicates: list[tuple[Envelope, str]] = []
        batch_ids: set[str] = set()
        for rec in ordered:
            try:
                if rec.envelope is not None and rec.payload is not None:
                    env, payload = rec.envelope, rec.payload
                else:
                    env, payload = from_kafka(rec.key, rec.value, rec.headers)
            except CqrsError as exc:
                out.append(self._dead_letter(rec, "envelope", type(exc).__name__, str(exc)))
                continue
            cid = env.command_id or env.message_id
            if "\0" in cid:
                out.append(self._dead_letter(rec, "envelope", "MalformedHeaderError",
                                             f"command id {cid!r} contains a NUL character"))
                continue
            if cid in seen or cid in batch_ids:
                duplicates.append((env, cid))
                continue
            derived = parse_derived_id(cid) if cid.startswith(DERIVED_PREFIX) else None
            if derived is not None:
                if positions is None:
                    positions = {}
                mark = positions.get(derived.stream)
                if mark is not None and derived.position <= mark and \
                        (retrying is None or cid not in retrying):
                    continue  # applied before, beyond the dedup window: no second effect
                if mark is None or derived.position > mark:
                    positions[derived.stream] = derived.position
                    streams_changed = True
            try:
                command = self.codec.decode(payload)
            except CqrsError as exc:
                stage = "unknown_type" if "Unregistered" in type(exc).__name__ else "decode"
                out.extend(self._unreadable(rec, stage, exc, env))
                continue
            batch_ids.add(cid)
            pending.append(_Pending(rec, env, command))

        new_seen: list[SeenCommand] = []
        deadlines: list[StoredDeadline] = []
        version = current.version
        snapshot = current.snapshot
        deleted = current.deleted
        agg_state = decoded
        if pending:
            if agg_state is UNDECODED:
                agg_state = None if snapshot is None else self.codec.decode(snapshot)
            decision = decide(entry, aggregate_id, agg_state, version, [
                CommandInput(
                    command_id=p.envelope.command_id or p.envelope.message_id,
                    command=p.command,
                    expected_version=p.envelope.expected_version,
                    timestamp=p.envelope.timestamp,
                    correlation_id=p.envelope.correlation_id,
                ) for p in pending
            ], self._route)
            for p, outcome in zip(pending, decision.outcomes, strict=True):
                if type(outcome) is Accepted:
                    for new_event in outcome.events:
                        key, value, headers = event_to_kafka(
                            new_event, self.codec.encode(new_event.event))
                        out.append(OutputRecord(self.topics.events, key, value, headers))
                    if outcome.deadlines:
                        deadlines.extend(stored_deadline(c, self._route, self.codec)
                                         for c in outcome.deadlines)
                elif type(outcome) is Failed:
                    retry = self._retry(p, outcome)
                    out.append(self._dead_letter(p.record, "handler", outcome.error_type,
                                                 outcome.message, retry))
                    if retry is not None and not retry[1]:
                        if p.envelope.command_id and p.envelope.command_id.startswith(DERIVED_PREFIX):
                            retrying = (retrying or set()) | {p.envelope.command_id}
                            streams_changed = True
                        continue  # transient: no answer yet, the id is not remembered
                if retrying and (p.envelope.command_id or "") in retrying:
                    retrying = retrying - {p.envelope.command_id or ""}
                    streams_changed = True
                result = self._result(p, aggregate_type, aggregate_id, outcome)
                result_bytes = self.codec.encode(result)
                out.append(self._result_record(result, result_bytes, p.envelope))
                new_seen.append(seen_command(result, result_bytes))
            if decision.version != version:
                version = decision.version
                deleted = decision.state is None and version > 0
                snapshot = None if decision.state is None else self.codec.encode(decision.state)
                agg_state = decision.state

        by_id = {s.command_id: s for s in [*(current.seen if duplicates else ()), *new_seen]}
        for dup_env, cid in duplicates:  # the first answer again, byte for byte
            first = by_id[cid]
            answer = expand_seen(first, aggregate_type, aggregate_id)
            if answer is None:
                again = self._result_record(self.codec.decode(first.result), first.result, dup_env)
            else:
                again = self._result_record(answer, self.codec.encode(answer), dup_env)
            # marked, so that counts of results (the status board's) do not count it twice
            again.headers = [DUPLICATE_HEADER]
            out.append(again)

        if not new_seen and version == current.version and not streams_changed:
            return StepResult(None, agg_state, out, deadlines)  # nothing to store
        record = current.remember(version, deleted, snapshot, new_seen,
                                  self.dedup.window_ms, self.dedup.max_per_aggregate)
        if streams_changed:
            record = record.with_streams(positions or {}, retrying or set())
        return StepResult(record, agg_state, out, deadlines)

    # ---- helpers ----------------------------------------------------------------------------

    def window(self, seen: list[SeenCommand]) -> list[SeenCommand]:
        """The part of ``seen`` (oldest first) the dedup policy keeps."""
        times = [s.timestamp_ms for s in seen]
        return [seen[i] for i in kept_indices(times, self.dedup.window_ms, self.dedup.max_per_aggregate)]

    @staticmethod
    def _result(p: _Pending, aggregate_type: str, aggregate_id: str, outcome: Any) -> CommandResult:
        # positional arguments, in CommandResult's field order: this runs once per command
        env, rec = p.envelope, p.record
        cid = env.command_id or env.message_id
        if type(outcome) is Accepted:
            return CommandResult(cid, ACCEPTED, aggregate_type, aggregate_id, outcome.version,
                                 env.timestamp, rec.partition, rec.offset,
                                 [e.event_id for e in outcome.events])
        if type(outcome) is RejectedOutcome:
            return CommandResult(cid, REJECTED, aggregate_type, aggregate_id,
                                 outcome.current_version, env.timestamp, rec.partition, rec.offset,
                                 [], outcome.reason, outcome.code)
        return CommandResult(cid, FAILED, aggregate_type, aggregate_id, outcome.current_version,
                             env.timestamp, rec.partition, rec.offset, [], None, None,
                             outcome.error_type, outcome.message)

    def _reply_partition(self, envelope: Envelope | None) -> int | None:
        """The partition the sender of ``envelope`` listens on, if it asked for a valid one."""
        wanted = None if envelope is None else envelope.reply_partition
        if wanted is None or self.results_partitions is None or not 0 <= wanted < self.results_partitions:
            return None
        return wanted

    def _result_record(self, result: CommandResult, value: bytes,
                       envelope: Envelope | None = None) -> OutputRecord:
        """The result's record: key = command id, value = the CommandResult, no headers (see
        docs/wire-format.md). Its readers decode the value; a header costs the producer ~0.2
        us and the broker ~0.3 us each, per record."""
        return OutputRecord(self.topics.results, result.command_id.encode(), value, [],
                            self._reply_partition(envelope), result.status)

    def _unreadable(
        self, rec: InputRecord, stage: str, exc: Exception, env: Envelope | None = None
    ) -> list[OutputRecord]:
        out = [self._dead_letter(rec, stage, type(exc).__name__, str(exc))]
        if env is not None:  # the sender is waiting for this id: tell it
            result = CommandResult(
                command_id=env.command_id or env.message_id, status=FAILED,
                aggregate_type=env.aggregate_type, aggregate_id=env.aggregate_id, version=-1,
                timestamp=env.timestamp, source_partition=rec.partition, source_offset=rec.offset,
                error_type=type(exc).__name__, message=str(exc),
            )
            out.append(self._result_record(result, self.codec.encode(result), env))
        return out

    def _retry(self, p: _Pending, outcome: Failed) -> tuple[int, bool] | None:
        """``(attempt, final)`` when the failure is transient by the app's retry policy (final:
        the attempts are used up, so this failure is the command's answer), else ``None``."""
        policy = self.app.retries
        if not policy.is_transient(outcome.error_types or (outcome.error_type,)):
            return None
        attempt = 1
        for k, v in p.record.headers:
            if k == ATTEMPT_HEADER and v:
                try:
                    attempt = max(1, int(v))
                except ValueError:
                    attempt = 1
        backoff = policy.backoff(p.envelope.message_type, outcome.error_type)
        return attempt, attempt >= backoff.max_attempts

    def _dead_letter(self, rec: InputRecord, stage: str, error_type: str, message: str,
                     retry: tuple[int, bool] | None = None) -> OutputRecord:
        headers: Headers = [(k, v if v is not None else b"") for k, v in rec.headers]
        headers += [
            (f"{DLQ_PREFIX}stage", stage.encode()),
            (f"{DLQ_PREFIX}error_type", error_type.encode()),
            (f"{DLQ_PREFIX}error", message.encode(errors="replace")),
            (f"{DLQ_PREFIX}topic", rec.topic.encode()),
            (f"{DLQ_PREFIX}partition", str(rec.partition).encode()),
            (f"{DLQ_PREFIX}offset", str(rec.offset).encode()),
        ]
        if retry is not None:  # a transient failure: the retry job's to deliver again or park
            headers += [(f"{DLQ_PREFIX}transient", b"1"),
                        (f"{DLQ_PREFIX}attempt", str(retry[0]).encode()),
                        (f"{DLQ_PREFIX}final", b"1" if retry[1] else b"0")]
        return OutputRecord(self.topics.dead_letters, rec.key, rec.value, headers)
