"""``Order``: the order aggregate, folded from its events.

A cancelled order keeps its state (it is not deleted), so that paying or shipping it later is
refused with a telling code (``order_cancelled``) rather than a bare ``aggregate_deleted``.
"""

from __future__ import annotations

import datetime as _dt

from cqrs.domain import Aggregate
from domain_examples.orders.messages import (
    OrderCancelled,
    OrderLine,
    OrderPaid,
    OrderPlaced,
    OrderShipped,
    OrderStatus,
)

__all__ = ["Order"]


class Order(Aggregate, name="orders.Order"):
    """An order's customer, lines, total, status and what has been paid for it."""

    status: OrderStatus = OrderStatus.NEW
    customer_id: str = ""
    lines: tuple[OrderLine, ...] = ()
    total_cents: int = 0
    paid_cents: int = 0
    placed_at: _dt.datetime | None = None

    def apply_order_placed(self, e: OrderPlaced) -> None:
        self.status = OrderStatus.PLACED
        self.customer_id = e.customer_id
        self.lines = e.lines
        self.total_cents = e.total_cents
        self.placed_at = e.placed_at

    def apply_order_paid(self, e: OrderPaid) -> None:
        self.status = OrderStatus.PAID
        self.paid_cents += e.amount_cents

    def apply_order_shipped(self, e: OrderShipped) -> None:
        self.status = OrderStatus.SHIPPED

    def apply_order_cancelled(self, e: OrderCancelled) -> None:
        self.status = OrderStatus.CANCELLED
        self.paid_cents -= e.refund_cents
