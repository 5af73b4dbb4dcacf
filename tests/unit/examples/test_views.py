"""The example apps' read models, folded with the local projector into SQLite from the events
the demo's scripted workload writes (run through the processor's own step: no services)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from workload_driver import APPS, run_script

from domain_examples import bank, loyalty
from domain_examples.loyalty import points_for
from domain_examples.workload import DEMO_T0, bank_script, loyalty_script, orders_script
from projections import LocalProjector, ProjectionReader, SqliteStore, records_for
from projections.model import projections_of
from projections.records import EventRecord
from projections.store import table_base


def _project(app_name: str, script: list[Any]) -> tuple[ProjectionReader, LocalProjector, list[EventRecord]]:
    events: list[EventRecord] = []
    run_script(script, events)
    store = SqliteStore(":memory:")
    local = LocalProjector(APPS[app_name], store)
    local.apply(events)
    return ProjectionReader(APPS[app_name], store), local, events


def _tables(local: LocalProjector) -> dict[str, Any]:
    app = local.app
    return {name: list(local.store.scan_views(p, table_base(app.name, name), 1))
            for name, p in projections_of(app).items()}


def test_bank_balances_after_the_workload_and_a_closed_account_is_kept_closed() -> None:
    reader, local, events = _project("bank", bank_script())
    alice = reader.get("balances", "acc-alice")
    assert alice is not None and alice["owner"] == "alice" and alice["is_open"]
    assert alice["balance_cents"] in (120_00 - 30_00, 120_00 - 50_00)  # one racer won
    assert reader.get("balances", "acc-bob")["balance_cents"] == 45_00  # type: ignore[index]  # retry not re-run
    mallory = reader.get("balances", "acc-mallory")
    assert mallory is not None and mallory["balance_cents"] == 10_00  # the crashed audit wrote nothing
    assert mallory["last_audited_at"] is None

    more = records_for(bank.app, [("acc-bob", bank.MoneyWithdrawn(45_00)), ("acc-bob", bank.AccountClosed())],
                       versions={"acc-bob": reader.version("balances", "acc-bob") or 0},
                       start=DEMO_T0 + dt.timedelta(days=1))
    local.apply(more)
    closed = reader.get("balances", "acc-bob")
    assert closed is not None and not closed["is_open"] and closed["balance_cents"] == 0
    assert closed["closed_at"] == DEMO_T0 + dt.timedelta(days=1, seconds=1)


def test_orders_view_and_a_customers_last_30_orders_newest_first() -> None:
    reader, local, events = _project("orders", orders_script())
    first = reader.get("orders", "ord-ann-00")
    assert first is not None and first["customer_id"] == "c-ann" and first["status"] == "shipped"
    assert first["placed_at"] == DEMO_T0 and first["paid_at"] is not None
    assert first["shipped_at"] is not None and first["cancelled_at"] is None
    last = reader.get("orders", "ord-ann-39")
    assert last is not None and last["status"] == "cancelled" and last["refund_cents"] == 0
    assert reader.get("orders", "ord-ann-36")["status"] == "placed"  # type: ignore[index]

    seen = [o for page in reader.pages("customer_orders", "c-ann", page_size=7) for o in page.items]
    assert [o["order_id"] for o in seen] == [f"ord-ann-{n:02d}" for n in range(39, 9, -1)]
    assert [o["placed_at"] for o in seen] == sorted((o["placed_at"] for o in seen), reverse=True)
    assert seen[0]["status"] == "cancelled" and seen[-1]["status"] == "shipped"
    assert {o["status"] for o in seen[4:10]} == {"paid"}
    ben = reader.category("customer_orders", "c-ben")
    assert [o["order_id"] for o in ben.items] == ["ord-ben-02", "ord-ben-01", "ord-ben-00"]


def test_loyalty_points_per_customer_sum_over_stores() -> None:
    reader, local, events = _project("loyalty", loyalty_script())
    accepted = [s.command for s, got in run_script(loyalty_script()) if got == "accepted"]
    expected: dict[str, tuple[int, int, int]] = {}
    for c in accepted:
        points, n, spent = expected.get(c.customer_id, (0, 0, 0))
        expected[c.customer_id] = (points + points_for(c.amount_cents), n + 1, spent + c.amount_cents)
    got = {c: reader.get("customer_points", c) for c in expected}
    assert {c: (v["points"], v["purchases"], v["spent_cents"]) for c, v in got.items() if v} == expected
    assert expected["c-ann"] == (25 + 80 + 4, 3, 109_00)  # from both stores
    assert got["c-ann"]["last_purchase_at"] == DEMO_T0  # type: ignore[index]  # the script's clock
    assert reader.get("customer_points", "store-north") is None  # keyed by customer, not store


def test_every_example_view_ignores_replays_and_batching() -> None:
    for app_name, script in (("bank", bank_script()), ("orders", orders_script()),
                             ("loyalty", loyalty_script())):
        _, local, events = _project(app_name, script)
        before = _tables(local)
        local.apply(events)
        for i in range(0, len(events), 5):
            local.apply(events[max(0, i - 2):i + 5])
        assert _tables(local) == before, app_name


def test_customer_points_folds_late_purchases_of_other_stores_onto_the_same_row() -> None:
    store = SqliteStore(":memory:")
    local = LocalProjector(loyalty.app, store)
    versions: dict[str, int] = {}
    local.apply(records_for(loyalty.app, [("s1", loyalty.PurchaseRecorded("i1", "c1", 10_00, 10))],
                            versions=versions))
    local.apply(records_for(loyalty.app, [("s2", loyalty.PurchaseRecorded("i2", "c1", 5_00, 5)),
                                          ("s1", loyalty.PurchaseRecorded("i3", "c2", 1_00, 1))],
                            versions=versions))
    reader = ProjectionReader(loyalty.app, store)
    assert reader.get("customer_points", "c1")["points"] == 15  # type: ignore[index]
    assert reader.get("customer_points", "c2")["points"] == 1  # type: ignore[index]
