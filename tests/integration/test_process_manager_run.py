"""A process manager's batch against the real Kafka and Cassandra, without Spark (the code the
query's foreachBatch calls): a failed reaction is dead-lettered and the others go on; a stateful
process manager's instances are stored, and a batch read again changes nothing."""

from __future__ import annotations

import datetime as dt
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from cqrs import type_name
from cqrs.config import CqrsConfig
from cqrs.deadletters import list_dead_letters
from cqrs.domain.decision import event_id_for
from cqrs.envelope import Envelope, from_kafka, to_kafka
from cqrs.kafka_io import read_to_end
from cqrs.process.job import ReactorRun
from cqrs.processor.job import publish_app_schemas
from cqrs.topics import AppTopics, ensure_topics, topics_for
from domain_examples.lending import LoanRequested, LoanSlotRefused

sys.path.insert(0, str(Path(__file__).parent / "apps"))
import picky_lending_app  # noqa: E402

app = picky_lending_app.app
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)


@pytest.fixture
def topics(cqrs_config: CqrsConfig) -> AppTopics:
    t = topics_for(app.name, f"t-pmrun-{uuid.uuid4().hex[:8]}-")
    ensure_topics(cqrs_config, t, partitions=2)
    return t


@pytest.fixture
def cfg(cqrs_config: CqrsConfig, topics: AppTopics) -> CqrsConfig:
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": topics.base.removesuffix(app.name)})
    publish_app_schemas(cfg, topics, app)
    return cfg


def event(agg_type: str, agg_id: str, version: int, ev: object, offset: int) -> tuple[Any, ...]:
    env = Envelope(event_id_for(agg_type, agg_id, version), type_name(ev), "event",
                   agg_type, agg_id, T0 + dt.timedelta(minutes=version), version, None,
                   f"cmd-{agg_id}-{version}", f"conv-{agg_id}", f"cmd-{agg_id}-{version}")
    key, value, headers = to_kafka(env, app.codec.encode(ev))
    return key, value, headers, 0, offset


def test_a_failed_reaction_is_dead_lettered_and_the_batch_goes_on(cfg: CqrsConfig,
                                                                   topics: AppTopics) -> None:
    run = ReactorRun(cfg, app, "picky", topics)
    try:
        report = run.run([event("lending.Book", "b1", 1, LoanRequested("mallory"), 0),
                          event("lending.Book", "b2", 1, LoanRequested("ann"), 1)])
    finally:
        run.close()
    assert (report.reacted, report.commands, report.failures) == (1, 1, 1)
    (sent,) = read_to_end(cfg, [topics.commands])
    env, _ = from_kafka(sent.key, sent.value, sent.headers)
    assert (env.aggregate_id, env.command_id, env.correlation_id) == (
        "ann", "pm:picky:lending.Book:1:0:b2", "conv-b2")
    (letter,) = list_dead_letters(cfg, topics)
    assert (letter.stage, letter.error_type, letter.source_topic) == (
        "process_manager", "ValueError", topics.events)
    assert "cannot serve mallory" in letter.error and letter.key == b"b1"


def test_instances_are_stored_and_a_batch_read_again_changes_nothing(cfg: CqrsConfig,
                                                                    topics: AppTopics) -> None:
    batch = [event("lending.Member", "ann", v, LoanSlotRefused(f"b{v}", "limit_reached"), v)
             for v in (1, 2)]
    run = ReactorRun(cfg, app, "strikes", topics)
    try:
        first = run.run(list(batch))
        assert (first.reacted, first.commands) == (2, 0)
        (inst,) = run.table.read(["ann"]).values()
        assert inst is not None and inst.state.refused_in_a_row == 2
        assert inst.applied == {"lending.Member:ann": 2}
        again = run.run(list(batch))  # the batch re-run after a crash
        assert (again.reacted, again.skipped) == (0, 2)
        third = run.run([event("lending.Member", "ann", 3, LoanSlotRefused("b3", "limit_reached"), 3)])
        assert third.commands == 1
    finally:
        run.close()
    (sent,) = read_to_end(cfg, [topics.commands])
    env, _ = from_kafka(sent.key, sent.value, sent.headers)
    assert env.command_id == "pm:strikes:lending.Member:3:0:ann"


def test_a_reaction_schedules_a_deadline_and_a_later_one_cancels_it(cfg: CqrsConfig,
                                                                   topics: AppTopics) -> None:
    from cqrs.scheduler.store import open_deadline_store
    from domain_examples.lending import BookLent, CancelLoan

    run = ReactorRun(cfg, app, "patience", topics)
    try:
        run.run([event("lending.Book", "b1", 1, LoanRequested("ann"), 0),
                 event("lending.Book", "b2", 1, LoanRequested("bob"), 1)])
        run.run([event("lending.Book", "b1", 2, BookLent("ann", 1), 2)])  # b1's loan went through
    finally:
        run.close()
    store = open_deadline_store(cfg, topics.base)
    try:
        assert store.of_owner("pm:patience:conv-b1") == []  # cancelled by the later reaction
        (d,) = store.of_owner("pm:patience:conv-b2")  # the stateless owner: the conversation
    finally:
        store.close()
    due = T0 + dt.timedelta(minutes=1 + 10)  # the event's time (version 1: T0 + 1 min) + 10 min
    assert (d.name, d.target_type, d.target_id, d.due_ms) == (
        "lending.CancelLoan", "lending.Book", "b2", int(due.timestamp() * 1000))
    env, payload = from_kafka(d.key, d.value, [])
    assert (env.command_id, env.timestamp, env.correlation_id, env.aggregate_id) == (
        d.command_id, due, "conv-b2", "b2")
    assert app.codec.decode(payload) == CancelLoan("bob", "timed_out")
