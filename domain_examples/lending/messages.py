"""Commands and events of the lending example: books are lent to members through a loan
conversation that spans both aggregates (see :mod:`domain_examples.lending.policies`)."""

from __future__ import annotations

from cqrs.domain import command, event

__all__ = [
    "AddBook", "BookAdded", "BookLent", "BookReturned", "CancelLoan", "ConfirmLoan",
    "LoanCancelled", "LoanRequested", "LoanSlotRefused", "LoanSlotReleased", "LoanSlotReserved",
    "MemberRegistered", "MemberSuspended", "RegisterMember", "ReleaseLoanSlot", "RequestLoan",
    "ReserveLoanSlot", "ReturnBook", "SuspendMember",
]

# --- books -------------------------------------------------------------------------------


@command(name="lending.AddBook")
class AddBook:
    title: str


@command(name="lending.RequestLoan")
class RequestLoan:
    """A member asks for a book: the loan's conversation starts here (its correlation id is
    this command's id unless the client gives one)."""

    member_id: str


@command(name="lending.ConfirmLoan")
class ConfirmLoan:
    member_id: str


@command(name="lending.CancelLoan")
class CancelLoan:
    """The compensation: the member could not take the loan, the book is free again."""

    member_id: str
    reason: str


@command(name="lending.ReturnBook")
class ReturnBook:
    pass


@event(name="lending.BookAdded")
class BookAdded:
    title: str


@event(name="lending.LoanRequested")
class LoanRequested:
    member_id: str


@event(name="lending.BookLent")
class BookLent:
    member_id: str
    loan_no: int = 0  # the book's how-manieth loan: with the book id, the loan's identity


@event(name="lending.LoanCancelled")
class LoanCancelled:
    member_id: str
    reason: str


@event(name="lending.BookReturned")
class BookReturned:
    member_id: str
    loan_no: int = 0


# --- members -----------------------------------------------------------------------------


@command(name="lending.RegisterMember")
class RegisterMember:
    name: str


@command(name="lending.SuspendMember")
class SuspendMember:
    reason: str


@command(name="lending.ReserveLoanSlot")
class ReserveLoanSlot:
    """Asked by the lending policy: take one of the member's loan slots for a book."""

    book_id: str


@command(name="lending.ReleaseLoanSlot")
class ReleaseLoanSlot:
    book_id: str


@event(name="lending.MemberRegistered")
class MemberRegistered:
    name: str


@event(name="lending.MemberSuspended")
class MemberSuspended:
    reason: str


@event(name="lending.LoanSlotReserved")
class LoanSlotReserved:
    book_id: str


@event(name="lending.LoanSlotRefused")
class LoanSlotRefused:
    """A slot request the member's rules refused; an event (not a rejection) so that the
    lending policy can compensate."""

    book_id: str
    reason: str  # "limit_reached" | "suspended" | "unknown_member"


@event(name="lending.LoanSlotReleased")
class LoanSlotReleased:
    book_id: str
