"""``Store``: one shop's register of invoices, the aggregate that decides on purchases.

Invoices arrive keyed by store (the register sends them), so a store is the aggregate and its
events are ordered per store. Points per *customer* are a read model that re-keys the events.

The store remembers its last :data:`RECENT_INVOICES` invoice ids to refuse duplicates (a
register re-sending an invoice after a timeout). Remembering every invoice forever would grow
the aggregate's state, and so every snapshot written, without bound; a re-send comes minutes
later, not thousands of invoices later. Exact re-sends of the same *command* are caught earlier
still, by the processor's command-id de-duplication.
"""

from __future__ import annotations

from cqrs.domain import Aggregate
from domain_examples.loyalty.messages import PurchaseRecorded

__all__ = ["RECENT_INVOICES", "Store"]

RECENT_INVOICES = 1000


class Store(Aggregate, name="loyalty.Store"):
    """A store's totals and the ids of its most recent invoices (oldest first)."""

    purchases: int = 0
    sales_cents: int = 0
    points_awarded: int = 0
    recent_invoice_ids: tuple[str, ...] = ()

    def apply_purchase_recorded(self, e: PurchaseRecorded) -> None:
        self.purchases += 1
        self.sales_cents += e.amount_cents
        self.points_awarded += e.points
        self.recent_invoice_ids = (*self.recent_invoice_ids, e.invoice_id)[-RECENT_INVOICES:]

    def has_recent_invoice(self, invoice_id: str) -> bool:
        return invoice_id in self.recent_invoice_ids
