"""Process managers at run time: the pure reactor, the instance table and the Spark query.

The declarations (:class:`~cqrs.domain.process.ProcessManager`, ``Send``, ``Reaction``) live in
the domain layer; this package runs them.
"""

from __future__ import annotations

from cqrs.process.reactor import (
    Instance, ProcessManagerError, ReactionFailure, Reactor, ReactorOutput, SentCommand,
    SourceEvent, process_manager_of,
)

__all__ = [
    "Instance", "ProcessManagerError", "ReactionFailure", "Reactor", "ReactorOutput",
    "SentCommand", "SourceEvent", "process_manager_of",
]
