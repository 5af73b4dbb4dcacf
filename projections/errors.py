"""Errors of the read side; all derive from :class:`cqrs.errors.CqrsError`."""

from __future__ import annotations

from cqrs.errors import CqrsError

__all__ = [
    "CategoryKeyChangedError",
    "DeadLetterRaisedError",
    "GenerationError",
    "PageTokenError",
    "ProjectionDefinitionError",
    "ProjectionError",
    "ProjectionStoreError",
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


class ProjectionStoreError(ProjectionError, RuntimeError):
    """The read-model store cannot be reached, created or written."""


class GenerationError(ProjectionError, RuntimeError):
    """A projection has no current generation (never run), or a rebuild is already under way."""


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
