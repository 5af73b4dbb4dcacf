"""Read models of the orders example.

- **orders** (per-order view): one row per order id: customer id, total in cents, status,
  placed / paid / shipped / cancelled times and the refund. The framework keeps the version of
  the last applied event, so replays are recognised and change nothing.
- **customer_orders** (category view, "a customer's last 30 orders"): grouped by customer id,
  ordered by ``placed_at`` newest first (then order id, to break ties), holding order id,
  total, status and placed time; ``orders.OrderPlaced`` inserts the item, the paid / shipped /
  cancelled events update its status, and items beyond the 30 newest are dropped, so a query
  is one partition read (``ProjectionReader.category("customer_orders", customer_id)``).
"""

from __future__ import annotations

import datetime as _dt

from domain_examples.orders.messages import (
    OrderCancelled,
    OrderPaid,
    OrderPlaced,
    OrderShipped,
    OrderStatus,
)
from domain_examples.orders.order import Order
from projections.model import CategoryProjection, Projection

__all__ = ["CUSTOMER_ORDERS_KEPT", "CustomerOrders", "Orders"]

CUSTOMER_ORDERS_KEPT = 30


class Orders(Projection):
    """Per order: customer_id, status, total_cents, placed/paid/shipped/cancelled times, refund."""

    name = "orders"
    aggregate = Order
    key = "order_id"
    columns = {"customer_id": str, "status": str, "total_cents": int, "placed_at": _dt.datetime,
               "paid_at": _dt.datetime, "shipped_at": _dt.datetime,
               "cancelled_at": _dt.datetime, "refund_cents": int}
    defaults = {"status": OrderStatus.NEW.value, "total_cents": 0, "refund_cents": 0}

    def on_placed(self, view: dict, event: OrderPlaced) -> None:
        view.update(customer_id=event.customer_id, status=OrderStatus.PLACED.value,
                    total_cents=event.total_cents, placed_at=event.placed_at)

    def on_paid(self, view: dict, event: OrderPaid) -> None:
        view.update(status=OrderStatus.PAID.value, paid_at=event.paid_at)

    def on_shipped(self, view: dict, event: OrderShipped) -> None:
        view.update(status=OrderStatus.SHIPPED.value, shipped_at=event.shipped_at)

    def on_cancelled(self, view: dict, event: OrderCancelled) -> None:
        view.update(status=OrderStatus.CANCELLED.value, cancelled_at=event.cancelled_at,
                    refund_cents=event.refund_cents)


class CustomerOrders(CategoryProjection):
    """A customer's last 30 orders, newest first: customer_id, placed_at, total_cents, status."""

    name = "customer_orders"
    aggregate = Order
    key = "order_id"
    columns = {"customer_id": str, "placed_at": _dt.datetime, "total_cents": int, "status": str}
    defaults = {"total_cents": 0, "status": OrderStatus.NEW.value}
    group_by = "customer_id"
    order_by = "placed_at"
    keep = CUSTOMER_ORDERS_KEPT

    def on_placed(self, view: dict, event: OrderPlaced) -> None:
        view.update(customer_id=event.customer_id, placed_at=event.placed_at,
                    total_cents=event.total_cents, status=OrderStatus.PLACED.value)

    def on_status(self, view: dict, event: OrderPaid | OrderShipped | OrderCancelled) -> None:
        view["status"] = _STATUS_AFTER[type(event)].value


_STATUS_AFTER: dict[type, OrderStatus] = {OrderPaid: OrderStatus.PAID,
                                          OrderShipped: OrderStatus.SHIPPED,
                                          OrderCancelled: OrderStatus.CANCELLED}
