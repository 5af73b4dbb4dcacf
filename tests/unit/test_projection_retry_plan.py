"""The pure parts of the projections' automatic retries (projections.dlq_retry): which views a
batch parked, the schedule of their attempts, and the app's policy."""

from __future__ import annotations

import pytest

from cqrs.errors import ConfigError
from cqrs.retries import Backoff, RetryPolicy
from cqrs.testing.example import AccountOpened, Deposited
from projections import LocalProjector, SqliteStore, records_for
from projections.dlq_retry import episode_id, letters_by_view, next_attempt, parkings_of
from projections.model import find_projection
from projections.records import DeadLetter
from projections.testing import POISON_FILE, Balances, app, make_rekeyed_app


def test_the_projection_backoff_is_the_default_unless_named() -> None:
    slow = Backoff(initial_s=30)
    policy = RetryPolicy(by_projection={Balances: slow, "other": None})
    assert policy.projection_backoff("balances") is slow
    assert policy.projection_backoff("other") is None  # parked for an operator at once
    assert policy.projection_backoff("third") == Backoff()  # retried by default
    assert RetryPolicy(projections=None).projection_backoff("balances") is None
    with pytest.raises(ConfigError, match="by_projection key 3"):
        RetryPolicy(by_projection={3: slow})


def test_attempts_wait_the_backoff_then_park() -> None:
    b = Backoff(initial_s=1, multiplier=2, max_s=60, jitter=0.2, max_attempts=3)
    state, due = next_attempt(b, "acc-1@4", 1, 10_000)
    assert state == "waiting" and due is not None and 10_800 <= due <= 11_200
    assert next_attempt(b, "acc-1@4", 1, 10_000) == (state, due)  # seeded: a re-run agrees
    state, due = next_attempt(b, "acc-1@4", 2, 20_000)
    assert state == "waiting" and due is not None and 21_600 <= due <= 22_400
    assert next_attempt(b, "acc-1@4", 3, 30_000) == ("parked", None)
    assert next_attempt(None, "acc-1@4", 1, 10_000) == ("parked", None)
    assert episode_id("acc-1", 4) == "acc-1@4"


def test_a_batch_reports_each_parked_view_once_with_its_failing_event() -> None:
    local = LocalProjector(app, SqliteStore(":memory:"), collect_dead_letters=True)
    POISON_FILE.write_text("666\n")
    try:
        versions: dict[str, int] = {}
        local.apply(records_for(app, [("acc-1", AccountOpened("ann")), ("acc-1", Deposited(666)),
                                      ("acc-1", Deposited(1)), ("acc-2", AccountOpened("bob"))],
                                versions=versions))
        first = list(local.dead_letters)
        local.apply(records_for(app, [("acc-1", Deposited(2))], versions=versions))
        later = local.dead_letters[len(first):]
    finally:
        POISON_FILE.unlink()
    balances = find_projection(app, "balances")
    parkings = parkings_of(balances, first, app.codec.decode)
    assert [(p.key, p.parked_at, p.reason, p.message_type) for p in parkings] == [
        ("acc-1", 2, "handler", "example.bank.Deposited")]
    assert "poisoned deposit amount 666" in parkings[0].error
    held = parkings_of(balances, later, app.codec.decode)
    assert [(p.key, p.parked_at, p.reason) for p in held] == [("acc-1", 2, "parked")]


def test_a_rekeyed_projections_letters_are_grouped_by_view_key() -> None:
    rekeyed = make_rekeyed_app()
    projection = find_projection(rekeyed, "movements_by_band")
    records = records_for(rekeyed, [("acc-1", AccountOpened("ann")), ("acc-1", Deposited(5)),
                                    ("acc-2", AccountOpened("bob")), ("acc-2", Deposited(70)),
                                    ("acc-2", Deposited(71))])
    letters = [DeadLetter(r, "parked", "held", 1) for r in records]
    grouped = letters_by_view(projection, letters, rekeyed.codec.decode)
    assert {k: [(dl.record.aggregate_id, dl.record.version) for dl in v] for k, v in grouped.items()} == {
        "band-0": [("acc-1", 2)], "band-7": [("acc-2", 2), ("acc-2", 3)]}
    assert [p.key for p in parkings_of(projection, letters, rekeyed.codec.decode)] == ["band-0", "band-7"]
