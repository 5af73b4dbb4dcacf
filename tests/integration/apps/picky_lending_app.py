"""The lending aggregates with a process manager whose reaction fails on one member's events
(a bug), for tests of failed reactions."""

from __future__ import annotations

from cqrs.app import App
from cqrs.domain import ProcessManager, ReactionContext, Send
from domain_examples.lending import (
    Book, BookHandler, LoanRequested, Member, MemberHandler, ReserveLoanSlot, StrikeCount, Strikes,
)


class Picky(ProcessManager):
    name = "picky"

    def requested(self, event: LoanRequested, ctx: ReactionContext) -> Send:
        if event.member_id == "mallory":
            raise ValueError(f"cannot serve {event.member_id}")
        return Send(event.member_id, ReserveLoanSlot(book_id=ctx.aggregate_id))


app = App("picky-lending", aggregates=[Book, Member], handlers=[BookHandler, MemberHandler],
          process_managers=[Picky, Strikes])
__all__ = ["Picky", "StrikeCount", "app"]
