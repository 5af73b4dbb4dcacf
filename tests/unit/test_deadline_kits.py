"""Deadlines in the test kits: asserting what a command or a reaction scheduled and cancelled,
and moving a test's clock to fire what is due, with no services and no sleeping.

The orders example's whole flow, a moved deadline, deadlines that schedule the next one, a
deadline to another aggregate, a process manager's saga timeout, the messages of failed
assertions, and a property: the kit fires exactly the deadlines whose last change is a
schedule due by the clock, each once, in due order."""

from __future__ import annotations

import datetime as dt
from datetime import timedelta

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs import (
    Aggregate, App, Cancel, CommandContext, CommandHandler, ProcessManager, ReactionContext,
    Schedule, Send, command, event,
)
from cqrs.domain.deadlines import DeadlineChange, deadline_command_id
from cqrs.errors import NotAMessageError
from cqrs.testing import AggregateTest
from cqrs.testing.deadlines import ClockError, PendingDeadlines, last_changes
from cqrs.testing.process import ProcessTest
from domain_examples.orders import (
    CancelUnpaidOrder, Order, OrderCancelled, OrderLine, OrderPaid, OrderPlaced, OrderStatus,
    PayOrder, PlaceOrder,
)
from domain_examples.orders import app as orders

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
LINES = (OrderLine("tea-500g", 2, 899), OrderLine("mug", 1, 1_250))
WINDOW = timedelta(minutes=15)  # PlaceOrder's default payment window
DUE = T0 + WINDOW


@pytest.fixture
def order() -> AggregateTest:
    return AggregateTest(orders, Order, aggregate_id="order-1", timestamp=T0)


def place() -> PlaceOrder:
    return PlaceOrder("cust-7", LINES, T0)


# --- the orders example ---------------------------------------------------------------------------

def test_placing_an_order_schedules_its_cancellation_at_the_end_of_the_window(order: AggregateTest) -> None:
    placed = order.when(place())
    placed.then(OrderPlaced("cust-7", LINES, 3_048, T0))
    deadline = placed.then_scheduled(CancelUnpaidOrder(), after=WINDOW)
    # the same deadline, said with its time, its target and its name
    assert placed.then_scheduled(CancelUnpaidOrder(), at=DUE, to="order-1",
                                 name="orders.CancelUnpaidOrder") == deadline
    assert deadline.owner == "orders.Order:order-1" and deadline.due == DUE
    assert deadline.command_id == f"dl:orders.Order:order-1:orders.CancelUnpaidOrder:{int(DUE.timestamp() * 1000)}"
    assert placed.deadlines == (deadline,) and placed.pending == (deadline,)
    # the window counts from the command's own time
    short = order.when(PlaceOrder("cust-7", LINES, T0, payment_window_s=60), timestamp=T0 + timedelta(hours=1))
    short.then_scheduled(CancelUnpaidOrder(), at=T0 + timedelta(hours=1, seconds=60))


def test_an_unpaid_order_is_cancelled_when_time_passes_the_window(order: AggregateTest) -> None:
    later = order.when(place()).advance(WINDOW)
    later.then_fired(CancelUnpaidOrder())
    later.then(OrderCancelled("unpaid", 0, DUE))  # stamped with its due time
    later.then_state(status=OrderStatus.CANCELLED)
    (fired,) = later.inputs
    assert fired.command_id == later.fired[0].command_id  # its derived id
    assert fired.timestamp == DUE and fired.correlation_id == "test-command-1"  # the conversation goes on
    assert later.pending == () and later.clock == DUE and later.version == 2


def test_nothing_fires_before_its_time_and_time_adds_up(order: AggregateTest) -> None:
    placed = order.when(place())
    early = placed.advance(WINDOW - timedelta(milliseconds=1))
    early.then_fired()
    early.then_state(status=OrderStatus.PLACED)
    assert early.pending == placed.pending
    on_time = early.advance(timedelta(milliseconds=1))
    on_time.then(OrderCancelled("unpaid", 0, DUE))
    on_time.advance(timedelta(days=30)).then_fired()  # fired once, never again


