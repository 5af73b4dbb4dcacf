"""``Account``: the bank account aggregate, folded from its events."""

from __future__ import annotations

import datetime as _dt

from cqrs.domain import Aggregate
from domain_examples.bank.messages import (
    AccountAudited,
    AccountOpened,
    MoneyDeposited,
    MoneyWithdrawn,
)

__all__ = ["Account"]


class Account(Aggregate, name="bank.Account"):
    """An account: its owner, balance in cents and when it was last audited.

    ``AccountClosed`` is terminal and has no applier: once closed, there is no state.
    """

    owner: str = ""
    is_open: bool = False
    balance_cents: int = 0
    last_audited_at: _dt.datetime | None = None

    def apply_account_opened(self, e: AccountOpened) -> None:
        self.owner = e.owner
        self.is_open = True

    def apply_money_deposited(self, e: MoneyDeposited) -> None:
        self.balance_cents += e.amount_cents

    def apply_money_withdrawn(self, e: MoneyWithdrawn) -> None:
        self.balance_cents -= e.amount_cents

    def apply_account_audited(self, e: AccountAudited) -> None:
        self.last_audited_at = e.audited_at
