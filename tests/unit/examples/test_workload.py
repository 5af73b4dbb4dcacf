"""The demo's scripted workload gets exactly the answers it announces (run through the same
step the Spark processor runs, wave by wave, so the demo cannot drift from the domain code)."""

from __future__ import annotations

import collections

import pytest

from cqrs.client import encode_command
from cqrs.processor import AggregateStep, InputRecord
from cqrs.topics import topics_for
from domain_examples import bank, loyalty, orders
from domain_examples.workload import DEMO_T0, RACE, Scripted, check_answers, bank_script, loyalty_script, orders_script, waves

APPS = {"bank": bank.app, "orders": orders.app, "loyalty": loyalty.app}


def _outcome(result: object) -> str:
    status = result.status  # type: ignore[attr-defined]
    if status == "rejected":
        return f"rejected:{result.code}"  # type: ignore[attr-defined]
    if status == "failed":
        return f"failed:{result.error_type}"  # type: ignore[attr-defined]
    return status


def _run(script: list[Scripted]) -> list[tuple[Scripted, str]]:
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
            answered += [(s, _outcome(r)) for (s, _), r in zip(items, results, strict=True)]
    return answered


@pytest.mark.parametrize("script", [bank_script(), orders_script(), loyalty_script()],
                         ids=["bank", "orders", "loyalty"])
def test_every_scripted_command_gets_the_answer_it_announces(script: list[Scripted]) -> None:
    assert check_answers(_run(script)) == []


def test_a_race_needs_exactly_one_winner() -> None:
    a, b = [s for s in bank_script() if s.expect == RACE]
    assert check_answers([(a, "accepted"), (b, "rejected:wrong_expected_version")]) == []
    assert check_answers([(a, "rejected:wrong_expected_version"), (b, "accepted")]) == []
    assert len(check_answers([(a, "accepted"), (b, "accepted")])) == 1


def test_the_script_shows_each_kind_of_answer() -> None:
    expects = {s.expect.split(":")[0] for s in [*bank_script(), *orders_script(), *loyalty_script()]}
    assert expects == {"accepted", "rejected", "failed", RACE}
    ids = [s.command_id for s in bank_script() if s.command_id]
    assert len(ids) != len(set(ids))  # a duplicate command id
