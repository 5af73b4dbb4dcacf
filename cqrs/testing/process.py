"""Given / when / then tests of process managers, on the same reactor as the Spark job.

>>> test = ProcessTest(library, Lending)
>>> test.when(LoanRequested("ann"), aggregate_id="book-1").then(Send("ann", ReserveSlot("book-1")))
>>> test.given(SlotReserved("book-1")).when(SlotReleased("book-1")).then_nothing()

``given`` events build a stateful instance (their commands are dropped, their deadlines kept
pending); ``when`` reacts to one event and ``then`` compares the commands it sends (as
:class:`Send`) in order; ``then_scheduled`` / ``then_cancelled`` check its deadlines, and
``advance(timedelta)`` moves the clock and lists the deadlines' commands that fire. Events and
commands are round-tripped through the app's Avro codec, as in :class:`AggregateTest`.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import attrs

from cqrs.app import App
from cqrs.domain.deadlines import DeadlineChange, Schedule
from cqrs.domain.decision import event_id_for
from cqrs.domain.messages import type_name
from cqrs.domain.process import ProcessManager, Send
from cqrs.envelope import Envelope
from cqrs.errors import NotAMessageError
from cqrs.process.reactor import Instance, Reactor, ReactorOutput, SourceEvent, process_manager_of
from cqrs.testing._deadline_checks import (
    check_cancelled, check_fired, check_nothing_scheduled, check_scheduled,
)
from cqrs.testing._diff import diff as _diff
from cqrs.testing.deadlines import PendingDeadlines, advance_clock
from cqrs.testing.scenario import DEFAULT_TIMESTAMP

__all__ = ["ProcessAfter", "ProcessTest", "ProcessWhen"]


class ProcessTest:
    """Entry point: ``ProcessTest(app, ProcessManagerClass or name)``."""

    def __init__(self, app: App, process_manager: type[ProcessManager[Any]] | str, *,
                 aggregate_id: str = "test-aggregate-1", correlation_id: str = "test-conversation-1",
                 timestamp: _dt.datetime = DEFAULT_TIMESTAMP) -> None:
        name = process_manager if isinstance(process_manager, str) else process_manager.name
        self.app = app
        self.reactor = Reactor(app, process_manager_of(app, name))
        self.aggregate_id = aggregate_id
        self.correlation_id = correlation_id
        self.timestamp = timestamp
        self._versions: dict[tuple[str, str], int] = {}

    def source(self, event: Any, *, aggregate_id: str | None = None, version: int | None = None,
               correlation_id: str | None = None, timestamp: _dt.datetime | None = None) -> SourceEvent:
        """``event`` as the events topic would hold it: the aggregate type comes from the model,
        versions count up per aggregate unless given."""
        payload = self.app.codec.encode(event)
        back = self.app.codec.decode(payload)
        if back != event:
            raise AssertionError(f"event {event!r} does not survive Avro encoding:\n{_diff(event, back)}")
        agg_type = self._aggregate_type(event)
        agg_id = aggregate_id or self.aggregate_id
        v = version if version is not None else self._versions.get((agg_type, agg_id), 0) + 1
        self._versions[(agg_type, agg_id)] = max(v, self._versions.get((agg_type, agg_id), 0))
        env = Envelope(event_id_for(agg_type, agg_id, v), type_name(event), "event", agg_type, agg_id,
                       timestamp or self.timestamp, v, None, f"test-command-{agg_id}-{v}",
                       correlation_id or self.correlation_id, f"test-command-{agg_id}-{v}")
        return SourceEvent(env, event, payload)

    def _aggregate_type(self, event: Any) -> str:
        for entry in self.app.model.aggregates.values():
            if type(event) in entry.event_classes:
                return entry.type_name
        return "test.Aggregate"  # an event listed in App(events=...) only

    def given(self, *events: Any, **where: Any) -> ProcessGiven:
        """The instance after ``events`` (reactions run, their commands dropped, their
        deadlines pending)."""
        instances: dict[str, Instance | None] = {}
        pending = PendingDeadlines()
        clock: _dt.datetime | None = None
        for ev in events:
            src = ev if isinstance(ev, SourceEvent) else self.source(ev, **where)
            out = self.reactor.run([src], instances)
            if out.failures:
                f = out.failures[0]
                raise AssertionError(f"given event {ev!r} failed: {f.error_type}: {f.message}")
            instances.update(out.instances)
            pending.apply(self._scheduled(out))
            ts = src.envelope.timestamp
            clock = ts if clock is None else max(clock, ts)
        return ProcessGiven(self, instances, pending, clock)

    def when(self, event: Any, **where: Any) -> ProcessWhen:
        """The reaction to ``event`` of a new instance."""
        return ProcessGiven(self, {}).when(event, **where)

    def _roundtrip(self, obj: Any, what: str) -> Any:
        """``obj`` as the app's codec gives it back."""
        back = self.app.codec.decode(self.app.codec.encode(obj))
        if back != obj:
            raise AssertionError(f"{what} {obj!r} does not survive Avro encoding:\n{_diff(obj, back)}")
        return back

    def _scheduled(self, out: ReactorOutput) -> list[DeadlineChange]:
        """The reaction's deadline changes, their commands checked against the codec."""
        for change in out.deadlines:
            if change.command is not None:
                self._roundtrip(change.command, "scheduled command")
        return out.deadlines


