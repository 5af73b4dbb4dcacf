"""The example bank of ``projections.testing`` after an incompatible release: ``Deposited.amount``
was renamed ``cents`` (the old field removed, the new one without a default, no upcaster), so
the stored deposits cannot be read. Same app name and projection name, so it runs on the same
topics and tables. For tests/integration/test_rebuild_refusals.py; not a test module.
"""

from __future__ import annotations

from cqrs.app import App
from cqrs.domain import Aggregate, event
from projections import Projection

__all__ = ["app"]


@event(name="example.bank.Deposited")
class Deposited:
    cents: int


class Account(Aggregate, name="example.bank.Account"):
    balance: int = 0

    def apply_deposited(self, e: Deposited) -> None:
        self.balance += e.cents


class Balances(Projection):
    name = "balances"
    aggregate = Account
    key = "account_id"
    columns = {"balance": int}
    defaults = {"balance": 0}

    def on_deposited(self, view: dict, event: Deposited) -> None:
        view["balance"] += event.cents


app = App("example-bank", aggregates=[Account], handlers=[], projections=[Balances])