def test_a_paid_order_cancels_its_deadline_and_nothing_fires(order: AggregateTest) -> None:
    paid = order.when(place()).when(PayOrder(3_048, "pay-1"), timestamp=T0 + timedelta(minutes=5))
    paid.then(OrderPaid(3_048, "pay-1", T0 + timedelta(minutes=5)))
    paid.then_cancelled(CancelUnpaidOrder)
    paid.then_cancelled("orders.CancelUnpaidOrder")  # by name, the same
    paid.then_nothing_scheduled()
    assert paid.pending == ()
    later = paid.advance(timedelta(hours=1))
    later.then_fired()
    later.then_state(status=OrderStatus.PAID)


def test_a_chain_goes_on_from_the_clock_and_branches_do_not_share_deadlines(order: AggregateTest) -> None:
    placed = order.when(place())
    paid = placed.when(PayOrder(3_048, "pay-1"))  # stamped with the clock: the placing time
    assert paid.inputs[0].timestamp == T0 and paid.inputs[0].command_id == "test-command-2"
    placed.advance(WINDOW).then_fired(CancelUnpaidOrder())  # the other branch still has it
    late = placed.advance(WINDOW).when(PayOrder(3_048, "pay-1"))  # after the cancellation
    late.then_rejected(code="order_cancelled")
    assert late.inputs[0].timestamp == DUE


def test_the_orders_deadline_handler_ignores_a_paid_order(order: AggregateTest) -> None:
    order.given(OrderPlaced("cust-7", LINES, 3_048, T0), OrderPaid(3_048, "pay-1", T0)).when(
        CancelUnpaidOrder()).then()


# --- a domain of holds: moves, self-rescheduling, other aggregates ---------------------------------

@command(name="kit.HoldSeats")
class HoldSeats:
    show_id: str
    seats: int


@command(name="kit.ExtendHold")
class ExtendHold:
    minutes: int


@command(name="kit.ExpireHold")
class ExpireHold:
    pass


@command(name="kit.PayHold")
class PayHold:
    pass


@command(name="kit.Remind")
class Remind:
    pass


@command(name="kit.ReleaseSeats")
class ReleaseSeats:
    seats: int


@command(name="kit.ScheduleOrphan")
class ScheduleOrphan:
    pass


@command(name="kit.Orphan")
class Orphan:  # no handler anywhere
    pass


@command(name="kit.Tag")
class Tag:
    tags: tuple[str, ...]


@event(name="kit.SeatsHeld")
class SeatsHeld:
    show_id: str
    seats: int


@event(name="kit.HoldExtended")
class HoldExtended:
    minutes: int


@event(name="kit.HoldExpired")
class HoldExpired:
    at: dt.datetime


@event(name="kit.HoldPaid")
class HoldPaid:
    pass


@event(name="kit.Reminded")
class Reminded:
    at: dt.datetime


@event(name="kit.SeatsReleased")
class SeatsReleased:
    seats: int


class Hold(Aggregate, name="kit.Hold"):
    show_id: str = ""
    seats: int = 0
    status: str = "new"
    reminders: int = 0

    def apply_seats_held(self, e: SeatsHeld) -> None:
        self.show_id, self.seats, self.status = e.show_id, e.seats, "held"

    def apply_hold_extended(self, e: HoldExtended) -> None:
        pass

    def apply_hold_expired(self, e: HoldExpired) -> None:
        self.status = "expired"

    def apply_hold_paid(self, e: HoldPaid) -> None:
        self.status = "paid"

    def apply_reminded(self, e: Reminded) -> None:
        self.reminders += 1


class Show(Aggregate, name="kit.Show"):
    free: int = 0

    def apply_seats_released(self, e: SeatsReleased) -> None:
        self.free += e.seats


HOLD_FOR = timedelta(minutes=15)


