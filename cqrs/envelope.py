"""The message envelope and its mapping to a Kafka record (see docs/wire-format.md).

An **event** record is::

    key     = aggregate id, UTF-8
    value   = the payload, Avro single-object encoded
    headers = the envelope fields, UTF-8 text (ints in decimal, timestamps ISO-8601 UTC)

An event's headers are only those that cannot be derived: ``cqrs.message_type``,
``cqrs.aggregate_type``, ``cqrs.timestamp``, ``cqrs.version`` and ``cqrs.command_id``, plus
``cqrs.correlation_id`` when it is not the command id. A record with a ``cqrs.version`` header
and no ``cqrs.kind`` is an event; its id is :func:`~cqrs.domain.decision.event_id_for` its
aggregate and version, its causation its command id, its correlation its command id unless given
(a header, when present, wins: events written with all ten headers read the same). Every header
costs the producer ~0.2 µs and the broker ~0.3 µs per record (the broker parses headers when it
validates a batch), and the processor writes one event per accepted command.

A **command** record carries its envelope in the value instead, as one Avro record
(:class:`CommandRecord`, single-object encoded, the payload's bytes inside), and no headers:
only the processor reads commands, and a Python consumer pays ~1.5 us per header per record
to read headers (confluent-kafka builds a tuple per header), 12-18 us for a command's eight,
while the record decodes in ~2 us. Events keep their headers: projectors read them as columns
in Spark SQL, and any consumer can filter on them without Avro. Command records in the older
header form are still read.

``to_kafka`` / ``from_kafka`` are pure functions (no Kafka client import): the same code serves
the Python producer, the Spark job (which sees headers as ``array<struct<key, value>>``) and
tests. Unknown headers (tracing...) are ignored; a header given twice takes its last value.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Literal

import attrs

from cqrs.codec.binary import record_writer, values_reader
from cqrs.codec.schema import schema_for
from cqrs.codec.single_object import MAGIC, fingerprint
from cqrs.domain._names import TYPE_ATTR
from cqrs.domain.decision import NewEvent, event_id_for
from cqrs.domain.messages import type_name
from cqrs.errors import MalformedHeaderError, MissingHeaderError
from cqrs.native import builder, native

__all__ = [
    "COMMAND_RECORD_PREFIX",
    "command_value",
    "MAX_AGGREGATE_ID_BYTES",
    "MAX_STATE_KEY_BYTES",
    "CONTENT_TYPE",
    "EVENT_RECORD_FRAME_BYTES",
    "HEADER_FRAME_BYTES",
    "RECORD_FRAME_BYTES",
    "HEADER_PREFIX",
    "CommandRecord",
    "Envelope",
    "Headers",
    "check_aggregate_id",
    "MessageKind",
    "event_to_kafka",
    "from_kafka",
    "read_command",
    "record_size",
    "to_kafka",
]

CONTENT_TYPE: Final = "application/vnd.cqrs+avro-single-object"
HEADER_PREFIX: Final = "cqrs."
MessageKind = Literal["command", "event"]
Headers = list[tuple[str, bytes]]

MAX_AGGREGATE_ID_BYTES: Final = 65_535
"""The longest aggregate id (UTF-8 bytes): Cassandra's limit for a partition key, which the
read models key by. An aggregate's id is shorter still by its type: see
:data:`MAX_STATE_KEY_BYTES`."""

MAX_STATE_KEY_BYTES: Final = 65_535
"""Cassandra's limit on the bytes of a row's key values together: the aggregate-state row is
keyed by the aggregate id and the aggregate type (its clustering columns), so their UTF-8
lengths add up to at most this (Cassandra: ``Key length of 65547 is longer than maximum of
65535`` for a 65,535-byte id of a ``bank.Account``; measured on Cassandra 5.0)."""

# How Kafka counts a record, the way librdkafka checks it against ``message.max.bytes`` when
# it is produced (rd_kafka_msg_new0 refuses it with MSG_SIZE_TOO_LARGE): key + value +
# serialized headers + the record's v2 framing at its widest (RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD:
# the length, timestamp delta, offset delta, key and value lengths and header count as varints
# of 5, 10, 5, 5, 5, 5 bytes, and one byte of attributes). A header serializes as its name and
# value, each after a varint of its length (rd_kafka_header_add). The broker counts the whole
# record batch (these records and a 61-byte batch header) against the topic's
# ``max.message.bytes``, 1,048,588 by default, which is above librdkafka's 1,000,000.
RECORD_FRAME_BYTES: Final = 36
"""The framing librdkafka adds to a record's key, value and headers, at most."""
HEADER_FRAME_BYTES: Final = 10
"""The framing of one header beyond its name and value: two varint lengths, at most."""

