"""The ticketing example: ticket orders that carry the customer's name and e-mail, declared
personal data (``personal()``, data subject ``customer_id``): they are encrypted with the
customer's own key wherever they are written, and ``cqrs forget domain_examples.ticketing:app
CUSTOMER`` makes them unreadable everywhere (see docs/personal-data.md).

``domain_examples.ticketing:app`` is the App; its read model is in
:mod:`domain_examples.ticketing.views`. On the stack it needs ``[personal_data] master_key``.
"""

from __future__ import annotations

from cqrs.app import App
from domain_examples.ticketing.messages import (
    CancelTicketOrder,
    PlaceTicketOrder,
    TicketOrderCancelled,
    TicketOrderPlaced,
)
from domain_examples.ticketing.order import TicketOrder, TicketOrderHandler
from domain_examples.ticketing.views import TicketOrders

__all__ = [
    "CancelTicketOrder",
    "PlaceTicketOrder",
    "TicketOrder",
    "TicketOrderCancelled",
    "TicketOrderHandler",
    "TicketOrderPlaced",
    "TicketOrders",
    "app",
]

app = App("ticketing", aggregates=[TicketOrder], handlers=[TicketOrderHandler],
          projections=[TicketOrders])
