"""``StoreHandler``: records purchases and awards points.

Codes: ``invalid_invoice`` (blank invoice id), ``missing_customer`` (blank customer id),
``invalid_amount`` (amount <= 0), ``duplicate_invoice`` (invoice id seen recently in this store).
"""

from __future__ import annotations

from cqrs.domain import CommandHandler, Rejected
from domain_examples.loyalty.messages import PurchaseRecorded, RecordPurchase
from domain_examples.loyalty.points import points_for
from domain_examples.loyalty.store import Store

__all__ = ["StoreHandler"]


class StoreHandler(CommandHandler[Store]):
    def record(self, store: Store, cmd: RecordPurchase) -> list[PurchaseRecorded]:
        if not cmd.invoice_id.strip():
            raise Rejected("invoice id must not be blank", code="invalid_invoice")
        if not cmd.customer_id.strip():
            raise Rejected("customer id must not be blank", code="missing_customer")
        if cmd.amount_cents <= 0:
            raise Rejected(f"amount must be positive, got {cmd.amount_cents} cents", code="invalid_amount")
        if store.has_recent_invoice(cmd.invoice_id):
            raise Rejected(f"invoice {cmd.invoice_id!r} is already recorded", code="duplicate_invoice")
        return [
            PurchaseRecorded(cmd.invoice_id, cmd.customer_id, cmd.amount_cents, points_for(cmd.amount_cents))
        ]