_REQUIRED: Final = ("message_id", "message_type", "kind", "aggregate_type", "timestamp")
_EVENT_REQUIRED: Final = ("message_type", "aggregate_type", "timestamp")  # and a version
_OPTIONAL_STR: Final = ("command_id", "correlation_id", "causation_id")
_OPTIONAL_INT: Final = ("version", "expected_version", "reply_partition")
# (field, header) pairs, so reading a record builds no header name
_REQUIRED_HEADERS: Final = tuple((n, HEADER_PREFIX + n) for n in _REQUIRED)
_OPTIONAL_STR_HEADERS: Final = tuple((n, HEADER_PREFIX + n) for n in _OPTIONAL_STR)
_OPTIONAL_INT_HEADERS: Final = tuple((n, HEADER_PREFIX + n) for n in _OPTIONAL_INT)


@attrs.frozen(slots=True)
class Envelope:
    """Everything about a message except its payload."""

    message_id: str
    message_type: str  # stable type name of the payload class
    kind: MessageKind
    aggregate_type: str
    aggregate_id: str
    timestamp: _dt.datetime  # when the command was issued (events inherit it); tz-aware
    version: int | None = None  # events: the aggregate version this event produced
    expected_version: int | None = None  # commands: None = any, 0 = new, n = exactly n
    command_id: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    reply_partition: int | None = None  # commands: results-topic partition the sender listens on
    content_type: str = CONTENT_TYPE

    @classmethod
    def for_event(cls, e: NewEvent) -> Envelope:
        """The envelope of an event produced by the decision function."""
        return cls(
            message_id=e.event_id,
            message_type=e.type_name,
            kind="event",
            aggregate_type=e.aggregate_type,
            aggregate_id=e.aggregate_id,
            timestamp=e.timestamp,
            version=e.version,
            command_id=e.causation_id,
            correlation_id=e.correlation_id,
            causation_id=e.causation_id,
        )

    @classmethod
    def for_command(
        cls,
        command: object,
        *,
        command_id: str,
        aggregate_type: str,
        aggregate_id: str,
        timestamp: _dt.datetime,
        expected_version: int | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        reply_partition: int | None = None,
    ) -> Envelope:
        """The envelope of a command sent by a client."""
        return cls(
            message_id=command_id,
            message_type=type_name(command),
            kind="command",
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            timestamp=timestamp,
            expected_version=expected_version,
            command_id=command_id,
            correlation_id=correlation_id or command_id,
            causation_id=causation_id,
            reply_partition=reply_partition,
        )


@attrs.frozen(slots=True)
class CommandRecord:
    """The value of a command record: the command's envelope and its payload (the command,
    single-object encoded) in one Avro record, wire name ``cqrs.CommandRecord``. The key is the
    aggregate id, as for events; the message id is the command id."""

    command_id: str
    message_type: str
    aggregate_type: str
    timestamp: _dt.datetime
    payload: bytes
    expected_version: int | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    reply_partition: int | None = None


setattr(CommandRecord, TYPE_ATTR, "cqrs.CommandRecord")
_COMMAND_SCHEMA: Final = schema_for(CommandRecord)
COMMAND_RECORD_PREFIX: Final = MAGIC + fingerprint(_COMMAND_SCHEMA)
"""The first 10 bytes of every command record's value (marker and schema fingerprint)."""
_write_command = record_writer(CommandRecord, _COMMAND_SCHEMA, COMMAND_RECORD_PREFIX)
# the record's field values as a tuple: the processor builds the envelope of them, no record
_read_command_values = values_reader(CommandRecord, _COMMAND_SCHEMA)
assert _write_command is not None and _read_command_values is not None, \
    "CommandRecord codec not generated"
_PREFIX_SIZE: Final = len(COMMAND_RECORD_PREFIX)
# the same bytes from the fields' values, in CommandRecord's order: no record object to build
_write_command_values = record_writer(CommandRecord, _COMMAND_SCHEMA, COMMAND_RECORD_PREFIX,
                                      tuple(f.name for f in attrs.fields(CommandRecord)))