@attrs.frozen
class ProcessGiven:
    """The instances after the given events, the deadlines they left pending and the clock
    (the latest event's time); ``when`` reacts to one more event."""

    test: ProcessTest
    instances: dict[str, Instance | None]
    _pending: PendingDeadlines = attrs.field(factory=PendingDeadlines, eq=False, repr=False)
    clock: _dt.datetime | None = None

    def when(self, event: Any, **where: Any) -> ProcessWhen:
        src = event if isinstance(event, SourceEvent) else self.test.source(event, **where)
        out = self.test.reactor.run([src], self.instances)
        pending = self._pending.copy()
        pending.apply(self.test._scheduled(out))
        ts = src.envelope.timestamp
        return ProcessWhen(self.test, src, out, pending, ts if self.clock is None else max(self.clock, ts))


@attrs.frozen
class ProcessWhen:
    """The reaction to one event; assert on it with ``then*``."""

    test: ProcessTest
    source: SourceEvent
    output: ReactorOutput
    _pending: PendingDeadlines = attrs.field(factory=PendingDeadlines, eq=False, repr=False)
    clock: _dt.datetime = DEFAULT_TIMESTAMP  # the latest event's time

    @property
    def sent(self) -> list[Send]:
        """The commands sent, as Sends (target, command, expected version)."""
        self._raise_failure()
        for c in self.output.commands:
            self.test._roundtrip(c.command, "command")
        return [Send(c.envelope.aggregate_id, c.command, c.envelope.expected_version)
                for c in self.output.commands]

    @property
    def deadlines(self) -> tuple[DeadlineChange, ...]:
        """What the reaction scheduled (``due`` set) and cancelled (``due`` None), in order."""
        self._raise_failure()
        return tuple(self.output.deadlines)

    @property
    def pending(self) -> tuple[DeadlineChange, ...]:
        """Every deadline waiting after the reaction (the given events' too), earliest first."""
        return tuple(self._pending)

    def then_scheduled(self, command: Any, *, after: _dt.timedelta | None = None,
                       at: _dt.datetime | None = None, to: str | None = None,
                       name: str | None = None) -> DeadlineChange:
        """Assert the reaction scheduled ``command`` as ``Schedule(command, after=/at=, to=,
        name=)`` in it would (``after`` from the event's time; ``to`` is required, as in a
        reaction). Returns the deadline."""
        if to is None:
            raise NotAMessageError(
                f"then_scheduled({command!r}) needs to=<aggregate id>: a process manager's "
                "deadline names the aggregate its command goes to, as its Schedule does")
        return check_scheduled(
            f"reaction to {self.source.event!r}", self.deadlines,
            Schedule(command, after=after, at=at, to=to, name=name),
            now=self.source.envelope.timestamp, times={}, default_target=None)

    def then_cancelled(self, name: str | type) -> DeadlineChange:
        """Assert the reaction cancelled the deadline ``name`` (a str, or the command class)."""
        return check_cancelled(f"reaction to {self.source.event!r}", self.deadlines, name)

    def then_nothing_scheduled(self) -> None:
        """Assert the reaction scheduled no deadline (cancelling is allowed)."""
        check_nothing_scheduled(f"reaction to {self.source.event!r}", self.deadlines)

    def advance(self, by: _dt.timedelta) -> ProcessAfter:
        """Move the clock ``by`` on from the event's time: every deadline due by then fires
        (its command goes to its aggregate, through the codec), earliest first."""
        self._raise_failure()
        return ProcessAfter(self.test, (), self._pending, self.clock).advance(by)

    @property
    def state(self) -> Any:
        """The instance's state after the reaction (stateful process managers)."""
        self._raise_failure()
        changed = list(self.output.instances.values())
        if not changed:
            raise AssertionError(f"the reaction to {self.source.event!r} changed no instance")
        return changed[-1].state

    def then(self, *expected: Send) -> list[Send]:
        sent = self.sent
        if sent != list(expected):
            raise AssertionError(f"reaction to {self.source.event!r} sent other commands:\n"
                                 f"{_diff(list(expected), sent)}")
        return sent

    def then_nothing(self) -> None:
        self.then()

    def then_state(self, expected: Any) -> Any:
        if self.state != expected:
            raise AssertionError(f"state after {self.source.event!r}:\n{_diff(expected, self.state)}")
        return self.state

    def then_completes(self) -> None:
        """The event ends its conversation (it is one of ``completes_on``)."""
        if not self.output.outcomes:
            raise AssertionError(f"{self.source.event!r} does not complete the conversation: "
                                 "add its class to completes_on")

    def then_fails(self, error_type: str | type | None = None) -> None:
        if not self.output.failures:
            raise AssertionError(f"the reaction to {self.source.event!r} did not fail")
        want = error_type if isinstance(error_type, str) or error_type is None else error_type.__qualname__
        got = self.output.failures[0].error_type
        if want is not None and got != want:
            raise AssertionError(f"the reaction failed with {got}, expected {want}")

    def _raise_failure(self) -> None:
        if self.output.failures:
            f = self.output.failures[0]
            raise AssertionError(f"the reaction to {self.source.event!r} raised {f.error_type}: "
                                 f"{f.message}\n{f.stack}")


