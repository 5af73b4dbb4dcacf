"""The domain layer: commands, events, aggregates, handlers, the model and the decision function.

Imports only the standard library and attrs (a unit test enforces it).
"""

from __future__ import annotations

from cqrs.domain.aggregate import Aggregate, applies
from cqrs.domain.decision import (
    EVENT_ID_NAMESPACE,
    Accepted,
    CommandInput,
    Decision,
    Failed,
    NewEvent,
    Outcome,
    RejectedOutcome,
    decide,
    event_id_for,
    replay,
)
from cqrs.domain.deadlines import Cancel, DeadlineChange, Schedule
from cqrs.domain.handler import CommandContext, CommandHandler, HandlerRoute
from cqrs.domain.messages import (
    Command,
    Event,
    Message,
    command,
    event,
    is_command,
    is_event,
    is_terminal,
    type_name,
    type_version,
)
from cqrs.domain.model import AggregateEntry, DomainModel
from cqrs.domain.personal import FORGOTTEN, PersonalFields, personal, personal_fields
from cqrs.domain.process import ProcessManager, Reaction, ReactionContext, Send
from cqrs.errors import Rejected

__all__ = [
    "EVENT_ID_NAMESPACE",
    "FORGOTTEN",
    "Accepted",
    "Aggregate",
    "AggregateEntry",
    "Cancel",
    "Command",
    "CommandContext",
    "CommandHandler",
    "CommandInput",
    "DeadlineChange",
    "Decision",
    "DomainModel",
    "Event",
    "Failed",
    "HandlerRoute",
    "Message",
    "NewEvent",
    "Outcome",
    "PersonalFields",
    "ProcessManager",
    "Reaction",
    "ReactionContext",
    "Rejected",
    "RejectedOutcome",
    "Schedule",
    "Send",
    "applies",
    "command",
    "decide",
    "event",
    "event_id_for",
    "is_command",
    "is_event",
    "is_terminal",
    "personal",
    "personal_fields",
    "replay",
    "type_name",
    "type_version",
]
