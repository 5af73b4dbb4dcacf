"""``TicketOrder``, its state (the customer's name and e-mail personal, as in its events), and
``TicketOrderHandler``, each refusal a ``Rejected`` with a code:

| code | when |
| --- | --- |
| ``already_placed`` | placing an order id twice |
| ``no_tickets`` | fewer than one ticket |
| ``not_placed`` | cancelling an order that was never placed |
| ``already_cancelled`` | cancelling twice |
"""

from __future__ import annotations

from cqrs.domain import Aggregate, CommandHandler, Rejected, personal
from domain_examples.ticketing.messages import (
    CancelTicketOrder,
    PlaceTicketOrder,
    TicketOrderCancelled,
    TicketOrderPlaced,
)

__all__ = ["TicketOrder", "TicketOrderHandler"]


class TicketOrder(Aggregate, name="ticketing.TicketOrder", subject="customer_id"):
    """Who ordered (name and e-mail: personal), which show, how many tickets, and its status."""

    customer_id: str = ""
    customer_name: str = personal(default="")
    email: str = personal(default="")
    show: str = ""
    tickets: int = 0
    status: str = "new"  # new, placed, cancelled

    def apply_ticket_order_placed(self, e: TicketOrderPlaced) -> None:
        self.customer_id, self.customer_name, self.email = e.customer_id, e.customer_name, e.email
        self.show, self.tickets, self.status = e.show, e.tickets, "placed"

    def apply_ticket_order_cancelled(self, e: TicketOrderCancelled) -> None:
        self.status = "cancelled"


class TicketOrderHandler(CommandHandler[TicketOrder]):
    def place(self, order: TicketOrder, cmd: PlaceTicketOrder) -> list[TicketOrderPlaced]:
        if order.status != "new":
            raise Rejected(f"order already placed for {order.customer_id!r}", code="already_placed")
        if cmd.tickets < 1:
            raise Rejected(f"an order is for one ticket or more, not {cmd.tickets}",
                           code="no_tickets")
        return [TicketOrderPlaced(cmd.customer_id, cmd.customer_name, cmd.email, cmd.show,
                                  cmd.tickets)]

    def cancel(self, order: TicketOrder, cmd: CancelTicketOrder) -> list[TicketOrderCancelled]:
        if order.status == "new":
            raise Rejected("order was never placed", code="not_placed")
        if order.status == "cancelled":
            raise Rejected("order is already cancelled", code="already_cancelled")
        return [TicketOrderCancelled(cmd.reason)]
