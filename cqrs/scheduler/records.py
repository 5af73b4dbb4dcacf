"""A deadline as the scheduler stores it: the decision's :class:`~cqrs.domain.deadlines.DeadlineChange`
with its command already as the record the commands topic takes (so firing needs no codec).
Shared by the processor's step, the process managers' job, the test kits and the store."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import Any

import attrs

from cqrs.domain.deadlines import DeadlineChange, due_ms_of
from cqrs.domain.messages import type_name
from cqrs.config import DEFAULT_MAX_RECORD_BYTES
from cqrs.envelope import Envelope, record_size, to_kafka
from cqrs.errors import RecordTooLargeError

__all__ = ["StoredDeadline", "deadline_json", "stored_deadline"]


@attrs.frozen
class StoredDeadline:
    """A deadline as stored: ``due_ms`` None is a cancellation (only ``owner`` and ``name``
    matter then)."""

    owner: str
    name: str
    due_ms: int | None
    target_type: str | None = None
    target_id: str | None = None
    command_id: str | None = None
    key: bytes | None = None
    value: bytes | None = None  # the command's record, as the commands topic takes it
    correlation_id: str | None = None
    command_type: str | None = None
    placed_ms: int | None = None  # where its due entry lies (set by the store)

    @property
    def cancelled(self) -> bool:
        return self.due_ms is None

    @property
    def due(self) -> _dt.datetime | None:
        """The due time (milliseconds, UTC), None for a cancellation."""
        return None if self.due_ms is None else _dt.datetime.fromtimestamp(
            self.due_ms / 1000, _dt.timezone.utc)



def stored_deadline(change: DeadlineChange, route: Callable[[Any], Any], codec: Any,
                    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> StoredDeadline:
    """``change`` as stored: a cancellation, or a schedule with its command's record (the
    command addressed to ``change.target_id``, with the deadline's derived id, stamped with
    the due time and the scheduling command's correlation id). ``route``: the app model's
    ``route`` (which aggregate type handles the command).

    :class:`~cqrs.errors.RecordTooLargeError` when that record would be over
    ``max_record_bytes``: it could never be sent, so the decision that schedules it fails now
    (the step answers its command ``failed``, a process manager dead-letters its event) rather
    than the scheduler failing at the due time, on every round."""
    if change.due is None:
        return StoredDeadline(change.owner, change.name, None)
    entry, _ = route(change.command)
    assert change.target_id is not None
    cid = change.command_id
    env = Envelope.for_command(
        change.command, command_id=cid, aggregate_type=entry.type_name,
        aggregate_id=change.target_id, timestamp=change.due, expected_version=None,
        correlation_id=change.correlation_id, causation_id=change.causation_id)
    key, value, headers = to_kafka(env, codec.encode(change.command))
    assert not headers, "a command record carries its envelope in its value"
    size = record_size(key, value, headers)
    if size > max_record_bytes:
        raise RecordTooLargeError(
            f"deadline {change.name!r} of {change.owner!r} would send {type_name(change.command)} "
            f"as a {size:,}-byte Kafka record, over the limit of {max_record_bytes:,} bytes: make "
            "the command smaller (keep large data elsewhere and put a reference in it)")
    return StoredDeadline(change.owner, change.name, due_ms_of(change.due), entry.type_name,
                          change.target_id, cid, key, value, change.correlation_id,
                          type_name(change.command))


def deadline_json(d: StoredDeadline) -> dict[str, Any]:
    """A pending deadline as JSON-ready data (CLI and HTTP)."""
    due = _dt.datetime.fromtimestamp((d.due_ms or 0) / 1000, _dt.timezone.utc)
    return {"name": d.name, "due": due.isoformat(), "command_type": d.command_type,
            "target_type": d.target_type, "target_id": d.target_id, "command_id": d.command_id,
            "correlation_id": d.correlation_id}
