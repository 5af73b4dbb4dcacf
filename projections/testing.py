"""Projections of the example bank (``cqrs.testing.example``), for tests, docs and benchmarks.

``app`` is the bank with these projections, importable by Spark executors as
``projections.testing:app``.
"""

from __future__ import annotations

import datetime as _dt
import tempfile
from pathlib import Path

from cqrs.app import App
from cqrs.testing.example import (
    Account,
    AccountClosed,
    AccountHandler,
    AccountOpened,
    Deposited,
    Withdrawn,
)
from projections.model import DELETE, CategoryProjection, Delete, EventMeta, Projection

__all__ = ["POISON_FILE", "AccountsByOwner", "Balances", "app", "make_bank_app"]

POISON_FILE = Path(tempfile.gettempdir()) / "cqrs-projections-poison-amounts"
"""Deposits of an amount listed in this file (one per line) make :class:`Balances` fail: lets
tests poison a handler and fix it again across processes."""


def _poisoned(amount: int) -> bool:
    try:
        return str(amount) in POISON_FILE.read_text().split()
    except FileNotFoundError:
        return False


class Balances(Projection):
    """One row per account: owner, balance, number of movements; deleted when closed."""

    name = "balances"
    aggregate = Account
    key = "account_id"
    columns = {"owner": str, "balance": int, "movements": int, "updated_at": _dt.datetime}
    defaults = {"balance": 0, "movements": 0}

    def on_opened(self, view: dict, event: AccountOpened, meta: EventMeta) -> None:
        view["owner"] = event.owner
        view["updated_at"] = meta.timestamp

    def on_deposited(self, view: dict, event: Deposited, meta: EventMeta) -> None:
        if _poisoned(event.amount):
            raise ValueError(f"poisoned deposit amount {event.amount}")
        view["balance"] += event.amount
        view["movements"] += 1
        view["updated_at"] = meta.timestamp

    def on_withdrawn(self, view: dict, event: Withdrawn, meta: EventMeta) -> None:
        view["balance"] -= event.amount
        view["movements"] += 1
        view["updated_at"] = meta.timestamp

    def on_closed(self, view: dict, event: AccountClosed) -> Delete:
        return DELETE


class AccountsByOwner(CategoryProjection):
    """An owner's newest accounts (the 3 last opened), with their balances."""

    name = "accounts_by_owner"
    aggregate = Account
    key = "account_id"
    columns = {"owner": str, "opened_at": _dt.datetime, "balance": int}
    defaults = {"balance": 0}
    group_by = "owner"
    order_by = "opened_at"
    keep = 3

    def on_opened(self, view: dict, event: AccountOpened, meta: EventMeta) -> None:
        view["owner"] = event.owner
        view["opened_at"] = meta.timestamp

    def on_moved(self, view: dict, event: Deposited | Withdrawn) -> None:
        view["balance"] += event.amount if isinstance(event, Deposited) else -event.amount


def make_bank_app(name: str = "example-bank") -> App:
    return App(name, aggregates=[Account], handlers=[AccountHandler],
               projections=[Balances, AccountsByOwner])


app = make_bank_app()