def command_value(command_id: str, message_type: str, aggregate_type: str,
                  timestamp: _dt.datetime, payload: bytes, expected_version: int | None = None,
                  correlation_id: str | None = None, causation_id: str | None = None,
                  reply_partition: int | None = None) -> bytes:
    """The value of a command's record: ``to_kafka(envelope, payload)[1]`` for the envelope of
    :meth:`Envelope.for_command` with these fields (``correlation_id`` as the envelope holds it:
    already defaulted to the command id), the same bytes and checks without building the
    envelope and the record (~2 us a command, every sender)."""
    _check_aware(timestamp)  # the same check (and error) as the header form
    if _write_command_values is not None:
        try:
            return _write_command_values(None, (  # type: ignore[no-any-return]
                command_id, message_type, aggregate_type, timestamp, bytes(payload),
                expected_version, correlation_id, causation_id, reply_partition))
        except Exception:  # noqa: BLE001, S110 - a value of the wrong type: the checked path
            pass  # below names it
    return _command_value(Envelope(
        command_id, message_type, "command", aggregate_type, "", timestamp, None,
        expected_version, command_id, correlation_id, causation_id, reply_partition), payload)


def _command_value(envelope: Envelope, payload: bytes) -> bytes:
    _check_aware(envelope.timestamp)  # the same check (and error) as the header form
    if envelope.command_id not in (None, envelope.message_id):
        raise MalformedHeaderError(
            f"command envelope has message id {envelope.message_id!r} and command id "
            f"{envelope.command_id!r}: a command's message id is its command id")
    rec = CommandRecord(
        envelope.message_id, envelope.message_type, envelope.aggregate_type, envelope.timestamp,
        bytes(payload), envelope.expected_version, envelope.correlation_id,
        envelope.causation_id, envelope.reply_partition)
    try:
        return _write_command(rec)  # type: ignore[misc]
    except Exception:  # noqa: BLE001 - a value of the wrong type: the checked path names it
        import io

        from fastavro import schemaless_writer

        from cqrs.codec.values import record_to_avro

        buf = io.BytesIO()
        buf.write(COMMAND_RECORD_PREFIX)
        schemaless_writer(buf, _COMMAND_SCHEMA, record_to_avro(rec, "command envelope"))
        return buf.getvalue()


def _envelope_of(rec: CommandRecord, aggregate_id: str) -> Envelope:
    return Envelope(rec.command_id, rec.message_type, "command", rec.aggregate_type, aggregate_id,
                    rec.timestamp, None, rec.expected_version, rec.command_id,
                    rec.correlation_id, rec.causation_id, rec.reply_partition)


def read_command(aggregate_id: str, value: bytes) -> tuple[Envelope, bytes] | None:
    """``(envelope, payload)`` of a well-formed command record's value, or ``None``: the
    processor's hot path (no error texts); :func:`from_kafka` names what is wrong."""
    if not value.startswith(COMMAND_RECORD_PREFIX):
        return None
    try:  # CommandRecord's fields, in order (a record object only to copy it cost ~0.8 us)
        (command_id, message_type, aggregate_type, timestamp, payload, expected_version,
         correlation_id, causation_id, reply_partition) = \
            _read_command_values(value, _PREFIX_SIZE)  # type: ignore[misc]
    except Exception:  # noqa: BLE001 - truncated, garbled: from_kafka says what
        return None
    return _make_envelope(command_id, message_type, "command", aggregate_type, aggregate_id,
                          timestamp, None, expected_version, command_id, correlation_id,
                          causation_id, reply_partition, CONTENT_TYPE), payload


_make_envelope: Final = builder(Envelope)  # every field given: a command record's envelope


def _decode_command(value: bytes, aggregate_id: str) -> tuple[Envelope, bytes]:
    found = read_command(aggregate_id, value)
    if found is not None:
        return found
    import io

    from fastavro import schemaless_reader

    from cqrs.codec.values import record_from_avro

    try:  # fastavro reads what the generated reader does not (and names the problem)
        raw = schemaless_reader(io.BytesIO(value[_PREFIX_SIZE:]), _COMMAND_SCHEMA, None)
        rec = record_from_avro(CommandRecord, raw)
    except Exception as exc:  # noqa: BLE001
        raise MalformedHeaderError(
            f"command record of aggregate {aggregate_id!r} is not a readable cqrs.CommandRecord "
            f"({type(exc).__name__}: {exc}): it was garbled or truncated on the way") from None
    return _envelope_of(rec, aggregate_id), rec.payload


