"""Commands and events of the ticketing example. A ticket order carries its customer's name and
e-mail address: personal data, whose data subject is the customer (``customer_id``)."""

from __future__ import annotations

from cqrs.domain import command, event, personal

__all__ = ["CancelTicketOrder", "PlaceTicketOrder", "TicketOrderCancelled", "TicketOrderPlaced"]


@command(name="ticketing.PlaceTicketOrder", subject="customer_id")
class PlaceTicketOrder:
    """Order ``tickets`` seats of ``show`` for a customer (the order id is the aggregate id)."""

    customer_id: str
    customer_name: str = personal()
    email: str = personal()
    show: str = ""
    tickets: int = 1


@command(name="ticketing.CancelTicketOrder")
class CancelTicketOrder:
    reason: str = ""


@event(name="ticketing.TicketOrderPlaced", subject="customer_id")
class TicketOrderPlaced:
    customer_id: str
    customer_name: str = personal()
    email: str = personal()
    show: str = ""
    tickets: int = 1


@event(name="ticketing.TicketOrderCancelled")
class TicketOrderCancelled:
    reason: str = ""
