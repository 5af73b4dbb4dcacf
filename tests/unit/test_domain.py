"""Messages, aggregates, handlers, the model and the decision function."""

from __future__ import annotations

import datetime as dt

import attrs
import pytest

from cqrs.domain import (
    Accepted,
    Aggregate,
    Command,
    CommandHandler,
    CommandInput,
    DomainModel,
    Event,
    Failed,
    RejectedOutcome,
    applies,
    command,
    decide,
    event,
    event_id_for,
    replay,
    type_name,
    type_version,
)
from cqrs.errors import (
    AggregateDefinitionError,
    CqrsError,
    DuplicateHandlerError,
    DuplicateTypeNameError,
    HandlerSignatureError,
    InvalidTypeNameError,
    MissingApplierError,
    MissingHandlerError,
    Rejected,
    ReplayError,
)
from cqrs.testing.example import (
    Account,
    AccountClosed,
    AccountHandler,
    AccountOpened,
    CloseAccount,
    Deposit,
    Deposited,
    OpenAccount,
    Withdraw,
    Withdrawn,
)

T0 = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
MODEL = DomainModel([Account], [AccountHandler])
ENTRY = MODEL.entry(Account)


def cmd(cid: str, c: object, expected: int | None = None) -> CommandInput:
    return CommandInput(cid, c, expected, T0)


# ---- messages --------------------------------------------------------------------------


@event(name="test.Renamed", version=3)
class Moved:
    x: int


@command
class Plain:
    y: str


def test_event_decorator_makes_frozen_named_versioned_class() -> None:
    m = Moved(1)
    assert (type_name(m), type_version(Moved)) == ("test.Renamed", 3)
    assert isinstance(m, Event) and not isinstance(m, Command)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        m.x = 2  # type: ignore[misc]


def test_bare_decorator_defaults_to_module_qualname_and_version_1() -> None:
    assert type_name(Plain) == f"{__name__}.Plain"
    assert type_version(Plain("a")) == 1
    assert isinstance(Plain("a"), Command)


@pytest.mark.parametrize("bad", ["", "1abc", "a..b", "has space"])
def test_invalid_type_name_is_refused(bad: str) -> None:
    with pytest.raises(InvalidTypeNameError, match="is invalid"):
        event(name=bad)(type("X", (), {"__annotations__": {"a": int}}))


def test_invalid_version_is_refused() -> None:
    with pytest.raises(InvalidTypeNameError, match="version 0"):
        event(version=0)(type("X", (), {"__annotations__": {"a": int}}))


# ---- aggregate ---------------------------------------------------------------------------


def test_aggregate_subclass_is_mutable_attrs_class_with_defaults() -> None:
    a = Account()
    a.balance = 5
    assert attrs.has(Account) and a == Account(balance=5)
    assert type_name(Account) == "example.bank.Account"


def test_aggregate_field_without_default_is_refused() -> None:
    with pytest.raises(AggregateDefinitionError, match="have no default"):

        class Bad(Aggregate):
            owner: str


def test_applies_decorator_and_missing_applier() -> None:
    class Other(Aggregate):
        total: int = 0

        @applies(Deposited)
        def whatever(self, e: Deposited) -> None:
            self.total += e.amount

    state, version = replay(Other, [Deposited(2), Deposited(3)])
    assert (state, version) == (Other(5), 2)
    with pytest.raises(MissingApplierError, match="apply_withdrawn"):
        replay(Other, [Withdrawn(1)])


def test_replay_after_terminal_event_is_an_error() -> None:
    with pytest.raises(ReplayError, match="follows the terminal event"):
        replay(Account, [AccountOpened("a"), AccountClosed(0), Deposited(1)])


# ---- model -------------------------------------------------------------------------------


@command(name="test.Dup")
class DupCommand:
    n: int


class DupHandlerA(CommandHandler[Account]):
    def one(self, account: Account, cmd: DupCommand) -> None:
        return None


class DupHandlerB(CommandHandler[Account]):
    def two(self, account: Account, cmd: DupCommand) -> None:
        return None


def test_two_handlers_for_one_command_are_refused() -> None:
    with pytest.raises(DuplicateHandlerError, match="DupHandlerA.one, DupHandlerB.two"):
        DomainModel([Account], [DupHandlerA, DupHandlerB])


def test_listed_command_without_handler_is_refused() -> None:
    with pytest.raises(MissingHandlerError, match="test.Dup"):
        DomainModel([Account], [AccountHandler], commands=[DupCommand])


def test_duplicate_type_names_are_refused() -> None:
    @event(name="example.bank.Deposited")
    class Impostor:
        amount: int

    with pytest.raises(DuplicateTypeNameError, match="example.bank.Deposited"):
        DomainModel([Account], [AccountHandler], events=[Impostor])


class BadSignature(CommandHandler[Account]):
    def x(self, cmd: Deposit) -> None:
        return None


def test_bad_handler_signature_is_refused() -> None:
    with pytest.raises(HandlerSignatureError, match="BadSignature.x"):
        DomainModel([Account], [BadSignature])


def test_model_indexes_commands_events_and_routes() -> None:
    assert set(MODEL.commands) == {
        "example.bank.OpenAccount", "example.bank.Deposit",
        "example.bank.Withdraw", "example.bank.CloseAccount", "example.bank.Explode",
    }  # fmt: skip
    assert MODEL.events["example.bank.AccountClosed"] is AccountClosed
    entry, route = MODEL.route(Deposit(1))
    assert entry is ENTRY and route.method_name == "deposit"
    with pytest.raises(MissingHandlerError):
        MODEL.route("nope.Nothing")


