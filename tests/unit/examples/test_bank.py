"""The bank example, given / when / then."""

from __future__ import annotations

import datetime as dt

import pytest

from cqrs.testing import AggregateTest
from domain_examples.bank import (
    Account,
    AccountAudited,
    AccountClosed,
    AccountOpened,
    AuditAccount,
    CloseAccount,
    ComplianceCheck,
    ComplianceServiceError,
    Deposit,
    MoneyDeposited,
    MoneyWithdrawn,
    OpenAccount,
    Withdraw,
    app,
)

T0 = dt.datetime(2024, 3, 1, 9, 30, tzinfo=dt.timezone.utc)


@pytest.fixture
def account() -> AggregateTest:
    return AggregateTest(app, Account, aggregate_id="acc-1")


def test_open_account(account: AggregateTest) -> None:
    account.when(OpenAccount("ann"), expected_version=0).then(AccountOpened("ann"))
    account.when(OpenAccount("ann")).then_state(owner="ann", is_open=True, balance_cents=0)


def test_then_state_names_an_unknown_attribute(account: AggregateTest) -> None:
    with pytest.raises(AssertionError, match="no attribute 'balance'.*balance_cents"):
        account.when(OpenAccount("ann")).then_state(balance=0)


def test_open_twice_or_without_owner_is_rejected(account: AggregateTest) -> None:
    account.given(AccountOpened("ann")).when(OpenAccount("bob")).then_rejected("ann", code="already_open")
    account.when(OpenAccount("  ")).then_rejected(code="invalid_owner")


def test_deposit_and_withdraw_move_the_balance(account: AggregateTest) -> None:
    opened = account.given(AccountOpened("ann"), MoneyDeposited(1_000))
    opened.when(Deposit(250)).then(MoneyDeposited(250))
    opened.when(Deposit(250)).then_state(balance_cents=1_250)
    opened.when(Withdraw(1_000)).then(MoneyWithdrawn(1_000))
    opened.when(Withdraw(400)).then_state(balance_cents=600)


def test_withdraw_more_than_the_balance_is_insufficient_funds(account: AggregateTest) -> None:
    outcome = (
        account.given(AccountOpened("ann"), MoneyDeposited(100))
        .when(Withdraw(101))
        .then_rejected("insufficient funds", code="insufficient_funds")
    )
    assert outcome.current_version == 2


@pytest.mark.parametrize("amount", [0, -5])
def test_non_positive_amounts_are_invalid(account: AggregateTest, amount: int) -> None:
    opened = account.given(AccountOpened("ann"), MoneyDeposited(100))
    opened.when(Deposit(amount)).then_rejected(code="invalid_amount")
    opened.when(Withdraw(amount)).then_rejected(code="invalid_amount")


@pytest.mark.parametrize("cmd", [Deposit(1), Withdraw(1), CloseAccount(), AuditAccount("eve")])
def test_commands_on_an_unopened_account_are_not_open(account: AggregateTest, cmd: object) -> None:
    account.when(cmd).then_rejected(code="not_open")


def test_close_needs_a_zero_balance(account: AggregateTest) -> None:
    account.given(AccountOpened("ann"), MoneyDeposited(5)).when(CloseAccount()).then_rejected(
        "withdraw", code="balance_not_zero"
    )
    closed = account.given(AccountOpened("ann"), MoneyDeposited(5), MoneyWithdrawn(5)).when(CloseAccount())
    closed.then(AccountClosed())
    assert closed.state is None and closed.version == 4  # terminal: the account is deleted


def test_a_closed_account_refuses_everything(account: AggregateTest) -> None:
    account.given(AccountOpened("ann"), AccountClosed()).when(Deposit(5)).then_rejected(
        code="aggregate_deleted"
    )


def test_audit_records_the_balance_at_the_command_time(account: AggregateTest) -> None:
    audited = account.given(AccountOpened("ann"), MoneyDeposited(700)).when(
        AuditAccount("eve"), timestamp=T0
    )
    audited.then(AccountAudited("eve", 700, T0))
    audited.then_state(last_audited_at=T0, balance_cents=700)


def test_audit_of_a_demo_owner_crashes_and_leaves_the_account_as_it_was(account: AggregateTest) -> None:
    crashed = account.given(AccountOpened("mallory"), MoneyDeposited(700)).when(AuditAccount("eve"))
    failure = crashed.then_failed(ComplianceServiceError, "demo of a handler failure")
    assert failure.current_version == 2
    assert crashed.version == 2
    crashed.then_state(owner="mallory", balance_cents=700, last_audited_at=None)


def test_the_crashing_owners_are_configurable() -> None:
    from cqrs.app import App
    from domain_examples.bank import AccountHandler

    strict = App("bank-strict", aggregates=[Account], handlers=[AccountHandler(ComplianceCheck({"ann"}))])
    test = AggregateTest(strict, Account)
    test.given(AccountOpened("ann")).when(AuditAccount("eve")).then_failed("ComplianceServiceError")
    test.given(AccountOpened("mallory")).when(AuditAccount("eve"), timestamp=T0).then(
        AccountAudited("eve", 0, T0)
    )


def test_wrong_expected_version_is_rejected(account: AggregateTest) -> None:
    account.given(AccountOpened("ann")).when(Deposit(5), expected_version=3).then_rejected(
        code="wrong_expected_version"
    )
    account.given(AccountOpened("ann")).when(Deposit(5), expected_version=1).then(MoneyDeposited(5))
