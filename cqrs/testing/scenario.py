"""Given / when / then tests of aggregates, on the same decision function as the Spark job.

>>> test = AggregateTest(bank, Account)
>>> test.given(AccountOpened("ann"), Deposited(10)).when(Withdraw(3)).then(Withdrawn(3))
>>> test.given(AccountOpened("ann")).when(Withdraw(3)).then_rejected(code="insufficient_funds")

Every event, command and resulting state is also round-tripped through the app's Avro codec
(``check_serialization=True``), so a class the codec cannot carry fails here, not in production.

Deadlines: ``then_scheduled`` / ``then_cancelled`` / ``then_nothing_scheduled`` check what a
command scheduled and cancelled, ``when(...)`` on a ``When`` goes on with the next command, and
``advance(timedelta)`` moves the test's clock, firing every deadline due by then in due order
through the same decision function (stamped with its due time, under its derived id):

>>> test.when(PlaceOrder(...)).then_scheduled(CancelUnpaidOrder(), after=timedelta(minutes=15))
>>> test.when(PlaceOrder(...)).advance(timedelta(minutes=15)).then(OrderCancelled("unpaid", 0, due))
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import Any

import attrs

from cqrs.codec.registry import Codec
from cqrs.domain.aggregate import Aggregate
from cqrs.domain.deadlines import DeadlineChange, Schedule
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
from cqrs.scheduler.records import stored_deadline
from cqrs.testing._deadline_checks import (
    check_cancelled, check_fired, check_nothing_scheduled, check_scheduled,
)
from cqrs.testing._diff import diff as _diff
from cqrs.testing.deadlines import PendingDeadlines, advance_clock, aware

__all__ = ["AggregateTest", "Given", "When"]

DEFAULT_TIMESTAMP = _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)


def _attribute_names(state: Any) -> list[str]:
    """The public attributes of a state object, for an error message."""
    if attrs.has(type(state)):
        return [f.name for f in attrs.fields(type(state)) if not f.name.startswith("_")]
    return sorted(k for k in vars(state) if not k.startswith("_")) if hasattr(state, "__dict__") else []


MAX_FIRED_PER_ADVANCE = 10_000  # a deadline that keeps scheduling itself soon would never end


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
        self.model: DomainModel = model
        self.entry: AggregateEntry = model.entry(aggregate)
        self.aggregate_id = aggregate_id
        self.timestamp = timestamp
        self.codec: Codec | None = None
        if check_serialization:
            from cqrs.personal.keys import MemoryKeyStore

            # personal fields are sealed and opened on the way, with keys of the test's own
            self.codec = Codec(model.message_classes(), upcasters=getattr(app_or_model, "upcasters", ()),
                               key_store=MemoryKeyStore())

    def given(self, *events: Any) -> Given:
        """The aggregate's history (events folded by the aggregate's appliers)."""
        for ev in events:
            self._roundtrip(ev, "given event")
        state, version = replay(self.entry.aggregate_class, events)
        return Given(self, state, version)

    def when(self, command: Any, expected_version: int | None = None, **kwargs: Any) -> When:
        """A command on a new aggregate (no history)."""
        return Given(self, None, 0).when(command, expected_version, **kwargs)

    def _roundtrip(self, obj: Any, what: str) -> Any:
        """``obj`` as the codec gives it back (``obj`` itself without a codec)."""
        if self.codec is None or obj is None:
            return obj
        back = self.codec.decode(self.codec.encode(obj))
        if back != obj:
            raise AssertionError(
                f"{what} {obj!r} does not survive Avro encoding:\n{_diff(obj, back)}"
            )
        return back

    def _fired_command(self, due: DeadlineChange) -> Any:
        """A due deadline's command as the processor reads it: stored as the scheduler stores
        it (:func:`~cqrs.scheduler.records.stored_deadline`, the command's record with its
        envelope), read back from that record and decoded; the envelope must carry the
        deadline's id, due time and correlation (``due.command`` itself without a codec)."""
        if self.codec is None:
            return due.command
        from cqrs.envelope import read_command

        stored = stored_deadline(due, self.model.route, self.codec)
        assert stored.key is not None and stored.value is not None
        found = read_command(stored.key.decode(), stored.value)
        assert found is not None, f"the record of deadline {due.name!r} is not a command record"
        env, payload = found
        assert (env.command_id, env.timestamp, env.correlation_id) == (
            due.command_id, due.due, due.correlation_id), env
        return self._roundtrip(self.codec.decode(payload), "deadline command")

    def _decide(self, state: Any, version: int, ci: CommandInput) -> Decision:
        """One command through the processor's decision (its router too: a scheduled command
        without a handler fails the command that scheduled it)."""
        decision = decide(self.entry, self.aggregate_id, state, version, [ci], self.model.route)
        outcome = decision.outcomes[0]
        if isinstance(outcome, Accepted):
            for change in outcome.deadlines:
                self._roundtrip(change.command, "scheduled command")
        return decision

    def _is_own(self, deadline: DeadlineChange) -> bool:
        """Whether a deadline's command goes to this test's aggregate (else to another one)."""
        return (deadline.target_id == self.aggregate_id
                and self.model.route(deadline.command)[0] is self.entry)


