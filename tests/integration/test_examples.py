"""The example apps end to end on the real stack: the demo's scripted commands through the Spark
command processor (Kafka in, events out), then the Spark projector into a fresh Cassandra
keyspace, then the read models through ``ProjectionReader``; the oracle is the clean fold of the
same events with the local projector on SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cqrs.client import encode_command
from cqrs.config import CqrsConfig
from cqrs.kafka_io import make_producer, read_to_end
from cqrs.loading import load_app
from cqrs.processor.job import prepare_processor, start_processor
from cqrs.processor.workers import ProcessorOptions
from cqrs.topics import topics_for
from domain_examples.loyalty import points_for
from domain_examples.workload import (
    DEMO_T0, Scripted, bank_script, check_answers, loyalty_script, orders_script, outcome_of,
)
from projections import LocalProjector, ProjectionReader, SqliteStore
from projections.model import projections_of
from projections.records import event_record
from projections.runner import run_projectors
from projections.store import ProjectionStore, table_base
from projections.stores import cached_store


class Example:
    """One example app on its own topics, keyspace and checkpoints."""

    def __init__(self, base: CqrsConfig, app_ref: str, prefix: str, keyspace: str, tmp: Path) -> None:
        self.app_ref = app_ref
        self.app = load_app(app_ref)
        self.cfg = base.with_overrides(kafka={"topic_prefix": prefix}, cassandra={"keyspace": keyspace},
                                       spark={"checkpoint_dir": str(tmp / "ck")})
        self.topics = topics_for(self.app.name, prefix)

    def run(self, spark: Any, script: list[Scripted]) -> list[tuple[Scripted, str]]:
        """Send every command of the script at once (an aggregate's commands keep their order in
        its partition), process them, then project the events; return the answers."""
        opts = ProcessorOptions(self.app_ref, topics=self.topics,
                                checkpoint=self.cfg.spark.checkpoint_location(self.app.name, "processor"))
        opts = prepare_processor(self.cfg, opts)  # topics, state table, schemas: no Spark query
        producer = make_producer(self.cfg)
        ids = []
        for i, s in enumerate(script):
            cid, key, value, headers = encode_command(
                self.app, s.aggregate_id, s.command, expected_version=s.expected_version,
                command_id=s.command_id or f"{self.topics.commands}-{i}", timestamp=DEMO_T0)
            producer.produce(self.topics.commands, key=key, value=value, headers=headers)
            ids.append(cid)
        assert producer.flush(30) == 0
        start_processor(spark, self.cfg, opts, available_now=True).awaitTermination()
        run_projectors(spark, self.cfg, self.app_ref, available_now=True, report=lambda m: None,
                       poll_s=0.5, topic_prefix=self.cfg.kafka.topic_prefix)
        results = {r.command_id: r for r in (self.app.codec.decode(rec.value) for rec in
                                             read_to_end(self.cfg, [self.topics.results]))}
        return [(s, outcome_of(results[cid])) for s, cid in zip(script, ids, strict=True)]

    def store(self) -> ProjectionStore:
        return cached_store(self.cfg)

    def reader(self) -> ProjectionReader:
        return ProjectionReader(self.app, self.store())

    def clean_fold(self) -> SqliteStore:
        records = [event_record(r.key, r.value, r.headers, r.partition, r.offset)
                   for r in read_to_end(self.cfg, [self.topics.events])]
        oracle = SqliteStore(":memory:")
        LocalProjector(self.app, oracle, collect_dead_letters=True).apply(records)
        return oracle

    def tables(self, store: ProjectionStore) -> dict[str, Any]:
        out = {}
        for name, p in projections_of(self.app).items():
            base = table_base(self.app.name, name)
            gen = store.generations(base).current
            assert gen is not None
            out[name] = [(k, v.values, v.version, v.deleted) for k, v in store.scan_views(p, base, gen)]
        return out


@pytest.fixture
def example(cqrs_config: CqrsConfig, unique_name: str, unique_keyspace: str, tmp_path: Path) -> Any:
    return lambda app_ref: Example(cqrs_config, app_ref, unique_name + "-", unique_keyspace, tmp_path)


def test_bank_balances(example: Any, spark: Any) -> None:
    ex = example("domain_examples.bank:app")
    answered = ex.run(spark, bank_script())
    assert check_answers(answered) == []
    reader = ex.reader()
    alice = reader.get("balances", "acc-alice")
    won = next(s.command.amount_cents for s, got in answered if s.aggregate_id == "acc-alice"
               and got == "accepted" and type(s.command).__name__ == "Withdraw")
    assert alice is not None and alice["owner"] == "alice" and alice["is_open"] is True
    assert alice["balance_cents"] == 120_00 - won
    assert reader.get("balances", "acc-bob")["balance_cents"] == 45_00  # type: ignore[index]
    assert reader.get("balances", "acc-mallory")["balance_cents"] == 10_00  # type: ignore[index]
    assert ex.tables(ex.store()) == ex.tables(ex.clean_fold())


def test_orders_a_customers_last_30_orders_newest_first(example: Any, spark: Any) -> None:
    ex = example("domain_examples.orders:app")
    assert check_answers(ex.run(spark, orders_script(ann_orders=40))) == []
    reader = ex.reader()
    pages = list(reader.pages("customer_orders", "c-ann", page_size=8))
    seen = [o for page in pages for o in page.items]
    assert len(pages) == 4
    assert [o["order_id"] for o in seen] == [f"ord-ann-{n:02d}" for n in range(39, 9, -1)]
    assert [o["status"] for o in seen[:5]] == ["cancelled", "placed", "placed", "placed", "paid"]
    assert seen[-1]["status"] == "shipped"
    order = reader.get("orders", "ord-ann-05")
    assert order is not None and order["status"] == "shipped" and order["customer_id"] == "c-ann"
    assert order["shipped_at"] is not None and order["paid_at"] is not None
    assert ex.tables(ex.store()) == ex.tables(ex.clean_fold())


def test_loyalty_points_per_customer_sum_over_stores(example: Any, spark: Any) -> None:
    ex = example("domain_examples.loyalty:app")
    answered = ex.run(spark, loyalty_script())
    assert check_answers(answered) == []
    expected: dict[str, tuple[int, int]] = {}
    stores: dict[str, set[str]] = {}
    for s, got in answered:
        if got == "accepted":
            points, n = expected.get(s.command.customer_id, (0, 0))
            expected[s.command.customer_id] = (points + points_for(s.command.amount_cents), n + 1)
            stores.setdefault(s.command.customer_id, set()).add(s.aggregate_id)
    assert len(stores["c-ann"]) == 2  # the case that needs re-keying
    reader = ex.reader()
    for customer, (points, purchases) in expected.items():
        row = reader.get("customer_points", customer)
        assert row is not None and (row["points"], row["purchases"]) == (points, purchases), customer
    assert ex.tables(ex.store()) == ex.tables(ex.clean_fold())
