"""A tiny bank-account domain used by the framework's own tests and docs.

Open, deposit, withdraw, close; closing is a terminal event (deletion).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cqrs.app import App
from cqrs.domain import Aggregate, CommandContext, CommandHandler, Event, Rejected, command, event

__all__ = [
    "Account",
    "AccountClosed",
    "AccountHandler",
    "AccountOpened",
    "CloseAccount",
    "Deposit",
    "Explode",
    "Deposited",
    "OpenAccount",
    "Withdraw",
    "Withdrawn",
    "make_app",
]


@command(name="example.bank.OpenAccount")
class OpenAccount:
    owner: str


@command(name="example.bank.Deposit")
class Deposit:
    amount: int


@command(name="example.bank.Withdraw")
class Withdraw:
    amount: int


@command(name="example.bank.CloseAccount")
class CloseAccount:
    pass


@command(name="example.bank.Explode")
class Explode:
    """A command whose handler always crashes: shows handler failures and dead letters."""

    note: str = ""


@event(name="example.bank.AccountOpened")
class AccountOpened:
    owner: str


@event(name="example.bank.Deposited")
class Deposited:
    amount: int


@event(name="example.bank.Withdrawn")
class Withdrawn:
    amount: int


@event(name="example.bank.AccountClosed", terminal=True)
class AccountClosed:
    final_balance: int


class Account(Aggregate, name="example.bank.Account"):
    owner: str = ""
    is_open: bool = False
    balance: int = 0

    def apply_account_opened(self, e: AccountOpened) -> None:
        self.owner = e.owner
        self.is_open = True

    def apply_deposited(self, e: Deposited) -> None:
        self.balance += e.amount

    def apply_withdrawn(self, e: Withdrawn) -> None:
        self.balance -= e.amount


class AccountHandler(CommandHandler[Account]):
    def open(self, account: Account, cmd: OpenAccount) -> list[Event]:
        if account.is_open:
            raise Rejected(f"account already opened by {account.owner!r}", code="already_open")
        return [AccountOpened(cmd.owner)]

    def deposit(self, account: Account, cmd: Deposit) -> list[Event]:
        _require_open(account)
        if cmd.amount <= 0:
            raise Rejected(f"amount must be positive, got {cmd.amount}", code="invalid_amount")
        return [Deposited(cmd.amount)]

    def withdraw(self, account: Account, cmd: Withdraw, ctx: CommandContext) -> list[Event]:
        _require_open(account)
        if cmd.amount <= 0:
            raise Rejected(f"amount must be positive, got {cmd.amount}", code="invalid_amount")
        if cmd.amount > account.balance:
            raise Rejected(
                f"insufficient funds: balance {account.balance}, asked {cmd.amount} "
                f"(at version {ctx.version})",
                code="insufficient_funds",
            )
        return [Withdrawn(cmd.amount)]

    def close(self, account: Account, cmd: CloseAccount) -> list[Withdrawn | AccountClosed]:
        _require_open(account)
        events: list[Withdrawn | AccountClosed] = []
        if account.balance > 0:
            events.append(Withdrawn(account.balance))
        events.append(AccountClosed(account.balance))
        return events


    def explode(self, account: Account, cmd: Explode) -> list[Event]:
        raise RuntimeError(f"handler crashed on purpose: {cmd.note}")


def _require_open(account: Account) -> None:
    if not account.is_open:
        raise Rejected("account is not open", code="not_open")


def make_app(name: str = "example-bank") -> App:
    """The bank as an App (the import is late: ``cqrs.app`` pulls in the codec)."""
    from cqrs.app import App

    return App(name, aggregates=[Account], handlers=[AccountHandler])