@attrs.frozen
class Given:
    """The aggregate before a command: its state and version (after the given events, or the
    commands of the chain so far), the deadlines pending and the clock; ``when`` runs one
    command."""

    test: AggregateTest
    state: Any
    version: int
    _pending: PendingDeadlines = attrs.field(factory=PendingDeadlines, eq=False, repr=False)
    clock: _dt.datetime | None = None  # the latest command's time, or where advance() went
    commands_run: int = 0  # when(...) commands of the chain so far (for default command ids)
    # ids of the commands the chain decided: a deadline firing again under one of them (its
    # name scheduled again for the same time) is a duplicate the processor does not decide again
    _decided: frozenset[str] = attrs.field(default=frozenset(), eq=False, repr=False)

    def when(
        self,
        command: Any,
        expected_version: int | None = None,
        *,
        command_id: str | None = None,
        timestamp: _dt.datetime | None = None,
        correlation_id: str | None = None,
    ) -> When:
        """Decide ``command``; stamped ``timestamp`` (default: the clock, else the test's time),
        under ``command_id`` (default ``test-command-<n>``, n counting the chain's commands)."""
        self.test._roundtrip(command, "command")
        ts = aware(timestamp) if timestamp is not None else (self.clock or self.test.timestamp)
        ci = CommandInput(command_id or f"test-command-{self.commands_run + 1}", command,
                          expected_version, ts, correlation_id)
        decision = self.test._decide(self.state, self.version, ci)
        pending = self._pending.copy()
        outcome = decision.outcomes[0]
        if isinstance(outcome, Accepted):
            pending.apply(outcome.deadlines)
        clock = ts if self.clock is None else max(self.clock, ts)
        return When(self.test, self, (ci,), decision, None, pending, clock)


