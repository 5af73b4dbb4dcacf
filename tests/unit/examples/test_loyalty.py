"""The loyalty example, given / when / then: purchases per store, points per purchase."""

from __future__ import annotations

import pytest

from cqrs.testing import AggregateTest
from domain_examples.loyalty import (
    RECENT_INVOICES,
    PurchaseRecorded,
    RecordPurchase,
    Store,
    app,
    points_for,
)


@pytest.fixture
def store() -> AggregateTest:
    return AggregateTest(app, Store, aggregate_id="store-berlin-1")


@pytest.mark.parametrize(("cents", "points"), [(1, 0), (99, 0), (100, 1), (12_345, 123), (0, 0), (-500, 0)])
def test_one_point_per_whole_currency_unit(cents: int, points: int) -> None:
    assert points_for(cents) == points


def test_a_purchase_awards_points_to_its_customer(store: AggregateTest) -> None:
    recorded = store.when(RecordPurchase("inv-1", "cust-7", 12_345))
    recorded.then(PurchaseRecorded("inv-1", "cust-7", 12_345, 123))
    recorded.then_state(purchases=1, sales_cents=12_345, points_awarded=123, recent_invoice_ids=("inv-1",))


def test_totals_add_up_over_customers(store: AggregateTest) -> None:
    store.given(PurchaseRecorded("inv-1", "cust-7", 1_000, 10)).when(
        RecordPurchase("inv-2", "cust-8", 250)
    ).then_state(purchases=2, sales_cents=1_250, points_awarded=12)


def test_a_duplicate_invoice_is_rejected(store: AggregateTest) -> None:
    store.given(PurchaseRecorded("inv-1", "cust-7", 1_000, 10)).when(
        RecordPurchase("inv-1", "cust-7", 1_000)
    ).then_rejected("inv-1", code="duplicate_invoice")


def test_the_same_invoice_id_in_another_store_is_fine() -> None:
    other = AggregateTest(app, Store, aggregate_id="store-paris-2")
    other.when(RecordPurchase("inv-1", "cust-7", 1_000)).then(PurchaseRecorded("inv-1", "cust-7", 1_000, 10))


@pytest.mark.parametrize(
    ("cmd", "code"),
    [
        (RecordPurchase(" ", "cust-7", 100), "invalid_invoice"),
        (RecordPurchase("inv-1", "", 100), "missing_customer"),
        (RecordPurchase("inv-1", "cust-7", 0), "invalid_amount"),
        (RecordPurchase("inv-1", "cust-7", -100), "invalid_amount"),
    ],
)
def test_invalid_purchases_are_rejected(store: AggregateTest, cmd: RecordPurchase, code: str) -> None:
    store.when(cmd).then_rejected(code=code)


def test_only_the_most_recent_invoice_ids_are_remembered(store: AggregateTest) -> None:
    history = [PurchaseRecorded(f"inv-{i}", "cust-7", 100, 1) for i in range(RECENT_INVOICES + 1)]
    given = store.given(*history)
    assert len(given.state.recent_invoice_ids) == RECENT_INVOICES
    given.when(RecordPurchase(f"inv-{RECENT_INVOICES}", "cust-7", 100)).then_rejected(code="duplicate_invoice")
    # the oldest id has left the window (exact command re-sends are still caught by command id)
    given.when(RecordPurchase("inv-0", "cust-7", 100)).then(PurchaseRecorded("inv-0", "cust-7", 100, 1))
