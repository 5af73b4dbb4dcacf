"""The records the command processor writes besides events: results and its own state.

Both are attrs classes carried by the app's Avro codec like any message (stable type names,
schemas in the schema store), so any consumer can read them.
"""

from __future__ import annotations

import datetime as _dt
from typing import Final

import attrs

from cqrs.domain._names import TYPE_ATTR

__all__ = [
    "ACCEPTED",
    "FAILED",
    "FRAMEWORK_CLASSES",
    "REJECTED",
    "AggregateRecord",
    "CommandResult",
    "SeenCommand",
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
class SeenCommand:
    """A command the processor has answered: its id, when it was issued, its encoded result."""

    command_id: str
    timestamp_ms: int
    result: bytes


@attrs.frozen
class AggregateRecord:
    """What the processor keeps per aggregate in Spark state (the KTable row).

    ``snapshot`` is the app-codec encoding of the aggregate, ``None`` before the first event and
    after a terminal event (``deleted``). ``seen`` holds the recent command ids for
    de-duplication, newest last, bounded by the configured window and count.
    """

    version: int = 0
    deleted: bool = False
    snapshot: bytes | None = None
    seen: list[SeenCommand] = attrs.field(factory=list)


FRAMEWORK_CLASSES: Final[tuple[type, ...]] = (CommandResult, SeenCommand, AggregateRecord)

# stable wire names, independent of where these classes live
for _cls in FRAMEWORK_CLASSES:
    setattr(_cls, TYPE_ATTR, f"cqrs.{_cls.__name__}")
