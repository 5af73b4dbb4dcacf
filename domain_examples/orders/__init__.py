"""The orders example: place, pay, ship and cancel orders; every rule a rejection with a code.

``domain_examples.orders:app`` is the App; its read models ("a customer's last 30 orders") are
described in :mod:`domain_examples.orders.views`.
"""

from __future__ import annotations

from cqrs.app import App
from domain_examples.orders.handler import OrderHandler
from domain_examples.orders.messages import (
    PAYMENT_WINDOW_S,
    CancelOrder,
    CancelUnpaidOrder,
    OrderCancelled,
    OrderLine,
    OrderPaid,
    OrderPlaced,
    OrderShipped,
    OrderStatus,
    PayOrder,
    PlaceOrder,
    ShipOrder,
)
from domain_examples.orders.order import Order
from domain_examples.orders.views import CustomerOrders, Orders

__all__ = [
    "PAYMENT_WINDOW_S",
    "CancelOrder",
    "CancelUnpaidOrder",
    "CustomerOrders",
    "Order",
    "OrderCancelled",
    "OrderHandler",
    "OrderLine",
    "OrderPaid",
    "OrderPlaced",
    "OrderShipped",
    "OrderStatus",
    "Orders",
    "PayOrder",
    "PlaceOrder",
    "ShipOrder",
    "app",
]

app = App("orders", aggregates=[Order], handlers=[OrderHandler],
          projections=[Orders, CustomerOrders])
