"""The lending example's cross-aggregate rules over random interleavings, on the real step and
reactor code (the processor's AggregateStep, the process managers' Reactor) with Kafka's
ordering guarantees and nothing more: commands of one aggregate in order, any interleaving
across aggregates, process managers lagging, crashing and replaying the whole log.

Invariants: no member ever holds more than MAX_LOANS slots or books; a book is lent to at most
one member; every loan conversation a client started ends exactly once (lent or cancelled) once
everything is delivered; the slots a member holds are exactly the books lent or requested for
them; the member_loans read model lists each member's newest loans with their status; a replay
of the process managers changes nothing."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict, deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.client import encode_command
from cqrs.envelope import from_kafka, to_kafka
from cqrs.process import Instance, Reactor, SourceEvent
from cqrs.processor import AggregateStep, InputRecord
from cqrs.results import AggregateRecord
from cqrs.topics import topics_for
from domain_examples.lending import (
    MAX_LOANS, MEMBER_LOANS_KEPT, AddBook, BookLent, BookReturned, LoanCancelled, RegisterMember,
    RequestLoan, ReturnBook, app,
)
from projections import LocalProjector, ProjectionReader, SqliteStore
from projections.records import EventRecord

TOPICS = topics_for(app.name)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
MEMBERS = ["ann", "bob"]
BOOKS = [f"b{i}" for i in range(6)]


class World:
    """Kafka and the jobs, in memory: a commands queue per aggregate, the event log, the
    processor's state per aggregate and each process manager's position and instances."""

    def __init__(self) -> None:
        self.step = AggregateStep(app, app.codec, TOPICS)
        self.queues: dict[str, deque[InputRecord]] = defaultdict(deque)
        self.states: dict[tuple[str, str], AggregateRecord] = {}
        self.log: list[SourceEvent] = []
        self.reactors = [Reactor(app, pm) for pm in app.process_managers]
        self.read = [0] * len(self.reactors)
        self.instances: list[dict[str, Instance | None]] = [{} for _ in self.reactors]
        self.offset = 0
        self.started: list[str] = []  # command ids of accepted RequestLoans: conversations
        self.outcomes: Counter[str] = Counter()
        self.answers: dict[str, str] = {}

    def send(self, aggregate_id: str, command: object, command_id: str | None = None) -> None:
        cid, key, value, headers = encode_command(
            app, aggregate_id, command, command_id=command_id,
            timestamp=T0 + dt.timedelta(seconds=self.offset))
        self.offset += 1
        self.queues[aggregate_id].append(InputRecord(key, value, headers, 0, self.offset, TOPICS.commands))

    def process(self, aggregate_id: str, n: int) -> None:
        """The processor takes up to ``n`` commands of one aggregate (one micro-batch)."""
        q = self.queues[aggregate_id]
        batch = [q.popleft() for _ in range(min(n, len(q)))]
        if not batch:
            return
        env = from_kafka(batch[0].key, batch[0].value, batch[0].headers)[0]
        key = (env.aggregate_type, aggregate_id)
        result = self.step.apply(env.aggregate_type, aggregate_id, self.states.get(key), batch)
        if result.record is not None:
            self.states[key] = result.record
        for rec in result.out:
            if rec.topic == TOPICS.events:
                e, payload = from_kafka(rec.key, rec.value, rec.headers)
                self.log.append(SourceEvent(e, app.codec.decode(payload), payload))
            elif rec.topic == TOPICS.results:
                r = app.codec.decode(rec.value)
                assert self.answers.setdefault(r.command_id, r.status) == r.status
        self.check()

    def react(self, i: int, n: int) -> None:
        """Process manager ``i`` reads up to ``n`` more events and sends its commands."""
        events = self.log[self.read[i]:self.read[i] + n]
        self.read[i] += len(events)
        out = self.reactors[i].run(events, self.instances[i])
        assert not out.failures, out.failures
        self.instances[i].update(out.instances)
        for o in out.outcomes:
            self.outcomes[o.correlation_id] += 1
        for c in out.commands:  # as the job writes them
            key, value, headers = to_kafka(c.envelope, app.codec.encode(c.command))
            self.queues[c.envelope.aggregate_id].append(
                InputRecord(key, value, headers, 0, self.offset, TOPICS.commands))
            self.offset += 1

    def replay(self, i: int) -> None:
        """Process manager ``i`` forgets its checkpoint (its instances stay, as in Cassandra)."""
        self.read[i] = 0
        self.outcomes.clear()  # outcomes are written again: count them afresh

    def state(self, agg_type: str, agg_id: str) -> Any:
        rec = self.states.get((agg_type, agg_id))
        return None if rec is None or rec.snapshot is None else app.codec.decode(rec.snapshot)

    def check(self) -> None:
        lent: Counter[str] = Counter()
        for b in BOOKS:
            book = self.state("lending.Book", b)
            if book is not None and book.lent_to:
                lent[book.lent_to] += 1
        for m in MEMBERS:
            member = self.state("lending.Member", m)
            slots = len(member.loans) if member is not None else 0
            assert slots <= MAX_LOANS and lent[m] <= MAX_LOANS, (m, slots, lent[m])

    def drain(self) -> None:
        while any(self.queues.values()) or any(r < len(self.log) for r in self.read):
            for agg in list(self.queues):
                self.process(agg, 100)
            for i in range(len(self.reactors)):
                self.react(i, len(self.log))


actions = st.lists(st.one_of(
    st.tuples(st.just("request"), st.sampled_from(BOOKS), st.sampled_from(MEMBERS)),
    st.tuples(st.just("return"), st.sampled_from(BOOKS), st.just("")),
    st.tuples(st.just("process"), st.sampled_from(BOOKS + MEMBERS), st.integers(1, 3)),
    st.tuples(st.just("react"), st.integers(0, 1), st.integers(1, 4)),
    st.tuples(st.just("replay"), st.integers(0, 1), st.just(0)),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(actions)
def test_the_loan_limit_holds_and_every_conversation_ends_once(steps: list[tuple[Any, Any, Any]]) -> None:
    w = World()
    for m in MEMBERS:
        w.send(m, RegisterMember(m))
    for b in BOOKS:
        w.send(b, AddBook(b))
    w.drain()
    requests: list[str] = []
    for kind, a, b in steps:
        if kind == "request":
            cid = f"loan-{len(requests)}"
            requests.append(cid)
            w.send(a, RequestLoan(b), command_id=cid)
        elif kind == "return":
            w.send(a, ReturnBook())
        elif kind == "process":
            w.process(a, b)
        elif kind == "react":
            w.react(a, b)
        else:
            w.replay(a)
    w.drain()
    started = {cid for cid in requests if w.answers.get(cid) == "accepted"}
    ended = {e.envelope.correlation_id for e in w.log if isinstance(e.event, (BookLent, LoanCancelled))}
    assert started == ended
    by_conversation = Counter(e.envelope.correlation_id for e in w.log
                              if isinstance(e.event, (BookLent, LoanCancelled)))
    assert all(n == 1 for n in by_conversation.values()), by_conversation
    # slots are exactly the books lent to (or being requested for) the member
    for m in MEMBERS:
        member = w.state("lending.Member", m)
        held = {b for b in BOOKS if (book := w.state("lending.Book", b)) is not None
                and m in (book.lent_to, book.requested_by)}
        assert set(member.loans) == held, (m, member.loans, held)

    # the member_loans read model folded from the log: each member's newest loans with status
    records = [EventRecord(e.envelope.aggregate_id, e.envelope.aggregate_type,
                           e.envelope.message_type, e.envelope.version or 0, e.payload,
                           e.envelope.timestamp.isoformat(), 0, i) for i, e in enumerate(w.log)]
    store = SqliteStore(":memory:")
    LocalProjector(app, store).apply(records)
    reader = ProjectionReader(app, store)
    for m in MEMBERS:
        lent = [(e.envelope.aggregate_id, e.event.loan_no) for e in w.log
                if isinstance(e.event, BookLent) and e.event.member_id == m]
        returned = {(e.envelope.aggregate_id, e.event.loan_no) for e in w.log
                    if isinstance(e.event, BookReturned)}
        items = reader.category("member_loans", m).items
        assert len(items) == min(len(lent), MEMBER_LOANS_KEPT)
        for item in items:
            book, no = item["loan"].split("#")
            assert (book, int(no)) in lent
            assert item["status"] == ("returned" if (book, int(no)) in returned else "lent")

    # a replay of every process manager from the start adds nothing
    before = len(w.log)
    for i in range(len(w.reactors)):
        w.replay(i)
    w.drain()
    assert len(w.log) == before
