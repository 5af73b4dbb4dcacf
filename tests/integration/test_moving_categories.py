"""Categories whose items move between groups, on the real stack: Kafka events -> the Spark
projector -> Cassandra, live in many micro-batches, then a rebuild of each projection: the
rebuilt tables equal the live ones, and both equal the clean fold of the log on SQLite.

The library of :mod:`projections.testing`: ``loans_by_member`` is re-keyed (one item per loan
id, from the books' events, grouped by member) and ``books_by_holder`` is keyed by the book;
loans are transferred between members (the items move), returned (deleted, or out of the
category) and lent again.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from cqrs.config import CqrsConfig
from cqrs.kafka_io import read_to_end
from cqrs.topics import ensure_topics, topics_for
from projections import ProjectionReader, SqliteStore
from projections.local import LocalProjector
from projections.model import CategoryProjection, projections_of
from projections.rebuild import rebuild_projection
from projections.records import event_record
from projections.runner import run_projectors
from projections.store import ProjectionStore, table_base
from projections.stores import cached_store
from projections.testing import (
    BookLent, BookReturned, LoanTransferred, library_app, produce_events, publish_schemas,
)

pytestmark = pytest.mark.integration

APP_REF = "projections.testing:library_app"
MEMBERS = [f"m{i}" for i in range(6)]


def history(rng: random.Random, books: int, events: int, loans: dict[str, str | None],
            first_loan: int) -> list[tuple[str, object]]:
    """Books lent, transferred (most often) and returned at random, continuing ``loans``
    (book -> its loan id, None when on the shelf, updated in place)."""
    for i in range(books):
        loans.setdefault(f"b{i}", None)
    out: list[tuple[str, object]] = []
    for n in range(first_loan, first_loan + events):
        book = rng.choice(sorted(loans))
        loan = loans[book]
        if loan is None:
            loans[book] = f"L{n}"
            out.append((book, BookLent(f"L{n}", rng.choice(MEMBERS))))
        elif rng.random() < 0.75:
            out.append((book, LoanTransferred(loan, rng.choice(MEMBERS))))
        else:
            loans[book] = None
            out.append((book, BookReturned(loan)))
    return out


def tables(store: ProjectionStore, generation: int | None = None) -> dict[str, Any]:
    """Every view row, and each group's newest ``keep`` rows (deleted ones included: the slots
    of the items that moved out), of the current generation unless given."""
    out: dict[str, Any] = {}
    for name, p in projections_of(library_app).items():
        assert isinstance(p, CategoryProjection)
        base = table_base(library_app.name, name)
        gen = generation or store.generations(base).current
        assert gen is not None
        out[name] = [(k, v.values, v.version, v.deleted, v.parked_at)
                     for k, v in store.scan_views(p, base, gen)]
        groups: dict[str, list[Any]] = {}
        for group, row in store.scan_category(p, base, gen):
            groups.setdefault(group, []).append(row)
        # a group's partition may hold more than ``keep`` rows for a moment: two tasks write
        # into it and each trims what it read; readers only ever read the newest ``keep``
        out[name + ":groups"] = {g: rows[:p.keep] for g, rows in sorted(groups.items())}
    return out


def test_items_move_between_groups_and_a_rebuild_equals_live(
    cqrs_config: CqrsConfig, unique_name: str, unique_keyspace: str, tmp_path: Path, spark: Any
) -> None:
    prefix = unique_name + "-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix},
                                     cassandra={"keyspace": unique_keyspace},
                                     spark={"checkpoint_dir": str(tmp_path / "ck")},
                                     projections={"drop_grace_s": 1.0,
                                                  "max_events_per_trigger": 150})
    topics = topics_for(library_app.name, prefix)
    ensure_topics(cfg, topics)
    publish_schemas(cfg, topics, library_app)
    rng, versions, loans = random.Random(unique_name), {}, {}  # type: ignore[var-annotated]

    def project() -> None:
        run_projectors(spark, cfg, APP_REF, available_now=True, report=lambda m: None, poll_s=0.5)

    produce_events(cfg, topics.events, library_app, history(rng, 25, 500, loans, 0),
                   versions=versions)
    project()
    produce_events(cfg, topics.events, library_app, history(rng, 30, 300, loans, 500),
                   versions=versions)
    project()

    store = cached_store(cfg)
    live = tables(store)
    records = [event_record(r.key, r.value, r.headers, r.partition, r.offset)
               for r in read_to_end(cfg, [topics.events])]
    assert len(records) == 800
    oracle = SqliteStore(":memory:")
    LocalProjector(library_app, oracle).apply(records)
    assert live == tables(oracle)
    moved = sum(1 for _, rows in live["loans_by_member:groups"].items() for r in rows if r.deleted)
    assert moved > 10  # the history did move (and return) loans out of groups

    for name in projections_of(library_app):
        report = rebuild_projection(spark, cfg, APP_REF, name, report=lambda m: None)
        assert (report.old_generation, report.new_generation) == (1, 2)
    assert tables(store) == live  # generation 2, rebuilt from the log, row for row

    reader = ProjectionReader(library_app, store)
    for member in MEMBERS:
        items = reader.category("loans_by_member", member).items
        assert all(item["member"] == member for item in items)
        for item in items:  # each item is where its loan's view says it is
            assert reader.get("loans_by_member", item["loan_id"]) == item
