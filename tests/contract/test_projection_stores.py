"""One contract for every projection store: the same tests run on SQLite (fast, no services)
and on Cassandra (marked integration: needs the running stack)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from cqrs.domain import FORGOTTEN
from cqrs.errors import MissingKeyStoreError
from cqrs.personal import SEALED_PREFIX, MemoryKeyStore
from cqrs.testing.example import AccountClosed, AccountOpened, Deposited, Withdrawn
from domain_examples.ticketing import TicketOrder, TicketOrderHandler, TicketOrderPlaced, TicketOrders
from projections import (
    CategoryProjection, EventMeta, GenerationError, PageTokenError, Projection, ProjectionReader,
    WaitTimeoutError,
)
from projections.apply import Target, apply_batch
from projections.dlq import replay_dead_letters
from projections.local import LocalProjector, records_for
from projections.model import projections_of
from projections.personal import forget_in_read_models, with_personal_columns
from projections.records import CategoryWrite, Generations, ViewWrite
from projections.sqlite_store import SqliteStore
from projections.store import ProjectionStore, table_base
from projections.testing import (
    POISON_FILE,
    AccountsByOwner,
    Balances,
    BookLent,
    BookReturned,
    LoansByMember,
    LoanTransferred,
    MovementsByBand,
    make_bank_app,
    make_library_app,
    make_rekeyed_app,
)

T0 = dt.datetime(2026, 5, 1, tzinfo=dt.timezone.utc)


# Cassandra twice: rows grouped into requests (3 a request, so the tests' few rows still make
# several groups) and one request per row.
@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.integration),
                        pytest.param("cassandra-row-per-request", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[ProjectionStore]:
    if request.param == "sqlite":
        s: ProjectionStore = SqliteStore(tmp_path / "views.sqlite")
    else:
        from projections.cassandra_store import CassandraStore

        cfg = request.getfixturevalue("cqrs_config")
        keyspace = request.getfixturevalue("unique_keyspace")
        rows = 1 if request.param == "cassandra-row-per-request" else 3
        settings = attrs.evolve(cfg.projections, rows_per_request=rows)
        s = CassandraStore(cfg.cassandra, settings, keyspace=keyspace)
    yield s
    s.close()


@pytest.fixture
def app() -> Any:
    return make_bank_app("contract-bank")


def _rows(store: ProjectionStore, app: Any) -> tuple[list[Any], list[Any]]:
    b, c = Balances(), AccountsByOwner()
    views = list(store.scan_views(b, table_base(app.name, b.name), 1))
    cat = list(store.scan_category(c, table_base(app.name, c.name), 1))
    return views, cat


def _history(app: Any) -> list[Any]:
    versions: dict[str, int] = {}
    events = [("a1", AccountOpened("ann")), ("a1", Deposited(10)), ("a2", AccountOpened("bob")),
              ("a3", AccountOpened("ann")), ("a1", Withdrawn(3)), ("a2", Deposited(5)),
              ("a4", AccountOpened("ann")), ("a5", AccountOpened("ann")), ("a3", Deposited(1)),
              ("a2", AccountClosed(5))]
    return records_for(app, events, versions=versions, start=T0)


def test_views_and_categories_after_a_history(store: ProjectionStore, app: Any) -> None:
    LocalProjector(app, store).apply(_history(app))
    reader = ProjectionReader(app, store)
    assert reader.get("balances", "a1") == {
        "account_id": "a1", "owner": "ann", "balance": 7, "movements": 2,
        "updated_at": T0 + dt.timedelta(seconds=4)}
    assert reader.get("balances", "a2") is None  # closed: deleted
    assert reader.version("balances", "a2") == 3
    assert reader.get("balances", "nope") is None
    first = reader.category("accounts_by_owner", "ann", page_size=2)
    assert [i["account_id"] for i in first.items] == ["a5", "a4"]  # newest first
    second = reader.category("accounts_by_owner", "ann", page_size=2, page_token=first.next_token)
    assert [i["account_id"] for i in second.items] == ["a3"] and second.next_token is None
    assert second.items[0]["balance"] == 1
    # keep = 3: a1, the oldest of ann's four accounts, was trimmed from the group
    assert [r.aggregate_id for r in store.category_rows(
        AccountsByOwner(), table_base(app.name, "accounts_by_owner"), 1, "ann", 10)] == ["a5", "a4", "a3"]
    with pytest.raises(PageTokenError, match="accounts_by_owner"):
        reader.category("accounts_by_owner", "bob", page_token=first.next_token)


def test_replaying_everything_or_a_suffix_changes_nothing(store: ProjectionStore, app: Any) -> None:
    local = LocalProjector(app, store)
    history = _history(app)
    local.apply(history)
    before = _rows(store, app)
    local.apply(history)
    local.apply(history[4:])
    for i in range(0, len(history), 3):  # and in small batches, from the start again
        local.apply(history[i:i + 3])
    assert _rows(store, app) == before


def test_older_writes_never_override_newer_ones(store: ProjectionStore, app: Any) -> None:
    p, base = Balances(), table_base(app.name, "balances")
    store.ensure_generation(p, base, 1)
    new = {"owner": "x", "balance": 3, "movements": 3, "updated_at": T0}
    old = {**new, "balance": 1, "movements": 1}
    store.write(p, base, 1, [], [ViewWrite("k", new, 3)])
    store.write(p, base, 1, [], [ViewWrite("k", old, 1)])
    assert store.view(p, base, 1, "k").values == new  # type: ignore[union-attr]


def test_parking_marks_survive_replays_and_clear_on_unpark(store: ProjectionStore, app: Any) -> None:
    p, base = Balances(), table_base(app.name, "balances")
    store.ensure_generation(p, base, 1)
    v2 = {"owner": "x", "balance": 2, "movements": 1, "updated_at": T0}
    store.write(p, base, 1, [], [ViewWrite("k", v2, 2)])
    store.write(p, base, 1, [], [ViewWrite("k", v2, 2, mode="park", parked_at=3)])
    store.write(p, base, 1, [], [ViewWrite("k", v2, 2)])  # a replay of the write before
    assert store.view(p, base, 1, "k").parked_at == 3  # type: ignore[union-attr]
    store.write(p, base, 1, [], [ViewWrite("k", v2, 4, mode="unpark")])
    assert store.view(p, base, 1, "k").parked_at is None  # type: ignore[union-attr]
    store.write(p, base, 1, [], [ViewWrite("k", v2, 4, mode="park", parked_at=5)])
    stored = store.view(p, base, 1, "k")
    assert stored is not None and (stored.parked_at, stored.version) == (5, 4)


def test_category_deleted_items_keep_their_slot(store: ProjectionStore, app: Any) -> None:
    p, base = AccountsByOwner(), table_base(app.name, "accounts_by_owner")
    store.ensure_generation(p, base, 1)
    writes = [CategoryWrite("g", T0 + dt.timedelta(seconds=i), f"a{i}",
                            {"owner": "g", "opened_at": T0 + dt.timedelta(seconds=i), "balance": i},
                            1) for i in range(5)]
    store.write(p, base, 1, writes, [])
    store.write(p, base, 1, [CategoryWrite("g", writes[4].sort, "a4", None, 2, deleted=True)], [])
    store.trim(p, base, 1, ["g"])
    rows = store.category_rows(p, base, 1, "g", 10)
    assert [(r.aggregate_id, r.deleted) for r in rows] == [("a4", True), ("a3", False), ("a2", False)]


def test_generations_positions_and_drop(store: ProjectionStore, app: Any) -> None:
    p, base = Balances(), table_base(app.name, "balances")
    assert store.generations(base) == Generations(None, None)
    store.ensure_generation(p, base, 1)
    store.set_generations(base, Generations(1, 2))
    assert store.generations(base) == Generations(1, 2)
    store.save_positions(base, 1, {0: 10, 1: 7})
    store.save_positions(base, 1, {1: 9})
    assert store.positions(base, 1) == {0: 10, 1: 9}
    store.write(p, base, 1, [], [ViewWrite("k", {"owner": "x"}, 1)])
    store.drop_generation(p, base, 1)
    assert store.positions(base, 1) == {}
    store.ensure_generation(p, base, 1)  # recreated empty
    assert list(store.scan_views(p, base, 1)) == []


def test_wait_for_names_what_it_waited_for(store: ProjectionStore, app: Any) -> None:
    reader = ProjectionReader(app, store)
    with pytest.raises(GenerationError, match="balances"):
        reader.get("balances", "a1")
    LocalProjector(app, store).apply(_history(app))
    assert reader.wait_for("balances", "a1", 3, timeout=1) == 3
    with pytest.raises(WaitTimeoutError, match=r"'balances'.*version 4.*'a1'.*version 3") as err:
        reader.wait_for("balances", "a1", 4, timeout=0.2)
    assert (err.value.aggregate_id, err.value.version, err.value.seen) == ("a1", 4, 3)


def test_poisoned_event_parks_only_its_aggregate_until_replayed(
    store: ProjectionStore, app: Any
) -> None:
    versions: dict[str, int] = {}
    poison = 7919
    POISON_FILE.write_text(f"{poison}\n")
    try:
        local = LocalProjector(app, store, ["balances"], collect_dead_letters=True)
        log = records_for(app, [("p", AccountOpened("ann")), ("p", Deposited(poison)),
                                ("ok", AccountOpened("bob"))], versions=versions)
        log += records_for(app, [("p", Deposited(1)), ("ok", Deposited(2))], versions=versions)
        local.apply(log[:3])
        local.apply(log[3:])
        reader = ProjectionReader(app, store)
        assert reader.get("balances", "p")["balance"] == 0  # type: ignore[index]  # held at v1
        assert reader.get("balances", "ok")["balance"] == 2  # type: ignore[index]
        assert [(d.record.version, d.reason) for d in local.dead_letters] == [(2, "handler"), (3, "parked")]
        target = local.targets[0]
        report = replay_dead_letters(store, target, local.dead_letters, app.codec.decode)
        assert report.still_parked == 1  # not fixed yet: still parked, nothing lost
    finally:
        POISON_FILE.unlink()
    report = replay_dead_letters(store, target, local.dead_letters, app.codec.decode)
    assert report.still_parked == 0
    assert reader.get("balances", "p")["balance"] == poison + 1  # type: ignore[index]
    log += records_for(app, [("p", Withdrawn(1))], versions=versions)
    local.apply(log[-1:])
    clean = SqliteStore(":memory:")
    LocalProjector(app, clean, ["balances"]).apply(log)  # the clean fold of the same log
    assert _views(store, app, target) == _views(clean, app, target)


def _views(store: ProjectionStore, app: Any, target: Target) -> list[Any]:
    return [(k, v.values, v.version, v.parked_at)
            for k, v in store.scan_views(target.projection, target.base, target.generation)]


# --- re-keyed projections ---------------------------------------------------------------------


def _bands(store: ProjectionStore, app: Any) -> list[Any]:
    p = MovementsByBand()
    return list(store.scan_views(p, table_base(app.name, p.name), 1))


def test_rekeyed_views_fold_every_source_once_and_replays_change_nothing(store: ProjectionStore) -> None:
    app = make_rekeyed_app("contract-rekeyed")
    versions: dict[str, int] = {}
    log = records_for(app, [("a1", AccountOpened("ann")), ("a2", AccountOpened("bob")),
                            ("a1", Deposited(12)), ("a2", Deposited(15)), ("a1", Withdrawn(3)),
                            ("a2", Withdrawn(0)), ("a1", Deposited(18)), ("a3", AccountOpened("cy")),
                            ("a3", Deposited(4))], versions=versions, start=T0)
    local = LocalProjector(app, store)
    local.apply(log)
    reader = ProjectionReader(app, store)
    assert reader.get("movements_by_band", "band-1") == {
        "band": "band-1", "movements": 3, "total": 45, "last_at": T0 + dt.timedelta(seconds=6)}
    assert reader.get("movements_by_band", "band-0")["total"] == 7  # type: ignore[index]
    assert reader.version("movements_by_band", "band-1") == 3  # events applied to the view
    assert reader.get("movements_by_band", "band-9") is None
    stored = store.view(MovementsByBand(), table_base(app.name, "movements_by_band"), 1, "band-1")
    assert stored is not None and stored.sources == {"a1": 4, "a2": 2}
    before = _bands(store, app)
    local.apply(log)
    local.apply(log[4:])
    for i in range(0, len(log), 2):
        local.apply(list(reversed(log[i:i + 2])))
    assert _bands(store, app) == before
    more = records_for(app, [("a2", Deposited(11))], versions=versions, start=T0 + dt.timedelta(hours=1))
    local.apply([*log[-3:], *more, *more])
    assert reader.get("movements_by_band", "band-1")["total"] == 56  # type: ignore[index]


def test_rekeyed_failing_handler_parks_the_view_until_replayed(store: ProjectionStore) -> None:
    app = make_rekeyed_app("contract-rekeyed")
    poison = 7927  # band-792
    versions: dict[str, int] = {}
    POISON_FILE.write_text(f"{poison}\n")
    try:
        local = LocalProjector(app, store, ["movements_by_band"], collect_dead_letters=True)
        log = records_for(app, [("a", AccountOpened("ann")), ("b", AccountOpened("bob")),
                                ("a", Deposited(7920)), ("b", Deposited(poison)),
                                ("a", Deposited(7921)), ("b", Deposited(5))], versions=versions)
        local.apply(log)
        reader = ProjectionReader(app, store)
        held = reader.get("movements_by_band", "band-792")
        assert held is not None and held["movements"] == 1  # kept the fold before the failure
        assert reader.get("movements_by_band", "band-0")["movements"] == 1  # type: ignore[index]
        letters = [(d.record.aggregate_id, d.record.version, d.reason) for d in local.dead_letters]
        assert sorted(letters) == [("a", 3, "parked"), ("b", 2, "handler")]
        local.apply(log)  # a replayed batch parks nothing more, applies nothing twice
        assert reader.get("movements_by_band", "band-792")["movements"] == 1  # type: ignore[index]
        target = local.targets[0]
            # still held: events of both sources (counted per source aggregate)
        assert replay_dead_letters(store, target, local.dead_letters, app.codec.decode).still_parked == 2
    finally:
        POISON_FILE.unlink()
    assert replay_dead_letters(store, target, local.dead_letters, app.codec.decode).still_parked == 0
    assert replay_dead_letters(store, target, local.dead_letters, app.codec.decode).still_parked == 0
    clean = SqliteStore(":memory:")
    LocalProjector(app, clean, ["movements_by_band"]).apply(log)
    assert [(k, v.values, v.version, v.parked_at) for k, v in _bands(store, app)] == [
        (k, v.values, v.version, v.parked_at) for k, v in _bands(clean, app)]


class OpenedOn(Projection):
    """A date column: the day an account was opened."""

    name = "opened_on"
    aggregate = "example.bank.Account"
    key = "account_id"
    columns = {"owner": str, "opened_on": dt.date}

    def on_account_opened(self, view: dict, event: AccountOpened, meta: EventMeta) -> None:
        view["owner"], view["opened_on"] = event.owner, meta.timestamp.date()


class OpenedByDay(CategoryProjection):
    """A category ordered by a date column."""

    name = "opened_by_day"
    aggregate = "example.bank.Account"
    key = "account_id"
    columns = {"owner": str, "day": dt.date}
    group_by, order_by, keep = "owner", "day", 10

    def on_account_opened(self, view: dict, event: AccountOpened, meta: EventMeta) -> None:
        view["owner"], view["day"] = event.owner, meta.timestamp.date()


def test_date_columns_round_trip_and_order_a_category(store: ProjectionStore) -> None:
    from cqrs.app import App
    from cqrs.testing.example import Account, AccountHandler

    app = App("contract-dates", aggregates=[Account], handlers=[AccountHandler],
              projections=[OpenedOn, OpenedByDay])
    days = [dt.datetime(2026, 5, d, 12, tzinfo=dt.timezone.utc) for d in (3, 1, 2)]
    records = [r for i, day in enumerate(days)
               for r in records_for(app, [(f"a{i}", AccountOpened("ann"))], start=day)]
    LocalProjector(app, store).apply(records)
    reader = ProjectionReader(app, store)
    assert reader.get("opened_on", "a1") == {"account_id": "a1", "owner": "ann",
                                             "opened_on": dt.date(2026, 5, 1)}
    first = reader.category("opened_by_day", "ann", page_size=2)
    assert [i["day"] for i in first.items] == [dt.date(2026, 5, 3), dt.date(2026, 5, 2)]  # newest first
    rest = reader.category("opened_by_day", "ann", page_size=2, page_token=first.next_token)
    assert [i["day"] for i in rest.items] == [dt.date(2026, 5, 1)]


# --- categories whose items move between groups ------------------------------------------------


def _library_log(app: Any) -> list[Any]:
    """ann borrows four books (keep = 3: her oldest loan is trimmed), then her newest loan is
    transferred to bob and back, another one to bob for good, and one is returned."""
    versions: dict[str, int] = {}
    events = [("b1", BookLent("L1", "ann")), ("b2", BookLent("L2", "ann")),
              ("b3", BookLent("L3", "ann")), ("b4", BookLent("L4", "ann")),
              ("b4", LoanTransferred("L4", "bob")), ("b5", BookLent("L5", "bob")),
              ("b4", LoanTransferred("L4", "ann")), ("b3", LoanTransferred("L3", "bob")),
              ("b2", BookReturned("L2")), ("b2", BookLent("L6", "cy"))]
    return records_for(app, events, versions=versions, start=T0)


def _library_tables(store: ProjectionStore, app: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, p in projections_of(app).items():
        base = table_base(app.name, name)
        out[name] = [(k, v.values, v.version, v.deleted, v.sources)
                     for k, v in store.scan_views(p, base, 1)]
        out[name + ":category"] = list(store.scan_category(p, base, 1))  # type: ignore[arg-type]
    return out


def test_category_items_move_between_groups_and_a_rebuild_equals_live(store: ProjectionStore) -> None:
    live_app, rebuilt_app = make_library_app("contract-library"), make_library_app("contract-rebuilt")
    log = _library_log(live_app)
    local = LocalProjector(live_app, store)
    for i in range(0, len(log), 2):  # live: two events a batch, some of them twice
        local.apply(log[max(0, i - 1):i + 2])
    LocalProjector(rebuilt_app, store).apply(log)  # a rebuild: the whole log in one batch
    assert _library_tables(store, live_app) == _library_tables(store, rebuilt_app)

    reader = ProjectionReader(live_app, store)
    loans = {m: [(i["loan_id"], i["transfers"]) for i in reader.category("loans_by_member", m).items]
             for m in ("ann", "bob", "cy")}
    # ann's newest three places: L4 (back from bob), L3 (moved to bob: its slot stays), L2
    # (returned: deleted in place); L1 was trimmed when L4 came and does not come back.
    # bob's: L5, the slot L4 left when it went back to ann, L3 (lent before L4)
    assert loans == {"ann": [("L4", 2)], "bob": [("L5", 0), ("L3", 1)], "cy": [("L6", 0)]}
    assert reader.get("loans_by_member", "L3") == {
        "loan_id": "L3", "member": "bob", "book": "b3", "lent_at": T0 + dt.timedelta(seconds=2),
        "transfers": 1}
    assert reader.get("loans_by_member", "L2") is None
    rows = store.category_rows(LoansByMember(), table_base(live_app.name, "loans_by_member"), 1,
                               "ann", 10)
    assert [(r.aggregate_id, r.deleted) for r in rows] == [("L4", False), ("L3", True), ("L2", True)]
    holders = {m: [i["book"] for i in reader.category("books_by_holder", m).items]
               for m in ("ann", "bob", "cy")}
    # b2 left ann when returned and came back with its next loan, to cy
    assert holders == {"ann": ["b4"], "bob": ["b5", "b3"], "cy": ["b2"]}

    local.apply(log)  # a replay changes nothing
    assert _library_tables(store, live_app) == _library_tables(store, rebuilt_app)


def test_a_moved_items_deleted_row_is_not_undone_by_a_replayed_write(store: ProjectionStore) -> None:
    p, base = LoansByMember(), table_base("contract-library", "loans_by_member")
    store.ensure_generation(p, base, 1)
    values = {"member": "ann", "book": "b1", "lent_at": T0, "transfers": 0}
    row = CategoryWrite("ann", T0, "L1", values, 1)
    store.write(p, base, 1, [row], [])
    store.write(p, base, 1, [CategoryWrite("ann", T0, "L1", None, 2, deleted=True),
                             CategoryWrite("bob", T0, "L1", {**values, "member": "bob"}, 2)], [])
    store.write(p, base, 1, [row], [])  # the first write again (a replay): older, ignored
    groups = {g: (r.aggregate_id, r.version, r.deleted) for g, r in store.scan_category(p, base, 1)}
    assert groups == {"ann": ("L1", 2, True), "bob": ("L1", 2, False)}


def test_a_failing_handler_parks_a_moving_item_until_replayed(store: ProjectionStore) -> None:
    app = make_library_app("contract-library")
    versions: dict[str, int] = {}
    POISON_FILE.write_text("zed\n")
    try:
        local = LocalProjector(app, store, ["loans_by_member"], collect_dead_letters=True)
        log = records_for(app, [("b1", BookLent("L1", "ann")), ("b2", BookLent("L2", "ann")),
                                ("b1", LoanTransferred("L1", "bob")),
                                ("b1", LoanTransferred("L1", "zed")),  # fails: L1 parked at bob
                                ("b1", LoanTransferred("L1", "cy")), ("b2", LoanTransferred("L2", "cy"))],
                          versions=versions, start=T0)
        local.apply(log[:3])
        local.apply(log[3:])
        reader = ProjectionReader(app, store)
        loans = {m: [i["loan_id"] for i in reader.category("loans_by_member", m).items]
                 for m in ("ann", "bob", "cy")}
        assert loans == {"ann": [], "bob": ["L1"], "cy": ["L2"]}  # L1 held where it was
        assert [(d.record.version, d.reason) for d in local.dead_letters] == [(3, "handler"), (4, "parked")]
        target = local.targets[0]
        assert replay_dead_letters(store, target, local.dead_letters, app.codec.decode).still_parked == 1
    finally:
        POISON_FILE.unlink()  # the handler is fixed: zed is a member like any other
    assert replay_dead_letters(store, target, local.dead_letters, app.codec.decode).still_parked == 0
    assert [i["loan_id"] for i in reader.category("loans_by_member", "cy").items] == ["L2", "L1"]
    clean = SqliteStore(":memory:")
    LocalProjector(app, clean, ["loans_by_member"]).apply(log)
    p, base = LoansByMember(), table_base(app.name, "loans_by_member")
    assert list(store.scan_category(p, base, 1)) == list(clean.scan_category(p, base, 1))
    assert [(k, v.values, v.version, v.parked_at) for k, v in store.scan_views(p, base, 1)] == [
        (k, v.values, v.version, v.parked_at) for k, v in clean.scan_views(p, base, 1)]


# --- personal columns (#26): sealed in every store, opened for readers, rewritten on forget ---

class OrdersByCustomer(CategoryProjection):
    """A category whose items carry the customer's name (personal, subject customer_id)."""

    name = "orders_by_customer"
    aggregate = TicketOrder
    key = "order_id"
    columns = {"customer_id": str, "customer_name": str, "placed_at": dt.datetime, "show": str}
    personal_columns = {"customer_name": "customer_id"}
    group_by = "customer_id"
    order_by = "placed_at"

    def on_placed(self, view: dict, event: TicketOrderPlaced, meta: EventMeta) -> None:
        view.update(customer_id=event.customer_id, customer_name=event.customer_name,
                    placed_at=meta.timestamp, show=event.show)


