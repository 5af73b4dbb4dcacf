"""Projection declarations, the pure fold, table names and the CLI wiring (no services)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from cqrs.cli.main import build_parser
from cqrs.testing.example import Account, AccountClosed, AccountOpened, Deposited, Withdrawn
from projections import (
    DELETE,
    CategoryProjection,
    EventMeta,
    Projection,
    ProjectionDefinitionError,
    UnknownProjectionError,
    records_for,
)
from projections.fold import fold_aggregate
from projections.model import find_projection
from projections.records import StoredView
from projections.store import table_base
from projections.testing import AccountsByOwner, Balances, make_bank_app

app = make_bank_app("unit-bank")


def test_handlers_are_found_by_annotation_with_or_without_meta() -> None:
    assert Balances.handlers["example.bank.Deposited"] == "on_deposited"
    assert AccountsByOwner.handlers["example.bank.Withdrawn"] == "on_moved"  # a union
    assert Balances.aggregate_type == "example.bank.Account"
    assert Balances.new_view() == {"owner": None, "balance": 0, "movements": 0, "updated_at": None}


@pytest.mark.parametrize("attrs_, message", [
    ({"name": "Bad-Name"}, "Bad-Name"),
    ({"columns": {"x": list}}, "columns\\['x'\\]"),
    ({"columns": {"grp": int}}, "grp"),
    ({"defaults": {"nope": 1}}, "nope"),
])
def test_bad_declarations_are_refused_with_the_bad_value(attrs_: dict[str, Any], message: str) -> None:
    body: dict[str, Any] = {"name": "p", "aggregate": Account, "columns": {"n": int},
                            "on_dep": lambda self, view, event: None}
    body["on_dep"].__annotations__ = {"event": Deposited}
    body.update(attrs_)
    with pytest.raises(ProjectionDefinitionError, match=message):
        type("P", (Projection,), body)


def test_a_handler_without_an_event_annotation_is_refused() -> None:
    with pytest.raises(ProjectionDefinitionError, match="annotate parameter 'event'"):
        class P(Projection):
            name = "p"
            aggregate = Account
            columns = {"n": int}

            def on_x(self, view: dict, event: int) -> None: ...


def test_category_needs_group_and_order_columns() -> None:
    with pytest.raises(ProjectionDefinitionError, match="group_by = 'missing'"):
        class C(CategoryProjection):
            name = "c"
            aggregate = Account
            columns = {"owner": str}
            group_by = "missing"
            order_by = "owner"

            def on_o(self, view: dict, event: AccountOpened) -> None: ...


def test_unknown_projection_names_what_exists() -> None:
    with pytest.raises(UnknownProjectionError, match="accounts_by_owner.*balances"):
        find_projection(app, "nope")


def _fold(records: Any, stored: StoredView | None = None, projection: Projection | None = None) -> Any:
    return fold_aggregate(projection or Balances(), "a", stored, records, app.codec.decode)


def test_fold_skips_applied_and_duplicate_versions() -> None:
    recs = records_for(app, [("a", AccountOpened("ann")), ("a", Deposited(5)), ("a", Deposited(7))])
    out = _fold([*recs, recs[1]], StoredView({**Balances.new_view(), "owner": "ann", "balance": 5,
                                              "movements": 1}, 2))
    assert out.view.version == 3 and out.view.values["balance"] == 12 and out.applied == 1


def test_fold_parks_on_a_gap_and_keeps_the_view_before_it() -> None:
    recs = records_for(app, [("a", AccountOpened("ann")), ("a", Deposited(5)), ("a", Deposited(7))])
    out = _fold([recs[0], recs[2]])
    assert (out.view.mode, out.view.parked_at, out.view.version) == ("park", 2, 1)
    assert [(d.record.version, d.reason) for d in out.dead] == [(3, "gap")]


def test_fold_of_a_parked_aggregate_dead_letters_everything_new() -> None:
    recs = records_for(app, [("a", AccountOpened("ann")), ("a", Deposited(5))])
    out = _fold(recs, StoredView(None, 0, parked_at=1))
    assert out.view is None and [d.reason for d in out.dead] == ["parked", "parked"]


def test_a_category_item_whose_group_changes_moves_and_keeps_its_old_slot() -> None:
    class Renamed(AccountsByOwner):
        name = "renamed"

        def on_moved(self, view: dict, event: Deposited | Withdrawn, meta: EventMeta) -> None:
            view["owner"] = "someone-else"

    recs = records_for(app, [("a", AccountOpened("ann")), ("a", Deposited(5))])
    out = _fold(recs, projection=Renamed())
    assert out.dead == []
    t0 = recs[0].timestamp
    assert [(c.group, c.sort.isoformat(), c.version, c.deleted) for c in out.category] == [
        ("ann", t0, 2, True), ("someone-else", t0, 2, False)]  # the old place left at version 2
    # folded in two batches: the same rows (the first batch wrote ann's row at version 1)
    first = _fold(recs[:1], projection=Renamed())
    stored = StoredView(first.view.values, 1)
    assert _fold(recs[1:], stored, projection=Renamed()).category == out.category


def test_changing_the_order_value_of_a_category_item_parks_it() -> None:
    class Reordered(AccountsByOwner):
        name = "reordered"

        def on_moved(self, view: dict, event: Deposited | Withdrawn, meta: EventMeta) -> None:
            view["opened_at"] = meta.timestamp

    recs = records_for(app, [("a", AccountOpened("ann")), ("a", Deposited(5))])
    out = _fold(recs, projection=Reordered())
    assert out.dead[0].reason == "handler" and "'opened_at' changed" in out.dead[0].error
    assert "fixed once set" in out.dead[0].error
    assert [(c.group, c.version, c.deleted) for c in out.category] == [("ann", 1, False)]


def test_table_names_are_safe_and_bounded() -> None:
    assert table_base("example-bank", "balances") == "example_bank__balances"
    long = table_base("a-very-long-application-name-for-tests", "balances")
    assert len(long) <= 38 and long.endswith("balances") or long.startswith("p")


def test_cli_has_the_read_side_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "projector", "m:app", "balances", "--available-now"])
    assert args.projections == ["balances"] and args.available_now
    assert parser.parse_args(["projections", "dlq", "m:app", "replay"]).action == "replay"
    assert parser.parse_args(["rebuild", "m:app", "balances", "--keep-old"]).keep_old
    assert parser.parse_args(["run", "processor", "m:app"]).job == "processor"


def test_core_never_imports_projections() -> None:
    import pathlib

    import ast

    def imports_projections(path: pathlib.Path) -> bool:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "projections" or n.startswith("projections.") for n in names):
                return True
        return False

    core = pathlib.Path(__file__).resolve().parents[2] / "cqrs"
    offenders = [p for p in core.rglob("*.py") if p.parent.name != "cli" and imports_projections(p)]
    assert offenders == []


def test_event_meta_parses_the_timestamp_lazily() -> None:
    meta = EventMeta("a", "t", "m", 1, "2026-01-01T00:00:00+00:00")
    assert meta.timestamp == dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def test_category_rows_carry_the_version_of_the_last_applied_event() -> None:
    recs = records_for(app, [("a", AccountOpened("ann")), ("a", Deposited(5)), ("a", AccountClosed(5))])
    out = _fold(recs, projection=AccountsByOwner())  # AccountsByOwner ignores AccountClosed
    assert (out.view.version, [c.version for c in out.category]) == (3, [2])


# --- re-keyed projections ---------------------------------------------------------------------


def test_a_rekeyed_projection_needs_key_of_and_may_be_a_category() -> None:
    from projections import RekeyedProjection
    from projections.model import CategoryProjection

    with pytest.raises(ProjectionDefinitionError, match="key_of"):
        class NoKey(RekeyedProjection):
            name = "no_key"
            aggregate = Account
            columns = {"n": int}

            def on_dep(self, view: dict, event: Deposited) -> None: ...

    class Both(RekeyedProjection, CategoryProjection):
        name = "both"
        aggregate = Account
        columns = {"g": str, "s": int}
        group_by, order_by = "g", "s"

        def key_of(self, event: Deposited, meta: Any) -> str | None:
            return "k"

        def on_dep(self, view: dict, event: Deposited) -> None: ...

    assert Both.handlers == {"example.bank.Deposited": "on_dep"}
    with pytest.raises(ProjectionDefinitionError, match="group_by = 'nope'"):  # checked as a category
        class Bad(RekeyedProjection, CategoryProjection):
            name = "bad"
            aggregate = Account
            columns = {"g": str, "s": int}
            group_by, order_by = "nope", "s"

            def key_of(self, event: Deposited, meta: Any) -> str | None:
                return "k"

            def on_dep(self, view: dict, event: Deposited) -> None: ...


def test_a_bad_view_key_fails_the_batch_naming_the_event() -> None:
    from projections import LocalProjector, RekeyedProjection, SqliteStore, ViewKeyError, records_for
    from cqrs.app import App
    from cqrs.testing.example import AccountHandler

    class ByAmount(RekeyedProjection):
        name = "by_amount"
        aggregate = Account
        columns = {"n": int}

        def key_of(self, event: Deposited, meta: Any) -> str | None:
            return event.amount  # type: ignore[return-value]  # not a str: the bug under test

        def on_dep(self, view: dict, event: Deposited) -> None: ...

    app = App("bad-key", aggregates=[Account], handlers=[AccountHandler], projections=[ByAmount])
    local = LocalProjector(app, SqliteStore(":memory:"))
    with pytest.raises(ViewKeyError, match=r"returned 7 .*'acc-1'"):
        local.apply(records_for(app, [("acc-1", AccountOpened("ann")), ("acc-1", Deposited(7))]))


def test_the_local_projector_raises_on_a_dead_letter_unless_asked_to_collect_them() -> None:
    import pytest

    from cqrs.app import App
    from cqrs.testing.example import Account, AccountHandler, AccountOpened, Deposited
    from projections import DeadLetterRaisedError, LocalProjector, Projection, SqliteStore, records_for

    class Fragile(Projection):
        name, aggregate, key = "fragile", Account, "account_id"
        columns, defaults = {"balance": int}, {"balance": 0}

        def on_deposited(self, view: dict, e: Deposited) -> None:
            if e.amount == 13:
                raise ValueError("unlucky amount 13")
            view["balance"] += e.amount

    app = App("local-dead", aggregates=[Account], handlers=[AccountHandler], projections=[Fragile])
    log = records_for(app, [("a1", AccountOpened("ann")), ("a1", Deposited(13))])
    with pytest.raises(DeadLetterRaisedError, match=r"version 2 of aggregate 'a1' \(handler: "
                                                     r"ValueError: unlucky amount 13\)"):
        LocalProjector(app, SqliteStore(":memory:")).apply(log)
    collecting = LocalProjector(app, SqliteStore(":memory:"), collect_dead_letters=True)
    collecting.apply(log)
    assert [(d.record.version, d.reason) for d in collecting.dead_letters] == [(2, "handler")]


def test_a_rekeyed_category_item_moves_with_its_group_and_is_deleted_in_place() -> None:
    from projections.rekeyed import fold_view, group_by_view
    from projections.testing import BookLent, BookReturned, LoansByMember, LoanTransferred, library_app

    p = LoansByMember()
    recs = records_for(library_app, [("b1", BookLent("L1", "ann")), ("b1", LoanTransferred("L1", "bob")),
                                     ("b1", LoanTransferred("L1", "ann")), ("b1", LoanTransferred("L1", "cy"))])
    (items,) = group_by_view(p, recs, library_app.codec.decode).values()
    out = fold_view(p, "L1", None, items)
    t0 = recs[0].timestamp
    # ann left at the 4th event (the last time), bob at the 3rd; cy holds the item at 4
    assert [(c.group, c.sort.isoformat(), c.aggregate_id, c.version, c.deleted) for c in out.category] == [
        ("ann", t0, "L1", 4, True), ("bob", t0, "L1", 3, True), ("cy", t0, "L1", 4, False)]
    assert out.view.values["member"] == "cy" and out.view.values["transfers"] == 3
    returned = records_for(library_app, [("b1", BookReturned("L1"))], versions={"b1": 4})
    (more,) = group_by_view(p, returned, library_app.codec.decode).values()
    stored = StoredView(out.view.values, 4, sources={"b1": 4})
    done = fold_view(p, "L1", stored, more)
    assert [(c.group, c.version, c.deleted) for c in done.category] == [("cy", 5, True)]


def test_a_deleted_category_item_leaves_its_slot_however_the_fold_is_batched() -> None:
    class Closing(AccountsByOwner):
        name = "closing"

        def on_closed(self, view: dict, event: AccountClosed):
            return DELETE

    recs = records_for(app, [("a", AccountOpened("ann")), ("a", AccountClosed(0)), ("a", Deposited(5))])
    whole = _fold(recs, projection=Closing())  # the deposit after the close starts a view with no group
    first = _fold(recs[:2], projection=Closing())
    rest = _fold(recs[2:], StoredView(None, 2, deleted=True), projection=Closing())
    assert [(c.group, c.version, c.deleted) for c in whole.category] == [("ann", 2, True)]
    assert [*first.category, *rest.category] == whole.category