@attrs.frozen
class When:
    """One step of a test: a command decided (``when``), or the deadlines that fired when time
    moved on (``advance``); assert on it with ``then*``, go on with ``when`` / ``advance``."""

    test: AggregateTest
    given: Given  # the aggregate before this step
    inputs: tuple[CommandInput, ...]  # the commands decided, in order
    decision: Decision  # their outcomes, the state and version after them
    # advance(...): every deadline that came due, in due order, its command as the codec gave it
    # back (those to another aggregate are listed, not decided); None for a when(...) step
    fired: tuple[DeadlineChange, ...] | None = None
    _pending: PendingDeadlines = attrs.field(factory=PendingDeadlines, eq=False, repr=False)
    clock: _dt.datetime = DEFAULT_TIMESTAMP

    @property
    def command(self) -> Any:
        """The step's (last) command: the ``when`` command, or the last deadline that fired on
        this aggregate (None if none did)."""
        return self.inputs[-1].command if self.inputs else None

    @property
    def outcome(self) -> Outcome:
        """The step's outcome (an ``advance`` that fired several commands: see ``.decision``)."""
        outcomes = self.decision.outcomes
        if len(outcomes) != 1:
            raise AssertionError(
                f"{self._describe()}: {len(outcomes)} commands were decided, not one: read "
                f".decision.outcomes, or check their events with then(...)")
        return outcomes[0]

    @property
    def state(self) -> Any:
        """The aggregate state after the step (``None`` if new and untouched, or deleted)."""
        return self.decision.state

    @property
    def version(self) -> int:
        return self.decision.version

    @property
    def deadlines(self) -> tuple[DeadlineChange, ...]:
        """What the step's commands scheduled (``due`` set) and cancelled (``due`` None), in
        order, as the processor stores them."""
        return tuple(c for o in self.decision.outcomes if isinstance(o, Accepted) for c in o.deadlines)

    @property
    def pending(self) -> tuple[DeadlineChange, ...]:
        """Every deadline of the chain waiting after this step (scheduled, neither cancelled
        nor fired), earliest first."""
        return tuple(self._pending)

    def when(self, command: Any, expected_version: int | None = None, **kwargs: Any) -> When:
        """The next command, on the aggregate as this step left it (its deadlines pending);
        stamped with the clock unless ``timestamp=`` says otherwise."""
        return self._next().when(command, expected_version, **kwargs)

    def advance(self, by: _dt.timedelta) -> When:
        """Move the clock ``by`` on and fire every deadline due by then, earliest first: each
        one's command goes through the codec and the same decision as any command, stamped with
        its due time, under its derived id (``dl:<owner>:<name>:<due ms>``), and what it
        schedules or cancels applies before the next one fires. A deadline to another aggregate
        comes due too: it is listed in ``fired``, not decided here; so is one whose derived id
        this aggregate decided before (its name scheduled again for the same time), which the
        processor's dedup answers with its first result."""
        until = advance_clock(self.clock, by)
        pending = self._pending.copy()
        decided = set(self._decided())
        state, version = self.state, self.version
        inputs: list[CommandInput] = []
        outcomes: list[Outcome] = []
        fired: list[DeadlineChange] = []
        while (due := pending.pop_due(until)) is not None:
            assert due.due is not None
            if len(fired) == MAX_FIRED_PER_ADVANCE:
                raise AssertionError(
                    f"advance to {until.isoformat()}: more than {MAX_FIRED_PER_ADVANCE} deadlines "
                    f"fired (the next: {due.name!r} due {due.due.isoformat()}): advance in "
                    "smaller steps, or check for a deadline that keeps scheduling itself")
            command = self.test._fired_command(due)
            due = attrs.evolve(due, command=command)
            fired.append(due)
            if not self.test._is_own(due) or due.command_id in decided:
                continue
            decided.add(due.command_id)
            ci = CommandInput(due.command_id, command, None, due.due, due.correlation_id)
            decision = self.test._decide(state, version, ci)
            outcome = decision.outcomes[0]
            if isinstance(outcome, Accepted):
                pending.apply(outcome.deadlines)
            state, version = decision.state, decision.version
            inputs.append(ci)
            outcomes.append(outcome)
        return When(self.test, self._next(), tuple(inputs), Decision(state, version, tuple(outcomes)),
                    tuple(fired), pending, until)

    def _decided(self) -> frozenset[str]:
        return self.given._decided | {ci.command_id for ci in self.inputs}

    def _next(self) -> Given:
        run = self.given.commands_run + (1 if self.fired is None else 0)
        return Given(self.test, self.state, self.version, self._pending, self.clock, run,
                     self._decided())

    def _describe(self) -> str:
        if self.fired is None:
            return (
                f"command {self.command!r} on {self.test.entry.type_name} at version "
                f"{self.given.version}"
            )
        return (f"advance to {self.clock.isoformat()} on {self.test.entry.type_name} "
                f"{self.test.aggregate_id!r} at version {self.given.version}")

    def _not_accepted(self) -> str:
        """Why a step has no deadline changes although it ran, for messages."""
        refused = [o for o in self.decision.outcomes if not isinstance(o, Accepted)]
        return f" (not accepted: {refused[0]!r})" if refused else ""

    def then(self, *events: Any) -> Accepted:
        """Assert the step's commands were accepted and produced exactly ``events`` (in order);
        returns the (last) outcome."""
        outcomes = self.decision.outcomes
        if not outcomes:
            raise AssertionError(
                f"{self._describe()}: no deadline was decided on this aggregate, so there are no "
                f"events to compare with {list(events)!r} (fired: "
                f"{[d.name for d in self.fired or ()]!r}, pending: "
                f"{[d.name for d in self._pending]!r}); then_fired() checks what fired")
        for outcome in outcomes:
            if not isinstance(outcome, Accepted):
                raise AssertionError(
                    f"{self._describe()}: expected it to be accepted with events {list(events)!r}, "
                    f"but got {outcome!r}"
                )
        accepted = [o for o in outcomes if isinstance(o, Accepted)]
        actual = [e.event for o in accepted for e in o.events]
        if actual != list(events):
            raise AssertionError(
                f"{self._describe()}: events differ:\n{_diff(list(events), actual)}"
            )
        self._check_serialization([e for o in accepted for e in o.events])
        return accepted[-1]

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

    def then_scheduled(self, command: Any, *, after: _dt.timedelta | None = None,
                       at: _dt.datetime | None = None, to: str | None = None,
                       name: str | None = None) -> DeadlineChange:
        """Assert the step scheduled ``command`` as ``Schedule(command, after=/at=, to=, name=)``
        in its handler would: ``after`` from the deciding command's time, ``to`` this aggregate
        unless given, ``name`` the command's type name unless given. Returns the deadline."""
        return check_scheduled(
            self._describe(), self.deadlines, Schedule(command, after=after, at=at, to=to, name=name),
            now=self.inputs[0].timestamp if self.inputs else self.clock,
            times={ci.command_id: ci.timestamp for ci in self.inputs},
            default_target=self.test.aggregate_id, note=self._not_accepted())

    def then_cancelled(self, name: str | type) -> DeadlineChange:
        """Assert the step cancelled the deadline ``name`` (a str, or the command class as in
        ``Cancel(...)``)."""
        return check_cancelled(self._describe(), self.deadlines, name, self._not_accepted())

    def then_nothing_scheduled(self) -> None:
        """Assert the step scheduled no deadline (cancelling is allowed)."""
        check_nothing_scheduled(self._describe(), self.deadlines)

    def then_fired(self, *commands: Any) -> tuple[DeadlineChange, ...]:
        """Assert the deadlines ``advance`` fired sent exactly ``commands`` (in due order; a
        deadline to another aggregate as ``Send(aggregate_id, command)``); ``then_fired()``:
        nothing fired. Returns the deadlines."""
        if self.fired is None:
            raise AssertionError(f"{self._describe()}: then_fired checks what advance(...) fired; "
                                 "call it on the step advance(...) returns")
        check_fired(self._describe(), self.fired, commands, self._pending,
                    shorthand_for=self.test.aggregate_id)
        return self.fired

    def _check_serialization(self, events: Sequence[NewEvent]) -> None:
        for e in events:
            self.test._roundtrip(e.event, "produced event")
        if self.decision.state is not None:
            self.test._roundtrip(self.decision.state, "resulting state")
