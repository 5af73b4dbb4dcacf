"""Read models of the orders example (to be written against the projections API).

- **orders** (per-order view): one row per order id: customer id, lines, total in cents,
  status, placed / paid / shipped / cancelled times, refund, and the version of the last event
  applied (replays are recognised by version and change nothing).
- **customer_orders** (category view, "a customer's last 30 orders"): partitioned by customer
  id, clustered by ``placed_at`` newest first (then order id, to break ties), holding order id,
  total, status and the last event version; ``orders.OrderPlaced`` inserts the row, the paid /
  shipped / cancelled events update its status, and rows beyond the 30 newest are dropped, so a
  query is one partition read: ``WHERE customer_id = ? LIMIT 30``.
"""

from __future__ import annotations

__all__: list[str] = []
