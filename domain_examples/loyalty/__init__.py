"""The loyalty example: point-of-sale purchases recorded per store, points per customer.

``domain_examples.loyalty:app`` is the App. The aggregate is the store (invoices arrive keyed
by store); the points per customer are a read model that re-keys the events by customer (see
:mod:`domain_examples.loyalty.views`).
"""

from __future__ import annotations

from cqrs.app import App
from domain_examples.loyalty.handler import StoreHandler
from domain_examples.loyalty.messages import PurchaseRecorded, RecordPurchase
from domain_examples.loyalty.points import CENTS_PER_POINT, points_for
from domain_examples.loyalty.store import RECENT_INVOICES, Store
from domain_examples.loyalty.views import CustomerPoints

__all__ = [
    "CENTS_PER_POINT",
    "RECENT_INVOICES",
    "CustomerPoints",
    "PurchaseRecorded",
    "RecordPurchase",
    "Store",
    "StoreHandler",
    "app",
    "points_for",
]

app = App("loyalty", aggregates=[Store], handlers=[StoreHandler],
          projections=[CustomerPoints])
