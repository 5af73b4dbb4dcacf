"""The records the command processor writes besides events: results and its own state.

Both are attrs classes carried by the app's Avro codec like any message (stable type names,
schemas in the schema store), so any consumer can read them.
"""

from __future__ import annotations

import array
import datetime as _dt
import struct
import sys
from collections.abc import Sequence
from typing import Final

import attrs

from cqrs.codec.binary import Mismatch, leading_strings
from cqrs.codec.single_object import HEADER_SIZE, MAGIC
from cqrs.domain._names import TYPE_ATTR
from cqrs.domain.decision import event_id_for
from cqrs.native import builder, native

__all__ = [
    "ACCEPTED",
    "FAILED",
    "FRAMEWORK_CLASSES",
    "REJECTED",
    "AggregateRecord",
    "CommandResult",
    "ResultHead",
    "ConversationOutcome",
    "accepted_seen",
    "SeenCommand",
    "expand_seen",
    "kept_indices",
    "result_head",
    "seen_command",
]

ACCEPTED: Final = "accepted"
REJECTED: Final = "rejected"
FAILED: Final = "failed"


@attrs.frozen
class CommandResult:
    """The outcome of one command, written to the command-results topic (key = command id).

    ``version`` is the aggregate's version after the command when accepted, else its current
    version. ``source_partition`` / ``source_offset`` locate the command in the commands topic.
    """

    command_id: str
    status: str  # accepted | rejected | failed
    aggregate_type: str
    aggregate_id: str
    version: int
    timestamp: _dt.datetime
    source_partition: int
    source_offset: int
    event_ids: list[str] = attrs.field(factory=list)
    reason: str | None = None
    code: str | None = None
    error_type: str | None = None
    message: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status == ACCEPTED


@attrs.frozen
class ResultHead:
    """What readers of the results topic group or count by: a result record's first fields."""

    command_id: str
    status: str
    aggregate_type: str
    aggregate_id: str


def result_head(value: bytes | None) -> ResultHead | None:
    """The command id, status and aggregate of a result record's value (a single-object
    :class:`CommandResult`, whose schema starts with these four strings), without decoding the
    rest; None when the value is not one. A result record has no headers (see
    docs/wire-format.md): counting by status or grouping by aggregate reads this."""
    if not value or value[:2] != MAGIC:
        return None
    try:
        return ResultHead(*leading_strings(value, HEADER_SIZE, 4))
    except (Mismatch, IndexError, UnicodeDecodeError):
        return None


@attrs.frozen
class SeenCommand:
    """A command the processor has answered: its id, when it was issued, and its result, either
    encoded (a CommandResult, single-object Avro) or, for a plain acceptance, compact (see
    :func:`seen_command`; :func:`expand_seen` gives the CommandResult back)."""

    command_id: str
    timestamp_ms: int
    result: bytes


# A plain acceptance (no reason, code or error) is remembered as its varying fields only:
# version, event count, source partition and offset, timestamp in microseconds. The rest is
# known where it is read (command id, aggregate) or derived (event ids from the versions):
# 33 bytes instead of ~130, and the dedup memory is most of an aggregate's state row.
_COMPACT_MARK: Final = b"\x01"  # an encoded result starts with C3 01 (single-object marker)
_COMPACT: Final = struct.Struct("<qIiqq")
_EPOCH: Final = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_MICRO: Final = _dt.timedelta(microseconds=1)
_UTC: Final = _dt.timezone.utc
_LAST_TIME: tuple[_dt.datetime, int, int] = (_EPOCH, 0, 0)  # a UTC time, its micros and ms


def seen_command(result: CommandResult, encoded: bytes) -> SeenCommand:
    """What the dedup memory keeps of an answer (``encoded``: ``result``'s bytes)."""
    if (result.status == ACCEPTED and result.reason is None and result.code is None
            and result.error_type is None and result.message is None):
        return accepted_seen(result.command_id, result.timestamp, result.version,
                             len(result.event_ids), result.source_partition, result.source_offset)
    return SeenCommand(result.command_id, _micros_ms(result.timestamp)[1], encoded)


