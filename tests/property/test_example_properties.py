"""Properties of the example apps over random command sequences (the decision function runs
exactly as in the Spark processor): invariants of state, events and replay."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.app import App
from cqrs.domain import Accepted, CommandInput, Decision, NewEvent, RejectedOutcome, decide, replay
from domain_examples import bank, loyalty, orders

SETTINGS = settings(max_examples=100, deadline=None)
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def _run(app: App, aggregate: type, commands: Sequence[Any]) -> tuple[Decision, list[NewEvent]]:
    """Decide ``commands`` in order on a new aggregate; check replay rebuilds the same state."""
    inputs = [CommandInput(f"c{i}", c, None, T0 + dt.timedelta(minutes=i)) for i, c in enumerate(commands)]
    decision = decide(app.model.entry(aggregate), "agg-1", None, 0, inputs)
    events = [e for o in decision.outcomes if isinstance(o, Accepted) for e in o.events]
    assert replay(aggregate, events) == (decision.state, decision.version)
    return decision, events


def _payloads(events: list[NewEvent], cls: type) -> list[Any]:
    return [e.event for e in events if isinstance(e.event, cls)]


# ---- bank -------------------------------------------------------------------------------------

amounts = st.integers(-50, 500)
bank_commands = st.tuples(
    st.sampled_from([[], [bank.OpenAccount("ann")]]),  # most runs start with an open account
    st.lists(
        st.one_of(
            *[st.builds(bank.Deposit, amounts), st.builds(bank.Withdraw, amounts)] * 4,
            st.builds(bank.OpenAccount, st.sampled_from(["ann", " "])),
            st.builds(bank.AuditAccount, st.just("eve")),
            st.just(bank.CloseAccount()),  # rarer: it ends the run
        ),
        max_size=25,
    ),
).map(lambda t: [*t[0], *t[1]])


@SETTINGS
@given(bank_commands)
def test_bank_balance_is_never_negative_and_is_deposits_minus_withdrawals(cmds: list[Any]) -> None:
    decision, events = _run(bank.app, bank.Account, cmds)
    balance = 0
    for e in events:
        if isinstance(e.event, bank.MoneyDeposited):
            balance += e.event.amount_cents
        elif isinstance(e.event, bank.MoneyWithdrawn):
            balance -= e.event.amount_cents
        assert balance >= 0
    if decision.state is not None:
        assert decision.state.balance_cents == balance
    else:  # never opened, or closed: a closed account had nothing left
        assert balance == 0
    for cmd, outcome in zip(cmds, decision.outcomes, strict=True):
        if isinstance(cmd, bank.Withdraw) and isinstance(outcome, RejectedOutcome):
            assert outcome.code in {"insufficient_funds", "invalid_amount", "not_open", "aggregate_deleted"}


# ---- orders -----------------------------------------------------------------------------------

ALLOWED = {  # status before -> statuses an accepted command may lead to
    orders.OrderStatus.NEW: {orders.OrderStatus.PLACED},
    orders.OrderStatus.PLACED: {orders.OrderStatus.PAID, orders.OrderStatus.CANCELLED},
    orders.OrderStatus.PAID: {orders.OrderStatus.SHIPPED, orders.OrderStatus.CANCELLED},
    orders.OrderStatus.SHIPPED: set(),
    orders.OrderStatus.CANCELLED: set(),
}
PLACE_TEA = orders.PlaceOrder("cust-1", (orders.OrderLine("tea", 2, 450),), T0)  # total 900
PLACE_MUGS = orders.PlaceOrder("cust-1", (orders.OrderLine("mug", 1, 900), orders.OrderLine("pot", 1, 100)), T0)
INVALID_PLACES = [
    orders.PlaceOrder("", PLACE_TEA.lines, T0),
    orders.PlaceOrder("cust-1", (), T0),
    orders.PlaceOrder("cust-1", (orders.OrderLine("tea", 0, 450),), T0),
    orders.PlaceOrder("cust-1", (orders.OrderLine("tea", 1, 1), orders.OrderLine("tea", 1, 1)), T0),
]
ORDER_COMMANDS = [  # sampled uniformly: repeats weigh a command, cancel is rare as it ends the run
    PLACE_TEA, PLACE_MUGS, *INVALID_PLACES,
    *[orders.PayOrder(900, "pay")] * 3, *[orders.PayOrder(1_000, "pay")] * 2, orders.PayOrder(5, "pay"),
    *[orders.ShipOrder("dhl", "JD1")] * 4,
    orders.CancelOrder("because"),
]
order_commands = st.tuples(
    st.sampled_from([PLACE_TEA, PLACE_MUGS, *INVALID_PLACES[:2]]),  # most runs start placed
    st.lists(st.sampled_from(ORDER_COMMANDS), max_size=12),
).map(lambda t: [t[0], *t[1]])


@SETTINGS
@given(order_commands)
def test_orders_move_only_along_the_life_cycle_and_refund_what_was_paid(cmds: list[Any]) -> None:
    decision, events = _run(orders.app, orders.Order, cmds)
    status, paid = orders.OrderStatus.NEW, 0
    for e in events:
        state, _ = replay(orders.Order, [x for x in events if x.version <= e.version])
        assert state is not None and state.status in ALLOWED[status]
        status = state.status
        if isinstance(e.event, orders.OrderPaid):
            assert e.event.amount_cents == state.total_cents
            paid += e.event.amount_cents
        if isinstance(e.event, orders.OrderCancelled):
            assert e.event.refund_cents == paid
            paid = 0
        assert state.paid_cents == paid
    if _payloads(events, orders.OrderShipped):
        assert _payloads(events, orders.OrderPaid) and not _payloads(events, orders.OrderCancelled)
    assert len(_payloads(events, orders.OrderPlaced)) <= 1


# ---- loyalty ----------------------------------------------------------------------------------

purchases = st.lists(
    st.builds(
        loyalty.RecordPurchase,
        st.sampled_from([f"inv-{i}" for i in range(20)] + [""]),
        st.sampled_from(["cust-1", "cust-2", "cust-3", "cust-4", ""]),
        st.integers(-100, 50_000),
    ),
    max_size=20,
)


@SETTINGS
@given(purchases)
def test_loyalty_points_total_is_the_sum_of_awarded_points(cmds: list[Any]) -> None:
    decision, events = _run(loyalty.app, loyalty.Store, cmds)
    recorded = _payloads(events, loyalty.PurchaseRecorded)
    assert all(r.points == loyalty.points_for(r.amount_cents) for r in recorded)
    per_customer: dict[str, int] = {}
    for r in recorded:  # the re-keying the points-per-customer read model will do
        per_customer[r.customer_id] = per_customer.get(r.customer_id, 0) + r.points
    total = sum(r.points for r in recorded)
    assert sum(per_customer.values()) == total
    if decision.state is not None:
        assert decision.state.points_awarded == total
        assert decision.state.purchases == len(recorded)
    assert len({r.invoice_id for r in recorded}) == len(recorded)  # no invoice counted twice