class HoldHandler(CommandHandler[Hold]):
    def hold(self, hold: Hold, cmd: HoldSeats) -> list[object]:
        return [SeatsHeld(cmd.show_id, cmd.seats), Schedule(ExpireHold(), after=HOLD_FOR),
                Schedule(Remind(), after=timedelta(days=1))]

    def extend(self, hold: Hold, cmd: ExtendHold) -> list[object]:  # moves the expiry
        return [HoldExtended(cmd.minutes), Schedule(ExpireHold(), after=timedelta(minutes=cmd.minutes))]

    def expire(self, hold: Hold, cmd: ExpireHold, ctx: CommandContext) -> list[object]:
        if hold.status != "held":
            return []
        # the seats go back to the show: a deadline to another aggregate, due at once
        return [HoldExpired(ctx.timestamp), Schedule(ReleaseSeats(hold.seats), after=timedelta(0),
                                                      to=hold.show_id)]

    def pay(self, hold: Hold, cmd: PayHold) -> list[object]:
        return [HoldPaid(), Cancel(ExpireHold)]

    def remind(self, hold: Hold, cmd: Remind, ctx: CommandContext) -> list[object]:
        again = [Schedule(Remind(), after=timedelta(days=1))] if hold.reminders < 2 else []
        return [Reminded(ctx.timestamp), *again]  # the next one from this one's time

    def orphan(self, hold: Hold, cmd: ScheduleOrphan) -> list[object]:
        return [Schedule(Orphan(), after=timedelta(minutes=1))]

    def tag(self, hold: Hold, cmd: Tag) -> list[object]:
        return [Schedule(Tag(list(cmd.tags)), after=timedelta(minutes=1))]  # type: ignore[arg-type]


class ShowHandler(CommandHandler[Show]):
    def release(self, show: Show, cmd: ReleaseSeats) -> list[SeatsReleased]:
        return [SeatsReleased(cmd.seats)]


class HoldPolicy(ProcessManager):
    """A saga: a held hold is expired if not paid within ten minutes of being held."""

    name = "hold-policy"

    def held(self, event: SeatsHeld, ctx: ReactionContext) -> list[object]:
        return [Send(event.show_id, ReleaseSeats(0)),
                Schedule(ExpireHold(), after=timedelta(minutes=10), to=ctx.aggregate_id,
                         name="payment-timeout")]

    def paid(self, event: HoldPaid) -> Cancel:
        return Cancel("payment-timeout")


tickets = App("kit-tickets", aggregates=[Hold, Show], handlers=[HoldHandler, ShowHandler],
              process_managers=[HoldPolicy])


@pytest.fixture
def hold() -> AggregateTest:
    return AggregateTest(tickets, Hold, aggregate_id="hold-1", timestamp=T0)


def test_a_moved_deadline_fires_once_at_its_new_time(hold: AggregateTest) -> None:
    extended = hold.when(HoldSeats("show-1", 2)).when(ExtendHold(20), timestamp=T0 + timedelta(minutes=10))
    moved = extended.then_scheduled(ExpireHold(), after=timedelta(minutes=20))
    assert moved.due == T0 + timedelta(minutes=30)
    assert [d.due for d in extended.pending if d.name == "kit.ExpireHold"] == [moved.due]
    extended.advance(timedelta(minutes=19, seconds=59)).then_fired()  # the old time passed: nothing
    at_new_time = extended.advance(timedelta(minutes=20))
    at_new_time.then_fired(ExpireHold(), Send("show-1", ReleaseSeats(2)))
    at_new_time.then(HoldExpired(moved.due))
    assert at_new_time.inputs[0].command_id == moved.command_id
    at_new_time.advance(timedelta(hours=1)).then_fired()


def test_a_deadline_to_another_aggregate_is_listed_not_decided(hold: AggregateTest) -> None:
    expired = hold.when(HoldSeats("show-1", 2)).advance(HOLD_FOR)
    release, = [d for d in expired.fired if d.target_id == "show-1"]
    assert release.due == T0 + HOLD_FOR and release.owner == "kit.Hold:hold-1"
    assert [i.command for i in expired.inputs] == [ExpireHold()]  # only the hold's own
    expired.then(HoldExpired(T0 + HOLD_FOR))
    # its command goes to the show as any command: test that aggregate on its own
    AggregateTest(tickets, Show, aggregate_id="show-1").when(release.command).then(SeatsReleased(2))


