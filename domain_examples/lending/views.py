"""Read models of the lending example.

- **member_loans** ("a member's 10 most recent loans"): a category of *loans*, not of
  aggregates. A loan's events come from its book (``BookLent``, ``BookReturned``), so the
  projection is re-keyed by loan (book id and the book's loan number) and grouped by member,
  newest loan first, the 10 newest kept per member: one partition read answers "what does ann
  hold, and what did she borrow lately".
"""

from __future__ import annotations

import datetime as _dt
from typing import Final

from domain_examples.lending.aggregates import Book
from domain_examples.lending.messages import BookLent, BookReturned
from projections.model import CategoryProjection, EventMeta, RekeyedProjection

__all__ = ["MEMBER_LOANS_KEPT", "MemberLoans"]

MEMBER_LOANS_KEPT: Final = 10


class MemberLoans(RekeyedProjection, CategoryProjection):
    """Per member, the newest loans: loan (book#n), book, status, lent_at, returned_at."""

    name = "member_loans"
    aggregate = Book
    key = "loan"
    columns = {"member_id": str, "book_id": str, "status": str, "lent_at": _dt.datetime,
               "returned_at": _dt.datetime}
    group_by = "member_id"
    order_by = "lent_at"
    keep = MEMBER_LOANS_KEPT

    def key_of(self, event: BookLent | BookReturned, meta: EventMeta) -> str:
        return f"{meta.aggregate_id}#{event.loan_no}"

    def on_lent(self, view: dict, event: BookLent, meta: EventMeta) -> None:
        view.update(member_id=event.member_id, book_id=meta.aggregate_id, status="lent",
                    lent_at=meta.timestamp)

    def on_returned(self, view: dict, event: BookReturned, meta: EventMeta) -> None:
        view.update(status="returned", returned_at=meta.timestamp)