def accepted_seen(command_id: str, timestamp: _dt.datetime, version: int, events: int,
                  source_partition: int, source_offset: int) -> SeenCommand:
    """What the dedup memory keeps of a plain acceptance (no reason, code or error), from the
    fields of its result: for a caller that has them without the :class:`CommandResult`."""
    micros, ms = _micros_ms(timestamp)
    return _make_seen(command_id, ms, _COMPACT_MARK + _COMPACT.pack(
        version, events, source_partition, source_offset, micros))


def _micros_ms(ts: _dt.datetime) -> tuple[int, int]:
    """An aware time's microseconds and milliseconds since the epoch."""
    global _LAST_TIME
    last = _LAST_TIME
    if ts.tzinfo is _UTC and ts == last[0]:  # the in-process runner's clock stands still
        return last[1], last[2]
    micros = (ts - _EPOCH) // _MICRO
    # as int(ts.timestamp() * 1000), which divides the same micros by 10**6 (true division)
    ms = int(micros / 1_000_000 * 1000)
    if ts.tzinfo is _UTC:
        _LAST_TIME = (ts, micros, ms)
    return micros, ms


def expand_seen(seen: SeenCommand, aggregate_type: str, aggregate_id: str) -> CommandResult | None:
    """The CommandResult of a compact entry of ``aggregate_type`` ``aggregate_id``'s memory;
    ``None`` for an entry that holds the encoded result (decode ``seen.result`` then)."""
    if not seen.result.startswith(_COMPACT_MARK):
        return None
    version, events, partition, offset, micros = _COMPACT.unpack_from(seen.result, 1)
    return CommandResult(
        seen.command_id, ACCEPTED, aggregate_type, aggregate_id, version,
        _EPOCH + _dt.timedelta(microseconds=micros), partition, offset,
        [event_id_for(aggregate_type, aggregate_id, v) for v in range(version - events + 1, version + 1)])


def kept_indices(times_ms: Sequence[int], window_ms: int, max_count: int) -> list[int]:
    """Which remembered commands (oldest first) stay: those issued within ``window_ms`` of the
    newest one, then at most the ``max_count`` newest of those. The one rule for dedup memory."""
    if not times_ms:
        return []
    cutoff = max(times_ms) - window_ms
    kept = [i for i, t in enumerate(times_ms) if t >= cutoff]
    return kept[-max_count:] if max_count > 0 else []


