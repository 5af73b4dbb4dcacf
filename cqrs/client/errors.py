"""Errors of the command client, the ``cqrs send`` command and the HTTP service.

Each names the offending value and says what to do; all derive from :class:`~cqrs.errors.CqrsError`
and from the builtin they resemble.
"""

from __future__ import annotations

from cqrs.errors import CqrsError

__all__ = [
    "ClientClosedError",
    "ClientError",
    "CommandDataError",
    "CommandDeliveryError",
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
    """An aggregate id is empty, not text, or not encodable as a Kafka key."""


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


class ClientClosedError(ClientError, RuntimeError):
    """The client was closed: create a new one (or use it as a context manager)."""
