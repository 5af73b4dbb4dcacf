"""The two aggregates of the lending example and their handlers.

A **book** is available, requested (a loan conversation is under way) or lent. A **member**
holds at most :data:`MAX_LOANS` loan slots and gets none while suspended. Neither can enforce
the other's rule: the lending policy (a process manager) carries a loan from one to the other.

| code | when |
| --- | --- |
| ``unknown_book`` | any book command before ``AddBook`` |
| ``already_added`` / ``already_registered`` | adding a book / registering a member twice |
| ``not_available`` | requesting a book that is requested or lent |
| ``no_such_loan`` | confirming, cancelling or returning a loan the book does not have |
| ``unknown_member`` | suspending a member never registered |
"""

from __future__ import annotations

from typing import Final

from cqrs.domain import Aggregate, CommandHandler, Rejected
from domain_examples.lending.messages import (
    AddBook, BookAdded, BookLent, BookReturned, CancelLoan, ConfirmLoan, LoanCancelled,
    LoanRequested, LoanSlotRefused, LoanSlotReleased, LoanSlotReserved, MemberRegistered,
    MemberSuspended, RegisterMember, ReleaseLoanSlot, RequestLoan, ReserveLoanSlot, ReturnBook,
    SuspendMember,
)

__all__ = ["MAX_LOANS", "Book", "BookHandler", "Member", "MemberHandler"]

MAX_LOANS: Final = 3


class Book(Aggregate, name="lending.Book"):
    title: str = ""
    added: bool = False
    requested_by: str = ""  # a loan conversation under way for this member
    lent_to: str = ""
    loans: int = 0  # loans so far: numbers them

    def apply_book_added(self, e: BookAdded) -> None:
        self.title = e.title
        self.added = True

    def apply_loan_requested(self, e: LoanRequested) -> None:
        self.requested_by = e.member_id

    def apply_book_lent(self, e: BookLent) -> None:
        self.requested_by = ""
        self.lent_to = e.member_id
        self.loans = e.loan_no

    def apply_loan_cancelled(self, e: LoanCancelled) -> None:
        self.requested_by = ""

    def apply_book_returned(self, e: BookReturned) -> None:
        self.lent_to = ""


class Member(Aggregate, name="lending.Member"):
    name: str = ""
    registered: bool = False
    suspended: bool = False
    loans: tuple[str, ...] = ()  # book ids holding one of the member's slots

    def apply_member_registered(self, e: MemberRegistered) -> None:
        self.name = e.name
        self.registered = True

    def apply_member_suspended(self, e: MemberSuspended) -> None:
        self.suspended = True

    def apply_loan_slot_reserved(self, e: LoanSlotReserved) -> None:
        self.loans = (*self.loans, e.book_id) if e.book_id not in self.loans else self.loans

    def apply_loan_slot_refused(self, e: LoanSlotRefused) -> None:
        pass

    def apply_loan_slot_released(self, e: LoanSlotReleased) -> None:
        self.loans = tuple(b for b in self.loans if b != e.book_id)


def _added(book: Book | None) -> Book:
    if book is None or not book.added:
        raise Rejected("no such book: add it first", code="unknown_book")
    return book


class BookHandler(CommandHandler[Book]):
    def add(self, book: Book | None, cmd: AddBook) -> BookAdded:
        if book is not None and book.added:
            raise Rejected("the book is in the catalogue already", code="already_added")
        return BookAdded(cmd.title)

    def request(self, book: Book | None, cmd: RequestLoan) -> LoanRequested:
        b = _added(book)
        if b.requested_by or b.lent_to:
            raise Rejected("the book is requested or lent", code="not_available")
        return LoanRequested(cmd.member_id)

    def confirm(self, book: Book | None, cmd: ConfirmLoan) -> BookLent:
        b = _added(book)
        if b.requested_by != cmd.member_id:
            raise Rejected(f"no loan requested by {cmd.member_id!r}", code="no_such_loan")
        return BookLent(cmd.member_id, b.loans + 1)

    def cancel(self, book: Book | None, cmd: CancelLoan) -> LoanCancelled:
        b = _added(book)
        if b.requested_by != cmd.member_id:
            raise Rejected(f"no loan requested by {cmd.member_id!r}", code="no_such_loan")
        return LoanCancelled(cmd.member_id, cmd.reason)

    def give_back(self, book: Book | None, cmd: ReturnBook) -> BookReturned:
        b = _added(book)
        if not b.lent_to:
            raise Rejected("the book is not lent", code="no_such_loan")
        return BookReturned(b.lent_to, b.loans)


class MemberHandler(CommandHandler[Member]):
    def register(self, member: Member | None, cmd: RegisterMember) -> MemberRegistered:
        if member is not None and member.registered:
            raise Rejected("the member is registered already", code="already_registered")
        return MemberRegistered(cmd.name)

    def suspend(self, member: Member | None, cmd: SuspendMember) -> list[MemberSuspended]:
        if member is None or not member.registered:
            raise Rejected("no such member", code="unknown_member")
        return [] if member.suspended else [MemberSuspended(cmd.reason)]

    def reserve(self, member: Member | None, cmd: ReserveLoanSlot) -> LoanSlotReserved | LoanSlotRefused:
        # a refusal is an event, not a rejection: the lending policy reacts to it
        if member is None or not member.registered:
            return LoanSlotRefused(cmd.book_id, "unknown_member")
        if member.suspended:
            return LoanSlotRefused(cmd.book_id, "suspended")
        if cmd.book_id in member.loans:
            return LoanSlotReserved(cmd.book_id)  # asked again: the slot is held already
        if len(member.loans) >= MAX_LOANS:
            return LoanSlotRefused(cmd.book_id, "limit_reached")
        return LoanSlotReserved(cmd.book_id)

    def release(self, member: Member | None, cmd: ReleaseLoanSlot) -> list[LoanSlotReleased]:
        if member is None or cmd.book_id not in member.loans:
            return []
        return [LoanSlotReleased(cmd.book_id)]