@attrs.frozen
class AggregateRecord:
    """What the processor keeps per aggregate in Spark state (the KTable row).

    ``snapshot`` is the app-codec encoding of the aggregate, ``None`` before the first event and
    after a terminal event (``deleted``). The recent command ids and their first results (the
    de-duplication memory, oldest first) are packed into four flat fields so that a batch reads
    them without decoding one record per command; use :meth:`of`, :meth:`seen_command_ids`,
    :attr:`seen` and :meth:`remember` rather than the packed fields.
    """

    version: int = 0
    deleted: bool = False
    snapshot: bytes | None = None
    seen_ids: str = ""  # command ids joined by NUL
    seen_times: bytes = b""  # int64 little endian per id: the command's timestamp in ms
    seen_sizes: bytes = b""  # uint32 little endian per id: length of its result
    seen_results: bytes = b""  # the encoded CommandResults, concatenated
    # commands sent by process managers, remembered forever (see cqrs.domain.process): per
    # stream (a process manager reacting to one aggregate's events), the highest (event
    # version, index) applied; and the derived ids that failed transiently and are waiting
    # for the retry job (they are run when they come back, though below the mark)
    streams: str = ""  # stream keys joined by NUL
    stream_marks: bytes = b""  # int64 little endian pairs per stream: version, index
    retrying: str = ""  # derived command ids joined by NUL
    # not stored (init=False keeps it out of the Avro schema; not compared): the oldest and
    # newest of ``seen_times``, set by :meth:`remember` on the record it makes (else computed
    # once, on first use), so that appending one command checks the dedup window in O(1)
    # instead of scanning every remembered time (~4 us at 100 remembered, a list or numpy)
    _time_bounds: tuple[int, int] | None = attrs.field(init=False, default=None, eq=False,
                                                       repr=False)

    @classmethod
    def of(cls, version: int = 0, deleted: bool = False, snapshot: bytes | None = None,
           seen: Sequence[SeenCommand] = ()) -> AggregateRecord:
        ids = [s.command_id for s in seen]
        for cid in ids:
            if "\0" in cid:
                raise ValueError(f"command id {cid!r} contains a NUL character")
        return cls(
            version, deleted, snapshot, "\0".join(ids),
            _pack("q", [s.timestamp_ms for s in seen]),
            _pack("I", [len(s.result) for s in seen]),
            b"".join(s.result for s in seen),
        )

    def seen_command_ids(self) -> list[str]:
        return self.seen_ids.split("\0") if self.seen_ids else []

    @property
    def seen(self) -> list[SeenCommand]:
        out, pos = [], 0
        for cid, ts, size in zip(self.seen_command_ids(), _unpack("q", self.seen_times),
                                 _unpack("I", self.seen_sizes), strict=True):
            out.append(SeenCommand(cid, ts, self.seen_results[pos:pos + size]))
            pos += size
        return out

    def remember(self, version: int, deleted: bool, snapshot: bytes | None,
                 new: Sequence[SeenCommand], window_ms: int, max_count: int) -> AggregateRecord:
        """The next record: new version and snapshot, ``new`` commands appended to the memory,
        trimmed by :func:`kept_indices` (without unpacking the remembered results)."""
        if len(new) == 1:  # the most common case by far: one new command per aggregate
            one = new[0]
            if "\0" in one.command_id:
                raise ValueError("a command id contains a NUL character")
            t = one.timestamp_ms
            if self.seen_times:
                lo, hi = self.time_bounds()
                lo, hi = (t, hi) if t < lo else (lo, t) if t > hi else (lo, hi)
            else:
                lo = hi = t
            if len(self.seen_times) // 8 < max_count and lo >= hi - window_ms:
                record = _make_record(
                    version, deleted, snapshot,
                    f"{self.seen_ids}\0{one.command_id}" if self.seen_ids else one.command_id,
                    self.seen_times + _ONE_TIME.pack(t),
                    self.seen_sizes + _ONE_SIZE.pack(len(one.result)),
                    self.seen_results + one.result,
                    self.streams, self.stream_marks, self.retrying)
                _SET_BOUNDS(record, "_time_bounds", (lo, hi))
                return record
            return (self._remember_dropping(version, deleted, snapshot, new, [t], window_ms,
                                            max_count)
                    or self._remember_trimmed(version, deleted, snapshot, new, window_ms,
                                              max_count))
        if any("\0" in s.command_id for s in new):
            raise ValueError("a command id contains a NUL character")
        new_times = [s.timestamp_ms for s in new]
        count = len(self.seen_times) // 8 + len(new)
        if new and count <= max_count:
            lo, hi = min(new_times), max(new_times)
            if self.seen_times:
                old_lo, old_hi = self.time_bounds()
                lo, hi = min(lo, old_lo), max(hi, old_hi)
            if lo >= hi - window_ms:
                # the common case, once per aggregate per batch: nothing falls out of the
                # memory, so the new commands are appended to the packed fields as they are
                # (packing all of a full memory's times again cost ~20 us)
                new_ids = "\0".join(s.command_id for s in new)
                record = _make_record(
                    version, deleted, snapshot,
                    f"{self.seen_ids}\0{new_ids}" if self.seen_ids else new_ids,
                    self.seen_times + _pack("q", new_times),
                    self.seen_sizes + _pack("I", [len(s.result) for s in new]),
                    self.seen_results + b"".join(s.result for s in new),
                    self.streams, self.stream_marks, self.retrying)
                _SET_BOUNDS(record, "_time_bounds", (lo, hi))
                return record
        return (self._remember_dropping(version, deleted, snapshot, new, new_times, window_ms,
                                        max_count)
                or self._remember_trimmed(version, deleted, snapshot, new, window_ms, max_count))

    def remember_accepted(self, version: int, deleted: bool, snapshot: bytes | None,
                          command_id: str, timestamp: _dt.datetime, answered: int, events: int,
                          source_partition: int, source_offset: int, window_ms: int,
                          max_count: int) -> AggregateRecord:
        """:meth:`remember` of one plain acceptance (the fields of :func:`accepted_seen`;
        ``answered``: the version its result names): the commonest step of the memory, one
        command per aggregate per batch, done natively (``cqrs_native``: the step ~6 us quicker
        a command) when nothing falls out of the memory; the same record either way."""
        if _remember_accepted is not None:
            record = _remember_accepted(self, _make_record, _UTC, command_id, timestamp, answered,
                                        events, source_partition, source_offset, version,
                                        deleted, snapshot, window_ms, max_count)
            if record is not None:
                return record  # type: ignore[no-any-return]
        return self.remember(version, deleted, snapshot,
                             [accepted_seen(command_id, timestamp, answered, events,
                                            source_partition, source_offset)],
                             window_ms, max_count)

    def _remember_dropping(self, version: int, deleted: bool, snapshot: bytes | None,
                           new: Sequence[SeenCommand], new_times: list[int], window_ms: int,
                           max_count: int) -> AggregateRecord | None:
        """:meth:`remember` when the commands that fall out of the memory are its oldest ones
        (a full memory, or a busy aggregate's ids expiring in order: the steady state of an
        aggregate with many commands): the packed fields cut after them and the new ones
        appended, as :meth:`_remember_trimmed` makes them, without unpacking the memory (a
        full one of 1,000 cost that ~300 us a command). None when it is not so."""
        old_count = len(self.seen_times) // 8
        if not old_count or not new or max_count <= 0:
            return None
        old_lo, old_hi = self.time_bounds()
        new_lo, new_hi = min(new_times), max(new_times)
        cutoff = max(old_hi, new_hi) - window_ms  # kept_indices' rule: kept are those >= it
        if new_lo < cutoff:
            return None  # a new command is out of the window at once
        count = old_count + len(new)
        drop = count - max_count if count > max_count else 0  # the oldest beyond the count
        old = None
        if old_lo < cutoff:  # some expire: only if they are the oldest ones
            import numpy as np

            old = np.frombuffer(self.seen_times, "<i8")
            expired = old < cutoff
            n_expired = int(np.count_nonzero(expired))
            if not expired[:n_expired].all():
                return None  # an expired one after a kept one: not a prefix
            drop = max(drop, n_expired)
        if drop == 0 or drop > old_count:
            return None
        if drop == old_count:
            kept_ids, lo, hi = "", new_lo, new_hi
        else:
            kept_ids = (self.seen_ids[self.seen_ids.index("\0") + 1:] if drop == 1
                        else self.seen_ids.split("\0", drop)[drop])
            if old_count - drop >= _MANY:
                if old is None:
                    import numpy as np

                    old = np.frombuffer(self.seen_times, "<i8")
                kept = old[drop:]
                lo, hi = min(int(kept.min()), new_lo), max(int(kept.max()), new_hi)
            else:
                kept_times = struct.unpack_from(f"<{old_count - drop}q", self.seen_times, 8 * drop)
                lo, hi = min(new_lo, *kept_times), max(new_hi, *kept_times)
        cut = sum(struct.unpack_from(f"<{drop}I", self.seen_sizes))  # bytes of results dropped
        new_ids = "\0".join(s.command_id for s in new)
        record = _make_record(
            version, deleted, snapshot,
            f"{kept_ids}\0{new_ids}" if kept_ids else new_ids,
            self.seen_times[8 * drop:] + _pack("q", new_times),
            self.seen_sizes[4 * drop:] + _pack("I", [len(s.result) for s in new]),
            self.seen_results[cut:] + b"".join(s.result for s in new),
            self.streams, self.stream_marks, self.retrying)
        _SET_BOUNDS(record, "_time_bounds", (lo, hi))
        return record

    def time_bounds(self) -> tuple[int, int]:
        """The oldest and newest remembered command times, ms (the memory must not be empty)."""
        bounds = self._time_bounds
        if bounds is None:  # a record read from its row: once, then kept by remember
            if len(self.seen_times) >= 8 * _MANY:
                import numpy as np

                old = np.frombuffer(self.seen_times, "<i8")
                bounds = (int(old.min()), int(old.max()))
            else:
                times = _unpack("q", self.seen_times)
                bounds = (min(times), max(times))
            _SET_BOUNDS(self, "_time_bounds", bounds)
        return bounds

    def _remember_trimmed(self, version: int, deleted: bool, snapshot: bytes | None,
                          new: Sequence[SeenCommand], window_ms: int,
                          max_count: int) -> AggregateRecord:
        """:meth:`remember` by unpacking everything: the reference, and the path when some
        commands fall out of the memory."""
        ids = self.seen_command_ids() + [s.command_id for s in new]
        times = _unpack("q", self.seen_times) + [s.timestamp_ms for s in new]
        sizes = _unpack("I", self.seen_sizes) + [len(s.result) for s in new]
        results = self.seen_results + b"".join(s.result for s in new)
        keep = kept_indices(times, window_ms, max_count)
        if len(keep) != len(ids):
            offsets = [0]
            for size in sizes:
                offsets.append(offsets[-1] + size)
            results = b"".join(results[offsets[i]:offsets[i + 1]] for i in keep)
            ids = [ids[i] for i in keep]
            times = [times[i] for i in keep]
            sizes = [sizes[i] for i in keep]
        record = AggregateRecord(version, deleted, snapshot, "\0".join(ids),
                                 _pack("q", times), _pack("I", sizes), results,
                                 self.streams, self.stream_marks, self.retrying)
        if times:
            _SET_BOUNDS(record, "_time_bounds", (min(times), max(times)))
        return record

    # ---- commands of process managers -------------------------------------------------------

    def stream_positions(self) -> dict[str, tuple[int, int]]:
        """Per stream, the highest (event version, index) of a derived command applied."""
        if not self.streams:
            return {}
        marks = _unpack("q", self.stream_marks)
        return {k: (marks[2 * i], marks[2 * i + 1])
                for i, k in enumerate(self.streams.split("\0"))}

    def retrying_ids(self) -> set[str]:
        return set(self.retrying.split("\0")) if self.retrying else set()

    def with_streams(self, positions: dict[str, tuple[int, int]],
                     retrying: set[str]) -> AggregateRecord:
        """This record with the process managers' marks and waiting ids replaced."""
        for key in [*positions, *retrying]:
            if "\0" in key:
                raise ValueError(f"stream or command id {key!r} contains a NUL character")
        keys = sorted(positions)
        record = attrs.evolve(
            self, streams="\0".join(keys),
            stream_marks=_pack("q", [n for k in keys for n in positions[k]]),
            retrying="\0".join(sorted(retrying)))
        _SET_BOUNDS(record, "_time_bounds", self._time_bounds)  # the same memory
        return record


