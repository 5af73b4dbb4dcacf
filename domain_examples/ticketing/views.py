"""Read model of the ticketing example.

- **ticket_orders** (per-order view): one row per order id: customer id, the customer's name,
  show, tickets and status. The name is a copy of the events' personal field, so it is a
  personal column (``personal_columns``, data subject ``customer_id``): every store holds it
  sealed with the customer's key, the readers open it, and once the customer is forgotten it
  reads as ``FORGOTTEN`` (``cqrs forget`` also rewrites it in place; see
  docs/personal-data.md). The e-mail address is not copied: a read model keeps what it shows.
"""

from __future__ import annotations

from domain_examples.ticketing.messages import TicketOrderCancelled, TicketOrderPlaced
from domain_examples.ticketing.order import TicketOrder
from projections.model import Projection

__all__ = ["TicketOrders"]


class TicketOrders(Projection):
    """Per order: customer_id, customer_name (personal), show, tickets, status."""

    name = "ticket_orders"
    aggregate = TicketOrder
    key = "order_id"
    columns = {"customer_id": str, "customer_name": str, "show": str, "tickets": int,
               "status": str}
    personal_columns = {"customer_name": "customer_id"}
    defaults = {"tickets": 0, "status": "new"}

    def on_placed(self, view: dict, event: TicketOrderPlaced) -> None:
        view.update(customer_id=event.customer_id, customer_name=event.customer_name,
                    show=event.show, tickets=event.tickets, status="placed")

    def on_cancelled(self, view: dict, event: TicketOrderCancelled) -> None:
        view["status"] = "cancelled"
