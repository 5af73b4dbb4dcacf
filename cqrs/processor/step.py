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

Every record the step returns fits the limits it is written under (``max_record_bytes``, see
:meth:`cqrs.config.KafkaSettings.max_record_bytes`, and Cassandra's key), so one command's
outputs cannot fail the task that writes them, and with it every other aggregate's batch:

* an aggregate id whose state-row key (id and type) is over Cassandra's 65,535 bytes: each of
  its commands is dead-lettered at stage ``envelope`` with a ``failed`` result, no state;
* a command whose events or result would be over the record limit: a ``failed`` result
  (:class:`~cqrs.errors.RecordTooLargeError`, naming the record, its size and the limit), a
  dead letter at stage ``output``, none of its events, the aggregate as it was before it (the
  commands after it are decided again from there);
* a result or dead letter whose texts (a rejection's reason, a crash's message) or copied
  command do not fit: cut until it does, the original size in a ``cqrs.dlq.*_size`` header.

Everything written is a pure function of (state, records): a re-run micro-batch rewrites
byte-identical records. No clock is read; de-duplication is windowed by command timestamps.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import attrs

from cqrs.app import App
from cqrs.codec.registry import Codec
from cqrs.config import DEFAULT_MAX_RECORD_BYTES, RECORD_MARGIN_BYTES
from cqrs.domain.decision import (
    Accepted, CommandInput, Decision, Failed, NewEvent, RejectedOutcome, decide,
)
from cqrs.domain.model import AggregateEntry
from cqrs.domain.process import DERIVED_PREFIX, parse_derived_id
from cqrs.envelope import (
    EVENT_RECORD_FRAME_BYTES, MAX_STATE_KEY_BYTES, RECORD_FRAME_BYTES,
    Envelope, Headers, check_aggregate_id, event_to_kafka, from_kafka, record_size,
)
from cqrs.budget import Watch
from cqrs.errors import CqrsError, DecisionTimeoutError, RecordTooLargeError
from cqrs.native import builder, native
from cqrs.processor.state_table import StoredAggregate
from cqrs.results import (
    ACCEPTED, FAILED, REJECTED, AggregateRecord, CommandResult, SeenCommand, accepted_seen,
    expand_seen, kept_indices, seen_command,
)
from cqrs.retries import ATTEMPT_HEADER
from cqrs.scheduler.records import StoredDeadline, stored_deadline
from cqrs.topics import AppTopics

__all__ = ["DUPLICATE_HEADER", "UNDECODED", "AggregateStep", "DedupPolicy", "InputRecord", "OutputRecord",
           "StepResult", "Watch"]

DLQ_PREFIX = "cqrs.dlq."
# AggregateRecord's Avro fields as the native packed step reads and writes them (native/src/packed.rs)
_PACKED_STATE_LAYOUT: Final = [
    ("version", "long"), ("deleted", "boolean"), ("snapshot", ["null", "bytes"]),
    ("seen_ids", "string"), ("seen_times", "bytes"), ("seen_sizes", "bytes"),
    ("seen_results", "bytes"), ("streams", "string"), ("stream_marks", "bytes"),
    ("retrying", "string"),
]
_make_input: Final = builder(CommandInput)  # every field given (see cqrs.native.builder)
# the one header a result record can carry: on the answer to a command id seen before (the first
# answer again, as a retried send or a process manager's replay gets it)
DUPLICATE_HEADER: tuple[str, bytes] = ("cqrs.duplicate", b"1")
OUTPUT_STAGE = "output"  # the dead-letter stage of a command whose outputs do not fit
TOO_LARGE = RecordTooLargeError.__name__
MAX_ERROR_TEXT = 4_000  # bytes of an error text a cut dead letter keeps


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
    # the new state row, packed, when apply_packed made it (``record`` is None then: the row
    # holds it; see AggregateStep.recorded)
    row: StoredAggregate | None = None


def _watched(inputs: Sequence[CommandInput], todo: Sequence[_Pending],
             watch: Watch) -> Iterator[CommandInput]:
    """``inputs``, noting each one's record in ``watch`` as the decision takes it."""
    for ci, p in zip(inputs, todo, strict=True):
        watch.record, watch.since = p.record, time.monotonic()
        yield ci
    watch.record = None


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


# a plain acceptance's entry in the dedup memory, as its fields (see accepted_seen): command id,
# timestamp, the version answered, events, source partition and offset
_Acceptance = tuple[str, Any, int, int, int, int]


@attrs.define(slots=True)
class _Pending:
    record: InputRecord
    envelope: Envelope
    command: Any


class AggregateStep:
    """Applies one aggregate's commands of a micro-batch (see the module doc)."""

    def __init__(self, app: App, codec: Codec, topics: AppTopics, dedup: DedupPolicy = DedupPolicy(),
                 results_partitions: int | None = None,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES):
        self.app = app
        self.codec = codec
        self.topics = topics
        self.dedup = dedup
        # partitions of the results topic: a command's reply partition is honoured below it
        self.results_partitions = results_partitions
        self._route = app.model.route  # checks the commands a handler schedules
        # the largest record written (cqrs.envelope.record_size): from the configuration,
        # KafkaSettings.max_record_bytes()
        self.max_record_bytes = max_record_bytes
        # an accepted command's result written from its fields, without the CommandResult
        # object (its 13 fields cost ~2 us to set on a frozen class; None: the codec has no
        # generated writer for it)
        self._write_result = codec.values_writer(CommandResult)
        # apply_packed's native step (None: the module is not installed, or not for this app)
        self._packed_step = self._native_packed_step()

    # ---- state ------------------------------------------------------------------------------

    def load_state(self, blob: bytes | None) -> AggregateRecord:
        return AggregateRecord() if blob is None else self.codec.decode(blob)

    def dump_state(self, record: AggregateRecord) -> bytes:
        return self.codec.encode(record)

    def _native_packed_step(self) -> Any:
        """``cqrs_native.PackedStep`` for :meth:`apply_packed`, or None: without the native
        module, for an app with personal fields (their keys are looked up per batch), and
        when the state record is not laid out as that step writes it."""
        if native is None or self._write_result is None or self.codec.personal:
            return None
        reg = self.codec.lookup(AggregateRecord)
        if [(f["name"], f["type"]) for f in reg.schema["fields"]] != _PACKED_STATE_LAYOUT:
            return None  # pragma: no cover - a change to AggregateRecord the native step lacks
        reads, writes = self.codec.quick_paths()
        return native.PackedStep({
            "record_header": reg.header, "reads": reads, "writes": writes,
            "encode": self.codec.encode, "entry_of": self.app.model.entry, "decide": decide,
            "route": self._route, "make_input": _make_input, "accepted": Accepted,
            "write_result": self._write_result, "make_output": builder(OutputRecord),
            "make_row": builder(StoredAggregate), "make_result": builder(StepResult),
            "event_to_kafka": event_to_kafka, "monotonic": time.monotonic, "utc": _dt.timezone.utc,
            "events_topic": self.topics.events, "results_topic": self.topics.results,
            "accepted_status": ACCEPTED, "results_partitions": self.results_partitions,
            "max_record_bytes": self.max_record_bytes,
            "event_frame_bytes": EVENT_RECORD_FRAME_BYTES, "record_frame_bytes": RECORD_FRAME_BYTES,
            "max_state_key_bytes": MAX_STATE_KEY_BYTES, "window_ms": self.dedup.window_ms,
            "max_count": self.dedup.max_per_aggregate, "derived_prefix": DERIVED_PREFIX,
        })

    @property
    def packs(self) -> bool:
        """Whether :meth:`apply_packed` can take commands (else it always returns None)."""
        return self._packed_step is not None

    def recorded(self, result: StepResult) -> StepResult:
        """``result`` with its record, when :meth:`apply_packed` left it in its packed row."""
        if result.row is None:
            return result
        return StepResult(self.load_state(result.row.record), result.state, result.out,
                          result.deadlines)

    # ---- the step ---------------------------------------------------------------------------

    def apply_packed(self, aggregate_type: str, aggregate_id: str, packed: bytes,
                     records: list[InputRecord], watch: Watch | None = None) -> StepResult | None:
        """:meth:`apply` on the state the packed row ``packed`` holds
        (:meth:`StoredAggregate.packed`; ``records``: its commands not applied yet), for the
        state to be kept packed again: the result's :attr:`~StepResult.row` is the new row,
        its ``record`` None. In one native call for the commonest case (one plain command,
        accepted, its records within the limits, nothing falling out of the dedup memory):
        :meth:`_one`'s records without its objects; this step from the decision on otherwise.
        None when neither takes the command (nothing decided): unpack the row and
        :meth:`apply` it."""
        if self._packed_step is None or len(records) != 1:
            return None
        found = self._packed_step(aggregate_type, aggregate_id, packed, records[0], watch)
        if type(found) is not tuple:
            return found  # type: ignore[no-any-return]
        entry, decoded, command, inputs, decision = found
        current = self.load_state(StoredAggregate.unpacked(aggregate_id, aggregate_type, packed).record)
        return self._hand_over(entry, aggregate_type, aggregate_id, current, decoded, records[0],
                               command, inputs, decision, watch)

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
        watch: Watch | None = None,
    ) -> StepResult:
        """:meth:`run`, also taking and giving the aggregate object (``decoded``: the object
        ``state.snapshot`` holds, when the caller has it, saving a decode). ``watch``: noted
        with the command being decided (see :class:`Watch`)."""
        ordered = records if type(records) is list else list(records)
        if len(ordered) > 1 and any(ordered[i].offset > ordered[i + 1].offset or
               ordered[i].partition != ordered[i + 1].partition for i in range(len(ordered) - 1)):
            ordered = sorted(ordered, key=lambda r: (r.partition, r.offset))  # a shuffle's order
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
        # the state row's key is the id and the type: Cassandra refuses a write of more than
        # 65,535 bytes, which would fail the task on every run. Type names are ASCII and a
        # character is at most 4 bytes of UTF-8, so only a long id is encoded to be measured.
        if 4 * len(aggregate_id) + len(aggregate_type) > MAX_STATE_KEY_BYTES:
            try:
                check_aggregate_id(aggregate_id, None, aggregate_type)
            except CqrsError as exc:
                for rec in ordered:
                    env = rec.envelope
                    if env is None:
                        try:
                            env = from_kafka(rec.key, rec.value, rec.headers)[0]
                        except CqrsError:
                            env = None
                    out.extend(self._unreadable(rec, "envelope", exc, env))
                return StepResult(None, decoded, out)

        current = state if state is not None else AggregateRecord()
        if len(ordered) == 1 and not current.streams and not current.retrying:
            one = ordered[0]
            if one.envelope is not None and one.payload is not None:
                return self._one(entry, aggregate_type, aggregate_id, current, one, decoded, watch)
        return self._general(entry, aggregate_type, aggregate_id, current, ordered, decoded, watch)

    def _general(self, entry: AggregateEntry, aggregate_type: str, aggregate_id: str,
                 current: AggregateRecord, ordered: list[InputRecord], decoded: Any,
                 watch: Watch | None) -> StepResult:
        """:meth:`apply` from the aggregate's state on (``ordered``: its records, in order):
        read them, drop those seen before, then :meth:`_decided`."""
        out: list[OutputRecord] = []
        # the dedup memory as one string: an id that is not a substring of it was not seen
        # (the usual case, a C search); a set of them costs ~75 ns per remembered id
        seen_ids = current.seen_ids
        seen: set[str] | None = None
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
            if cid in batch_ids or (cid in seen_ids and cid in (
                    seen if seen is not None else (seen := set(current.seen_command_ids())))):
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
        return self._decided(entry, aggregate_type, aggregate_id, current, decoded, pending, None,
                             None, out, duplicates, positions, retrying, streams_changed, watch)

    def _decided(self, entry: AggregateEntry, aggregate_type: str, aggregate_id: str,
                 current: AggregateRecord, decoded: Any, pending: list[_Pending],
                 inputs: list[CommandInput] | None, first: Decision | None,
                 out: list[OutputRecord], duplicates: list[tuple[Envelope, str]],
                 positions: dict[str, tuple[int, int]] | None, retrying: set[str] | None,
                 streams_changed: bool, watch: Watch | None) -> StepResult:
        """The rest of :meth:`apply` once the commands to decide are read (``pending``):
        decide, write, remember. ``inputs`` and ``first``, when given, are ``pending``'s
        CommandInputs and their decision on the aggregate as ``current`` holds it (see
        :meth:`_one`)."""
        # answers to remember: entries, or a plain acceptance's fields (see accepted_seen)
        new_seen: list[SeenCommand | _Acceptance] = []
        deadlines: list[StoredDeadline] = []
        version = current.version
        snapshot = current.snapshot
        deleted = current.deleted
        agg_state = decoded
        if pending:
            if agg_state is UNDECODED:
                agg_state = None if snapshot is None else self.codec.decode(snapshot)
            encode, events_topic = self.codec.encode, self.topics.events
            write_result, results_topic = self._write_result, self.topics.results
            if inputs is None:
                inputs = [  # CommandInput's fields: id, command, expected version, time, correlation
                    _make_input(p.envelope.command_id or p.envelope.message_id, p.command,
                                p.envelope.expected_version, p.envelope.timestamp,
                                p.envelope.correlation_id) for p in pending
                ]
            # state and version after the commands answered so far
            state_now, version_now = agg_state, version
            start = 0  # the first command not answered yet
            # commands decided at once: all of them, one by one after one did not fit (deciding
            # all again after each would cost a batch of such commands quadratic time)
            size = len(pending)
            limit = self.max_record_bytes
            event_room = limit - EVENT_RECORD_FRAME_BYTES  # the bounds below, as locals:
            result_room = limit - RECORD_FRAME_BYTES  # they are read once per command
            while start < len(pending):
                todo = pending[start:start + size] if start else pending
                chunk = inputs[start:start + size] if start else inputs
                if first is not None:  # decided already, all of them (start is 0)
                    decision, first = first, None
                else:
                    if watch is not None and len(chunk) == 1:  # the usual case: no generator
                        watch.record, watch.since = todo[0].record, time.monotonic()
                    decision = decide(entry, aggregate_id, state_now, version_now,
                                      chunk if watch is None or len(chunk) == 1
                                      else _watched(chunk, todo, watch), self._route)
                    if watch is not None:
                        watch.record = None
                too_large: tuple[_Pending, str] | None = None  # a command whose outputs do not fit
                for p, outcome in zip(todo, decision.outcomes, strict=True):
                    if type(outcome) is Accepted:
                        if outcome.events:
                            # an event record holds, besides its payload and event type, less
                            # than its command's record (the aggregate id, the command and
                            # correlation ids, the aggregate type) and a frame: only an event
                            # over the limit by this bound is counted exactly (record_size), so
                            # an event costs a len() and a comparison
                            rec = p.record  # its key and value are there: it was read
                            room = event_room - (len(rec.key) + len(rec.value)  # type: ignore[arg-type]
                                                 if not rec.headers else
                                                 record_size(rec.key, rec.value, rec.headers))
                            for new_event in outcome.events:
                                key, value, headers = event_to_kafka(new_event, encode(new_event.event))
                                if len(value) + len(new_event.type_name) > room and \
                                        record_size(key, value, headers) > limit:
                                    del out[len(out) - outcome.events.index(new_event):]
                                    too_large = (p, self._oversized_event(outcome, new_event, key, value, headers))
                                    break
                                out.append(OutputRecord(events_topic, key, value, headers))
                            if too_large is not None:
                                break  # none of its records: decide again from before it
                        if outcome.deadlines:
                            try:
                                stored = [stored_deadline(c, self._route, self.codec, limit)
                                          for c in outcome.deadlines]
                            except RecordTooLargeError as exc:
                                if outcome.events:
                                    del out[len(out) - len(outcome.events):]
                                too_large = (p, f"{exc}{_OR_RAISE}")
                                break  # none of its records: decide again from before it
                            deadlines.extend(stored)
                    elif type(outcome) is Failed:
                        retry = self._retry(p, outcome)
                        letter = self._dead_letter(p.record, "handler", outcome.error_type,
                                                   outcome.message, retry)
                        if retry is not None and not retry[1] and _was_cut(letter):
                            # its command was cut to fit: the retry job cannot deliver it
                            # again, so this failure is the answer (the letter is parked)
                            retry = (retry[0], True)
                            letter = self._dead_letter(p.record, "handler", outcome.error_type,
                                                       outcome.message, retry)
                        out.append(letter)
                        if retry is not None and not retry[1]:
                            if p.envelope.command_id and p.envelope.command_id.startswith(DERIVED_PREFIX):
                                retrying = (retrying or set()) | {p.envelope.command_id}
                                streams_changed = True
                            continue  # transient: no answer yet, the id is not remembered
                    if retrying and (p.envelope.command_id or "") in retrying:
                        retrying = retrying - {p.envelope.command_id or ""}
                        streams_changed = True
                    if type(outcome) is Accepted and write_result is not None:
                        # the usual answer, written from its fields (CommandResult's order);
                        # one that does not fit takes the path below, which says why
                        env, rec = p.envelope, p.record
                        cid = env.command_id or env.message_id
                        try:
                            result_bytes = write_result((
                                cid, ACCEPTED, aggregate_type, aggregate_id, outcome.version,
                                env.timestamp, rec.partition, rec.offset,
                                [e.event_id for e in outcome.events], None, None, None, None))
                        except Exception:  # noqa: BLE001 - a value it does not take: below
                            result_bytes = b""
                        if result_bytes and len(result_bytes) + 4 * len(cid) <= result_room:
                            out.append(OutputRecord(results_topic, cid.encode(), result_bytes,
                                                    [], self._reply_partition(env), ACCEPTED))
                            # its fields: an entry is made of them once the step knows
                            # whether it is the batch's only one (remember_accepted, below)
                            new_seen.append((cid, env.timestamp, outcome.version,
                                             len(outcome.events), rec.partition, rec.offset))
                            continue
                    result = self._result(p, aggregate_type, aggregate_id, outcome)
                    result_bytes = encode(result)
                    # the result's key is its command id, at most 4 bytes a character
                    if len(result_bytes) + 4 * len(result.command_id) > result_room:
                        if type(outcome) is Failed:  # its texts cut (its dead letter is written)
                            fitted = self._fitting(result, result_bytes)
                            if fitted is None:
                                continue  # not even cut: no answer (a command id near the limit)
                            result, result_bytes = fitted
                        else:
                            problem = self._oversized_result(result, result_bytes)
                            if problem is not None:
                                if type(outcome) is Accepted:  # its events and deadlines are the last
                                    if outcome.events:
                                        del out[len(out) - len(outcome.events):]
                                    if outcome.deadlines:
                                        del deadlines[len(deadlines) - len(outcome.deadlines):]
                                too_large = (p, problem)
                                break  # none of its records: decide again from before it
                    out.append(self._result_record(result, result_bytes, p.envelope))
                    new_seen.append(seen_command(result, result_bytes))
                if too_large is None:
                    state_now, version_now = decision.state, decision.version
                    start += len(todo)
                    continue
                p, problem = too_large
                i = 0  # its index in todo (a loop: a generator here would make p a cell variable,
                while todo[i] is not p:  # slower to read in the loop above)
                    i += 1
                outcome = decision.outcomes[i]
                before_version = (outcome.version - len(outcome.events) if type(outcome) is Accepted
                                  else outcome.current_version)  # type: ignore[union-attr]
                answer = self._too_large(p, aggregate_type, aggregate_id, before_version, problem, out)
                if retrying and (p.envelope.command_id or "") in retrying:
                    retrying = retrying - {p.envelope.command_id or ""}
                    streams_changed = True
                if answer is not None:
                    out.append(self._result_record(answer[0], answer[1], p.envelope))
                    new_seen.append(seen_command(answer[0], answer[1]))
                if i:  # the state before it: decide the commands before it again (pure: the
                    # same outcomes, whose records are in ``out`` already)
                    before = decide(entry, aggregate_id, state_now, version_now,
                                    inputs[start:start + i], self._route)
                    state_now, version_now = before.state, before.version
                start += i + 1
                size = 1
            if version_now != version:
                version = version_now
                deleted = state_now is None and version > 0
                snapshot = None if state_now is None else self.codec.encode(state_now)
                agg_state = state_now

        window, most = self.dedup.window_ms, self.dedup.max_per_aggregate
        if len(new_seen) == 1 and type(new_seen[0]) is tuple and not duplicates:
            record = current.remember_accepted(version, deleted, snapshot, *new_seen[0], window,
                                               most)
        else:
            seen = [s if type(s) is SeenCommand else accepted_seen(*s)  # type: ignore[misc]
                    for s in new_seen]
            if duplicates:
                self._answer_again(current, seen, duplicates, aggregate_type, aggregate_id, out)
            if not seen and version == current.version and not streams_changed:
                return StepResult(None, agg_state, out, deadlines)  # nothing to store
            record = current.remember(version, deleted, snapshot, seen, window, most)
        if streams_changed:
            record = record.with_streams(positions or {}, retrying or set())
        return StepResult(record, agg_state, out, deadlines)

    def _one(self, entry: AggregateEntry, aggregate_type: str, aggregate_id: str,
             current: AggregateRecord, rec: InputRecord, decoded: Any,
             watch: Watch | None) -> StepResult:
        """:meth:`apply` of one command record already read (``rec.envelope`` and ``payload``)
        on an aggregate that remembers no process manager's stream: the common case at large key
        spaces, one command per aggregate per batch, as one straight line. A plain acceptance
        whose records fit is written here; anything else (a duplicate, a derived id, a payload
        that cannot be read, a rejection, a crash, deadlines, a record over the limit) goes on
        through :meth:`_decided` from where this got, or (before the decision) through the
        general path, which writes the same records.
        ``tests/property/test_step_one_properties.py`` holds the two to the same outputs."""
        env = rec.envelope
        assert env is not None and rec.payload is not None
        cid = env.command_id or env.message_id
        if "\0" in cid or cid in current.seen_ids or cid.startswith(DERIVED_PREFIX):
            return self._general(entry, aggregate_type, aggregate_id, current, [rec], decoded, watch)
        try:
            command = self.codec.decode(rec.payload)
        except CqrsError:
            return self._general(entry, aggregate_type, aggregate_id, current, [rec], decoded, watch)
        snapshot = current.snapshot
        if decoded is UNDECODED:
            decoded = None if snapshot is None else self.codec.decode(snapshot)
        inputs = [_make_input(cid, command, env.expected_version, env.timestamp, env.correlation_id)]
        if watch is not None:
            watch.record, watch.since = rec, time.monotonic()
        decision = decide(entry, aggregate_id, decoded, current.version, inputs, self._route)
        if watch is not None:
            watch.record = None
        outcome = decision.outcomes[0]
        write_result = self._write_result
        if type(outcome) is not Accepted or outcome.deadlines or write_result is None:
            return self._hand_over(entry, aggregate_type, aggregate_id, current, decoded, rec,
                                   command, inputs, decision, watch)
        out: list[OutputRecord] = []
        limit = self.max_record_bytes
        if outcome.events:
            encode, events_topic = self.codec.encode, self.topics.events
            # as in _decided: only an event over the limit by this bound is counted exactly
            room = limit - EVENT_RECORD_FRAME_BYTES - (
                len(rec.key) + len(rec.value) if not rec.headers  # type: ignore[arg-type]
                else record_size(rec.key, rec.value, rec.headers))
            for new_event in outcome.events:
                key, value, headers = event_to_kafka(new_event, encode(new_event.event))
                if len(value) + len(new_event.type_name) > room and \
                        record_size(key, value, headers) > limit:
                    return self._hand_over(entry, aggregate_type, aggregate_id, current, decoded,
                                           rec, command, inputs, decision, watch)
                out.append(OutputRecord(events_topic, key, value, headers))
        try:
            result_bytes = write_result((
                cid, ACCEPTED, aggregate_type, aggregate_id, outcome.version, env.timestamp,
                rec.partition, rec.offset, [e.event_id for e in outcome.events], None, None,
                None, None))
        except Exception:  # noqa: BLE001 - a value it does not take: the general path says why
            result_bytes = b""
        if not result_bytes or len(result_bytes) + 4 * len(cid) > limit - RECORD_FRAME_BYTES:
            return self._hand_over(entry, aggregate_type, aggregate_id, current, decoded, rec,
                                   command, inputs, decision, watch)
        out.append(OutputRecord(self.topics.results, cid.encode(), result_bytes, [],
                                self._reply_partition(env), ACCEPTED))
        version, deleted, state = decision.version, current.deleted, decoded
        if version != current.version:
            state = decision.state
            deleted = state is None and version > 0
            snapshot = None if state is None else self.codec.encode(state)
        record = current.remember_accepted(
            version, deleted, snapshot, cid, env.timestamp, outcome.version, len(outcome.events),
            rec.partition, rec.offset, self.dedup.window_ms, self.dedup.max_per_aggregate)
        return StepResult(record, state, out, [])

    def _hand_over(self, entry: AggregateEntry, aggregate_type: str, aggregate_id: str,
                   current: AggregateRecord, decoded: Any, rec: InputRecord, command: Any,
                   inputs: list[CommandInput], decision: Decision,
                   watch: Watch | None) -> StepResult:
        """What :meth:`_one` does not write itself: the general path from its decision on."""
        assert rec.envelope is not None
        return self._decided(entry, aggregate_type, aggregate_id, current, decoded,
                             [_Pending(rec, rec.envelope, command)], inputs, decision, [], [],
                             None, None, False, watch)

    def _answer_again(self, current: AggregateRecord, new_seen: list[SeenCommand],
                      duplicates: list[tuple[Envelope, str]], aggregate_type: str,
                      aggregate_id: str, out: list[OutputRecord]) -> None:
        """Append to ``out`` the first answer again, byte for byte, of each command id seen
        before (in ``current``'s memory or earlier in the batch, ``new_seen``)."""
        by_id = {s.command_id: s for s in [*current.seen, *new_seen]}
        for dup_env, cid in duplicates:
            first = by_id.get(cid)
            if first is None:  # the first has no answer yet (a transient failure): neither has it
                continue
            answer = expand_seen(first, aggregate_type, aggregate_id)
            again = (self._fitting(self.codec.decode(first.result), first.result, _DUPLICATE_BYTES)
                     if answer is None else self._fitting(answer, None, _DUPLICATE_BYTES))
            if again is not None:  # it fit when first written: it does unless the limit shrank
                record = self._result_record(again[0], again[1], dup_env)
                # marked, so that counts of results (the status board's) do not count it twice
                record.headers = [DUPLICATE_HEADER]
                out.append(record)

    def timed_out(self, aggregate_type: str, aggregate_id: str, state: AggregateRecord | None,
                  rec: InputRecord, seconds: float) -> StepResult:
        """The answer to a command whose decision ran past the time budget: ``failed``
        (:class:`~cqrs.errors.DecisionTimeoutError`) and its dead letter, as a crashing handler's
        (a transient one by the app's retry policy, if it declares that error so), remembered
        so that a resend gets the same answer; the state is as before it."""
        current = state if state is not None else AggregateRecord()
        env = rec.envelope if rec.envelope is not None else from_kafka(rec.key, rec.value, rec.headers)[0]
        p = _Pending(rec, env, None)
        cid = env.command_id or env.message_id
        outcome = Failed(cid, DecisionTimeoutError.__name__,
                         f"the decision of command {cid!r} (aggregate {aggregate_type} "
                         f"{aggregate_id[:80]!r}) ran {seconds:.1f} s, past the processor's "
                         "budget ([processor] decision_budget_s): it was abandoned and nothing of "
                         "it was written; make the handler faster, or move slow work out of it",
                         current.version, (DecisionTimeoutError.__name__, "TimeoutError"))
        retry = self._retry(p, outcome)
        out = [self._dead_letter(rec, "handler", outcome.error_type, outcome.message, retry)]
        if retry is not None and not retry[1]:
            return StepResult(None, UNDECODED, out)  # the retry job delivers it again
        answer = self._fitting(self._result(p, aggregate_type, aggregate_id, outcome))
        if answer is None:
            return StepResult(None, UNDECODED, out)
        out.append(self._result_record(answer[0], answer[1], env))
        record = current.remember(current.version, current.deleted, current.snapshot,
                                  [seen_command(answer[0], answer[1])], self.dedup.window_ms,
                                  self.dedup.max_per_aggregate)
        return StepResult(record, UNDECODED, out)

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
            answer = self._fitting(CommandResult(
                command_id=env.command_id or env.message_id, status=FAILED,
                aggregate_type=env.aggregate_type, aggregate_id=env.aggregate_id, version=-1,
                timestamp=env.timestamp, source_partition=rec.partition, source_offset=rec.offset,
                error_type=type(exc).__name__, message=str(exc),
            ))
            if answer is not None:
                out.append(self._result_record(answer[0], answer[1], env))
        return out

    # ---- limits: what does not fit is answered, never written --------------------------------

    def _oversized_event(self, outcome: Accepted, new_event: NewEvent, key: bytes, value: bytes,
                         headers: Headers) -> str | None:
        """The reason when the record of ``new_event`` (of ``outcome``) would be over the record
        limit, else None."""
        limit = self.max_record_bytes
        size = record_size(key, value, headers)
        if size <= limit:
            return None
        n = new_event.version - outcome.events[0].version + 1
        return (f"its event {new_event.type_name} (version {new_event.version}, event {n:,} of "
                f"{len(outcome.events):,}) would be a {size:,}-byte Kafka record, over the limit "
                f"of {limit:,} bytes{_LIMIT_FROM}: make the event smaller (keep large data "
                f"elsewhere and put a reference in the event){_OR_RAISE}")

    def _oversized_result(self, result: CommandResult, encoded: bytes,
                          headers: int = 0) -> str | None:
        """The reason when the record of ``result`` (key: its command id; ``headers``: the bytes
        of its headers, record_size's count) would be over the record limit, else None."""
        limit = self.max_record_bytes - headers
        if RECORD_FRAME_BYTES + len(encoded) + 4 * len(result.command_id) <= limit:
            return None
        size = RECORD_FRAME_BYTES + len(encoded) + len(result.command_id.encode())
        if size <= limit:
            return None
        if result.status == ACCEPTED:
            what, advice = (f"accepted with {len(result.event_ids):,} events",
                            "return fewer events from one command (split the work over several "
                            "commands)")
        else:
            what, advice = (f"{result.status}, its reason {len((result.reason or '').encode()):,} "
                            "bytes", "give a shorter reason")
        return (f"its result ({what}) would be a {size:,}-byte Kafka record, over the limit of "
                f"{limit:,} bytes{_LIMIT_FROM}: {advice}{_OR_RAISE}")

    def _too_large(self, p: _Pending, aggregate_type: str, aggregate_id: str, version: int,
                   problem: str, out: list[OutputRecord]) -> tuple[CommandResult, bytes] | None:
        """Answer a command whose outputs do not fit: its dead letter (appended to ``out``) and
        its ``failed`` result (None: not even that fits)."""
        env, rec = p.envelope, p.record
        cid = env.command_id or env.message_id
        message = (f"command {cid!r} was not applied, nothing of it was written and aggregate "
                   f"{aggregate_type} {aggregate_id[:80]!r} is as it was before it: {problem}")
        out.append(self._dead_letter(rec, OUTPUT_STAGE, TOO_LARGE, message))
        return self._fitting(CommandResult(
            cid, FAILED, aggregate_type, aggregate_id, version, env.timestamp, rec.partition,
            rec.offset, [], None, None, TOO_LARGE, message))

    def _fitting(self, result: CommandResult, encoded: bytes | None = None,
                 headers: int = 0) -> tuple[CommandResult, bytes] | None:
        """``(result, its bytes)``, its texts (a crash's message, a rejection's reason) cut when
        its record (with ``headers`` bytes of headers) would be over the record limit; None when
        even that does not fit (a command id near the limit): no result can be written."""
        if encoded is None:
            encoded = self.codec.encode(result)
        if self._oversized_result(result, encoded, headers) is None:
            return result, encoded
        key_size = len(result.command_id.encode())
        for name in ("message", "reason"):
            text = getattr(result, name)
            if not text:
                continue
            over = RECORD_FRAME_BYTES + len(encoded) + key_size + headers - self.max_record_bytes
            # 16: the text's Avro length, a varint, may be shorter by a few bytes; no longer
            result = attrs.evolve(result, **{name: _cut_text(text, len(text.encode()) - over - 16)})
            encoded = self.codec.encode(result)
            if self._oversized_result(result, encoded, headers) is None:
                return result, encoded
        return None

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
        """The dead letter of ``rec``: its key, value and headers, and the ``cqrs.dlq.*``
        headers; cut to fit the record limit (see :meth:`_cut_letter`)."""
        original: Headers = [(k, v if v is not None else b"") for k, v in rec.headers]
        dlq: Headers = [
            (f"{DLQ_PREFIX}stage", stage.encode()),
            (f"{DLQ_PREFIX}error_type", error_type.encode()),
            (f"{DLQ_PREFIX}error", message.encode(errors="replace")),
            (f"{DLQ_PREFIX}topic", rec.topic.encode()),
            (f"{DLQ_PREFIX}partition", str(rec.partition).encode()),
            (f"{DLQ_PREFIX}offset", str(rec.offset).encode()),
        ]
        if retry is not None:  # a transient failure: the retry job's to deliver again or park
            dlq += [(f"{DLQ_PREFIX}transient", b"1"),
                    (f"{DLQ_PREFIX}attempt", str(retry[0]).encode()),
                    (f"{DLQ_PREFIX}final", b"1" if retry[1] else b"0")]
        if record_size(rec.key, rec.value, original) + record_size(None, None, dlq) \
                - RECORD_FRAME_BYTES > self.max_record_bytes:
            return self._cut_letter(rec, original, dlq)
        return OutputRecord(self.topics.dead_letters, rec.key, rec.value, original + dlq)

    def _cut_letter(self, rec: InputRecord, original: Headers, dlq: Headers) -> OutputRecord:
        """A dead letter over the record limit, cut until it fits: its error text to
        :data:`MAX_ERROR_TEXT` bytes, then the command's value, its headers, the error text
        further, the command's key; the original size of each part of the command cut in a
        ``cqrs.dlq.<part>_size`` header."""
        limit = self.max_record_bytes
        error = f"{DLQ_PREFIX}error"
        text = next(v for k, v in dlq if k == error).decode(errors="replace")

        def with_error(keep: int) -> Headers:
            return [(k, _cut_text(text, keep).encode() if k == error else v) for k, v in dlq]

        dlq = with_error(MAX_ERROR_TEXT)
        key, value, headers = rec.key, rec.value, original
        cut: Headers = []

        def over() -> int:
            return record_size(key, value, headers + dlq + cut) - limit

        if over() > 0 and value:
            cut.append((CUT_VALUE, str(len(value)).encode()))
            value = value[:max(0, len(value) - over())]
        if over() > 0 and headers:
            cut.append((CUT_HEADERS, str(sum(len(k.encode()) + len(v) for k, v in headers)).encode()))
            headers = []
        if over() > 0:  # a limit below a few kilobytes: the error text too
            dlq = with_error(max(0, len(_cut_text(text, MAX_ERROR_TEXT).encode()) - over()))
        if over() > 0 and key:
            cut.append((CUT_KEY, str(len(key)).encode()))
            key = key[:max(0, len(key) - over())]
        return OutputRecord(self.topics.dead_letters, key, value, headers + dlq + cut)