# ---- decision ----------------------------------------------------------------------------


def test_decide_accepts_rejects_and_versions() -> None:
    d = decide(
        ENTRY,
        "acc-1",
        None,
        0,
        [
            cmd("c1", OpenAccount("ann"), 0),
            cmd("c2", Deposit(10), 1),
            cmd("c3", Deposit(5), 1),  # stale expected version
            cmd("c4", Withdraw(50)),  # business rule
            cmd("c5", CloseAccount()),  # two events: Withdrawn + AccountClosed
            cmd("c6", Deposit(1)),  # after deletion
        ],
    )
    o = d.outcomes
    assert isinstance(o[0], Accepted) and o[0].version == 1
    assert isinstance(o[1], Accepted) and o[1].version == 2
    assert o[2] == RejectedOutcome("c3", o[2].reason, "wrong_expected_version", 2)
    assert "expected version 1" in o[2].reason
    assert isinstance(o[3], RejectedOutcome) and o[3].code == "insufficient_funds"
    assert isinstance(o[4], Accepted) and o[4].version == 4
    assert [e.version for e in o[4].events] == [3, 4]
    assert [e.type_name for e in o[4].events] == [
        "example.bank.Withdrawn", "example.bank.AccountClosed",
    ]  # fmt: skip
    assert isinstance(o[5], RejectedOutcome) and o[5].code == "aggregate_deleted"
    assert (d.state, d.version) == (None, 4)


def test_new_events_carry_ids_timestamps_and_causation() -> None:
    d = decide(ENTRY, "acc-2", None, 0, [CommandInput("c1", OpenAccount("x"), None, T0, "corr")])
    (ev,) = d.outcomes[0].events  # type: ignore[union-attr]
    assert ev.event_id == event_id_for("example.bank.Account", "acc-2", 1)
    assert (ev.timestamp, ev.causation_id, ev.correlation_id) == (T0, "c1", "corr")
    assert (ev.aggregate_id, ev.aggregate_type) == ("acc-2", "example.bank.Account")


def test_decide_does_not_mutate_input_state() -> None:
    state = Account("ann", True, 10)
    d = decide(ENTRY, "a", state, 2, [cmd("c1", Deposit(5))])
    assert state == Account("ann", True, 10)
    assert d.state == Account("ann", True, 15) and d.version == 3


def test_rejected_command_on_new_aggregate_keeps_no_state() -> None:
    d = decide(ENTRY, "a", None, 0, [cmd("c1", Deposit(5))])
    assert d.state is None and d.version == 0
    assert d.outcomes[0].code == "not_open"  # type: ignore[union-attr]


def test_deleted_aggregate_rejects_every_command() -> None:
    d = decide(ENTRY, "a", None, 7, [cmd("c1", OpenAccount("z"), None)])
    assert d.outcomes == (
        RejectedOutcome("c1", d.outcomes[0].reason, "aggregate_deleted", 7),  # type: ignore[union-attr]
    )


@event(name="test.Boom")
class Boom:
    after: int


@command(name="test.Explode")
class Explode:
    how: str


class Fragile(Aggregate, name="test.Fragile"):
    n: int = 0
    items: list[int] = attrs.Factory(list)

    def apply_deposited(self, e: Deposited) -> None:
        self.n += e.amount
        self.items.append(e.amount)  # mutates a nested list: the aggregate is deep-copied

    def apply_boom(self, e: Boom) -> None:
        self.n += 1000
        raise RuntimeError(f"applier broke after {e.after}")


class FragileHandler(CommandHandler[Fragile]):
    def explode(self, agg: Fragile, cmd: Explode) -> object:
        if cmd.how == "crash":
            raise ValueError("handler crashed")
        if cmd.how == "non-event":
            return [Deposited(1), 42]
        if cmd.how == "applier":
            return [Deposited(1), Boom(1)]
        return Deposited(1)  # a single event is fine too


FRAGILE = DomainModel([Fragile], [FragileHandler], events=[Boom]).entry(Fragile)


def test_failures_roll_back_and_report() -> None:
    before = Fragile(1, [1])
    d = decide(
        FRAGILE,
        "f",
        before,
        1,
        [
            cmd("ok1", Explode("single")),
            cmd("crash", Explode("crash")),
            cmd("non", Explode("non-event")),
            cmd("app", Explode("applier")),
            cmd("ok2", Explode("single")),
        ],
    )
    kinds = [type(o).__name__ for o in d.outcomes]
    assert kinds == ["Accepted", "Failed", "Failed", "Failed", "Accepted"]
    assert d.outcomes[1] == Failed("crash", "ValueError", "handler crashed", 2)
    assert d.outcomes[2].error_type == "NotAMessageError"  # type: ignore[union-attr]
    assert "42" in d.outcomes[2].message  # type: ignore[union-attr]
    assert d.outcomes[3].error_type == "RuntimeError"  # type: ignore[union-attr]
    assert d.state == Fragile(3, [1, 1, 1]) and d.version == 3
    assert before == Fragile(1, [1])  # deep copy protected the nested list


def test_rejected_exception_validates_its_arguments() -> None:
    r = Rejected("no", code="nope")
    assert isinstance(r, CqrsError) and (r.reason, r.code) == ("no", "nope")
    with pytest.raises(TypeError):
        Rejected("")
