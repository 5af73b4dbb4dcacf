"""Runs the demo's scripted workload through the processor's own step, wave by wave, with no
services: the answers (for tests of the script) and the events written (for tests of the
views). Shared by the example tests; not a test module itself."""

from __future__ import annotations

import collections

from cqrs.client import encode_command
from cqrs.processor import AggregateStep, InputRecord
from cqrs.topics import topics_for
from domain_examples import bank, loyalty, orders
from domain_examples.workload import DEMO_T0, Scripted, outcome_of, waves
from projections.records import EventRecord, event_record

__all__ = ["APPS", "run_script"]

APPS = {"bank": bank.app, "orders": orders.app, "loyalty": loyalty.app}


def run_script(script: list[Scripted],
               events: list[EventRecord] | None = None) -> list[tuple[Scripted, str]]:
    """Every scripted command's answer; the events written are appended to ``events`` as the
    projector reads them (offsets counted in write order, one partition)."""
    app = APPS[script[0].app]
    topics = topics_for(app.name)
    step = AggregateStep(app, app.codec, topics)
    states: dict[str, object] = {}
    answered: list[tuple[Scripted, str]] = []
    offset = 0
    for wave in waves(script):
        by_aggregate: dict[str, list[tuple[Scripted, InputRecord]]] = collections.defaultdict(list)
        for s in wave:
            cid, key, value, headers = encode_command(
                app, s.aggregate_id, s.command, expected_version=s.expected_version,
                command_id=s.command_id or f"cmd-{offset}", timestamp=DEMO_T0)
            by_aggregate[s.aggregate_id].append((s, InputRecord(key, value, headers, 0, offset)))
            offset += 1
        for aggregate_id, items in by_aggregate.items():
            entry, _ = app.model.route(items[0][0].command)
            new, out = step.run(entry.type_name, aggregate_id, states.get(aggregate_id),
                                [rec for _, rec in items])
            if new is not None:
                states[aggregate_id] = new
            results = [app.codec.decode(r.value) for r in out if r.topic == topics.results]
            answered += [(s, outcome_of(r)) for (s, _), r in zip(items, results, strict=True)]
            if events is not None:
                events += [event_record(r.key, r.value, r.headers, 0, len(events) + i)
                           for i, r in enumerate(r for r in out if r.topic == topics.events)]
    return answered
