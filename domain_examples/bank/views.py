"""Read models of the bank.

- **balances**: one row per account id: owner, balance in cents, whether it is open, when it
  was last audited and closed. Closing *marks* the row closed (``is_open = False``) instead of
  deleting it: a read model may remember what the aggregate forgets (``AccountClosed`` is
  terminal), and "this account was closed" is an answer a support desk needs. The version of
  the last applied event is kept by the framework, so a replayed event changes nothing.
"""

from __future__ import annotations

import datetime as _dt

from domain_examples.bank.account import Account
from domain_examples.bank.messages import (
    AccountAudited,
    AccountClosed,
    AccountOpened,
    MoneyDeposited,
    MoneyWithdrawn,
)
from projections.model import EventMeta, Projection

__all__ = ["Balances"]


class Balances(Projection):
    """Per account: owner, balance_cents, is_open, last_audited_at, closed_at."""

    name = "balances"
    aggregate = Account
    key = "account_id"
    columns = {"owner": str, "balance_cents": int, "is_open": bool,
               "last_audited_at": _dt.datetime, "closed_at": _dt.datetime}
    defaults = {"balance_cents": 0, "is_open": False}

    def on_opened(self, view: dict, event: AccountOpened) -> None:
        view["owner"] = event.owner
        view["is_open"] = True

    def on_deposited(self, view: dict, event: MoneyDeposited) -> None:
        view["balance_cents"] += event.amount_cents

    def on_withdrawn(self, view: dict, event: MoneyWithdrawn) -> None:
        view["balance_cents"] -= event.amount_cents

    def on_audited(self, view: dict, event: AccountAudited) -> None:
        view["last_audited_at"] = event.audited_at

    def on_closed(self, view: dict, event: AccountClosed, meta: EventMeta) -> None:
        view["is_open"] = False
        view["closed_at"] = meta.timestamp
