"""Time budgets of decisions (cqrs.budget) and a process manager's reaction past its budget:
it fails alone, its event dead-lettered, and the other events of the chunk are reacted to."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from cqrs.app import App
from cqrs.budget import BudgetedThread, Watch
from cqrs.config import load_config
from cqrs.domain import ProcessManager, ReactionContext, Send
from cqrs.process import Reactor
from cqrs.process.job import ReactorRun
from cqrs.testing.process import ProcessTest
from domain_examples import lending
from domain_examples.lending import LoanRequested, ReserveLoanSlot


def test_a_call_within_its_budget_returns_its_value_and_an_error_is_raised() -> None:
    runner = BudgetedThread("t-budget")
    watch = Watch()
    assert runner.call(lambda: 42, watch, 1.0) == (True, 42)
    with pytest.raises(ZeroDivisionError):
        runner.call(lambda: 1 / 0, watch, 1.0)
    runner.close()


def test_a_call_past_its_budget_is_abandoned_and_the_next_runs_in_a_new_thread() -> None:
    runner = BudgetedThread("t-budget-hung")
    watch = Watch()
    stopped = threading.Event()

    def spin() -> str:
        watch.start("item-1")
        try:
            while True:  # a loop in Python: told to stop, it stops at its next instruction
                pass
        except BaseException:
            stopped.set()
            raise

    started = time.monotonic()
    assert runner.call(spin, watch, 0.3) == (False, "item-1")
    # not before its budget; and it returned, which the spin alone never does (the bound only
    # stops a broken one waiting for pytest's timeout: ~0.35 s here)
    assert 0.3 <= time.monotonic() - started < 10.0
    assert stopped.wait(2.0), "the abandoned thread was not told to stop"
    assert runner.call(lambda: "next", Watch(), 0.3) == (True, "next")
    runner.close()


class Hang:
    """A call that hangs until the test lets it go (30 s at most): whatever the machine's speed,
    a run that returns while it still hangs did not wait for it. Told to stop, the call stops
    when it returns."""

    def __init__(self) -> None:
        self.go, self.over = threading.Event(), threading.Event()

    def __call__(self) -> None:
        self.go.wait(30.0)
        self.over.set()


STUCK_HANG = Hang()


@pytest.fixture
def hangs() -> Iterator[None]:
    """The hanging calls hang afresh in each test, and are let go when it is over."""
    for hang in (STUCK_HANG, TOTALS_HANG):
        hang.go.clear()
        hang.over.clear()
    yield
    for hang in (STUCK_HANG, TOTALS_HANG):
        hang.go.set()


class Stuck(ProcessManager):
    name = "stuck"

    def requested(self, event: LoanRequested, ctx: ReactionContext) -> Send:
        if event.member_id == "hang":
            STUCK_HANG()  # a call that hangs
        return Send(event.member_id, ReserveLoanSlot(book_id=ctx.aggregate_id))


stuck_app = App("stuck", aggregates=[lending.Book, lending.Member],
                handlers=[lending.BookHandler, lending.MemberHandler], process_managers=[Stuck])


def test_a_reaction_past_the_budget_fails_alone_and_the_rest_of_the_chunk_goes_on(hangs: None) -> None:
    kit = ProcessTest(stuck_app, Stuck)
    sources = [kit.source(LoanRequested(m), aggregate_id=f"b{i}", version=1)
               for i, m in enumerate(["ann", "hang", "bob"])]
    run = object.__new__(ReactorRun)  # its reacting part alone: no Kafka, no tables
    run.cfg = load_config(env={"CQRS_PROCESSOR_DECISION_BUDGET": "0.5"})
    run.reactor = Reactor(stuck_app, Stuck())
    run._reacting = BudgetedThread("t-reacting")
    out = run._react(sources, {})
    assert not STUCK_HANG.over.is_set()  # it did not wait for the hung reaction
    assert [c.envelope.aggregate_id for c in out.commands] == ["ann", "bob"]
    (failure,) = out.failures
    assert failure.source is sources[1] and failure.error_type == "DecisionTimeoutError"
    assert "past the budget" in failure.message
    run._reacting.close()


from cqrs.testing.example import Account, AccountHandler, AccountOpened, Deposited  # noqa: E402
from projections import Projection, SqliteStore, records_for  # noqa: E402
from projections.apply import Target, apply_within_budget  # noqa: E402
from projections.model import find_projection  # noqa: E402


class SlowTotals(Projection):
    name, aggregate, key = "slow_totals", Account, "account_id"
    columns, defaults = {"total": int}, {"total": 0}

    def on_opened(self, view: dict, e: AccountOpened) -> None:
        view["total"] = 0

    def on_deposited(self, view: dict, e: Deposited) -> None:
        if e.amount == 666:
            TOTALS_HANG()  # a handler that waits on something that hangs
        view["total"] += e.amount


TOTALS_HANG = Hang()
slow_bank = App("slow-bank", aggregates=[Account], handlers=[AccountHandler],
                projections=[SlowTotals])


def test_a_projection_handler_past_the_budget_parks_its_view_alone(hangs: None) -> None:
    store = SqliteStore(":memory:")
    projection = find_projection(slow_bank, "slow_totals")
    store.ensure_generation(projection, "t", 1)
    records = records_for(slow_bank, [("a", AccountOpened("ann")), ("b", AccountOpened("bob")),
                                      ("a", Deposited(5)), ("b", Deposited(666)), ("a", Deposited(7)),
                                      ("b", Deposited(1))])
    # distinct positions, as records read from a topic have
    records = [rec._replace(partition=0, offset=n) for n, rec in enumerate(records)]
    letters: list = []
    runner = BudgetedThread("t-projecting")
    stats = apply_within_budget(runner, 0.5, store, Target(projection, "t", 1), records,
                                slow_bank.codec.decode, letters.extend)
    assert not TOTALS_HANG.over.is_set()  # it did not wait for the hung handler
    assert stats.dead_letters == 2  # the hung one, and b's later event parked behind it
    assert [(d.reason, d.error.split(":")[0]) for d in letters] == [
        ("handler", "DecisionTimeoutError"), ("parked", "aggregate parked at version 2")]
    a = store.view(projection, "t", 1, "a")
    assert a is not None and a.values["total"] == 12  # the other aggregate, all applied
    b = store.view(projection, "t", 1, "b")
    assert b is not None and b.parked_at == 2 and b.values["total"] == 0
    runner.close()