PEOPLE = {"c-erin": ("Erin Quillfeather", "erin.q@example.com"),
          "c-ann": ("Ann Marlowe", "ann.m@example.com")}


def _ticket_app() -> Any:
    from cqrs.app import App

    app = App("contract-tickets", aggregates=[TicketOrder], handlers=[TicketOrderHandler],
              projections=[TicketOrders, OrdersByCustomer])
    app.use_key_store(MemoryKeyStore())
    return app


def _orders(app: Any) -> list[Any]:
    return records_for(app, [(f"o-{c}-{i}", TicketOrderPlaced(c, name, mail, f"show {i}", 1))
                             for i in range(2) for c, (name, mail) in PEOPLE.items()], start=T0)


def _raw(store: ProjectionStore, app: Any, generation: int = 1) -> tuple[list[Any], list[Any]]:
    """The rows as stored (``store`` not wrapped: nothing opened)."""
    t, c = TicketOrders(), OrdersByCustomer()
    return (list(store.scan_views(t, table_base(app.name, t.name), generation)),
            list(store.scan_category(c, table_base(app.name, c.name), generation)))


def _texts(rows: Any) -> str:
    return repr(rows)


def _anns(store: ProjectionStore, app: Any) -> tuple[list[Any], list[Any]]:
    views, items = _raw(store, app)
    return [v for v in views if "c-ann" in v[0]], [i for i in items if i[0] == "c-ann"]


