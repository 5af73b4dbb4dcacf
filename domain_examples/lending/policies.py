"""The process managers of the lending example: the rules that span a book and a member.

**lending** (stateless) carries a loan through its conversation::

    RequestLoan -> Book: LoanRequested -> ReserveLoanSlot -> Member: LoanSlotReserved
                                                           -> ConfirmLoan -> Book: BookLent
                                                     or:      LoanSlotRefused
                                                           -> CancelLoan -> Book: LoanCancelled
    ReturnBook  -> Book: BookReturned  -> ReleaseLoanSlot -> Member: LoanSlotReleased

The conversation ends with ``BookLent`` or ``LoanCancelled``; a client that sent the
``RequestLoan`` can wait for whichever comes.

**strikes** (stateful, one instance per member) suspends a member whose slot requests were
refused :data:`STRIKES_TO_SUSPEND` times in a row; a loan that goes through resets the count.
"""

from __future__ import annotations

from typing import Final

import attrs

from cqrs.domain import ProcessManager, Reaction, ReactionContext, Send
from domain_examples.lending.messages import (
    BookLent, BookReturned, CancelLoan, ConfirmLoan, LoanCancelled, LoanRequested,
    LoanSlotRefused, LoanSlotReserved, ReleaseLoanSlot, ReserveLoanSlot, SuspendMember,
)

__all__ = ["STRIKES_TO_SUSPEND", "Lending", "StrikeCount", "Strikes"]

STRIKES_TO_SUSPEND: Final = 3


class Lending(ProcessManager):
    name = "lending"
    completes_on = (BookLent, LoanCancelled)

    def requested(self, event: LoanRequested, ctx: ReactionContext) -> Send:
        return Send(event.member_id, ReserveLoanSlot(book_id=ctx.aggregate_id))

    def reserved(self, event: LoanSlotReserved, ctx: ReactionContext) -> Send:
        return Send(event.book_id, ConfirmLoan(member_id=ctx.aggregate_id))

    def refused(self, event: LoanSlotRefused, ctx: ReactionContext) -> Send:
        return Send(event.book_id, CancelLoan(member_id=ctx.aggregate_id, reason=event.reason))

    def returned(self, event: BookReturned, ctx: ReactionContext) -> Send:
        return Send(event.member_id, ReleaseLoanSlot(book_id=ctx.aggregate_id))


@attrs.frozen
class StrikeCount:
    refused_in_a_row: int = 0


class Strikes(ProcessManager[StrikeCount]):
    name = "strikes"

    def correlate(self, event: object, ctx: ReactionContext) -> str:
        # one instance per member: refusals come from the member, loans from the book
        return event.member_id if isinstance(event, BookLent) else ctx.aggregate_id

    def refused(self, state: StrikeCount | None, event: LoanSlotRefused,
                ctx: ReactionContext) -> Reaction[StrikeCount] | None:
        if event.reason != "limit_reached":
            return None  # suspended or unknown: no strike
        count = (state or StrikeCount()).refused_in_a_row + 1
        if count >= STRIKES_TO_SUSPEND:
            return Reaction(StrikeCount(0), send=[Send(ctx.aggregate_id, SuspendMember(
                reason=f"{count} loans refused in a row"))])
        return Reaction(StrikeCount(count))

    def lent(self, state: StrikeCount | None, event: BookLent) -> Reaction[StrikeCount]:
        return Reaction(StrikeCount(0))
