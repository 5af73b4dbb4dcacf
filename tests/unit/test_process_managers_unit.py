"""Process managers without services: declaration checks, the reactor, the test kit, and the
processor recognising the commands they send forever (beyond the dedup window)."""

from __future__ import annotations

import datetime as dt
from typing import Union

import attrs
import pytest

from cqrs.app import App
from cqrs.client import encode_command
from cqrs.domain import ProcessManager, Reaction, ReactionContext, Send, event
from cqrs.domain.process import derived_command_id, parse_derived_id
from cqrs.errors import DomainModelError, HandlerSignatureError, NotAMessageError
from cqrs.process import Reactor
from cqrs.processor import AggregateStep, DedupPolicy, InputRecord
from cqrs.testing.process import ProcessTest
from cqrs.topics import topics_for
from domain_examples.lending import (
    Book, BookHandler, BookLent, BookReturned, CancelLoan, ConfirmLoan, Lending, LoanCancelled,
    LoanRequested, LoanSlotRefused, LoanSlotReserved, Member, MemberHandler, ReleaseLoanSlot,
    ReserveLoanSlot, StrikeCount, Strikes, SuspendMember, app,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


# --- declarations -------------------------------------------------------------------------------

def test_a_reaction_needs_an_event_parameter_in_the_right_place() -> None:
    class Bad(ProcessManager):
        def on(self, ctx: ReactionContext, event: LoanRequested) -> None:
            return None

    with pytest.raises(HandlerSignatureError, match="must be def name"):
        Bad().routes()


def test_a_process_manager_with_no_reaction_is_refused() -> None:
    class Idle(ProcessManager):
        def helper(self, x: int) -> int:
            return x

    with pytest.raises(HandlerSignatureError, match="has no reaction"):
        Idle().routes()


def test_names_must_be_unique_and_events_known_to_the_app() -> None:
    class Again(Lending):
        name = "lending"

    with pytest.raises(DomainModelError, match="two process managers are called 'lending'"):
        App("x", aggregates=app.model.aggregates["lending.Book"].aggregate_class and
            [a.aggregate_class for a in app.model.aggregates.values()],
            handlers=[type(r.handler) for e in app.model.aggregates.values() for r in e.routes.values()][:0] or
            [__import__("domain_examples.lending", fromlist=["x"]).BookHandler,
             __import__("domain_examples.lending", fromlist=["x"]).MemberHandler],
            process_managers=[Lending, Again])


def test_completes_on_an_event_no_aggregate_applies_is_refused() -> None:
    @event(name="elsewhere.Happened")
    class Happened:
        what: str

    class NeverEnds(Lending):
        name = "never-ends"
        completes_on = (BookLent, Happened)

    with pytest.raises(DomainModelError, match=r"NeverEnds.completes_on names 'elsewhere.Happened'"):
        App("x", aggregates=[Book, Member], handlers=[BookHandler, MemberHandler],
            process_managers=[NeverEnds])


def test_a_stateless_reaction_returning_a_reaction_is_told_to_keep_state() -> None:
    class Confused(ProcessManager):
        def on(self, event: LoanRequested) -> object:
            return Reaction(None)

    confused = App("confused", aggregates=[Book, Member], handlers=[BookHandler, MemberHandler],
                   process_managers=[Confused])
    out = Reactor(confused, confused.process_managers[0]).run(
        [ProcessTest(confused, Confused).source(LoanRequested("ann"))], {})
    assert [f.error_type for f in out.failures] == ["NotAMessageError"]
    assert "subclass ProcessManager[S]" in out.failures[0].message


def test_send_takes_a_command_and_a_target() -> None:
    with pytest.raises(NotAMessageError, match="@command instance"):
        Send("ann", "not a command")
    with pytest.raises(NotAMessageError, match="target aggregate id"):
        Send("", ReserveLoanSlot("b"))


def test_a_name_that_cannot_be_part_of_a_table_name_is_refused() -> None:
    with pytest.raises(DomainModelError, match="process manager name 'Bad Name'"):
        class BadName(ProcessManager):  # noqa: F841
            name = "Bad Name"

            def on(self, event: LoanRequested) -> None:
                return None


# --- union-typed reactions ------------------------------------------------------------------------

class ReleaseOnEnd(ProcessManager):
    """Frees the member's slot whether the book comes back or the loan is cancelled."""

    name = "release-on-end"
    completes_on = (LoanCancelled,)

    def ended(self, event: BookReturned | LoanCancelled, ctx: ReactionContext) -> Send:
        return Send(event.member_id, ReleaseLoanSlot(book_id=ctx.aggregate_id))


@attrs.frozen
class Answers:
    seen: int = 0


class CountAnswers(ProcessManager[Answers]):
    """Stateful, ``typing.Union`` spelling: counts the member's answers per conversation."""

    name = "count-answers"

    def answered(self, state: Answers | None, event: Union[LoanSlotReserved, LoanSlotRefused],
                 ) -> Reaction[Answers]:
        return Reaction(Answers((state or Answers()).seen + 1))


def _library(*pms: type[ProcessManager]) -> App:
    return App("library-union", aggregates=[Book, Member], handlers=[BookHandler, MemberHandler],
               process_managers=list(pms))


def test_a_union_typed_reaction_has_one_route_per_member() -> None:
    routes = {r.event_class: r for r in ReleaseOnEnd().routes()}
    assert set(routes) == {BookReturned, LoanCancelled}
    assert {r.method_name for r in routes.values()} == {"ended"}
    assert all(r.wants_context and not r.stateful for r in routes.values())
    stateful = {r.event_class: r for r in CountAnswers().routes()}
    assert set(stateful) == {LoanSlotReserved, LoanSlotRefused}
    assert all(r.stateful and not r.wants_context for r in stateful.values())


def test_the_kit_reacts_to_each_member_of_the_union_and_completes_on_still_ends() -> None:
    lib = _library(ReleaseOnEnd, CountAnswers)
    t = ProcessTest(lib, ReleaseOnEnd)
    t.when(BookReturned("ann"), aggregate_id="b1").then(Send("ann", ReleaseLoanSlot("b1")))
    cancelled = t.when(LoanCancelled("bob", "suspended"), aggregate_id="b2")
    cancelled.then(Send("bob", ReleaseLoanSlot("b2")))
    cancelled.then_completes()  # a completes_on event that is also a union member does both
    with pytest.raises(AssertionError, match="does not complete"):
        t.when(BookReturned("ann"), aggregate_id="b1").then_completes()
    t.when(BookLent("ann"), aggregate_id="b1").then_nothing()  # not a member: no reaction
    c = ProcessTest(lib, CountAnswers)
    one = c.given(LoanSlotReserved("b1"), aggregate_id="ann")
    one.when(LoanSlotRefused("b2", "limit_reached"), aggregate_id="ann").then_state(Answers(2))
    c.when(LoanSlotRefused("b2", "limit_reached"), aggregate_id="ann").then_state(Answers(1))


def test_a_union_member_another_reaction_also_takes_is_refused() -> None:
    class Twice(ReleaseOnEnd):
        name = "twice"

        def returned(self, event: BookReturned) -> None:
            return None

    with pytest.raises(HandlerSignatureError, match="reacts to 'lending.BookReturned' in both"):
        _library(Twice)


@pytest.mark.parametrize("annotation", ["BookReturned | int", "BookReturned | list[int]",
                                        "Union[BookReturned, None]"])
def test_a_union_with_a_member_that_is_not_an_event_class_is_refused_at_app_build(
        annotation: str) -> None:
    class Loose(ProcessManager):
        def on_back(self, event: BookReturned) -> None:
            return None

    Loose.on_back.__annotations__["event"] = annotation  # as `from __future__ import annotations` stores it
    with pytest.raises(HandlerSignatureError) as info:
        _library(Loose)
    message = str(info.value)
    assert "Loose.on_back" in message and "'event'" in message
    assert "is not an @event class" in message and "make a helper method private" in message


def test_a_union_naming_a_class_that_does_not_resolve_is_refused_at_app_build() -> None:
    class Typo(ProcessManager):
        def on_back(self, event: BookReturned | BookMislaid) -> None:  # type: ignore[name-defined]  # noqa: F821
            return None

    with pytest.raises(HandlerSignatureError,
                       match=r"Typo.on_back cannot be resolved \(name 'BookMislaid' is not "
                             r"defined\): import every class"):
        _library(Typo)


# --- derived ids ---------------------------------------------------------------------------------

def test_derived_ids_round_trip_with_any_aggregate_id() -> None:
    ctx = ReactionContext("lending.Book", "shelf:3:b-1", 7, "e", T0, "conv")
    cid = derived_command_id("lending", ctx, 2)
    parsed = parse_derived_id(cid)
    assert parsed is not None
    assert (parsed.process_manager, parsed.aggregate_type, parsed.aggregate_id, parsed.position) == (
        "lending", "lending.Book", "shelf:3:b-1", (7, 2))
    assert parse_derived_id("3f1c-uuid") is None
    assert parse_derived_id("pm:x:y:notanumber:0:z") is None


# --- the kit and the reactor ---------------------------------------------------------------------

def test_the_lending_conversation_step_by_step() -> None:
    t = ProcessTest(app, Lending)
    t.when(LoanRequested("ann"), aggregate_id="b1").then(Send("ann", ReserveLoanSlot("b1")))
    t.when(LoanSlotReserved("b1"), aggregate_id="ann").then(Send("b1", ConfirmLoan("ann")))
    t.when(LoanSlotRefused("b1", "suspended"), aggregate_id="ann").then(
        Send("b1", CancelLoan("ann", "suspended")))
    t.when(BookReturned("ann"), aggregate_id="b1").then(Send("ann", ReleaseLoanSlot("b1")))
    t.when(BookLent("ann"), aggregate_id="b1").then_completes()
    t.when(LoanCancelled("ann", "x"), aggregate_id="b1").then_completes()


def test_a_stateful_process_manager_counts_per_member() -> None:
    t = ProcessTest(app, Strikes)
    two = t.given(LoanSlotRefused("b1", "limit_reached"), LoanSlotRefused("b2", "limit_reached"),
                  aggregate_id="ann")
    two.when(LoanSlotRefused("b3", "limit_reached"), aggregate_id="ann").then(
        Send("ann", SuspendMember("3 loans refused in a row")))
    two.when(LoanSlotRefused("b3", "suspended"), aggregate_id="ann").then_nothing()
    assert two.when(BookLent("ann"), aggregate_id="b9").then_state(StrikeCount(0))
    # bob's refusals are his own instance
    two.when(LoanSlotRefused("b3", "limit_reached"), aggregate_id="bob").then_nothing()


def test_commands_carry_the_conversation_the_event_and_its_time() -> None:
    t = ProcessTest(app, Lending)
    at = dt.datetime(2026, 5, 1, 12, tzinfo=dt.timezone.utc)
    src = t.source(LoanRequested("ann"), aggregate_id="b1", version=4, correlation_id="loan-9",
                   timestamp=at)
    (sent,) = t.when(src).output.commands
    env = sent.envelope
    assert env.command_id == "pm:lending:lending.Book:4:0:b1"
    assert (env.correlation_id, env.causation_id, env.timestamp) == ("loan-9", src.envelope.message_id, at)
    assert (env.aggregate_type, env.aggregate_id) == ("lending.Member", "ann")


def test_an_instance_skips_an_event_it_applied_and_a_failure_is_reported() -> None:
    t = ProcessTest(app, Strikes)
    src = t.source(LoanSlotRefused("b1", "limit_reached"), aggregate_id="ann")
    reactor = Reactor(app, Strikes())
    first = reactor.run([src], {})
    again = reactor.run([src], first.instances)  # the log holds the event twice
    assert (first.reacted, again.reacted, again.skipped) == (1, 0, 1)

    class Broken(ProcessManager):
        def on(self, event: LoanRequested) -> Send:
            raise RuntimeError("bug")

    broken = App("broken", aggregates=[a.aggregate_class for a in app.model.aggregates.values()],
                 handlers=[type(r.handler) for e in app.model.aggregates.values()
                           for r in list(e.routes.values())[:1]], process_managers=[Broken])
    out = Reactor(broken, broken.process_managers[0]).run(
        [ProcessTest(broken, Broken).source(LoanRequested("ann"))], {})
    assert [(f.error_type, f.message) for f in out.failures] == [("RuntimeError", "bug")]
    assert out.commands == []


def test_a_reaction_whose_command_or_deadline_is_over_the_record_limit_fails_alone() -> None:
    """A command (or a deadline's command) too large for Kafka would fail the job's send on
    every restart: the reaction fails instead, its event dead-lettered; the next events go on."""
    from cqrs.domain import Schedule

    class Chatty(ProcessManager):
        def requested(self, event: LoanRequested, ctx: ReactionContext) -> list:
            if event.member_id == "big":
                return [Send("m", ReserveLoanSlot(book_id="b" * 2_000))]
            if event.member_id == "later":
                return [Schedule(ReserveLoanSlot(book_id="b" * 2_000), to="m",
                                 after=dt.timedelta(minutes=1))]
            return [Send(event.member_id, ReserveLoanSlot(book_id=ctx.aggregate_id)),
                    Schedule(ReserveLoanSlot(book_id=ctx.aggregate_id), to=event.member_id,
                             after=dt.timedelta(minutes=1))]

    chatty = App("chatty", aggregates=[a.aggregate_class for a in app.model.aggregates.values()],
                 handlers=[type(r.handler) for e in app.model.aggregates.values()
                           for r in list(e.routes.values())[:1]], process_managers=[Chatty])
    kit = ProcessTest(chatty, Chatty)
    sources = [kit.source(LoanRequested(m), aggregate_id=f"b{i}", version=1)
               for i, m in enumerate(["big", "ann", "later", "bob"])]
    out = Reactor(chatty, chatty.process_managers[0], max_record_bytes=1_000).run(sources, {})
    assert [f.source.envelope.aggregate_id for f in out.failures] == ["b0", "b2"]
    assert {f.error_type for f in out.failures} == {"RecordTooLargeError"}
    assert "over the limit of 1,000 bytes" in out.failures[0].message
    assert "deadline" in out.failures[1].message
    assert [c.envelope.aggregate_id for c in out.commands] == ["ann", "bob"]
    assert [d.target_id for d in out.stored_deadlines] == ["ann", "bob"]
    for c in out.commands:  # the records it encoded are the ones a consumer reads back
        from cqrs.envelope import from_kafka

        env, payload = from_kafka(c.key, c.value, [])
        assert env == c.envelope and chatty.codec.decode(payload) == c.command


# --- the processor recognises derived ids forever ------------------------------------------------

TOPICS = topics_for("lending")


def _derived(cmd: object, target: str, source_version: int, offset: int, index: int = 0) -> InputRecord:
    ctx = ReactionContext("lending.Book", "b1", source_version, "e", T0, "conv")
    _, key, value, headers = encode_command(app, target, cmd, command_id=derived_command_id(
        "lending", ctx, index), timestamp=T0 + dt.timedelta(days=source_version))
    return InputRecord(key, value, headers, 0, offset, TOPICS.commands)


def test_a_derived_command_beyond_the_dedup_window_is_not_applied_again() -> None:
    step = AggregateStep(app, app.codec, TOPICS, DedupPolicy(window_ms=1000, max_per_aggregate=1))
    _, reg_key, reg_value, reg_headers = encode_command(
        app, "ann", __import__("domain_examples.lending", fromlist=["x"]).RegisterMember("Ann"),
        command_id="reg", timestamp=T0)
    state, out = step.run("lending.Member", "ann", None, [
        InputRecord(reg_key, reg_value, reg_headers, 0, 0, TOPICS.commands),
        _derived(ReserveLoanSlot("b1"), "ann", 2, 1),
        _derived(ReserveLoanSlot("b2"), "ann", 5, 2),
    ])
    assert state is not None and state.version == 3
    assert state.stream_positions() == {"lending:lending.Book:b1": (5, 0)}
    assert len(state.seen_command_ids()) == 1  # the window forgot the rest
    # a replay of the process manager sends both again, days later: no event; the one still
    # in the window gets its first answer again, the forgotten one no answer at all
    again, out = step.run("lending.Member", "ann", state, [
        _derived(ReserveLoanSlot("b1"), "ann", 2, 3), _derived(ReserveLoanSlot("b2"), "ann", 5, 4)])
    assert again is None
    assert [(r.topic, r.key) for r in out] == [(TOPICS.results, b"pm:lending:lending.Book:5:0:b1")]
    # the next reaction of the stream runs
    later, out = step.run("lending.Member", "ann", state, [_derived(ReserveLoanSlot("b3"), "ann", 6, 5)])
    assert later is not None and later.version == 4
    assert later.stream_positions() == {"lending:lending.Book:b1": (6, 0)}


def test_a_derived_command_waiting_for_a_retry_runs_when_it_comes_back() -> None:
    # the retry job delivers a transient failure later, after newer commands of its stream:
    # it is below the mark but in the waiting set, so it runs
    from cqrs.results import AggregateRecord

    step = AggregateStep(app, app.codec, TOPICS)
    waiting = AggregateRecord(version=1).with_streams(
        {"lending:lending.Book:b1": (9, 0)}, {derived_command_id(
            "lending", ReactionContext("lending.Book", "b1", 3, "e", T0, "c"), 0)})
    state, out = step.run("lending.Member", "ann", waiting, [
        _derived(ReserveLoanSlot("b1"), "ann", 3, 7)])
    assert state is not None and state.retrying == ""
    assert [r.topic for r in out].count(TOPICS.results) == 1


def test_a_state_rebuild_recovers_the_marks_from_the_commands_the_log_names() -> None:
    from cqrs.processor.rebuild import stream_marks

    ids = ["client-1", None, "pm:lending:lending.Book:3:0:b1", "pm:lending:lending.Book:2:1:b1",
           "pm:strikes:lending.Member:9:0:ann"]
    assert stream_marks(ids) == {"lending:lending.Book:b1": (3, 0),
                                 "strikes:lending.Member:ann": (9, 0)}
