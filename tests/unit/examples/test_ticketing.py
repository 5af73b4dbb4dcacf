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


def test_the_whole_flow_in_one_process_then_a_customer_is_forgotten() -> None:
    # the app's classes in an App of the test's own, with a memory key store bound (the
    # module's app stays unbound, for the stack's tests)
    from cqrs.app import App
    from cqrs.testing.runner import LocalRunner
    from domain_examples.ticketing import TicketOrderHandler, TicketOrders
    from projections import LocalReadModels

    shop = App("ticketing", aggregates=[TicketOrder], handlers=[TicketOrderHandler],
               projections=[TicketOrders])
    keys = MemoryKeyStore()
    shop.use_key_store(keys)
    runner = LocalRunner(shop, read_models=LocalReadModels(shop))
    for order_id, customer, name in (("o-1", "c-erin", "Erin Doe"), ("o-2", "c-finn", "Finn Roe")):
        placed = runner.send_and_wait(order_id, PlaceTicketOrder(customer, name, f"{customer}@x.org",
                                                                 "Hamlet", 2))
        assert placed.accepted, placed
    assert runner.send_and_wait("o-1", PlaceTicketOrder("c-erin", "E", "e@x.org", "Hamlet")).code \
        == "already_placed"
    views = runner.read_model()
    assert views.get("ticket_orders", "o-1")["customer_name"] == "Erin Doe"
    assert keys.forget("c-erin")
    assert runner.send_and_wait("o-1", CancelTicketOrder("changed plans")).accepted
    assert views.get("ticket_orders", "o-1")["customer_name"] == FORGOTTEN
    assert views.get("ticket_orders", "o-1")["status"] == "cancelled"
    assert (runner.state("o-1").customer_name, runner.state("o-1").email) == (FORGOTTEN, FORGOTTEN)
    assert views.get("ticket_orders", "o-2")["customer_name"] == "Finn Roe"
    assert runner.state("o-2").email == "c-finn@x.org"
