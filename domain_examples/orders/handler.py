"""``OrderHandler``: the order life cycle and its rules, each refusal a ``Rejected`` with a code.

placed -> paid -> shipped, and cancelled from placed or paid (a paid order is refunded). An
order not paid within its payment window is cancelled by a deadline: placing it schedules
``CancelUnpaidOrder`` for the end of the window, paying it cancels that deadline, and the
deadline's command cancels only an order still unpaid.

| code | when |
| --- | --- |
| ``already_placed`` | placing an order id twice |
| ``invalid_customer`` | blank customer id |
| ``empty_order`` | no lines |
| ``invalid_line`` | blank sku, quantity < 1 or negative price |
| ``duplicate_sku`` | two lines for one sku (one line with the summed quantity instead) |
| ``not_placed`` | paying, shipping or cancelling an order that was never placed |
| ``order_cancelled`` | paying or shipping a cancelled order |
| ``already_paid`` | paying a paid (or shipped) order |
| ``wrong_amount`` | paying another amount than the order total |
| ``not_paid`` | shipping an unpaid order |
| ``already_shipped`` | shipping twice, or cancelling a shipped order |
| ``already_cancelled`` | cancelling twice |
"""

from __future__ import annotations

from datetime import timedelta

from cqrs.domain import Cancel, CommandContext, CommandHandler, Rejected, Schedule
from domain_examples.orders.messages import (
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

__all__ = ["OrderHandler"]


class OrderHandler(CommandHandler[Order]):
    """Decides order commands; event times come from the command, never from the clock."""

    def place(self, order: Order, cmd: PlaceOrder) -> list[OrderPlaced]:
        if order.status is not OrderStatus.NEW:
            raise Rejected(f"order already placed by {order.customer_id!r}", code="already_placed")
        if not cmd.customer_id.strip():
            raise Rejected("customer id must not be blank", code="invalid_customer")
        if not cmd.lines:
            raise Rejected("an order needs at least one line", code="empty_order")
        _check_lines(cmd.lines)
        total = sum(line.total_cents for line in cmd.lines)
        return [OrderPlaced(cmd.customer_id, cmd.lines, total, cmd.placed_at),
                Schedule(CancelUnpaidOrder(), after=timedelta(seconds=cmd.payment_window_s))]

    def pay(self, order: Order, cmd: PayOrder, ctx: CommandContext) -> list[OrderPaid | Cancel]:
        _require_placed(order)
        _refuse_if_cancelled(order, "paid")
        if order.status in (OrderStatus.PAID, OrderStatus.SHIPPED):
            raise Rejected(f"order is already {order.status.value}", code="already_paid")
        if cmd.amount_cents != order.total_cents:
            raise Rejected(
                f"payment of {cmd.amount_cents} cents does not match the total of "
                f"{order.total_cents} cents",
                code="wrong_amount",
            )
        return [OrderPaid(cmd.amount_cents, cmd.payment_reference, ctx.timestamp),
                Cancel(CancelUnpaidOrder)]

    def cancel_unpaid(self, order: Order, cmd: CancelUnpaidOrder,
                      ctx: CommandContext) -> list[OrderCancelled]:
        if order.status is not OrderStatus.PLACED:  # paid (or cancelled) meanwhile: nothing to do
            return []
        return [OrderCancelled("unpaid", 0, ctx.timestamp)]

    def ship(self, order: Order, cmd: ShipOrder, ctx: CommandContext) -> list[OrderShipped]:
        _require_placed(order)
        _refuse_if_cancelled(order, "shipped")
        if order.status is OrderStatus.SHIPPED:
            raise Rejected("order is already shipped", code="already_shipped")
        if order.status is not OrderStatus.PAID:
            raise Rejected("order is not paid yet: it cannot be shipped", code="not_paid")
        return [OrderShipped(cmd.carrier, cmd.tracking_number, ctx.timestamp)]

    def cancel(self, order: Order, cmd: CancelOrder, ctx: CommandContext) -> list[OrderCancelled]:
        _require_placed(order)
        if order.status is OrderStatus.CANCELLED:
            raise Rejected("order is already cancelled", code="already_cancelled")
        if order.status is OrderStatus.SHIPPED:
            raise Rejected("order is already shipped: it cannot be cancelled", code="already_shipped")
        return [OrderCancelled(cmd.reason, order.paid_cents, ctx.timestamp)]


def _check_lines(lines: tuple[OrderLine, ...]) -> None:
    seen: set[str] = set()
    for line in lines:
        if not line.sku.strip() or line.quantity < 1 or line.unit_price_cents < 0:
            raise Rejected(
                f"invalid line {line!r}: needs a sku, a quantity >= 1 and a price >= 0",
                code="invalid_line",
            )
        if line.sku in seen:
            raise Rejected(
                f"sku {line.sku!r} is on two lines: send one line with the total quantity",
                code="duplicate_sku",
            )
        seen.add(line.sku)


def _require_placed(order: Order) -> None:
    if order.status is OrderStatus.NEW:
        raise Rejected("order was never placed", code="not_placed")


def _refuse_if_cancelled(order: Order, what: str) -> None:
    if order.status is OrderStatus.CANCELLED:
        raise Rejected(f"order is cancelled: it cannot be {what}", code="order_cancelled")
