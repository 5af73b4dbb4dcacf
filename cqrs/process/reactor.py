"""One process manager over a run of events: the pure part of its job, shared by the Spark
query, the local runner and the test kit.

For each event (in log order) the process manager reacts to or completes on:

1. a stateful process manager finds the instance (:meth:`ProcessManager.correlate`) and skips
   the event if the instance applied it already (per source aggregate, the highest version it
   applied: the event log may hold an event twice, and a replay reads everything again);
2. the reaction runs; each command it sends becomes an envelope with a derived id
   (:func:`~cqrs.domain.process.derived_command_id`), the event's timestamp and correlation id,
   and the event's id as causation id;
3. a ``completes_on`` event becomes a :class:`~cqrs.results.ConversationOutcome`;
4. a reaction that raises is a :class:`ReactionFailure`: the event is skipped (a stateful
   instance does not count it as applied) and the caller dead-letters it.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from cqrs.app import App
from cqrs.domain.deadlines import Cancel, DeadlineChange, Schedule, resolve_deadlines
from cqrs.domain.messages import type_name
from cqrs.domain.process import (
    ProcessManager, ReactionContext, ReactionRoute, derived_command_id, react,
)
from cqrs.config import DEFAULT_MAX_RECORD_BYTES
from cqrs.envelope import Envelope, record_size, to_kafka
from cqrs.budget import Watch
from cqrs.errors import CqrsError, DecisionTimeoutError, RecordTooLargeError
from cqrs.results import ConversationOutcome
from cqrs.scheduler.records import StoredDeadline, stored_deadline

__all__ = [
    "Instance",
    "ProcessManagerError",
    "ReactionFailure",
    "ReactorOutput",
    "Reactor",
    "SentCommand",
    "SourceEvent",
    "process_manager_of",
]


class ProcessManagerError(CqrsError, LookupError):
    """A process manager the app does not declare."""


def process_manager_of(app: App, name: str) -> ProcessManager[Any]:
    """The app's process manager called ``name``, else an error listing the known ones."""
    for pm in app.process_managers:
        if pm.name == name:
            return pm
    known = sorted(pm.name for pm in app.process_managers) or "none"
    raise ProcessManagerError(
        f"app {app.name!r} has no process manager {name!r} (known: {known}): add it to "
        "App(..., process_managers=[...]) or check the name"
    )


@attrs.frozen(slots=True)
class SourceEvent:
    """An event read from the events topic: its envelope, the decoded event and its bytes."""

    envelope: Envelope
    event: Any
    payload: bytes
    partition: int = -1
    offset: int = -1


@attrs.frozen(slots=True)
class Instance:
    """One instance of a stateful process manager: its state (``None``: finished) and, per
    source aggregate (``type:id``), the highest event version it applied."""

    key: str
    state: Any
    applied: Mapping[str, int] = attrs.field(factory=dict)

    def has_applied(self, env: Envelope) -> bool:
        return self.applied.get(f"{env.aggregate_type}:{env.aggregate_id}", 0) >= (env.version or 0)


@attrs.frozen(slots=True)
class SentCommand:
    """A command to send: its envelope (derived id, context), the command, and the record the
    commands topic takes (encoded and checked against the record limit when it was decided)."""

    envelope: Envelope
    command: Any
    key: bytes = b""
    value: bytes = b""


@attrs.frozen(slots=True)
class ReactionFailure:
    """A reaction that raised: the event, and what was raised."""

    source: SourceEvent
    error_type: str
    message: str
    stack: str


@attrs.define
class ReactorOutput:
    commands: list[SentCommand] = attrs.field(factory=list)
    outcomes: list[ConversationOutcome] = attrs.field(factory=list)
    failures: list[ReactionFailure] = attrs.field(factory=list)
    deadlines: list[DeadlineChange] = attrs.field(factory=list)  # scheduled and cancelled
    stored_deadlines: list[StoredDeadline] = attrs.field(factory=list)  # the same, as stored
    instances: dict[str, Instance] = attrs.field(factory=dict)  # changed instances
    reacted: int = 0
    skipped: int = 0  # applied by the instance before


