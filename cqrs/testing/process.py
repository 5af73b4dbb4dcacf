"""Given / when / then tests of process managers, on the same reactor as the Spark job.

>>> test = ProcessTest(library, Lending)
>>> test.when(LoanRequested("ann"), aggregate_id="book-1").then(Send("ann", ReserveSlot("book-1")))
>>> test.given(SlotReserved("book-1")).when(SlotReleased("book-1")).then_nothing()

``given`` events build a stateful instance (their commands are dropped); ``when`` reacts to one
event and ``then`` compares the commands it sends (as :class:`Send`) in order. Events and
commands are round-tripped through the app's Avro codec, as in :class:`AggregateTest`.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import attrs

from cqrs.app import App
from cqrs.domain.decision import event_id_for
from cqrs.domain.messages import type_name
from cqrs.domain.process import ProcessManager, Send
from cqrs.envelope import Envelope
from cqrs.process.reactor import Instance, Reactor, ReactorOutput, SourceEvent, process_manager_of
from cqrs.testing.scenario import DEFAULT_TIMESTAMP, _diff

__all__ = ["ProcessTest", "ProcessWhen"]


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
        """The instance after ``events`` (reactions run, their commands dropped)."""
        instances: dict[str, Instance | None] = {}
        for ev in events:
            src = ev if isinstance(ev, SourceEvent) else self.source(ev, **where)
            out = self.reactor.run([src], instances)
            if out.failures:
                f = out.failures[0]
                raise AssertionError(f"given event {ev!r} failed: {f.error_type}: {f.message}")
            instances.update(out.instances)
        return ProcessGiven(self, instances)

    def when(self, event: Any, **where: Any) -> ProcessWhen:
        """The reaction to ``event`` of a new instance."""
        return ProcessGiven(self, {}).when(event, **where)


@attrs.frozen
class ProcessGiven:
    test: ProcessTest
    instances: dict[str, Instance | None]

    def when(self, event: Any, **where: Any) -> ProcessWhen:
        src = event if isinstance(event, SourceEvent) else self.test.source(event, **where)
        out = self.test.reactor.run([src], self.instances)
        return ProcessWhen(self.test, src, out)


@attrs.frozen
class ProcessWhen:
    """The reaction to one event; assert on it with ``then*``."""

    test: ProcessTest
    source: SourceEvent
    output: ReactorOutput

    @property
    def sent(self) -> list[Send]:
        """The commands sent, as Sends (target, command, expected version)."""
        self._raise_failure()
        for c in self.output.commands:
            back = self.test.app.codec.decode(self.test.app.codec.encode(c.command))
            if back != c.command:
                raise AssertionError(f"command {c.command!r} does not survive Avro encoding:\n"
                                     f"{_diff(c.command, back)}")
        return [Send(c.envelope.aggregate_id, c.command, c.envelope.expected_version)
                for c in self.output.commands]

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
