"""A till whose refunds changed shape (whole euros in version 1, cents in version 2, with an
upcaster): tests/integration/test_log_table_stack.py writes version-1 events and reads them in
today's shape. Not a test module."""

from __future__ import annotations

from typing import Any

from cqrs.app import App
from cqrs.codec import upcaster
from cqrs.domain import Aggregate, event

__all__ = ["Refunded", "Till", "TillOpened", "app", "in_cents"]


@event(name="itest.till.TillOpened")
class TillOpened:
    clerk: str


@event(name="itest.till.Refunded", version=2)
class Refunded:
    amount_cents: int


@upcaster("itest.till.Refunded", from_version=1)
def in_cents(data: dict[str, Any]) -> dict[str, Any]:
    return {"amount_cents": data["amount"] * 100}


class Till(Aggregate, name="itest.till.Till"):
    clerk: str = ""
    refunded_cents: int = 0

    def apply_till_opened(self, e: TillOpened) -> None:
        self.clerk = e.clerk

    def apply_refunded(self, e: Refunded) -> None:
        self.refunded_cents += e.amount_cents


app = App("itest-till", aggregates=[Till], handlers=[], upcasters=[in_cents])
