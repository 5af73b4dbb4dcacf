"""Read model of the ticketing example.

- **ticket_orders** (per-order view): one row per order id: customer id, show, tickets and
  status. It holds no personal field on purpose: a read model that copied the customer's name
  or e-mail would store it in clear, and keep it after the customer is forgotten until the
  projection is rebuilt (see docs/personal-data.md).
"""

from __future__ import annotations

from domain_examples.ticketing.messages import TicketOrderCancelled, TicketOrderPlaced
from domain_examples.ticketing.order import TicketOrder
from projections.model import Projection

__all__ = ["TicketOrders"]


class TicketOrders(Projection):
    """Per order: customer_id, show, tickets, status."""

    name = "ticket_orders"
    aggregate = TicketOrder
    key = "order_id"
    columns = {"customer_id": str, "show": str, "tickets": int, "status": str}
    defaults = {"tickets": 0, "status": "new"}

    def on_placed(self, view: dict, event: TicketOrderPlaced) -> None:
        view.update(customer_id=event.customer_id, show=event.show, tickets=event.tickets,
                    status="placed")

    def on_cancelled(self, view: dict, event: TicketOrderCancelled) -> None:
        view["status"] = "cancelled"