def _check_aware(ts: _dt.datetime) -> None:
    """Raise :class:`MalformedHeaderError` unless ``ts`` is timezone-aware (a command record
    carries it as micros since the epoch: checked, not formatted, which cost ~1 us a command)."""
    if ts.tzinfo is None or ts.utcoffset() is None:
        raise MalformedHeaderError(
            f"envelope timestamp {ts!r} is naive: use a timezone-aware datetime "
            "(e.g. datetime.now(timezone.utc))"
        )


def _timestamp_text(ts: _dt.datetime) -> str:
    _check_aware(ts)
    return ts.astimezone(_dt.timezone.utc).isoformat(timespec="microseconds")


def to_kafka(envelope: Envelope, payload: bytes) -> tuple[bytes, bytes, Headers]:
    """``(key, value, headers)`` of the Kafka record carrying ``payload`` in ``envelope``: for
    a command a :class:`CommandRecord` value and no headers, for an event the payload and the
    envelope in headers."""
    if envelope.kind == "command":
        return envelope.aggregate_id.encode(), _command_value(envelope, payload), []
    derived = _derived_event_fields(envelope)
    headers: Headers = []
    if envelope.content_type != CONTENT_TYPE:
        headers.append(("content-type", envelope.content_type.encode()))
    for name in _REQUIRED:
        if name in derived:
            continue
        value = getattr(envelope, name)
        text = _timestamp_text(value) if name == "timestamp" else str(value)
        headers.append((HEADER_PREFIX + name, text.encode()))
    for name in (*_OPTIONAL_INT, *_OPTIONAL_STR):
        value = getattr(envelope, name)
        if value is not None and name not in derived:
            headers.append((HEADER_PREFIX + name, str(value).encode()))
    return envelope.aggregate_id.encode(), bytes(payload), headers


def _derived_event_fields(envelope: Envelope) -> set[str]:
    """The fields of an event envelope that :func:`from_kafka` derives when their header is
    absent (see the module doc), and that ``to_kafka`` therefore leaves out."""
    if envelope.kind != "event" or envelope.version is None:
        return set()
    if envelope.command_id is not None and None in (envelope.causation_id, envelope.correlation_id):
        return set()  # the reader would fill the None in: write every header, the kind too
    derived = {"kind"}
    if envelope.message_id == event_id_for(envelope.aggregate_type, envelope.aggregate_id,
                                           envelope.version):
        derived.add("message_id")
    if envelope.command_id is not None:
        if envelope.causation_id == envelope.command_id:
            derived.add("causation_id")
        if envelope.correlation_id == envelope.command_id:
            derived.add("correlation_id")
    return derived


# header tuples of the few distinct type names a processor writes, built once each
_MESSAGE_TYPE_HEADERS: dict[str, tuple[str, bytes]] = {}
_AGGREGATE_TYPE_HEADERS: dict[str, tuple[str, bytes]] = {}
_UTC: Final = _dt.timezone.utc
# the last UTC time an event header was made for, and the header (UTC: one text per instant)
_LAST_TIME_HEADER: tuple[_dt.datetime, tuple[str, bytes]] = (
    _dt.datetime(1970, 1, 1, tzinfo=_UTC), ("cqrs.timestamp", b"1970-01-01T00:00:00.000000+00:00"))


def _python_utc_text(ts: _dt.datetime) -> bytes:
    return ts.isoformat(timespec="microseconds").encode()


# a UTC time's header text: the same bytes from the datetime's fields, ~10x quicker, when the
# native module is installed
_utc_text: Callable[[_dt.datetime], bytes] = _python_utc_text if native is None else native.utc_text


