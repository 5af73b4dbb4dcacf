"""The ticketing example (personal data): its rules, its personal fields sealed on the way
(AggregateTest round-trips every message through a codec with keys of its own), and a
forgotten customer's fields read as the replacement while the rest of the order stays."""

from __future__ import annotations

import pytest

from cqrs.codec import InMemorySchemaStore
from cqrs.domain import FORGOTTEN
from cqrs.personal import MemoryKeyStore
from cqrs.testing import AggregateTest
from domain_examples.ticketing import (
    CancelTicketOrder,
    PlaceTicketOrder,
    TicketOrder,
    TicketOrderCancelled,
    TicketOrderPlaced,
    app,
)

PLACED = TicketOrderPlaced("c-erin", "Erin Doe", "erin@example.com", "Hamlet", 2)


@pytest.fixture
def order() -> AggregateTest:
    return AggregateTest(app, TicketOrder, aggregate_id="order-1")


def test_place_then_cancel(order: AggregateTest) -> None:
    order.when(PlaceTicketOrder("c-erin", "Erin Doe", "erin@example.com", "Hamlet", 2)).then(PLACED)
    order.given(PLACED).when(CancelTicketOrder("ill")).then(TicketOrderCancelled("ill"))
    order.given(PLACED).when(CancelTicketOrder()).then_state(status="cancelled",
                                                             email="erin@example.com")


@pytest.mark.parametrize(("given", "cmd", "code"), [
    ((PLACED,), PlaceTicketOrder("c-erin", "Erin", "e@example.com", "Hamlet"), "already_placed"),
    ((), PlaceTicketOrder("c-erin", "Erin", "e@example.com", "Hamlet", 0), "no_tickets"),
    ((), CancelTicketOrder(), "not_placed"),
    ((PLACED, TicketOrderCancelled()), CancelTicketOrder(), "already_cancelled"),
])
def test_each_rule_has_a_code(order: AggregateTest, given: tuple[object, ...], cmd: object,
                              code: str) -> None:
    order.given(*given).when(cmd).then_rejected(code=code)


def test_a_forgotten_customer_reads_as_the_replacement() -> None:
    keys = MemoryKeyStore()
    codec = app.codec_for(InMemorySchemaStore(), key_store=keys)
    event = codec.encode(PLACED)
    state = codec.encode(TicketOrder("c-erin", "Erin Doe", "erin@example.com", "Hamlet", 2, "placed"))
    assert b"Erin Doe" not in event + state and b"erin@example.com" not in event + state
    assert keys.forget("c-erin")
    assert codec.decode(event) == TicketOrderPlaced("c-erin", FORGOTTEN, FORGOTTEN, "Hamlet", 2)
    assert codec.decode(state) == TicketOrder("c-erin", FORGOTTEN, FORGOTTEN, "Hamlet", 2, "placed")
