"""Commands, events and values of the orders example. Prices are integer cents."""

from __future__ import annotations

import datetime as _dt
import enum

import attrs

from cqrs.domain import command, event

__all__ = [
    "CancelOrder",
    "OrderCancelled",
    "OrderLine",
    "OrderPaid",
    "OrderPlaced",
    "OrderShipped",
    "OrderStatus",
    "PayOrder",
    "PlaceOrder",
    "ShipOrder",
]


class OrderStatus(enum.Enum):
    """Where an order is in its life: new (not placed yet), placed, paid, shipped, cancelled."""

    NEW = "new"
    PLACED = "placed"
    PAID = "paid"
    SHIPPED = "shipped"
    CANCELLED = "cancelled"


@attrs.frozen
class OrderLine:
    """One line of an order: a product, how many, and the unit price in cents."""

    sku: str
    quantity: int
    unit_price_cents: int

    @property
    def total_cents(self) -> int:
        return self.quantity * self.unit_price_cents


# ---- commands ---------------------------------------------------------------------------------


PAYMENT_WINDOW_S = 900  # an order not paid within 15 minutes of being placed is cancelled


@command(name="orders.PlaceOrder")
class PlaceOrder:
    """Place an order; ``placed_at`` is when the customer placed it (the shop's clock); unless
    paid within ``payment_window_s`` seconds of the command's time, it is cancelled."""

    customer_id: str
    lines: tuple[OrderLine, ...]
    placed_at: _dt.datetime
    payment_window_s: int = PAYMENT_WINDOW_S


@command(name="orders.PayOrder")
class PayOrder:
    amount_cents: int
    payment_reference: str


@command(name="orders.ShipOrder")
class ShipOrder:
    carrier: str
    tracking_number: str


@command(name="orders.CancelOrder")
class CancelOrder:
    reason: str


@command(name="orders.CancelUnpaidOrder")
class CancelUnpaidOrder:
    """Sent by the order itself when its payment window ends (a deadline): cancels the order
    if it is still unpaid, and does nothing otherwise."""


# ---- events -----------------------------------------------------------------------------------


@event(name="orders.OrderPlaced")
class OrderPlaced:
    customer_id: str
    lines: tuple[OrderLine, ...]
    total_cents: int
    placed_at: _dt.datetime


@event(name="orders.OrderPaid")
class OrderPaid:
    amount_cents: int
    payment_reference: str
    paid_at: _dt.datetime


@event(name="orders.OrderShipped")
class OrderShipped:
    carrier: str
    tracking_number: str
    shipped_at: _dt.datetime


@event(name="orders.OrderCancelled")
class OrderCancelled:
    """The order is cancelled; ``refund_cents`` is what was paid and goes back (0 if unpaid)."""

    reason: str
    refund_cents: int
    cancelled_at: _dt.datetime