def event_to_kafka(e: NewEvent, payload: bytes) -> tuple[bytes, bytes, Headers]:
    """``to_kafka(Envelope.for_event(e), payload)``, the same bytes and headers in the same
    order, without building the envelope: the processor writes one of these per event."""
    type_header = _MESSAGE_TYPE_HEADERS.get(e.type_name)
    if type_header is None:
        type_header = _MESSAGE_TYPE_HEADERS[e.type_name] = ("cqrs.message_type", e.type_name.encode())
    aggregate_header = _AGGREGATE_TYPE_HEADERS.get(e.aggregate_type)
    if aggregate_header is None:
        aggregate_header = _AGGREGATE_TYPE_HEADERS[e.aggregate_type] = (
            "cqrs.aggregate_type", e.aggregate_type.encode())
    global _LAST_TIME_HEADER
    ts = e.timestamp
    last = _LAST_TIME_HEADER
    if ts.tzinfo is _UTC and ts == last[0]:  # the events of one command share its time
        time_header = last[1]
    elif ts.tzinfo is _UTC:
        time_header = ("cqrs.timestamp", _utc_text(ts))
        _LAST_TIME_HEADER = (ts, time_header)  # replaced whole: safe for threads
    else:
        time_header = ("cqrs.timestamp", _timestamp_text(ts).encode())
    command_id = e.causation_id
    headers = [
        type_header,
        aggregate_header,
        time_header,
        ("cqrs.version", str(e.version).encode()),
        ("cqrs.command_id", command_id.encode()),
    ]
    if e.correlation_id != command_id:
        headers.append(("cqrs.correlation_id", e.correlation_id.encode()))
    return e.aggregate_id.encode(), bytes(payload), headers


def _header_map(headers: Iterable[Any] | None) -> dict[str, bytes | None]:
    found: dict[str, bytes | None] = {}
    for item in headers or ():
        if type(item) is tuple and len(item) == 2:  # the common case, without an ABC check
            k, v = item
        elif isinstance(item, Sequence) and len(item) == 2:
            k, v = item
        else:  # a Spark Row / struct with .key / .value
            k, v = item["key"], item["value"]
        if type(k) is not str:
            k = k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
        found[k] = v if v is None or type(v) is bytes else bytes(v)
    return found


def _text(found: dict[str, bytes | None], name: str, required: bool) -> str | None:
    raw = found.get(name)
    if raw is None:
        if required:
            raise MissingHeaderError(
                f"Kafka record has no {name!r} header (headers present: {sorted(found)}): it was "
                "not produced through cqrs.envelope.to_kafka; send commands with the cqrs client"
            )
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedHeaderError(
            f"header {name!r} = {raw!r} is not UTF-8 text: the producer garbled it"
        ) from None


def record_size(key: bytes | None, value: bytes | None,
                headers: Sequence[tuple[str, bytes | None]] | None = None) -> int:
    """The bytes a Kafka record counts against the producers' ``message.max.bytes``, as
    librdkafka counts them (see the constants above; header names are UTF-8, one byte a
    character in the framework's headers): the figure to compare with
    :meth:`cqrs.config.KafkaSettings.max_record_bytes`."""
    size = RECORD_FRAME_BYTES + (len(key) if key else 0) + (len(value) if value else 0)
    for name, header_value in headers or ():
        size += HEADER_FRAME_BYTES + len(name.encode()) + (len(header_value) if header_value else 0)
    return size


EVENT_RECORD_FRAME_BYTES: Final = (
    RECORD_FRAME_BYTES + 6 * HEADER_FRAME_BYTES
    + len("cqrs.message_type" "cqrs.aggregate_type" "cqrs.timestamp" "cqrs.version"
          "cqrs.command_id" "cqrs.correlation_id")
    + len("2026-01-01T00:00:00.000000+00:00") + 20)  # the timestamp text, a version's digits
"""What an event record of :func:`event_to_kafka` holds besides its key, its payload, its type
names and its command and correlation ids, at most: framing, header names, timestamp and
version. With those it bounds the record's :func:`record_size` without counting its headers."""


