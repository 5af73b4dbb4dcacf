"""The lending example: books, members, and the rules between them as process managers.

``domain_examples.lending:app`` is the App. A member holds at most three loans and none while
suspended (the member's rules); a book is lent to one member at a time (the book's); the
``lending`` process manager carries a loan from one to the other and compensates when the
member refuses, and ``strikes`` suspends a member refused three times in a row. The read model
``member_loans`` lists a member's ten most recent loans.
"""

from __future__ import annotations

from cqrs.app import App
from domain_examples.lending.aggregates import MAX_LOANS, Book, BookHandler, Member, MemberHandler
from domain_examples.lending.messages import (
    AddBook, BookAdded, BookLent, BookReturned, CancelLoan, ConfirmLoan, LoanCancelled,
    LoanRequested, LoanSlotRefused, LoanSlotReleased, LoanSlotReserved, MemberRegistered,
    MemberSuspended, RegisterMember, ReleaseLoanSlot, RequestLoan, ReserveLoanSlot, ReturnBook,
    SuspendMember,
)
from domain_examples.lending.policies import STRIKES_TO_SUSPEND, Lending, StrikeCount, Strikes
from domain_examples.lending.views import MEMBER_LOANS_KEPT, MemberLoans

__all__ = [
    "MAX_LOANS", "MEMBER_LOANS_KEPT", "STRIKES_TO_SUSPEND", "AddBook", "Book", "BookAdded", "BookHandler", "BookLent",
    "BookReturned", "CancelLoan", "ConfirmLoan", "Lending", "LoanCancelled", "LoanRequested",
    "LoanSlotRefused", "LoanSlotReleased", "LoanSlotReserved", "Member", "MemberHandler", "MemberLoans",
    "MemberRegistered", "MemberSuspended", "RegisterMember", "ReleaseLoanSlot", "RequestLoan",
    "ReserveLoanSlot", "ReturnBook", "StrikeCount", "Strikes", "SuspendMember", "app",
]

app = App("lending", aggregates=[Book, Member], handlers=[BookHandler, MemberHandler],
          projections=[MemberLoans], process_managers=[Lending, Strikes])
