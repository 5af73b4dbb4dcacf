"""cqrs: event sourcing and CQRS on Kafka, Spark Structured Streaming and Cassandra."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cqrs.domain import (
    Aggregate,
    Cancel,
    Command,
    CommandContext,
    CommandHandler,
    DomainModel,
    Event,
    ProcessManager,
    Reaction,
    ReactionContext,
    Schedule,
    Send,
    applies,
    command,
    event,
    type_name,
    type_version,
)
from cqrs.errors import ConfigError, CqrsError, Rejected
from cqrs.retries import Backoff, RetryPolicy

if TYPE_CHECKING:
    from cqrs.app import App
    from cqrs.codec import Codec, Upcaster, upcaster

__all__ = [
    "Aggregate",
    "App",
    "Backoff",
    "Cancel",
    "Codec",
    "Command",
    "CommandContext",
    "CommandHandler",
    "ConfigError",
    "CqrsError",
    "DomainModel",
    "Event",
    "ProcessManager",
    "Reaction",
    "ReactionContext",
    "Rejected",
    "RetryPolicy",
    "Schedule",
    "Send",
    "Upcaster",
    "__version__",
    "applies",
    "command",
    "event",
    "type_name",
    "type_version",
    "upcaster",
]

__version__ = "0.1.0"

# imported on first use so that ``import cqrs`` (and cqrs.domain) stays free of fastavro
_LAZY = {
    "App": "cqrs.app",
    "Codec": "cqrs.codec",
    "Upcaster": "cqrs.codec",
    "upcaster": "cqrs.codec",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cqrs' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