def test_personal_columns_are_sealed_in_the_store_and_opened_for_readers(
        store: ProjectionStore) -> None:
    app = _ticket_app()
    LocalProjector(app, store).apply(_orders(app))
    views, items = _raw(store, app)
    assert len(views) == 4 and len(items) == 4
    raw = _texts((views, items))
    assert all(name not in raw and mail not in raw for name, mail in PEOPLE.values())
    assert {v.values["customer_name"][:len(SEALED_PREFIX)] for _, v in views} == {SEALED_PREFIX}
    reader = ProjectionReader(app, store)
    assert reader.get("ticket_orders", "o-c-erin-0") == {
        "order_id": "o-c-erin-0", "customer_id": "c-erin", "customer_name": "Erin Quillfeather",
        "show": "show 0", "tickets": 1, "status": "placed"}
    page = reader.category("orders_by_customer", "c-ann")
    assert [(i["order_id"], i["customer_name"]) for i in page.items] == [
        ("o-c-ann-1", "Ann Marlowe"), ("o-c-ann-0", "Ann Marlowe")]
    # a reader without the key store refuses to guess
    bare = App_without_keys(app)
    with pytest.raises(MissingKeyStoreError, match="ticket_orders"):
        ProjectionReader(bare, store).get("ticket_orders", "o-c-ann-0")


