"""The bank example: open, deposit, withdraw, audit and close accounts (amounts in cents).

``domain_examples.bank:app`` is the App (Spark executors import it by reference). An
``AuditAccount`` of an account owned by ``"mallory"`` crashes its handler on purpose, to show
failed results and dead letters (see :mod:`domain_examples.bank.compliance`).
"""

from __future__ import annotations

from cqrs.app import App
from domain_examples.bank.account import Account
from domain_examples.bank.compliance import DEMO_CRASHING_OWNERS, ComplianceCheck, ComplianceServiceError
from domain_examples.bank.handler import AccountHandler
from domain_examples.bank.messages import (
    AccountAudited,
    AccountClosed,
    AccountOpened,
    AuditAccount,
    CloseAccount,
    Deposit,
    MoneyDeposited,
    MoneyWithdrawn,
    OpenAccount,
    Withdraw,
)
from domain_examples.bank.views import Balances

__all__ = [
    "DEMO_CRASHING_OWNERS",
    "Account",
    "AccountAudited",
    "AccountClosed",
    "AccountHandler",
    "AccountOpened",
    "AuditAccount",
    "Balances",
    "CloseAccount",
    "ComplianceCheck",
    "ComplianceServiceError",
    "Deposit",
    "MoneyDeposited",
    "MoneyWithdrawn",
    "OpenAccount",
    "Withdraw",
    "app",
]

app = App("bank", aggregates=[Account], handlers=[AccountHandler()],
          projections=[Balances])
