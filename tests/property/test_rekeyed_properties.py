"""Properties of re-keyed projections on the SQLite store: any replay, duplication, shuffling
within a batch and split into batches of a log gives the tables of one clean fold, and each
view holds exactly the sum over every source aggregate (each event applied once). Categories
whose items move between groups (re-keyed or not) give the tables of a rebuild too, and their
groups show what an oracle written apart from the fold says."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.testing.example import AccountOpened, Deposited, Withdrawn
from projections import ProjectionReader, SqliteStore, records_for
from projections.local import LocalProjector
from projections.model import find_projection, projections_of
from projections.records import EventRecord
from projections.store import ProjectionStore, table_base
from projections.testing import (
    BookLent, BookReturned, LoanTransferred, MovementsByBand, make_library_app,
    make_rekeyed_app,
)

app = make_rekeyed_app("prop-rekeyed")


@st.composite
def logs(draw: Any) -> list[EventRecord]:
    accounts = [f"a{i}" for i in range(draw(st.integers(1, 5)))]
    events: list[tuple[str, object]] = [(a, AccountOpened("ann")) for a in accounts]
    for _ in range(draw(st.integers(1, 40))):
        acc = draw(st.sampled_from(accounts))
        amount = draw(st.integers(0, 35))  # 0 is ignored by key_of; four bands otherwise
        events.append((acc, Deposited(amount) if draw(st.booleans()) else Withdrawn(amount)))
    # interleave the accounts' histories differently from the order they were drawn in
    # (each account's own events stay in order: records_for numbers versions in list order)
    return records_for(app, events)


def snapshot(store: ProjectionStore) -> dict[str, Any]:
    return {name: list(store.scan_views(p, table_base(app.name, name), 1))
            for name, p in projections_of(app).items()}


@st.composite
def deliveries(draw: Any, log: list[EventRecord]) -> list[list[EventRecord]]:
    """Batches as a projector may see them: the position moves forward, a batch may start
    before it (a replay), repeat records, and arrive shuffled (as after a Spark shuffle)."""
    out: list[list[EventRecord]] = []
    position = 0
    while position < len(log):
        start = draw(st.integers(0, position))
        end = draw(st.integers(position + 1, len(log)))
        batch = list(log[start:end])
        batch += draw(st.lists(st.sampled_from(batch), max_size=5))  # duplicates
        random.Random(draw(st.integers(0, 2**32))).shuffle(batch)
        out.append(batch)
        position = end
    if draw(st.booleans()):
        out.append(list(log))  # the whole log once more
    return out


@settings(max_examples=80, deadline=None)
@given(log=logs(), data=st.data())
def test_any_delivery_of_the_log_equals_one_clean_fold(log: list[EventRecord], data: Any) -> None:
    clean = SqliteStore(":memory:")
    LocalProjector(app, clean).apply(log)
    store = SqliteStore(":memory:")
    local = LocalProjector(app, store)
    for batch in data.draw(deliveries(log)):
        local.apply(batch)
    assert snapshot(store) == snapshot(clean)


@settings(max_examples=40, deadline=None)
@given(log=logs())
def test_each_view_holds_each_event_once(log: list[EventRecord]) -> None:
    store = SqliteStore(":memory:")
    local = LocalProjector(app, store)
    local.apply(log)
    local.apply(log[len(log) // 2:])
    expected: dict[str, tuple[int, int]] = {}
    last: dict[str, int] = {}
    for r in log:
        event = app.codec.decode(r.value)
        if isinstance(event, (Deposited, Withdrawn)) and event.amount:
            band = f"band-{event.amount // 10}"
            n, total = expected.get(band, (0, 0))
            expected[band] = (n + 1, total + event.amount)
            last[r.aggregate_id] = r.version
    p = MovementsByBand()
    rows = dict(store.scan_views(p, table_base(app.name, p.name), 1))
    assert {k: (v.values["movements"], v.values["total"]) for k, v in rows.items()  # type: ignore[index]
            if v.values} == expected
    assert all(v.version == v.values["movements"] for v in rows.values() if v.values)
    merged: dict[str, int] = {}
    for v in rows.values():
        for src, version in (v.sources or {}).items():
            merged[src] = max(merged.get(src, 0), version)
    assert merged == last  # every source's last movement is recorded by the view it went to


# --- categories whose items move between groups -----------------------------------------------

library = make_library_app("prop-library")
MEMBERS = ("ann", "bob", "cy")


@st.composite
def library_logs(draw: Any) -> list[EventRecord]:
    """Books lent, transferred between members and returned, interleaved at random; each loan
    has an id of its own, so its item (``LoansByMember``) is fed by one book."""
    books = [f"b{i}" for i in range(draw(st.integers(1, 4)))]
    loan_of: dict[str, str | None] = dict.fromkeys(books)
    events: list[tuple[str, object]] = []
    for n in range(draw(st.integers(1, 45))):
        book = draw(st.sampled_from(books))
        loan, member = loan_of[book], draw(st.sampled_from(MEMBERS))
        if loan is None:
            loan_of[book] = f"L{n}"
            events.append((book, BookLent(f"L{n}", member)))
        elif draw(st.integers(0, 3)):
            events.append((book, LoanTransferred(loan, member)))
        else:
            loan_of[book] = None
            events.append((book, BookReturned(loan)))
    return records_for(library, events)


def library_tables(store: ProjectionStore) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, p in projections_of(library).items():
        base = table_base(library.name, name)
        out[name] = list(store.scan_views(p, base, 1))
        out[name + ":category"] = list(store.scan_category(p, base, 1))  # type: ignore[arg-type]
    return out


def expected_groups(log: list[EventRecord]) -> dict[str, dict[str, list[str]]]:
    """An oracle written apart from the fold: every place (group, order value) an item ever
    held stays in its group, a place the item left counts as deleted; a group shows the
    items still in place among its newest ``keep`` places."""
    places: dict[str, dict[tuple[str, str, str], bool]] = {"loans_by_member": {},
                                                          "books_by_holder": {}}
    at: dict[tuple[str, str], tuple[str, str, str] | None] = {}
    since: dict[str, str] = {}
    lent_at: dict[str, str] = {}

    def move(projection: str, item: str, place: tuple[str, str, str] | None) -> None:
        old = at.get((projection, item))
        if old is not None and old != place:
            places[projection][old] = False
        if place is not None:
            places[projection][place] = True
        at[projection, item] = place

    for r in log:
        event = library.codec.decode(r.value)
        if isinstance(event, BookLent):
            lent_at[event.loan_id] = r.timestamp
            since.setdefault(r.aggregate_id, r.timestamp)
        book_place = None
        if not isinstance(event, BookReturned):
            book_place = (event.member, since[r.aggregate_id], r.aggregate_id)
            move("loans_by_member", event.loan_id, (event.member, lent_at[event.loan_id], event.loan_id))
        else:
            move("loans_by_member", event.loan_id, None)
        move("books_by_holder", r.aggregate_id, book_place)
    out: dict[str, dict[str, list[str]]] = {}
    for projection, held in places.items():
        keep = find_projection(library, projection).keep  # type: ignore[attr-defined]
        for member in MEMBERS:
            newest = sorted((p for p in held if p[0] == member), key=lambda p: p[2])
            newest.sort(key=lambda p: p[1], reverse=True)  # newest first, then by item key
            out.setdefault(projection, {})[member] = [p[2] for p in newest[:keep] if held[p]]
    return out


@settings(max_examples=80, deadline=None)
@given(log=library_logs(), data=st.data())
def test_moving_items_any_delivery_equals_a_rebuild(log: list[EventRecord], data: Any) -> None:
    rebuilt = SqliteStore(":memory:")
    LocalProjector(library, rebuilt).apply(log)  # a rebuild: the whole log in one batch
    live = SqliteStore(":memory:")
    local = LocalProjector(library, live)
    for batch in data.draw(deliveries(log)):
        local.apply(batch)
    assert library_tables(live) == library_tables(rebuilt)
    reader = ProjectionReader(library, live)
    for name, groups in expected_groups(log).items():
        key = find_projection(library, name).key
        assert {m: [item[key] for item in reader.category(name, m).items]
                for m in MEMBERS} == groups