def App_without_keys(app: Any) -> Any:  # noqa: N802 - reads as a constructor
    from cqrs.app import App

    return App(app.name, aggregates=[TicketOrder], handlers=[TicketOrderHandler],
               projections=[TicketOrders, OrdersByCustomer])


def test_forgetting_rewrites_the_subjects_rows_and_a_rebuild_equals_them(
        store: ProjectionStore) -> None:
    app = _ticket_app()
    history = _orders(app)
    local = LocalProjector(app, store)
    local.apply(history)
    ann_before = _anns(store, app)
    reader = ProjectionReader(app, store)
    assert app.key_store.forget("c-erin")
    # readable as forgotten at once, before any row is rewritten
    assert reader.get("ticket_orders", "o-c-erin-1")["customer_name"] == FORGOTTEN
    done = forget_in_read_models(store, app, "c-erin", app.key_store)
    assert [(d.projection, d.generation, d.rewritten) for d in done] == [
        ("ticket_orders", 1, 2), ("orders_by_customer", 1, 4)]  # its views and items
    views, items = _raw(store, app)
    erin = [v.values for k, v in views if "c-erin" in k] + [
        r.values for _, r in items if r.aggregate_id.startswith("o-c-erin")]
    assert [v["customer_name"] for v in erin] == [FORGOTTEN] * 4  # not even the ciphertext
    assert [v["show"] for v in erin[:2]] == ["show 0", "show 1"]  # the rest untouched
    assert _anns(store, app) == ann_before
    assert reader.get("ticket_orders", "o-c-ann-0")["customer_name"] == "Ann Marlowe"
    assert [d.rewritten for d in forget_in_read_models(store, app, "c-erin", app.key_store)] == [0, 0]
    local.apply(history)  # a replay of the log does not bring the ciphertext back
    assert _raw(store, app) == (views, items)
    # a rebuild (generation 2, the events read with the key store) equals the rewritten rows
    for p in (TicketOrders(), OrdersByCustomer()):
        base = table_base(app.name, p.name)
        store.ensure_generation(p, base, 2)
        apply_batch(with_personal_columns(store, app), Target(p, base, 2), history,
                    app.codec.decode, lambda _: None)
    assert _raw(store, app, 2) == (views, items)
    # a later order of the forgotten customer gets a new key; forgetting again keeps it
    local.apply(records_for(app, [("o-c-erin-9", TicketOrderPlaced(
        "c-erin", "Erin Again", "e@x.org", "show 9", 1))], start=T0 + dt.timedelta(hours=1)))
    assert [d.rewritten for d in forget_in_read_models(store, app, "c-erin", app.key_store)] == [0, 0]
    assert reader.get("ticket_orders", "o-c-erin-9")["customer_name"] == "Erin Again"
