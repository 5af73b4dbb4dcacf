"""Commands and events of the bank. Amounts are integer cents; type names are ``bank.*``."""

from __future__ import annotations

import datetime as _dt

from cqrs.domain import command, event

__all__ = [
    "AccountAudited",
    "AccountClosed",
    "AccountOpened",
    "AuditAccount",
    "CloseAccount",
    "Deposit",
    "MoneyDeposited",
    "MoneyWithdrawn",
    "OpenAccount",
    "Withdraw",
]


# ---- commands ---------------------------------------------------------------------------------


@command(name="bank.OpenAccount")
class OpenAccount:
    owner: str


@command(name="bank.Deposit")
class Deposit:
    amount_cents: int


@command(name="bank.Withdraw")
class Withdraw:
    amount_cents: int


@command(name="bank.CloseAccount")
class CloseAccount:
    """Close an account whose balance is zero (withdraw the rest first)."""


@command(name="bank.AuditAccount")
class AuditAccount:
    """Run the compliance check on the account's owner and record the audit.

    Also the demo of handler failures: see :mod:`domain_examples.bank.compliance`.
    """

    auditor: str


# ---- events -----------------------------------------------------------------------------------


@event(name="bank.AccountOpened")
class AccountOpened:
    owner: str


@event(name="bank.MoneyDeposited")
class MoneyDeposited:
    amount_cents: int


@event(name="bank.MoneyWithdrawn")
class MoneyWithdrawn:
    amount_cents: int


@event(name="bank.AccountAudited")
class AccountAudited:
    auditor: str
    balance_cents: int
    audited_at: _dt.datetime


@event(name="bank.AccountClosed", terminal=True)
class AccountClosed:
    """Terminal: the account is gone; every later command is rejected (``aggregate_deleted``)."""
