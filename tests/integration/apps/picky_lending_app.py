"""The lending aggregates with a process manager whose reaction fails on one member's events
(a bug), for tests of failed reactions, and one with a saga timeout (a deadline)."""

from __future__ import annotations

from cqrs.app import App
from datetime import timedelta

from cqrs.domain import Cancel, ProcessManager, ReactionContext, Schedule, Send
from domain_examples.lending import (
    Book, BookHandler, BookLent, CancelLoan, LoanRequested, Member, MemberHandler, ReserveLoanSlot,
    StrikeCount, Strikes,
)


class Picky(ProcessManager):
    name = "picky"

    def requested(self, event: LoanRequested, ctx: ReactionContext) -> Send:
        if event.member_id == "mallory":
            raise ValueError(f"cannot serve {event.member_id}")
        return Send(event.member_id, ReserveLoanSlot(book_id=ctx.aggregate_id))


class Patience(ProcessManager):
    """A loan not lent within ten minutes of its request is cancelled at its book."""

    name = "patience"

    def requested(self, event: LoanRequested, ctx: ReactionContext) -> Schedule:
        return Schedule(CancelLoan(event.member_id, "timed_out"), after=timedelta(minutes=10),
                        to=ctx.aggregate_id)

    def lent(self, event: BookLent) -> Cancel:
        return Cancel(CancelLoan)


app = App("picky-lending", aggregates=[Book, Member], handlers=[BookHandler, MemberHandler],
          process_managers=[Picky, Strikes, Patience])
__all__ = ["Patience", "Picky", "StrikeCount", "app"]
