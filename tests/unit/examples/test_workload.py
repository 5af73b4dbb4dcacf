"""The demo's scripted workload gets exactly the answers it announces (run through the same
step the Spark processor runs, wave by wave, so the demo cannot drift from the domain code)."""

from __future__ import annotations

import pytest
from workload_driver import run_script as _run

from domain_examples.workload import RACE, Scripted, bank_script, check_answers, loyalty_script, orders_script


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
