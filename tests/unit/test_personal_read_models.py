"""Personal columns of read models (#26), the pure parts: declaring them, the fold's safety net
against copying a personal field into a column not declared personal, and the sealing wrapper
over a store (SQLite in memory; the contract suite runs it on every store)."""

from __future__ import annotations

from typing import Any

import pytest

from cqrs.app import App
from cqrs.domain import FORGOTTEN
from cqrs.personal import SEALED_PREFIX, MemoryKeyStore
from domain_examples.ticketing import (
    PlaceTicketOrder, TicketOrder, TicketOrderHandler, TicketOrderPlaced, TicketOrders,
)
from projections.errors import (
    PersonalColumnError, PersonalDataCopiedError, ProjectionDefinitionError,
)
from projections.local import LocalProjector, records_for
from projections.model import CategoryProjection, Projection
from projections.personal import check_personal_copies, with_personal_columns
from projections.records import ViewWrite
from projections.sqlite_store import SqliteStore


def _declare(**attrs: Any) -> type:
    body = {"name": "v", "aggregate": TicketOrder, "key": "order_id",
            "columns": {"customer_id": str, "customer_name": str, "tickets": int},
            "on_placed": lambda self, view, event: None, **attrs}
    body["on_placed"].__annotations__ = {"event": TicketOrderPlaced}
    return type("V", (Projection,), body)


@pytest.mark.parametrize(("personal", "says"), [
    ({"nope": "customer_id"}, "names 'nope', which is not one of the columns"),
    ({"tickets": "customer_id"}, "column 'tickets' is int; personal columns are str"),
    ({"customer_name": "who"}, "= 'who': name the column holding the data subject's id"),
    ({"customer_name": "tickets"}, "the subject column is int"),
    ({"customer_name": "customer_id", "customer_id": "order_id"},
     "'customer_id' is both a personal column and the data subject"),
    (["customer_name"], "give a dict {personal column: column holding"),
])
def test_a_wrong_declaration_is_refused_naming_the_column(personal: Any, says: str) -> None:
    with pytest.raises(ProjectionDefinitionError, match="V.personal_columns") as err:
        _declare(personal_columns=personal)
    assert says in str(err.value)


def test_the_key_may_be_the_subject_and_a_personal_group_is_refused() -> None:
    assert _declare(personal_columns={"customer_name": "order_id"}).personal_columns
    with pytest.raises(ProjectionDefinitionError, match="'customer_name' is the group_by column"):
        type("C", (CategoryProjection,), {
            "name": "c", "aggregate": TicketOrder, "key": "order_id",
            "columns": {"customer_name": str, "customer_id": str, "n": int},
            "personal_columns": {"customer_name": "customer_id"},
            "group_by": "customer_name", "order_by": "n",
            "on_placed": _declare().on_placed})


class Leaky(Projection):
    name = "leaky"
    aggregate = TicketOrder
    key = "order_id"
    columns = {"customer_id": str, "contact": str}

    def on_placed(self, view: dict, event: TicketOrderPlaced) -> None:
        view.update(customer_id=event.customer_id, contact=f"{event.customer_name} <x>")


def test_copying_a_personal_field_into_a_plain_column_parks_without_showing_it() -> None:
    app = App("leaky", aggregates=[TicketOrder], handlers=[TicketOrderHandler],
              projections=[Leaky, TicketOrders])
    app.use_key_store(MemoryKeyStore())
    store = SqliteStore(":memory:")
    local = LocalProjector(app, store, collect_dead_letters=True)
    local.apply(records_for(app, [("o1", TicketOrderPlaced("c1", "Ann Marlowe", "a@b.c"))]))
    [letter] = local.dead_letters
    assert letter.reason == "handler" and "PersonalDataCopiedError" in letter.error
    assert ("ticketing.TicketOrderPlaced.customer_name was copied into column 'contact', which "
            "is not declared personal") in letter.error
    assert "Ann Marlowe" not in letter.error and "personal_columns = {'contact'" in letter.error
    # the declared projection of the same app folded the same event fine
    assert local.dead_letters == [letter]


def test_the_safety_net_costs_nothing_without_personal_values() -> None:
    event = TicketOrderPlaced("c1", FORGOTTEN, "", "Hamlet")  # replaced and empty: nothing to leak
    check_personal_copies(Leaky(), event, {"contact": FORGOTTEN, "customer_id": "c1"})
    with pytest.raises(PersonalDataCopiedError, match="'order_id \\(the view key\\)'"):
        check_personal_copies(Leaky(), TicketOrderPlaced("c1", "Ann", "ann@x.org"), {}, "ann@x.org")


def test_the_wrapper_seals_with_the_subjects_key_and_refuses_a_value_without_subject() -> None:
    app = App("t", aggregates=[TicketOrder], handlers=[TicketOrderHandler], projections=[TicketOrders])
    keys = MemoryKeyStore()
    raw = SqliteStore(":memory:")
    store = with_personal_columns(raw, app, keys)
    assert with_personal_columns(store, app, keys) is store  # wrapping twice is wrapping once
    p, row = TicketOrders(), {"customer_id": "c1", "customer_name": "Ann", "show": "s",
                              "tickets": 1, "status": "placed"}
    store.ensure_generation(p, "b", 1)
    store.write(p, "b", 1, [], [ViewWrite("o1", row, 1)])
    sealed = raw.view(p, "b", 1, "o1").values["customer_name"]  # type: ignore[union-attr]
    assert sealed.startswith(SEALED_PREFIX + keys.get("c1").key_id.hex())  # type: ignore[union-attr]
    assert store.view(p, "b", 1, "o1").values == row  # type: ignore[union-attr]
    with pytest.raises(PersonalColumnError, match="subject column 'customer_id' is None"):
        store.write(p, "b", 1, [], [ViewWrite("o2", {**row, "customer_id": None}, 1)])
    keys.forget("c1")
    assert store.view(p, "b", 1, "o1").values["customer_name"] == FORGOTTEN  # type: ignore[union-attr]


def test_the_ticketing_read_model_shows_the_name_and_forgets_it() -> None:
    from cqrs.testing.runner import LocalRunner
    from projections import LocalReadModels

    app = App("ticketing", aggregates=[TicketOrder], handlers=[TicketOrderHandler],
              projections=[TicketOrders])
    keys = MemoryKeyStore()
    app.use_key_store(keys)
    runner = LocalRunner(app, read_models=LocalReadModels(app))
    runner.send_and_wait("o1", PlaceTicketOrder("c1", "Ann Marlowe", "ann@x.org", "Hamlet", 2))
    reader = runner.read_models.reader()
    assert reader.get("ticket_orders", "o1")["customer_name"] == "Ann Marlowe"  # type: ignore[index]
    keys.forget("c1")
    assert reader.get("ticket_orders", "o1")["customer_name"] == FORGOTTEN  # type: ignore[index]
