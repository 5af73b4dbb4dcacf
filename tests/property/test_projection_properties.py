"""Properties of the read side on the SQLite store: any batching and any replay of the log give
the tables of one clean fold; a category group holds the newest ``keep`` items."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.testing.example import AccountClosed, AccountOpened, Deposited, Withdrawn
from projections import SqliteStore, records_for
from projections.local import LocalProjector
from projections.model import projections_of
from projections.store import ProjectionStore, table_base
from projections.testing import AccountsByOwner, make_bank_app

app = make_bank_app("prop-bank")


@st.composite
def logs(draw: Any) -> list[Any]:
    accounts = draw(st.integers(1, 6))
    events: list[tuple[str, object]] = []
    opened: list[str] = []
    closed: set[str] = set()
    for _ in range(draw(st.integers(1, 40))):
        choice = draw(st.integers(0, 9))
        live = [a for a in opened if a not in closed]
        if choice == 0 or not live:
            acc = f"a{len(opened)}"
            if len(opened) >= accounts:
                continue
            opened.append(acc)
            events.append((acc, AccountOpened(draw(st.sampled_from(["ann", "bob"])))))
        elif choice == 9:
            acc = draw(st.sampled_from(live))
            closed.add(acc)
            events.append((acc, AccountClosed(0)))
        else:
            acc = draw(st.sampled_from(live))
            events.append((acc, Deposited(draw(st.integers(1, 9))) if choice < 7 else Withdrawn(1)))
    return records_for(app, events)


def snapshot(store: ProjectionStore) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, p in projections_of(app).items():
        base = table_base(app.name, name)
        out[name] = list(store.scan_views(p, base, 1))
    cat = AccountsByOwner()
    out["groups"] = [(g, r.aggregate_id, r.values, r.version, r.deleted)
                     for g, r in store.scan_category(cat, table_base(app.name, cat.name), 1)]
    return out


@settings(max_examples=60, deadline=None)
@given(log=logs(), data=st.data())
def test_any_batching_and_replay_equals_one_clean_fold(log: list[Any], data: Any) -> None:
    clean = SqliteStore(":memory:")
    LocalProjector(app, clean).apply(log)
    store = SqliteStore(":memory:")
    local = LocalProjector(app, store)
    i = 0
    while i < len(log):  # forward in random batches, sometimes stepping back (a replay)
        j = data.draw(st.integers(i + 1, len(log)))
        local.apply(log[i:j])
        back = data.draw(st.integers(0, j))
        local.apply(log[back:j])
        i = j
    local.apply(log)  # and the whole log once more
    assert snapshot(store) == snapshot(clean)


@settings(max_examples=60, deadline=None)
@given(log=logs())
def test_a_group_holds_its_newest_items_newest_first(log: list[Any]) -> None:
    store = SqliteStore(":memory:")
    LocalProjector(app, store).apply(log)
    cat = AccountsByOwner()
    base = table_base(app.name, cat.name)
    owners: dict[str, list[Any]] = {}
    for r in log:
        if r.message_type == "example.bank.AccountOpened":
            owners.setdefault(app.codec.decode(r.value).owner, []).append(r)
    for owner, opened in owners.items():
        rows = store.category_rows(cat, base, 1, owner, 100)
        newest = sorted(opened, key=lambda r: r.timestamp, reverse=True)[:cat.keep]
        assert [r.aggregate_id for r in rows] == [r.aggregate_id for r in newest]
