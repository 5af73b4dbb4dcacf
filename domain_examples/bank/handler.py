"""``AccountHandler``: the bank's decisions and their rejection codes.

Codes: ``invalid_owner``, ``already_open``, ``not_open``, ``invalid_amount``,
``insufficient_funds``, ``balance_not_zero``. ``AuditAccount`` for a demo owner crashes on
purpose (see :mod:`domain_examples.bank.compliance`).
"""

from __future__ import annotations

from cqrs.domain import CommandContext, CommandHandler, Rejected
from domain_examples.bank.account import Account
from domain_examples.bank.compliance import ComplianceCheck
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

__all__ = ["AccountHandler"]


class AccountHandler(CommandHandler[Account]):
    """Decides bank commands; ``compliance`` is the screening service used by audits."""

    def __init__(self, compliance: ComplianceCheck | None = None) -> None:
        self.compliance = compliance or ComplianceCheck()

    def open(self, account: Account, cmd: OpenAccount) -> list[AccountOpened]:
        if account.is_open:
            raise Rejected(f"account already opened by {account.owner!r}", code="already_open")
        if not cmd.owner.strip():
            raise Rejected("owner must not be blank", code="invalid_owner")
        return [AccountOpened(cmd.owner)]

    def deposit(self, account: Account, cmd: Deposit) -> list[MoneyDeposited]:
        _require_open(account)
        _require_positive(cmd.amount_cents)
        return [MoneyDeposited(cmd.amount_cents)]

    def withdraw(self, account: Account, cmd: Withdraw, ctx: CommandContext) -> list[MoneyWithdrawn]:
        _require_open(account)
        _require_positive(cmd.amount_cents)
        if cmd.amount_cents > account.balance_cents:
            raise Rejected(
                f"insufficient funds: balance {account.balance_cents} cents, asked "
                f"{cmd.amount_cents} (at version {ctx.version})",
                code="insufficient_funds",
            )
        return [MoneyWithdrawn(cmd.amount_cents)]

    def close(self, account: Account, cmd: CloseAccount) -> list[AccountClosed]:
        _require_open(account)
        if account.balance_cents != 0:
            raise Rejected(
                f"balance is {account.balance_cents} cents: withdraw it before closing",
                code="balance_not_zero",
            )
        return [AccountClosed()]

    def audit(self, account: Account, cmd: AuditAccount, ctx: CommandContext) -> list[AccountAudited]:
        _require_open(account)
        self.compliance.screen(account.owner)  # raises for the demo owners: a handler failure
        return [AccountAudited(cmd.auditor, account.balance_cents, ctx.timestamp)]


def _require_open(account: Account) -> None:
    if not account.is_open:
        raise Rejected("account is not open", code="not_open")


def _require_positive(amount_cents: int) -> None:
    if amount_cents <= 0:
        raise Rejected(f"amount must be positive, got {amount_cents} cents", code="invalid_amount")
