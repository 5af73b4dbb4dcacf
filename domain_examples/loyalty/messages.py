"""Commands and events of the loyalty example: point-of-sale invoices, keyed by store."""

from __future__ import annotations

from cqrs.domain import command, event

__all__ = ["PurchaseRecorded", "RecordPurchase"]


@command(name="loyalty.RecordPurchase")
class RecordPurchase:
    """A store's register reports an invoice paid by a loyalty-card customer."""

    invoice_id: str
    customer_id: str
    amount_cents: int


@event(name="loyalty.PurchaseRecorded")
class PurchaseRecorded:
    """An invoice was recorded; ``points`` were awarded to ``customer_id``.

    Keyed by store on the events topic; the points-per-customer read model re-keys it by
    ``customer_id``.
    """

    invoice_id: str
    customer_id: str
    amount_cents: int
    points: int
