"""Which handler failures are transient, and how long to wait before running a command again.

An app declares it (``App(..., retries=RetryPolicy(...))``); the command processor and the
retry job read it. Pure code: no Kafka, Spark or Cassandra.

- A handler failure whose exception type is declared **transient** (an unavailable service, a
  timeout) is not an answer: the processor writes the command to the dead-letter topic marked
  ``transient`` with its attempt number, writes no result and does not remember the command id,
  so the sender keeps waiting and the retry job can deliver the same command (same id) again.
- Any other failure (a bug, bad data) and every business rejection is an answer, as before.

The delay before attempt ``n + 1`` is ``initial_s * multiplier ** (n - 1)``, capped at
``max_s``, times a random factor in ``[1 - jitter, 1 + jitter]``. After ``max_attempts``
attempts the letter is parked. A :class:`Backoff` can be set per command type and per error
type; an error type's wins over a command type's, which wins over the default.

A **projection** whose handler failed parks the aggregate (or re-keyed view); the projector
replays its dead letters after ``projections`` (or ``by_projection[name]``): the same
:class:`Backoff`, every handler failure counts (a handler may be fixed and deployed meanwhile,
or call something that was down), ``None`` leaves the aggregate to operators at once.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from cqrs.domain.messages import type_name
from cqrs.errors import ConfigError

__all__ = ["ATTEMPT_HEADER", "Backoff", "RetryPolicy", "error_name"]

ATTEMPT_HEADER = "cqrs.retry.attempt"
"""Header of a command the retry job delivers again: its attempt number (2, 3...); absent on
the first run."""


def error_name(error: type[BaseException] | str) -> str:
    """How a failure's error type is written in results and dead letters: the exception class's
    ``__qualname__`` (what :class:`cqrs.domain.decision.Failed` records)."""
    if isinstance(error, str):
        return error
    if isinstance(error, type) and issubclass(error, BaseException):
        return error.__qualname__
    raise ConfigError(f"transient error {error!r} is neither an exception class nor its name")


def _positive(name: str) -> Any:
    def check(_: Any, attribute: Any, value: float) -> None:
        if not value > 0:
            raise ConfigError(f"Backoff {name} = {value!r}: use a number > 0")
    return check


@attrs.frozen
class Backoff:
    """Exponential backoff with jitter, and the attempts allowed (the first run included)."""

    initial_s: float = attrs.field(default=1.0, validator=_positive("initial_s"))
    multiplier: float = attrs.field(default=2.0, validator=_positive("multiplier"))
    max_s: float = attrs.field(default=300.0, validator=_positive("max_s"))
    jitter: float = 0.2
    max_attempts: int = 5

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"Backoff jitter = {self.jitter!r}: use a fraction in [0, 1)")
        if self.max_attempts < 1:
            raise ConfigError(f"Backoff max_attempts = {self.max_attempts!r}: use 1 or more")

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1 = the first run)."""
        if attempt < 1:
            raise ValueError(f"attempt {attempt!r}: attempts count from 1")
        base = min(self.max_s, self.initial_s * self.multiplier ** (attempt - 1))
        factor = 1.0 + (rng or random).uniform(-self.jitter, self.jitter)
        return base * factor


@attrs.frozen
class RetryPolicy:
    """The app's declaration: which error types are transient, and the backoff to use."""

    transient: tuple[str, ...] = attrs.field(
        default=(), converter=lambda errs: tuple(error_name(e) for e in errs))
    default: Backoff = Backoff()
    by_command: Mapping[str, Backoff] = attrs.field(
        factory=dict, converter=lambda m: {(k if isinstance(k, str) else type_name(k)): v
                                           for k, v in dict(m).items()})
    by_error: Mapping[str, Backoff] = attrs.field(
        factory=dict, converter=lambda m: {error_name(k): v for k, v in dict(m).items()})
    projections: Backoff | None = Backoff()
    by_projection: Mapping[str, Backoff | None] = attrs.field(
        factory=dict, converter=lambda m: {_projection_name(k): v for k, v in dict(m).items()})

    def is_transient(self, error_types: Iterable[str]) -> bool:
        """Whether a failure is retried: ``error_types`` are its exception's class and bases
        (``Failed.error_types``), so a subclass of a declared error is transient too."""
        return bool(self.transient) and any(e in self.transient for e in error_types)

    def backoff(self, command_type: str, error_type: str) -> Backoff:
        """The backoff for a command type and error type (type names, as on the wire)."""
        found = self.by_error.get(error_type) or self.by_command.get(command_type)
        return found if found is not None else self.default

    def projection_backoff(self, projection: str) -> Backoff | None:
        """The backoff of a projection's parked aggregates (``None``: not retried, parked for
        an operator at once)."""
        if projection in self.by_projection:
            return self.by_projection[projection]
        return self.projections


def _projection_name(projection: Any) -> str:
    """A projection's name from its name or its class (``name`` attribute)."""
    name = projection if isinstance(projection, str) else getattr(projection, "name", None)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"by_projection key {projection!r} is neither a projection name nor a "
                          "Projection class with a name")
    return name
