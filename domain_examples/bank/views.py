"""Read models of the bank (to be written against the projections API).

- **balances**: one row per account id: owner, balance in cents, open/closed, the version of
  the last event applied (so a replayed event is recognised and not added twice), and when it
  was last audited. Fed by ``bank.AccountOpened``, ``bank.MoneyDeposited``,
  ``bank.MoneyWithdrawn``, ``bank.AccountAudited`` and ``bank.AccountClosed`` (the row is kept
  and marked closed: a read model may remember what the aggregate forgets).
"""

from __future__ import annotations

__all__: list[str] = []
