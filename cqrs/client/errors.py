"""Errors of the command client, the ``cqrs send`` command and the HTTP service.

Each names the offending value and says what to do; all derive from :class:`~cqrs.errors.CqrsError`
and from the builtin they resemble.
"""

from __future__ import annotations

from cqrs.errors import CqrsError, RecordTooLargeError

__all__ = [
    "ClientClosedError",
    "ClientError",
    "CommandDataError",
    "CommandDeliveryError",
    "CommandTooLargeError",
    "CommandTimeoutError",
    "InvalidAggregateIdError",
    "InvalidCommandIdError",
    "UnknownCommandTypeError",
]


class ClientError(CqrsError):
    """Root of the command client's errors."""


class UnknownCommandTypeError(ClientError, LookupError):
    """A command type name (or class) is not handled by the app; the message lists the known ones."""


class CommandDataError(ClientError, ValueError):
    """JSON data does not fit the command's schema; ``field`` names the offending field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidAggregateIdError(ClientError, ValueError):
    """An aggregate id is empty, not text, not encodable as a Kafka key, or too long for the
    key of its aggregate-state row in Cassandra (the id and the aggregate type together at most
    65,535 bytes of UTF-8); ``limit``: the longest id of its type, in bytes, when known."""

    def __init__(self, message: str, limit: int | None = None) -> None:
        super().__init__(message)
        self.limit = limit


class InvalidCommandIdError(ClientError, ValueError):
    """A command id (or correlation id) is empty, not text, or contains a NUL character."""


class CommandTimeoutError(ClientError, TimeoutError):
    """No result arrived in time. ``command_id`` is the id to resend with: the processor
    de-duplicates, so resending the same id never runs the command twice."""

    def __init__(self, command_id: str, aggregate_id: str, timeout: float) -> None:
        super().__init__(
            f"no result for command {command_id!r} (aggregate {aggregate_id!r}) within "
            f"{timeout:g} s: is the processor running? Resending with the same command id is "
            "safe (it is de-duplicated)"
        )
        self.command_id = command_id
        self.aggregate_id = aggregate_id
        self.timeout = timeout


class CommandDeliveryError(ClientError, RuntimeError):
    """Kafka did not accept the command record (the broker refused it or stayed unreachable)."""

    def __init__(self, command_id: str, reason: str) -> None:
        super().__init__(
            f"command {command_id!r} was not delivered to Kafka: {reason}; resend it with the "
            "same command id once Kafka is reachable"
        )
        self.command_id = command_id


class CommandTooLargeError(CommandDeliveryError, RecordTooLargeError):
    """The command's record is over the largest Kafka record the framework writes
    (:meth:`cqrs.config.KafkaSettings.max_record_bytes`): refused before it is sent. ``size``
    and ``limit`` are in bytes; resending does not help, a smaller command does."""

    def __init__(self, command_id: str, aggregate_id: str, command_type: str, size: int,
                 limit: int) -> None:
        ClientError.__init__(
            self,
            f"command {command_id!r} ({command_type}, aggregate {aggregate_id[:80]!r}) is a "
            f"{size:,}-byte Kafka record, over the limit of {limit:,} bytes (kafka "
            "message.max.bytes less a margin): it was not sent; send less data in one command "
            "(keep large data elsewhere and send a reference), or raise message.max.bytes in "
            "[kafka.extra] together with the topics' max.message.bytes")
        self.command_id = command_id
        self.size = size
        self.limit = limit


class ClientClosedError(ClientError, RuntimeError):
    """The client was closed: create a new one (or use it as a context manager)."""
