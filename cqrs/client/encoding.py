"""How a command becomes a Kafka record: the one function every sender uses."""

from __future__ import annotations

import datetime as _dt
import uuid

from cqrs.app import App
from cqrs.codec.registry import Codec
from cqrs.client.errors import CommandTooLargeError, InvalidAggregateIdError
from cqrs.config import DEFAULT_MAX_RECORD_BYTES
from cqrs.domain.messages import type_name
from cqrs.envelope import (
    MAX_STATE_KEY_BYTES, Headers, check_aggregate_id, command_value, record_size,
)
from cqrs.errors import MalformedHeaderError

__all__ = ["encode_command"]


def encode_command(
    app: App,
    aggregate_id: str,
    command: object,
    *,
    expected_version: int | None = None,
    command_id: str | None = None,
    correlation_id: str | None = None,
    causation_id: str | None = None,
    timestamp: _dt.datetime | None = None,
    reply_partition: int | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    codec: Codec | None = None,
) -> tuple[str, bytes, bytes, Headers]:
    """``(command_id, key, value, headers)`` for ``command`` addressed to ``aggregate_id``.

    The aggregate type comes from the handler the model routes the command to; the timestamp
    (the command's time, which its events inherit) defaults to now, in UTC. ``reply_partition``
    asks the processor to write the result to that partition of the command-results topic, so
    a client need only read its own partition.

    Refused: an aggregate id that is empty or whose aggregate-state key (the id and the
    aggregate type) is over Cassandra's 65,535 bytes (:class:`InvalidAggregateIdError`), and a
    record over ``max_record_bytes`` (:class:`CommandTooLargeError`; a client passes
    :meth:`cqrs.config.KafkaSettings.max_record_bytes`).

    ``codec`` (default ``app.codec``) encodes the command: a command with personal fields needs
    one with a key store (a :class:`~cqrs.client.CommandClient` passes its own).
    """
    entry, _ = app.model.route(command)
    try:
        check_aggregate_id(aggregate_id, None, entry.type_name)
    except MalformedHeaderError as exc:
        longest = MAX_STATE_KEY_BYTES - len(entry.type_name.encode()) if aggregate_id else None
        raise InvalidAggregateIdError(str(exc), longest) from None
    cid = command_id or str(uuid.uuid4())
    if not cid or "\0" in cid:
        raise MalformedHeaderError(
            f"command id {cid!r} is empty or contains a NUL character: use printable text, "
            "e.g. a UUID"
        )
    if reply_partition is not None and (
        isinstance(reply_partition, bool) or not isinstance(reply_partition, int) or reply_partition < 0
    ):
        raise MalformedHeaderError(
            f"reply partition {reply_partition!r} is not a partition number: use an int >= 0 "
            "below the command-results topic's partition count"
        )
    # to_kafka(Envelope.for_command(...), payload), the same key, value and (no) headers,
    # without building the envelope
    message_type = type_name(command)
    value = command_value(
        cid, message_type, entry.type_name, timestamp or _dt.datetime.now(_dt.timezone.utc),
        (codec or app.codec).encode(command), expected_version, correlation_id or cid,
        causation_id, reply_partition)
    key = aggregate_id.encode()
    headers: Headers = []
    size = record_size(key, value, headers)
    if size > max_record_bytes:
        raise CommandTooLargeError(cid, aggregate_id, message_type, size, max_record_bytes)
    return cid, key, value, headers
