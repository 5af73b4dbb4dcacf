"""The orders example, given / when / then: the life cycle and a rejection code per rule."""

from __future__ import annotations

import datetime as dt

import pytest

from cqrs.testing import AggregateTest
from domain_examples.orders import (
    CancelOrder,
    Order,
    OrderCancelled,
    OrderLine,
    OrderPaid,
    OrderPlaced,
    OrderShipped,
    OrderStatus,
    PayOrder,
    PlaceOrder,
    ShipOrder,
    app,
)

UTC = dt.timezone.utc
PLACED_AT = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
T1 = dt.datetime(2024, 5, 1, 12, 5, tzinfo=UTC)
LINES = (OrderLine("tea-500g", 2, 899), OrderLine("mug", 1, 1_250))
PLACED = OrderPlaced("cust-7", LINES, 3_048, PLACED_AT)
PAID = OrderPaid(3_048, "pay-1", T1)
SHIPPED = OrderShipped("dhl", "JD0001", T1)
CANCELLED = OrderCancelled("changed my mind", 0, T1)


@pytest.fixture
def order() -> AggregateTest:
    return AggregateTest(app, Order, aggregate_id="order-1", timestamp=T1)


def test_place_totals_the_lines_and_keeps_the_commands_time(order: AggregateTest) -> None:
    placed = order.when(PlaceOrder("cust-7", LINES, PLACED_AT), expected_version=0)
    placed.then(PLACED)
    placed.then_state(status=OrderStatus.PLACED, customer_id="cust-7", total_cents=3_048, placed_at=PLACED_AT)


def test_the_happy_path(order: AggregateTest) -> None:
    order.given(PLACED).when(PayOrder(3_048, "pay-1")).then(PAID)
    order.given(PLACED, PAID).when(ShipOrder("dhl", "JD0001")).then(SHIPPED)
    order.given(PLACED, PAID).when(ShipOrder("dhl", "JD0001")).then_state(status=OrderStatus.SHIPPED)


@pytest.mark.parametrize(
    ("cmd", "code"),
    [
        (PlaceOrder(" ", LINES, PLACED_AT), "invalid_customer"),
        (PlaceOrder("cust-7", (), PLACED_AT), "empty_order"),
        (PlaceOrder("cust-7", (OrderLine("mug", 0, 1_250),), PLACED_AT), "invalid_line"),
        (PlaceOrder("cust-7", (OrderLine("mug", 1, -1),), PLACED_AT), "invalid_line"),
        (PlaceOrder("cust-7", (OrderLine("", 1, 1),), PLACED_AT), "invalid_line"),
        (PlaceOrder("cust-7", (OrderLine("mug", 1, 1), OrderLine("mug", 2, 1)), PLACED_AT), "duplicate_sku"),
    ],
)
def test_invalid_orders_are_rejected(order: AggregateTest, cmd: PlaceOrder, code: str) -> None:
    order.when(cmd).then_rejected(code=code)


@pytest.mark.parametrize(
    ("history", "cmd", "code"),
    [
        ((PLACED,), PlaceOrder("cust-7", LINES, PLACED_AT), "already_placed"),
        ((), PayOrder(3_048, "pay-1"), "not_placed"),
        ((), ShipOrder("dhl", "JD0001"), "not_placed"),
        ((), CancelOrder("why not"), "not_placed"),
        ((PLACED,), PayOrder(3_000, "pay-1"), "wrong_amount"),
        ((PLACED, PAID), PayOrder(3_048, "pay-2"), "already_paid"),
        ((PLACED, PAID, SHIPPED), PayOrder(3_048, "pay-2"), "already_paid"),
        ((PLACED, CANCELLED), PayOrder(3_048, "pay-1"), "order_cancelled"),
        ((PLACED,), ShipOrder("dhl", "JD0001"), "not_paid"),
        ((PLACED, CANCELLED), ShipOrder("dhl", "JD0001"), "order_cancelled"),
        ((PLACED, PAID, SHIPPED), ShipOrder("dhl", "JD0002"), "already_shipped"),
        ((PLACED, PAID, SHIPPED), CancelOrder("too late"), "already_shipped"),
        ((PLACED, CANCELLED), CancelOrder("again"), "already_cancelled"),
    ],
)
def test_life_cycle_rules(order: AggregateTest, history: tuple[object, ...], cmd: object, code: str) -> None:
    order.given(*history).when(cmd).then_rejected(code=code)


def test_cancelling_an_unpaid_order_refunds_nothing(order: AggregateTest) -> None:
    order.given(PLACED).when(CancelOrder("changed my mind")).then(CANCELLED)


def test_cancelling_a_paid_order_refunds_the_payment(order: AggregateTest) -> None:
    cancelled = order.given(PLACED, PAID).when(CancelOrder("out of stock"))
    cancelled.then(OrderCancelled("out of stock", 3_048, T1))
    cancelled.then_state(status=OrderStatus.CANCELLED, paid_cents=0)


def test_a_cancelled_order_is_kept_not_deleted(order: AggregateTest) -> None:
    cancelled = order.given(PLACED).when(CancelOrder("changed my mind"))
    assert cancelled.state is not None and cancelled.version == 2


def test_line_total() -> None:
    assert OrderLine("tea-500g", 3, 899).total_cents == 2_697