CUT_VALUE = f"{DLQ_PREFIX}value_size"  # a cut dead letter's original value size, in bytes
CUT_HEADERS = f"{DLQ_PREFIX}headers_size"  # ... of its original headers (names and values)
CUT_KEY = f"{DLQ_PREFIX}key_size"  # ... of its original key
_CUT = (CUT_VALUE, CUT_HEADERS, CUT_KEY)
_DUPLICATE_BYTES = record_size(None, None, [DUPLICATE_HEADER]) - RECORD_FRAME_BYTES
_LIMIT_FROM = f" (kafka message.max.bytes less {RECORD_MARGIN_BYTES:,})"
_OR_RAISE = (", or raise message.max.bytes in [kafka.extra] together with the topics' "
             "max.message.bytes")


def _was_cut(letter: OutputRecord) -> bool:
    """Whether the dead letter's copy of its command was cut to fit."""
    return any(k in _CUT for k, _ in letter.headers)


def _cut_text(text: str, keep: int) -> str:
    """``text`` if its UTF-8 is at most ``keep`` bytes, else its beginning and a note of its
    size, ``keep`` bytes in all (at least the note)."""
    data = text.encode(errors="replace")
    if len(data) <= keep:
        return text
    note = f" [... cut to fit Kafka's record limit: {len(data):,} bytes in all]"
    return data[:max(0, keep - len(note.encode()))].decode(errors="ignore") + note
