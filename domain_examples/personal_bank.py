"""The bench's bank with personal data: every account event carries the holder's name and
e-mail, declared ``personal()`` (data subject: the account), and so does the account's state.

Two apps of the same shapes, for ``bench/processor.py --personal`` to run side by side:

- ``domain_examples.personal_bank:app`` (``pd-bank``): ``holder`` and ``email`` personal, so
  each event has two fields sealed with the account's key, and each state row too;
- ``domain_examples.personal_bank:plain_app`` (``pd-bank-plain``): the same classes' fields,
  written in clear: the same bytes to decide, encode and write, without the encryption.

The classes are made by :func:`make_app` (this module evaluates annotations eagerly, so the
handler's and the appliers' annotations name the classes made there).
"""

import attrs

from cqrs.app import App
from cqrs.domain import Aggregate, CommandHandler, Event, Rejected, command, event, personal

__all__ = ["COMMANDS", "Commands", "app", "make_app", "plain_app"]


def make_app(name: str, *, personal_fields: bool) -> App:
    """The bank as an App named ``name``: holder and e-mail ``personal()`` when
    ``personal_fields``, else plain ``str`` fields. Its types are ``<name>.*``."""

    def field(default: str | None = None) -> str:
        if personal_fields:
            return personal() if default is None else personal(default=default)
        return attrs.field() if default is None else attrs.field(default=default)

    subject = "account_id" if personal_fields else None

    @command(name=f"{name}.OpenAccount", subject=subject)
    class OpenAccount:
        account_id: str
        holder: str = field()
        email: str = field()

    @command(name=f"{name}.Deposit")
    class Deposit:
        amount: int

    @event(name=f"{name}.AccountOpened", subject=subject)
    class AccountOpened:
        account_id: str
        holder: str = field()
        email: str = field()

    @event(name=f"{name}.Deposited", subject=subject)
    class Deposited:
        account_id: str
        amount: int
        holder: str = field()  # who the statement line is addressed to
        email: str = field()

    class Account(Aggregate, name=f"{name}.Account", subject=subject):
        account_id: str = ""
        holder: str = field("")
        email: str = field("")
        is_open: bool = False
        balance: int = 0

        def apply_account_opened(self, e: AccountOpened) -> None:
            self.account_id, self.holder, self.email = e.account_id, e.holder, e.email
            self.is_open = True

        def apply_deposited(self, e: Deposited) -> None:
            self.balance += e.amount

    class AccountHandler(CommandHandler[Account]):
        def open(self, account: Account, cmd: OpenAccount) -> list[Event]:
            if account.is_open:
                raise Rejected("account already opened", code="already_open")
            return [AccountOpened(cmd.account_id, cmd.holder, cmd.email)]

        def deposit(self, account: Account, cmd: Deposit) -> list[Event]:
            if not account.is_open:
                raise Rejected("account is not open", code="not_open")
            if cmd.amount <= 0:
                raise Rejected(f"amount must be positive, got {cmd.amount}", code="invalid_amount")
            return [Deposited(account.account_id, cmd.amount, account.holder, account.email)]

    built = App(name, aggregates=[Account], handlers=[AccountHandler])
    COMMANDS[name] = Commands(OpenAccount, Deposit)
    return built


@attrs.frozen
class Commands:
    """The command classes of one :func:`make_app` app (to build its workload)."""

    open_account: type
    deposit: type


COMMANDS: dict[str, Commands] = {}
"""App name -> its command classes."""


app = make_app("pd-bank", personal_fields=True)
plain_app = make_app("pd-bank-plain", personal_fields=False)
