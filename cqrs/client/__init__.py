"""Sending commands to an app and reading its results and aggregate state."""

from __future__ import annotations

from cqrs.client.aio import AsyncCommandClient
from cqrs.client.command_client import CommandClient, Outgoing
from cqrs.client.encoding import encode_command
from cqrs.client.errors import (
    ClientClosedError,
    ClientError,
    CommandDataError,
    CommandDeliveryError,
    CommandTimeoutError,
    CommandTooLargeError,
    InvalidAggregateIdError,
    InvalidCommandIdError,
    UnknownCommandTypeError,
)
from cqrs.client.json_commands import command_from_json, resolve_command_type, to_jsonable
from cqrs.client.query import HistoryReader, StateReader
from cqrs.client.replies import ListenerStats, ResultFuture

__all__ = [
    "AsyncCommandClient",
    "ClientClosedError",
    "ClientError",
    "CommandClient",
    "CommandDataError",
    "CommandDeliveryError",
    "CommandTimeoutError",
    "CommandTooLargeError",
    "HistoryReader",
    "InvalidAggregateIdError",
    "InvalidCommandIdError",
    "ListenerStats",
    "Outgoing",
    "ResultFuture",
    "StateReader",
    "UnknownCommandTypeError",
    "command_from_json",
    "encode_command",
    "resolve_command_type",
    "to_jsonable",
]