_MANY = 64  # remembered times from which numpy finds their bounds faster than a list
_ONE_TIME: Final = struct.Struct("<q")
_ONE_SIZE: Final = struct.Struct("<I")
# sets the cached bounds of a (frozen) record: a cache of its own immutable fields, set once
_SET_BOUNDS: Final = object.__setattr__
# made with every field given, once or twice a command (see cqrs.native.builder)
_make_record: Final = builder(AggregateRecord)
_make_seen: Final = builder(SeenCommand)
_remember_accepted: Final = None if native is None else native.remember_accepted


def _pack(code: str, values: Sequence[int]) -> bytes:
    arr = array.array(code, values)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def _unpack(code: str, data: bytes) -> list[int]:
    arr = array.array(code)
    arr.frombytes(data)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()


@attrs.frozen
class ConversationOutcome:
    """The end of a conversation, written by a process manager to the conversation-outcomes
    topic (key = correlation id) when it sees one of its ``completes_on`` events; ``payload`` is
    that event, app-codec encoded."""

    correlation_id: str
    process_manager: str
    event_type: str
    event_id: str
    aggregate_type: str
    aggregate_id: str
    version: int
    timestamp: _dt.datetime
    payload: bytes = attrs.field(repr=False)  # the event, encoded: decode it with the app's codec


FRAMEWORK_CLASSES: Final[tuple[type, ...]] = (CommandResult, SeenCommand, AggregateRecord,
                                              ConversationOutcome)

# stable wire names, independent of where these classes live
for _cls in FRAMEWORK_CLASSES:
    setattr(_cls, TYPE_ATTR, f"cqrs.{_cls.__name__}")