@attrs.frozen
class ProcessAfter:
    """What fired when the clock moved on: the deadlines that came due, in due order, each
    command as the codec gave it back (a process manager's deadline sends its command to an
    aggregate, as ``Send(to, command)`` with no expected version)."""

    test: ProcessTest
    fired: tuple[DeadlineChange, ...]
    _pending: PendingDeadlines = attrs.field(factory=PendingDeadlines, eq=False, repr=False)
    clock: _dt.datetime = DEFAULT_TIMESTAMP

    @property
    def pending(self) -> tuple[DeadlineChange, ...]:
        """The deadlines still waiting, earliest first."""
        return tuple(self._pending)

    def advance(self, by: _dt.timedelta) -> ProcessAfter:
        """Move the clock further ``by``; ``fired`` is then what fired in that step."""
        until = advance_clock(self.clock, by)
        pending = self._pending.copy()
        fired: list[DeadlineChange] = []
        while (due := pending.pop_due(until)) is not None:
            fired.append(attrs.evolve(due, command=self.test._roundtrip(due.command, "deadline command")))
        return ProcessAfter(self.test, tuple(fired), pending, until)

    def then_fired(self, *sends: Send) -> tuple[DeadlineChange, ...]:
        """Assert the deadlines that fired sent exactly ``sends``, in due order
        (``then_fired()``: nothing fired). Returns the deadlines."""
        check_fired(f"advance to {self.clock.isoformat()}", self.fired, sends, self._pending)
        return self.fired