def check_aggregate_id(aggregate_id: str, size: int | None = None,
                       aggregate_type: str | None = None) -> None:
    """Raise :class:`MalformedHeaderError` for an empty aggregate id or one longer than
    :data:`MAX_AGGREGATE_ID_BYTES` (``size``: its UTF-8 length, when known); with
    ``aggregate_type``, also for an id whose state row's key (id and type) would be longer than
    :data:`MAX_STATE_KEY_BYTES`."""
    if not aggregate_id:
        raise MalformedHeaderError(
            "the aggregate id (the record key) is empty: every command and event names its "
            "aggregate")
    size = len(aggregate_id.encode()) if size is None else size
    if size > MAX_AGGREGATE_ID_BYTES:
        raise MalformedHeaderError(
            f"the aggregate id {aggregate_id[:40]!r}... is {size:,} bytes long: the limit is "
            f"{MAX_AGGREGATE_ID_BYTES:,} (Cassandra's for a key); use a shorter id, e.g. a hash")
    if aggregate_type is not None:
        type_size = len(aggregate_type.encode())
        if size + type_size > MAX_STATE_KEY_BYTES:
            raise MalformedHeaderError(
                f"the aggregate id {aggregate_id[:40]!r}... is {size:,} bytes long: with its "
                f"type {aggregate_type!r} ({type_size} bytes) that is a {size + type_size:,}-"
                f"byte key of the aggregate-state row, over Cassandra's {MAX_STATE_KEY_BYTES:,}: "
                f"ids of {aggregate_type} may have {MAX_STATE_KEY_BYTES - type_size:,} bytes at "
                "most; use a shorter id, e.g. a hash")


def from_kafka(
    key: bytes | None, value: bytes | None, headers: Iterable[Any] | None
) -> tuple[Envelope, bytes]:
    """``(envelope, payload)`` of a Kafka record written by :func:`to_kafka`."""
    if key is None:
        raise MissingHeaderError(
            "Kafka record has no key: the key must be the aggregate id (UTF-8)"
        )
    if value is None:
        raise MissingHeaderError(
            "Kafka record has no value (a tombstone?): commands and events carry a payload"
        )
    try:
        aggregate_id = bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedHeaderError(f"record key {key!r} is not a UTF-8 aggregate id") from None
    check_aggregate_id(aggregate_id, len(key))
    if bytes(value[:_PREFIX_SIZE]) == COMMAND_RECORD_PREFIX:
        return _decode_command(bytes(value), aggregate_id)
    found = _header_map(headers)
    fields: dict[str, Any] = {"aggregate_id": aggregate_id}
    # an event (a version, no kind) may leave out what is derived from the rest
    lean_event = HEADER_PREFIX + "kind" not in found and found.get(HEADER_PREFIX + "version") is not None
    for name, header in _REQUIRED_HEADERS:
        raw = found.get(header)
        if raw is not None and type(raw) is bytes and raw.isascii():  # most headers: at once
            fields[name] = raw.decode("ascii")
        else:
            fields[name] = _text(found, header, not lean_event or name in _EVENT_REQUIRED)
    if lean_event:
        fields["kind"] = "event"
    if fields["kind"] not in ("command", "event"):
        raise MalformedHeaderError(
            f"header 'cqrs.kind' = {fields['kind']!r}: expected 'command' or 'event'"
        )
    try:
        ts = _dt.datetime.fromisoformat(fields["timestamp"])
    except ValueError:
        raise MalformedHeaderError(
            f"header 'cqrs.timestamp' = {fields['timestamp']!r} is not an ISO-8601 datetime "
            "such as 2024-01-01T00:00:00.000000+00:00"
        ) from None
    if ts.tzinfo is None:
        raise MalformedHeaderError(
            f"header 'cqrs.timestamp' = {fields['timestamp']!r} has no UTC offset: add +00:00"
        )
    fields["timestamp"] = ts
    for name, header in _OPTIONAL_INT_HEADERS:
        if header not in found:
            continue
        text = _text(found, header, False)
        if text is not None:
            try:
                fields[name] = int(text)
            except ValueError:
                raise MalformedHeaderError(
                    f"header {HEADER_PREFIX + name!r} = {text!r} is not an integer"
                ) from None
    for name, header in _OPTIONAL_STR_HEADERS:
        fields[name] = _text(found, header, False) if header in found else None
    if lean_event:
        command_id = fields["command_id"]
        if fields["message_id"] is None:
            fields["message_id"] = event_id_for(fields["aggregate_type"], aggregate_id,
                                                fields["version"])
        if command_id is not None:
            fields["causation_id"] = fields["causation_id"] or command_id
            fields["correlation_id"] = fields["correlation_id"] or command_id
    content_type = _text(found, "content-type", False) or CONTENT_TYPE
    if content_type != CONTENT_TYPE:
        raise MalformedHeaderError(
            f"content-type {content_type!r} is not {CONTENT_TYPE!r}: this record was not "
            "written by the cqrs codec"
        )
    return Envelope(content_type=content_type, **fields), bytes(value)
