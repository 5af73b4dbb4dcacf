"""Read models of the loyalty example (to be written against the projections API).

- **customer_points**: one row per customer id: total points, number of purchases and the
  last purchase. ``loyalty.PurchaseRecorded`` events are keyed by *store* on the events topic;
  this projection re-keys them by ``customer_id`` (the seed's "repartition by customer"), so a
  customer's points from every store meet in one row. Idempotence: points are added once per
  (store id, event version) — a replayed event is recognised by that position and adds nothing.
"""

from __future__ import annotations

__all__: list[str] = []
