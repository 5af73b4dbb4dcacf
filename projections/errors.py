"""Errors of the read side; all derive from :class:`cqrs.errors.CqrsError`."""

from __future__ import annotations

from cqrs.errors import CqrsError

__all__ = [
    "CategoryKeyChangedError",
    "DeadLetterRaisedError",
    "GenerationError",
    "PersonalColumnError",
    "PersonalDataCopiedError",
    "PageTokenError",
    "ProjectionDefinitionError",
    "ProjectionError",
    "ProjectionStoreError",
    "RebuildDeadLettersError",
    "UnknownProjectionError",
    "ViewKeyError",
    "WaitTimeoutError",
]


class ProjectionError(CqrsError):
    """Root of the read-side errors."""


class ProjectionDefinitionError(ProjectionError, TypeError):
    """A Projection subclass is declared wrongly (bad name, column type, handler signature)."""


class UnknownProjectionError(ProjectionError, LookupError):
    """No projection of that name is declared in the app."""


class CategoryKeyChangedError(ProjectionError, ValueError):
    """A handler changed the order value of a category item after it was set (a changed group
    value moves the item instead)."""


class PersonalColumnError(ProjectionError, ValueError):
    """A view's personal column holds a value but the view names no data subject for it (its
    subject column is empty), so there is no key to seal it with."""


class PersonalDataCopiedError(ProjectionError, ValueError):
    """A handler copied an event's personal field into a view column that is not declared
    personal: it would be stored in clear and outlive forgetting the subject. The message
    names the projection, event field and column, never the value."""


class ProjectionStoreError(ProjectionError, RuntimeError):
    """The read-model store cannot be reached, created or written."""


class GenerationError(ProjectionError, RuntimeError):
    """A projection has no current generation (never run), or a rebuild is already under way."""


class RebuildDeadLettersError(ProjectionError, RuntimeError):
    """A rebuild dead-lettered events into its new generation, so it did not switch readers to
    it nor drop the one they use (``allow_dead_letters=True``, ``cqrs rebuild
    --allow-dead-letters``, switches anyway). The new generation is left as built, recorded as
    building: the next rebuild needs ``--force`` and starts over in a generation of its own."""

    def __init__(self, app_ref: str, app_name: str, projection: str, generation: int,
                 readers_on: int | None, dead_letters: int, events: int) -> None:
        readers = (f"readers stay on generation {readers_on} and it was not dropped"
                   if readers_on is not None else "readers still have no generation")
        again = f"cqrs rebuild {app_ref} {projection} --force"
        super().__init__(
            f"the rebuild of {app_name}/{projection} dead-lettered {dead_letters:,} of "
            f"{events:,} events into generation {generation}, so it did not switch: {readers} "
            f"(generation {generation} is left as built). See why with `cqrs projections dlq "
            f"{app_ref} list --projection {projection}`; fix the projection (a handler, an "
            f"upcaster) and run `{again}`, or accept a generation that lacks those events with "
            f"`{again} --allow-dead-letters`"
        )
        self.projection = projection
        self.generation = generation
        self.readers_on = readers_on
        self.dead_letters = dead_letters
        self.events = events


class PageTokenError(ProjectionError, ValueError):
    """A page token was not produced by this reader for this projection and group."""


class WaitTimeoutError(ProjectionError, TimeoutError):
    """``wait_for`` gave up before the projection applied the awaited aggregate version."""

    def __init__(self, projection: str, aggregate_id: str, version: int, seen: int | None,
                 timeout: float) -> None:
        seen_text = "no view yet" if seen is None else f"it is at version {seen}"
        super().__init__(
            f"projection {projection!r} did not reach version {version} of aggregate "
            f"{aggregate_id!r} within {timeout:g} s ({seen_text}); is the projector running "
            f"(`cqrs projections status`), or is the aggregate parked (`cqrs projections dlq list`)?"
        )
        self.projection = projection
        self.aggregate_id = aggregate_id
        self.version = version
        self.seen = seen
        self.timeout = timeout


class ViewKeyError(ProjectionError, RuntimeError):
    """``key_of`` of a re-keyed projection raised or returned something that is not a key.

    The batch fails (the projector stops and retries it from its checkpoint when restarted):
    an event without a view key cannot park a view, and dropping it would lose it for good.
    """


class DeadLetterRaisedError(ProjectionError, RuntimeError):
    """The local projector met events it could not apply (a handler failed, or the aggregate
    is parked): raised unless it was asked to collect them (``collect_dead_letters=True``),
    so that a test does not pass over a failing handler. The letters are in ``letters``."""

    def __init__(self, message: str, letters: list[object]) -> None:
        super().__init__(message)
        self.letters = letters
