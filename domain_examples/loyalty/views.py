"""Read models of the loyalty example.

- **customer_points**: one row per customer id: total points, number of purchases, amount
  spent and the time of the last purchase. ``loyalty.PurchaseRecorded`` events are keyed by
  *store* on the events topic; this re-keyed projection folds them by ``customer_id`` (the
  seed's "repartition by customer"), so a customer's points from every store meet in one row.
  Idempotence comes from the framework: each view remembers the last version it applied per
  store, so a replayed event adds nothing. Handlers are order-independent across stores (sums,
  a count and a max), as re-keyed handlers must be.
"""

from __future__ import annotations

import datetime as _dt

from domain_examples.loyalty.messages import PurchaseRecorded
from domain_examples.loyalty.store import Store
from projections.model import EventMeta, RekeyedProjection

__all__ = ["CustomerPoints"]


class CustomerPoints(RekeyedProjection):
    """Per customer: points, purchases, spent_cents, last_purchase_at."""

    name = "customer_points"
    aggregate = Store
    key = "customer_id"
    columns = {"points": int, "purchases": int, "spent_cents": int,
               "last_purchase_at": _dt.datetime}
    defaults = {"points": 0, "purchases": 0, "spent_cents": 0}

    def key_of(self, event: PurchaseRecorded, meta: EventMeta) -> str | None:
        return event.customer_id

    def on_purchase(self, view: dict, event: PurchaseRecorded, meta: EventMeta) -> None:
        view["points"] += event.points
        view["purchases"] += 1
        view["spent_cents"] += event.amount_cents
        last = view["last_purchase_at"]
        view["last_purchase_at"] = meta.timestamp if last is None else max(last, meta.timestamp)