def test_a_fired_deadline_can_schedule_the_next_one_within_the_same_advance(hold: AggregateTest) -> None:
    paid = hold.when(HoldSeats("show-1", 2)).when(PayHold())
    three_days = paid.advance(timedelta(days=10))
    three_days.then_fired(Remind(), Remind(), Remind())
    days = [T0 + timedelta(days=n) for n in (1, 2, 3)]
    three_days.then(*(Reminded(d) for d in days))  # each stamped with its own due time
    assert [i.timestamp for i in three_days.inputs] == days
    assert three_days.deadlines[0].due == days[1]  # what the fired ones scheduled
    three_days.then_state(reminders=3, status="paid")
    with pytest.raises(AssertionError, match="3 commands were decided, not one"):
        three_days.then_rejected()


def test_an_advance_that_fires_without_end_stops_with_a_message(hold: AggregateTest,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cqrs.testing.scenario.MAX_FIRED_PER_ADVANCE", 2)
    with pytest.raises(AssertionError, match=r"more than 2 deadlines fired \(the next: 'kit.Remind' due "
                                             r"2024-05-04T12:00:00\+00:00\): advance in smaller steps"):
        hold.when(HoldSeats("show-1", 2)).when(PayHold()).advance(timedelta(days=10))


def test_deadlines_due_at_one_time_fire_in_name_order(hold: AggregateTest) -> None:
    both = hold.when(HoldSeats("show-1", 1)).when(ExtendHold(60 * 24))  # both due a day later
    fired = both.advance(timedelta(days=1)).fired
    # the expiry schedules the release for its own time: due at that time too, it goes next
    assert [d.name for d in fired] == ["kit.ExpireHold", "kit.ReleaseSeats", "kit.Remind"]
    assert {d.due for d in fired} == {T0 + timedelta(days=1)}


def test_a_deadline_without_a_handler_fails_the_command_that_scheduled_it(hold: AggregateTest) -> None:
    # as in the processor: the decision's router refuses it at once, not when it would fire
    failed = hold.when(ScheduleOrphan())
    failed.then_failed("MissingHandlerError", "Orphan")
    assert failed.pending == ()
    with pytest.raises(AssertionError, match=r"but its deadline changes were\n  none \(not accepted: Failed"):
        failed.then_scheduled(Orphan(), after=timedelta(minutes=1))


def test_scheduled_and_fired_commands_go_through_the_codec(hold: AggregateTest) -> None:
    with pytest.raises(AssertionError, match="scheduled command Tag.* does not survive Avro encoding"):
        hold.when(Tag(("a",)))
    placed = hold.when(HoldSeats("show-1", 2))
    fired = placed.advance(HOLD_FOR).fired[0]
    assert fired.command == placed.pending[0].command
    assert fired.command is not placed.pending[0].command  # the codec's copy was decided
    unchecked = AggregateTest(tickets, Hold, aggregate_id="hold-1", timestamp=T0, check_serialization=False)
    unchecked.when(HoldSeats("show-1", 2)).advance(HOLD_FOR).then_fired(ExpireHold(), Send("show-1", ReleaseSeats(2)))


def test_time_never_goes_back(hold: AggregateTest) -> None:
    held = hold.when(HoldSeats("show-1", 2))
    with pytest.raises(ClockError, match=r"advance\(\.\.\.\) takes a timedelta of zero or more, got "
                                         r"datetime.timedelta\(days=-1"):
        held.advance(timedelta(days=-1))
    with pytest.raises(ClockError, match="got 900"):
        held.advance(900)  # type: ignore[arg-type]
    with pytest.raises(ClockError, match="timezone-aware"):
        held.when(PayHold(), timestamp=dt.datetime(2024, 5, 1))
    # a command stamped before the clock does not move it back
    assert held.advance(timedelta(hours=1)).when(PayHold(), timestamp=T0).clock == T0 + timedelta(hours=1)


# --- the messages of failed assertions -------------------------------------------------------------

def test_a_deadline_scheduled_at_another_time_shows_both(order: AggregateTest) -> None:
    placed = order.when(place())
    with pytest.raises(AssertionError) as err:
        placed.then_scheduled(CancelUnpaidOrder(), after=timedelta(minutes=10))
    message = str(err.value)
    assert "expected it to schedule\n  'orders.CancelUnpaidOrder' due 2024-05-01T12:10:00+00:00 to 'order-1'" in message
    assert "but its deadline changes were\n  'orders.CancelUnpaidOrder' due 2024-05-01T12:15:00+00:00" in message
    assert "- 'due': datetime.datetime(2024, 5, 1, 12, 10, tzinfo=datetime.timezone.utc)" in message
    assert "+ 'due': datetime.datetime(2024, 5, 1, 12, 15, tzinfo=datetime.timezone.utc)" in message
    with pytest.raises(AssertionError, match="to 'order-2'"):
        placed.then_scheduled(CancelUnpaidOrder(), after=WINDOW, to="order-2")
    with pytest.raises(AssertionError, match="expected it to schedule\n  'other' due"):
        placed.then_scheduled(CancelUnpaidOrder(), after=WINDOW, name="other")


def test_the_other_assertions_list_the_deadlines(order: AggregateTest) -> None:
    placed = order.when(place())
    with pytest.raises(AssertionError, match=r"expected it to cancel 'orders.CancelUnpaidOrder', but its "
                                             r"deadline changes were\n  'orders.CancelUnpaidOrder' due"):
        placed.then_cancelled(CancelUnpaidOrder)
    with pytest.raises(AssertionError, match=r"expected it to schedule nothing, but it scheduled\n  "
                                             r"'orders.CancelUnpaidOrder' due 2024-05-01T12:15:00"):
        placed.then_nothing_scheduled()
    paid = placed.when(PayOrder(3_048, "pay-1"))
    with pytest.raises(AssertionError, match=r"but its deadline changes were\n  cancel 'orders.CancelUnpaidOrder'"):
        paid.then_scheduled(CancelUnpaidOrder(), after=WINDOW)
    early = placed.advance(timedelta(minutes=14))
    with pytest.raises(AssertionError) as err:
        early.then_fired(CancelUnpaidOrder())
    assert str(err.value).startswith("advance to 2024-05-01T12:14:00+00:00 on orders.Order 'order-1' at "
                                     "version 1: the deadlines that fired differ:")
    assert "-[CancelUnpaidOrder()]\n+[]" in str(err.value)
    assert "still pending:\n  'orders.CancelUnpaidOrder' due 2024-05-01T12:15:00+00:00" in str(err.value)
    with pytest.raises(AssertionError, match=r"no deadline was decided on this aggregate.*\(fired: \[\], pending: "
                                             r"\['orders.CancelUnpaidOrder'\]\); then_fired\(\) checks"):
        early.then(OrderCancelled("unpaid", 0, DUE))
    with pytest.raises(AssertionError, match="then_fired checks what advance"):
        placed.then_fired()


# --- a process manager's saga timeout ---------------------------------------------------------------

@pytest.fixture
def policy() -> ProcessTest:
    return ProcessTest(tickets, HoldPolicy, aggregate_id="hold-1", timestamp=T0)


def test_a_reaction_schedules_a_timeout_that_fires_unless_cancelled(policy: ProcessTest) -> None:
    held = policy.when(SeatsHeld("show-1", 2))
    held.then(Send("show-1", ReleaseSeats(0)))
    timeout = held.then_scheduled(ExpireHold(), after=timedelta(minutes=10), to="hold-1",
                                  name="payment-timeout")
    assert timeout.owner == "pm:hold-policy:test-conversation-1"  # stateless: the conversation
    assert held.deadlines == (timeout,) and held.pending == (timeout,)
    held.advance(timedelta(minutes=9)).then_fired()
    fired = held.advance(timedelta(minutes=10))
    fired.then_fired(Send("hold-1", ExpireHold()))
    assert fired.fired[0].command_id == deadline_command_id(timeout.owner, "payment-timeout", T0 + timedelta(minutes=10))
    assert fired.fired[0].correlation_id == "test-conversation-1" and fired.pending == ()
    assert fired.fired[0].command is not timeout.command  # the codec's copy
    fired.advance(timedelta(days=1)).then_fired()


def test_paying_cancels_the_saga_timeout(policy: ProcessTest) -> None:
    paid = policy.given(SeatsHeld("show-1", 2)).when(HoldPaid(), timestamp=T0 + timedelta(minutes=3))
    paid.then_nothing()
    paid.then_cancelled("payment-timeout")
    paid.then_nothing_scheduled()
    assert paid.pending == ()
    paid.advance(timedelta(hours=1)).then_fired()


def test_the_given_events_deadlines_stay_pending_per_conversation(policy: ProcessTest) -> None:
    two = policy.given(SeatsHeld("show-1", 2)).when(SeatsHeld("show-2", 1), aggregate_id="hold-2",
                                                     correlation_id="c2", timestamp=T0 + timedelta(minutes=1))
    assert [d.owner for d in two.pending] == ["pm:hold-policy:test-conversation-1", "pm:hold-policy:c2"]
    first = two.advance(timedelta(minutes=9))  # from the latest event's time
    first.then_fired(Send("hold-1", ExpireHold()))
    first.advance(timedelta(minutes=1)).then_fired(Send("hold-2", ExpireHold()))


def test_the_process_kit_messages(policy: ProcessTest) -> None:
    held = policy.when(SeatsHeld("show-1", 2))
    with pytest.raises(AssertionError, match=r"reaction to SeatsHeld\(show_id='show-1', seats=2\): expected "
                                             r"it to schedule\n  'payment-timeout' due 2024-05-01T12:15:00"):
        held.then_scheduled(ExpireHold(), after=timedelta(minutes=15), to="hold-1", name="payment-timeout")
    with pytest.raises(NotAMessageError, match=r"then_scheduled\(ExpireHold\(\)\) needs to=<aggregate id>"):
        held.then_scheduled(ExpireHold(), after=timedelta(minutes=10))
    with pytest.raises(AssertionError, match="expected it to cancel 'payment-timeout'"):
        held.then_cancelled("payment-timeout")
    with pytest.raises(AssertionError, match="expected it to schedule nothing"):
        held.then_nothing_scheduled()
    with pytest.raises(AssertionError, match=r"-\[\]\n\+\[Send\(aggregate_id='hold-1', command=ExpireHold\(\)"):
        held.advance(timedelta(minutes=10)).then_fired()


# --- the bookkeeping rules ----------------------------------------------------------------------------

def _change(owner: str, name: str, due_s: int | None) -> DeadlineChange:
    if due_s is None:
        return DeadlineChange(owner, name)
    return DeadlineChange(owner, name, T0 + timedelta(seconds=due_s), "a-1", Remind())


def test_pending_deadlines_rules() -> None:
    pending = PendingDeadlines([_change("o", "b", 5), _change("o", "a", 5), _change("p", "a", 1),
                                _change("o", "c", 9), _change("o", "c", None), _change("o", "d", 9),
                                _change("o", "d", 2)])
    assert [(d.owner, d.name) for d in pending] == [("p", "a"), ("o", "d"), ("o", "a"), ("o", "b")]
    copy = pending.copy()
    assert [d.name for d in pending.due(T0 + timedelta(seconds=2))] == ["a", "d"]
    assert pending.pop_due(T0) is None
    assert pending.pop_due(T0 + timedelta(seconds=1)) == _change("p", "a", 1)
    assert len(pending) == 3 and len(copy) == 4
    with pytest.raises(ClockError, match="timezone-aware"):
        pending.due(dt.datetime(2024, 1, 1))
    moved_then_cancelled = [_change("o", "a", 1), _change("o", "b", 2), _change("o", "a", 3),
                            _change("o", "a", None)]
    assert last_changes(moved_then_cancelled) == [_change("o", "b", 2), _change("o", "a", None)]


# --- the property ---------------------------------------------------------------------------------

@command(name="kit.Plan")
class Plan:
    name: str
    after_s: int


@command(name="kit.Unplan")
class Unplan:
    name: str


@command(name="kit.Ring")
class Ring:
    name: str


@event(name="kit.Planned")
class Planned:
    name: str


@event(name="kit.Rang")
class Rang:
    name: str
    at: dt.datetime


class Alarm(Aggregate, name="kit.Alarm"):
    def apply_planned(self, e: Planned) -> None:
        pass

    def apply_rang(self, e: Rang) -> None:
        pass


class AlarmHandler(CommandHandler[Alarm]):
    def plan(self, alarm: Alarm, cmd: Plan) -> list[object]:
        return [Planned(cmd.name), Schedule(Ring(cmd.name), after=timedelta(seconds=cmd.after_s), name=cmd.name)]

    def unplan(self, alarm: Alarm, cmd: Unplan) -> list[object]:
        return [Cancel(cmd.name)]

    def ring(self, alarm: Alarm, cmd: Ring, ctx: CommandContext) -> list[Rang]:
        return [Rang(cmd.name, ctx.timestamp)]


alarms = App("kit-alarms", aggregates=[Alarm], handlers=[AlarmHandler])


def test_a_deadline_scheduled_again_for_the_time_it_fired_is_not_decided_twice() -> None:
    # the same owner, name and due time: the same derived id, which the processor's dedup
    # answers with the first result; the kit lists it as fired and decides nothing
    test = AggregateTest(alarms, Alarm, aggregate_id="alarm-1", timestamp=T0)
    rang = test.when(Plan("a", 60)).advance(timedelta(minutes=1))
    rang.then(Rang("a", T0 + timedelta(minutes=1)))
    again = rang.when(Plan("a", 0)).advance(timedelta(0))
    again.then_fired(Ring("a"))
    assert again.fired[0].command_id == rang.inputs[0].command_id and again.inputs == ()
    rang.when(Plan("a", 1)).advance(timedelta(seconds=1)).then(Rang("a", T0 + timedelta(minutes=1, seconds=1)))

NAMES = st.sampled_from(["a", "b", "c"])
STEPS = st.lists(st.one_of(
    st.tuples(st.just("plan"), NAMES, st.integers(0, 30)),
    st.tuples(st.just("unplan"), NAMES, st.just(0)),
    st.tuples(st.just("advance"), st.just(""), st.integers(0, 20)),
), min_size=1, max_size=25)


@attrs.define
class Oracle:
    """The rule, said directly: the last change of a name wins, and advancing fires every
    name scheduled due by the clock, earliest first (ties by name), once; a name that fired
    and is scheduled again for the same time fires under the same id, which the processor
    does not decide twice."""

    clock: dt.datetime
    due: dict[str, dt.datetime] = attrs.field(factory=dict)
    decided: set[tuple[str, dt.datetime]] = attrs.field(factory=set)

    def advance(self, seconds: int) -> list[tuple[str, dt.datetime]]:
        self.clock += timedelta(seconds=seconds)
        fired = sorted(((at, name) for name, at in self.due.items() if at <= self.clock))
        for _, name in fired:
            del self.due[name]
        return [(name, at) for at, name in fired]

    def decide(self, fired: list[tuple[str, dt.datetime]]) -> list[tuple[str, dt.datetime]]:
        new = [f for f in fired if f not in self.decided]
        self.decided.update(fired)
        return new


@settings(max_examples=80, deadline=None)
@given(STEPS)
def test_the_kit_fires_exactly_what_the_last_changes_leave_due_in_due_order(steps: list[tuple[str, str, int]]) -> None:
    test = AggregateTest(alarms, Alarm, aggregate_id="alarm-1", timestamp=T0)
    oracle = Oracle(T0)
    chain = test.when(Unplan("nothing"))
    all_fired: list[tuple[str, dt.datetime]] = []
    for op, name, n in steps:
        if op == "plan":
            chain = chain.when(Plan(name, n))
            oracle.due[name] = oracle.clock + timedelta(seconds=n)
        elif op == "unplan":
            chain = chain.when(Unplan(name))
            oracle.due.pop(name, None)
        else:
            chain = chain.advance(timedelta(seconds=n))
            due = oracle.advance(n)
            decided = oracle.decide(due)
            assert [(d.name, d.due) for d in chain.fired] == due
            rang = [(e.event.name, e.event.at) for o in chain.decision.outcomes for e in o.events]
            assert rang == decided
            assert [i.command_id for i in chain.inputs] == [
                deadline_command_id("kit.Alarm:alarm-1", name, at) for name, at in decided]
            all_fired += rang
        assert chain.clock == oracle.clock
        assert sorted((d.name, d.due) for d in chain.pending) == sorted(oracle.due.items())
    # each deadline decided once: a (name, due) pair never twice
    assert len(all_fired) == len(set(all_fired))