class Reactor:
    """Runs one process manager of an app (see the module doc)."""

    def __init__(self, app: App, pm: ProcessManager[Any], codec: Any = None,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES):
        """``codec``: what encodes the commands a reaction sends (default the app's; the job
        passes the one bound to the schemas topic); ``max_record_bytes``: the largest record
        it may send (:meth:`cqrs.config.KafkaSettings.max_record_bytes`). A reaction whose
        command or deadline would be over it fails as a reaction that raised does, with
        :class:`~cqrs.errors.RecordTooLargeError`: its event is dead-lettered, nothing of it
        is sent, and the next events go on."""
        self.app = app
        self.pm = pm
        self.codec = app.codec if codec is None else codec
        self.max_record_bytes = max_record_bytes
        self.routes: dict[type, ReactionRoute] = {r.event_class: r for r in pm.routes()}
        self.stateful = pm.state_class() is not None
        self.completes_on = frozenset(pm.completes_on)

    @property
    def event_types(self) -> list[str]:
        """Type names of every event this process manager reads (reactions and completions)."""
        return sorted({type_name(c) for c in [*self.routes, *self.completes_on]})

    @staticmethod
    def context(env: Envelope) -> ReactionContext:
        return ReactionContext(
            aggregate_type=env.aggregate_type, aggregate_id=env.aggregate_id,
            version=env.version or 0, event_id=env.message_id, timestamp=env.timestamp,
            correlation_id=env.correlation_id or env.causation_id or env.message_id,
            causation_id=env.causation_id)

    def keys(self, events: Iterable[SourceEvent]) -> list[str]:
        """The instance keys a run of events touches (stateful process managers), to read
        their instances in one go. A ``correlate`` that raises is left to :meth:`run`."""
        if not self.stateful:
            return []
        keys: dict[str, None] = {}
        for src in events:
            if type(src.event) in self.routes:
                try:
                    keys[self._key(src)] = None
                except Exception:  # noqa: BLE001 - reported by run() as the event's failure
                    continue
        return list(keys)

    def _key(self, src: SourceEvent) -> str:
        key = self.pm.correlate(src.event, self.context(src.envelope))
        if not isinstance(key, str) or not key:
            raise ProcessManagerError(
                f"{type(self.pm).__qualname__}.correlate returned {key!r} for "
                f"{src.envelope.message_type} {src.envelope.message_id}: return a non-empty str"
            )
        return key

    def run(self, events: Sequence[SourceEvent], instances: Mapping[str, Instance | None], *,
            watch: Watch | None = None,
            timed_out: Mapping[int, float] | None = None) -> ReactorOutput:
        """React to ``events`` (in log order) given the instances they touch. ``watch``: noted
        with each event as its reaction runs (see :mod:`cqrs.budget`); ``timed_out``: events
        (their index) whose reaction ran past the budget before (how many seconds), failed as
        a reaction that raised, without running it again."""
        out = ReactorOutput()
        current: dict[str, Instance | None] = dict(instances)
        for i, src in enumerate(events):
            if watch is not None:
                watch.start(src)
            env = src.envelope
            ctx = self.context(env)
            if type(src.event) in self.completes_on:
                out.outcomes.append(ConversationOutcome(
                    ctx.correlation_id, self.pm.name, env.message_type, env.message_id,
                    env.aggregate_type, env.aggregate_id, ctx.version, env.timestamp,
                    src.payload))
            route = self.routes.get(type(src.event))
            if route is None:
                continue
            if timed_out and i in timed_out:
                out.failures.append(ReactionFailure(
                    src, DecisionTimeoutError.__name__,
                    f"the reaction of {type(self.pm).__qualname__}.{route.method_name} to "
                    f"{env.message_type} {env.message_id} ran over {timed_out[i]:.1f} s, past the "
                    "budget ([processor] decision_budget_s): it was abandoned and nothing of it "
                    "was sent; make the reaction faster, or move slow work out of it", ""))
                continue
            key = None
            try:
                if self.stateful:
                    key = self._key(src)
                    inst = current.get(key)
                    if inst is not None and inst.has_applied(env):
                        out.skipped += 1
                        continue
                    state, sends = react(self.pm, route, None if inst is None else inst.state,
                                         src.event, ctx)
                    applied = dict(inst.applied) if inst is not None else {}
                    applied[f"{env.aggregate_type}:{env.aggregate_id}"] = ctx.version
                    new = Instance(key, state, applied)
                else:
                    _, sends = react(self.pm, route, None, src.event, ctx)
                    new = None
                commands = [self._command(ctx, i, s) for i, s in enumerate(sends)
                            if not isinstance(s, (Schedule, Cancel))]
                later = [s for s in sends if isinstance(s, (Schedule, Cancel))]
                deadlines = resolve_deadlines(
                    later, owner=f"pm:{self.pm.name}:{key or ctx.correlation_id}",
                    now=ctx.timestamp, default_target=None, correlation_id=ctx.correlation_id,
                    causation_id=ctx.event_id, where=f"{type(self.pm).__qualname__}.{route.method_name}",
                ) if later else ()
                stored = [stored_deadline(d, self.app.model.route, self.codec, self.max_record_bytes)
                          for d in deadlines]
            except Exception as exc:  # noqa: BLE001 - the user's code: the event is dead-lettered
                out.failures.append(ReactionFailure(
                    src, type(exc).__qualname__, str(exc), traceback.format_exc(limit=20)))
                continue
            out.reacted += 1
            out.commands.extend(commands)
            out.deadlines.extend(deadlines)
            out.stored_deadlines.extend(stored)
            if new is not None:
                current[new.key] = new
                out.instances[new.key] = new
        if watch is not None:
            watch.record = None
        return out

    def _command(self, ctx: ReactionContext, index: int, send: Any) -> SentCommand:
        entry, _ = self.app.model.route(send.command)
        cid = derived_command_id(self.pm.name, ctx, index)
        env = Envelope.for_command(
            send.command, command_id=cid, aggregate_type=entry.type_name,
            aggregate_id=send.aggregate_id, timestamp=ctx.timestamp,
            expected_version=send.expected_version, correlation_id=ctx.correlation_id,
            causation_id=ctx.event_id)
        key, value, headers = to_kafka(env, self.codec.encode(send.command))
        size = record_size(key, value, headers)
        if size > self.max_record_bytes:
            raise RecordTooLargeError(
                f"it sends {env.message_type} to {send.aggregate_id!r} as a {size:,}-byte Kafka "
                f"record, over the limit of {self.max_record_bytes:,} bytes: make the command "
                "smaller (keep large data elsewhere and put a reference in it)")
        return SentCommand(env, send.command, key, value)
