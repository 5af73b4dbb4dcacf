"""Given / when / then tests of aggregates, on the same decision function as the Spark job.

>>> test = AggregateTest(bank, Account)
>>> test.given(AccountOpened("ann"), Deposited(10)).when(Withdraw(3)).then(Withdrawn(3))
>>> test.given(AccountOpened("ann")).when(Withdraw(3)).then_rejected(code="insufficient_funds")

Every event, command and resulting state is also round-tripped through the app's Avro codec
(``check_serialization=True``), so a class the codec cannot carry fails here, not in production.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import pprint
from typing import Any

import attrs

from cqrs.codec.registry import Codec
from cqrs.domain.aggregate import Aggregate
from cqrs.domain.decision import (
    Accepted,
    CommandInput,
    Decision,
    Failed,
    NewEvent,
    Outcome,
    RejectedOutcome,
    decide,
    replay,
)
from cqrs.domain.model import AggregateEntry, DomainModel

__all__ = ["AggregateTest", "Given", "When"]

DEFAULT_TIMESTAMP = _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)


def _diff(expected: Any, actual: Any) -> str:
    lines = difflib.unified_diff(
        pprint.pformat(expected, width=90).splitlines(),
        pprint.pformat(actual, width=90).splitlines(),
        "expected",
        "actual",
        lineterm="",
    )
    return "\n".join(lines)


def _attribute_names(state: Any) -> list[str]:
    """The public attributes of a state object, for an error message."""
    if attrs.has(type(state)):
        return [f.name for f in attrs.fields(type(state)) if not f.name.startswith("_")]
    return sorted(k for k in vars(state) if not k.startswith("_")) if hasattr(state, "__dict__") else []


class AggregateTest:
    """Entry point: ``AggregateTest(app_or_model, AggregateClass)``."""

    def __init__(
        self,
        app_or_model: Any,
        aggregate: type[Aggregate],
        *,
        aggregate_id: str = "test-aggregate-1",
        timestamp: _dt.datetime = DEFAULT_TIMESTAMP,
        check_serialization: bool = True,
    ) -> None:
        model = app_or_model if isinstance(app_or_model, DomainModel) else app_or_model.model
        self.entry: AggregateEntry = model.entry(aggregate)
        self.aggregate_id = aggregate_id
        self.timestamp = timestamp
        self.codec: Codec | None = None
        if check_serialization:
            self.codec = Codec(model.message_classes(), upcasters=getattr(app_or_model, "upcasters", ()))

    def given(self, *events: Any) -> Given:
        """The aggregate's history (events folded by the aggregate's appliers)."""
        for ev in events:
            self._roundtrip(ev, "given event")
        state, version = replay(self.entry.aggregate_class, events)
        return Given(self, state, version)

    def when(self, command: Any, expected_version: int | None = None, **kwargs: Any) -> When:
        """A command on a new aggregate (no history)."""
        return Given(self, None, 0).when(command, expected_version, **kwargs)

    def _roundtrip(self, obj: Any, what: str) -> None:
        if self.codec is None or obj is None:
            return
        back = self.codec.decode(self.codec.encode(obj))
        if back != obj:
            raise AssertionError(
                f"{what} {obj!r} does not survive Avro encoding:\n{_diff(obj, back)}"
            )


@attrs.frozen
class Given:
    """State and version after the given events; ``when`` runs one command."""

    test: AggregateTest
    state: Any
    version: int

    def when(
        self,
        command: Any,
        expected_version: int | None = None,
        *,
        command_id: str = "test-command-1",
        timestamp: _dt.datetime | None = None,
        correlation_id: str | None = None,
    ) -> When:
        self.test._roundtrip(command, "command")
        ci = CommandInput(
            command_id, command, expected_version, timestamp or self.test.timestamp, correlation_id
        )
        decision = decide(self.test.entry, self.test.aggregate_id, self.state, self.version, [ci])
        return When(self.test, self, command, decision)


@attrs.frozen
class When:
    """The decision for one command; assert on it with ``then*``."""

    test: AggregateTest
    given: Given
    command: Any
    decision: Decision

    @property
    def outcome(self) -> Outcome:
        return self.decision.outcomes[0]

    @property
    def state(self) -> Any:
        """The aggregate state after the command (``None`` if new and untouched, or deleted)."""
        return self.decision.state

    @property
    def version(self) -> int:
        return self.decision.version

    def _describe(self) -> str:
        return (
            f"command {self.command!r} on {self.test.entry.type_name} at version "
            f"{self.given.version}"
        )

    def then(self, *events: Any) -> Accepted:
        """Assert the command was accepted and produced exactly ``events`` (in order)."""
        outcome = self.outcome
        if not isinstance(outcome, Accepted):
            raise AssertionError(
                f"{self._describe()}: expected it to be accepted with events {list(events)!r}, "
                f"but got {outcome!r}"
            )
        actual = [e.event for e in outcome.events]
        if actual != list(events):
            raise AssertionError(
                f"{self._describe()}: events differ:\n{_diff(list(events), actual)}"
            )
        self._check_serialization(outcome.events)
        return outcome

    def then_rejected(self, reason_substring: str | None = None, code: str | None = None) -> RejectedOutcome:
        """Assert the command was rejected (optionally: reason contains / code equals)."""
        outcome = self.outcome
        if not isinstance(outcome, RejectedOutcome):
            raise AssertionError(f"{self._describe()}: expected a rejection, got {outcome!r}")
        if code is not None and outcome.code != code:
            raise AssertionError(
                f"{self._describe()}: rejected with code {outcome.code!r}, expected {code!r} "
                f"(reason: {outcome.reason!r})"
            )
        if reason_substring is not None and reason_substring not in outcome.reason:
            raise AssertionError(
                f"{self._describe()}: rejection reason {outcome.reason!r} does not contain "
                f"{reason_substring!r}"
            )
        return outcome

    def then_failed(self, error_type: str | type | None = None, message_substring: str | None = None) -> Failed:
        """Assert the handler or an applier crashed (optionally: error type / message)."""
        outcome = self.outcome
        if not isinstance(outcome, Failed):
            raise AssertionError(f"{self._describe()}: expected a failure, got {outcome!r}")
        if isinstance(error_type, type):
            error_type = error_type.__qualname__
        if error_type is not None and outcome.error_type != error_type:
            raise AssertionError(
                f"{self._describe()}: failed with {outcome.error_type} ({outcome.message!r}), "
                f"expected {error_type}"
            )
        if message_substring is not None and message_substring not in outcome.message:
            raise AssertionError(
                f"{self._describe()}: failure message {outcome.message!r} does not contain "
                f"{message_substring!r}"
            )
        return outcome

    def then_state(self, **expected: Any) -> Any:
        """Assert attributes of the resulting state, e.g. ``then_state(balance=7)``."""
        state = self.state
        if state is None:
            raise AssertionError(f"{self._describe()}: no state (new and untouched, or deleted)")
        unknown = sorted(k for k in expected if not hasattr(state, k))
        if unknown:
            raise AssertionError(
                f"{self._describe()}: {type(state).__qualname__} has no attribute "
                f"{', '.join(map(repr, unknown))}: then_state takes the state's attribute names "
                f"({', '.join(_attribute_names(state))})")
        actual = {k: getattr(state, k) for k in expected}
        if actual != expected:
            raise AssertionError(f"{self._describe()}: state differs:\n{_diff(expected, actual)}")
        return state

    def _check_serialization(self, events: tuple[NewEvent, ...]) -> None:
        for e in events:
            self.test._roundtrip(e.event, "produced event")
        if self.decision.state is not None:
            self.test._roundtrip(self.decision.state, "resulting state")
