"""Properties of re-keyed projections on the SQLite store: any replay, duplication, shuffling
within a batch and split into batches of a log gives the tables of one clean fold, and each
view holds exactly the sum over every source aggregate (each event applied once)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.testing.example import AccountOpened, Deposited, Withdrawn
from projections import SqliteStore, records_for
from projections.local import LocalProjector
from projections.model import projections_of
from projections.records import EventRecord
from projections.store import ProjectionStore, table_base
from projections.testing import MovementsByBand, make_rekeyed_app

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
