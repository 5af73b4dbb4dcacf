"""Reading the processor's aggregate state, and rebuilding it from the events into a new generation.

One workload, three phases (one test: every phase needs the previous one's Kafka topics and
state, and Spark runs are the expensive part on a 2-core box):

1. the processor (availableNow) on checkpoint A; the state table read without Spark matches the
   fold, by the Python API and by the CLI;
2. ``rebuild_state`` into generation 2 with checkpoint B: the same rows as generation 1, byte for
   byte, and generation 2 is current;
3. more commands, the processor on B with a different number of Spark tasks per batch (the
   state is not tied to them), read while it runs: nothing old re-runs, the new commands apply
   on top of the rebuilt state.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from cqrs.cli.main import main
from cqrs.client import encode_command
from cqrs.config import CqrsConfig
from cqrs.envelope import from_kafka
from cqrs.kafka_io import make_producer, read_to_end
from cqrs.processor.changelog import ChangelogView, changelog_topic, uses_changelog
from cqrs.processor.job import start_processor
from cqrs.processor.workers import ProcessorOptions
from cqrs.processor.rebuild import CheckpointExistsError, rebuild_state
from cqrs.processor.state import AggregateState, StateReader, StateReadError, state_codec
from cqrs.processor.state_table import open_state_table
from cqrs.results import CommandResult
from cqrs.testing.example import (
    Account, CloseAccount, Deposit, Explode, OpenAccount, Withdraw,
)
from cqrs.testing.example_app import app
from cqrs.topics import AppTopics, ensure_topics, topics_for

APP_REF = "cqrs.testing.example_app:app"
ACCOUNT = "example.bank.Account"
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)

# (aggregate id, command, command id, expected version)
WORKLOAD: list[tuple[str, object, str, int | None]] = [
    ("acc-0", OpenAccount("ann"), "c00", 0),
    ("acc-0", Deposit(100), "c01", None),
    ("acc-0", Withdraw(30), "c02", 2),
    ("acc-0", Deposit(5), "c03", None),
    ("acc-1", OpenAccount("bob"), "c10", None),
    ("acc-1", Deposit(50), "c11", None),
    ("acc-1", Withdraw(500), "c12", None),  # rejected: insufficient funds
    ("acc-1", Deposit(10), "c13", None),
    ("acc-1", Deposit(1), "c14", 1),  # rejected: wrong expected version
    ("acc-2", OpenAccount("cyd"), "c20", None),
    ("acc-2", Deposit(20), "c21", None),
    ("acc-2", CloseAccount(), "c22", None),  # Withdrawn(20) + AccountClosed: terminal
    ("acc-2", Deposit(3), "c23", None),  # rejected: deleted
    ("acc-3", OpenAccount("dee"), "c30", None),
    ("acc-3", Deposit(7), "c31", None),
    ("acc-3", Deposit(7), "c31", None),  # duplicate command id: answered once, applied once
    ("acc-3", Deposit(8), "c32", None),
    ("acc-4", OpenAccount("eve"), "c40", None),
    ("acc-4", Explode("boom"), "c41", None),  # handler crash: failed, dead letter
    ("acc-4", Deposit(1), "c42", None),
    ("acc-5", Deposit(5), "c50", None),  # rejected, never opened: version 0, remembered id
    ("acc-0", Deposit(2), "c04", None),
    ("acc-3", Withdraw(15), "c33", None),
    ("acc-4", Deposit(4), "c43", None),
]
# aggregate id -> (version, deleted, balance or None)
EXPECTED = {
    "acc-0": (5, False, 77),
    "acc-1": (3, False, 60),
    "acc-2": (4, True, None),
    "acc-3": (4, False, 0),
    "acc-4": (3, False, 5),
    "acc-5": (0, False, None),
}
FIRST_EVENTS = sum(v for v, _, _ in EXPECTED.values())

# phase 3: after the rebuild
MORE: list[tuple[str, object, str, int | None]] = [
    ("acc-0", Deposit(1), "m01", 5),  # on top of the rebuilt version
    ("acc-1", Deposit(50), "c11", None),  # a re-sent old command id: first result, no event
    ("acc-2", Deposit(1), "m02", None),  # still deleted
    ("acc-6", OpenAccount("fay"), "m03", 0),  # a new aggregate
]


def _send(cfg: CqrsConfig, topic: str, items: list[tuple[str, object, str, int | None]],
          start: int) -> None:
    producer = make_producer(cfg)
    for i, (agg, cmd, cid, expected) in enumerate(items, start):
        _, key, value, headers = encode_command(app, agg, cmd, expected_version=expected,
                                                command_id=cid,
                                                timestamp=T0 + dt.timedelta(seconds=i))
        producer.produce(topic, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0


def _events_by_aggregate(cfg: CqrsConfig, topic: str) -> dict[str, list[int]]:
    versions: dict[str, list[int]] = defaultdict(list)
    for rec in sorted(read_to_end(cfg, [topic]), key=lambda r: (r.partition, r.offset)):
        env, _ = from_kafka(rec.key, rec.value, rec.headers)
        assert env.version is not None
        versions[env.aggregate_id].append(env.version)
    return dict(versions)


def _check_expected(states: dict[tuple[str, str], AggregateState]) -> None:
    assert sorted(agg for _, agg in states) == sorted(EXPECTED)
    for agg, (version, deleted, balance) in EXPECTED.items():
        s = states[(ACCOUNT, agg)]
        assert (s.version, s.deleted) == (version, deleted), agg
        if balance is None:
            assert s.state is None, agg
        else:
            assert isinstance(s.state, Account) and s.state.balance == balance, agg


def _states(cfg: CqrsConfig, topics: AppTopics,
            generation: int | None = None) -> dict[tuple[str, str], AggregateState]:
    with StateReader(app, cfg, topics=topics, generation=generation) as reader:
        return {(s.aggregate_type, s.aggregate_id): s for s in reader.all()}


def _raw(cfg: CqrsConfig, topics: AppTopics, generation: int) -> dict[tuple[str, str], bytes]:
    if uses_changelog(cfg):
        view = ChangelogView(cfg, changelog_topic(topics.base, generation))
        return {row.key: row.record for row in view.scan()}
    table = open_state_table(cfg, topics)
    try:
        return {row.key: row.record for row in table.scan(generation)}
    finally:
        table.close()


@pytest.mark.parametrize("store", ["cassandra", "kafka"])
def test_read_rebuild_and_continue_on_the_rebuilt_state(
    cqrs_config: CqrsConfig, spark: Any, unique_names: Callable[[str], str],
    capsys: pytest.CaptureFixture[str], store: str,
) -> None:
    prefix = unique_names("state") + "-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix},
                                     processor={"state_store": store})
    topics = topics_for(app.name, prefix)
    ensure_topics(cfg, topics, partitions=3)
    ck_a = cfg.spark.checkpoint_location(prefix, "processor-a")
    ck_b = cfg.spark.checkpoint_location(prefix, "processor-b")
    opts_a = ProcessorOptions(app_ref=APP_REF, topics=topics, checkpoint=ck_a)
    opts_b = ProcessorOptions(app_ref=APP_REF, topics=topics, checkpoint=ck_b,
                              trigger_interval="1 second", max_offsets_per_trigger=2)

    with pytest.raises(StateReadError, match="start its processor"):
        _states(cfg, topics)

    # ---- 1. process, then read ------------------------------------------------------------
    _send(cfg, topics.commands, WORKLOAD, 0)
    t = time.monotonic()
    query = start_processor(spark, cfg, opts_a, available_now=True)
    query.awaitTermination()
    assert query.exception() is None
    print(f"processor on A: {time.monotonic() - t:.1f}s")

    states_a = _states(cfg, topics)
    _check_expected(states_a)
    with StateReader(app, cfg, topics=topics) as reader:
        t = time.perf_counter()
        one = reader.get("acc-0", ACCOUNT)
        print(f"one state read: {(time.perf_counter() - t) * 1000:.1f} ms (first, connecting)")
        assert one == states_a[(ACCOUNT, "acc-0")]
        assert one is not None and one.state == Account(owner="ann", is_open=True, balance=77)
        assert one.seen_command_ids == ("c00", "c01", "c02", "c03", "c04")
        assert reader.get("no-such-account") is None
        assert reader.get("acc-0", min_version=5, timeout=1).version == 5
        with pytest.raises(TimeoutError, match="version 5, not 6"):
            reader.get("acc-0", min_version=6, timeout=0.3)
        with pytest.raises(StateReadError, match="not in app"):
            reader.get("acc-0", "no.such.Type")
    assert states_a[(ACCOUNT, "acc-3")].seen_command_ids == ("c30", "c31", "c32", "c33")
    assert states_a[(ACCOUNT, "acc-5")].seen_command_ids == ("c50",)
    events_before = _events_by_aggregate(cfg, topics.events)
    assert sum(len(v) for v in events_before.values()) == FIRST_EVENTS
    results_before = read_to_end(cfg, [topics.results])
    assert len(results_before) == len(WORKLOAD)

    # the CLI prints the same state as JSON (configuration from the environment, as a user's)
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CQRS_KAFKA_TOPIC_PREFIX", prefix)
        env.setenv("CQRS_PROCESSOR_STATE_STORE", store)
        assert main(["state", "get", APP_REF, "acc-1"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["version"] == 3 and printed["state"]["balance"] == 60
        assert printed["seen_command_ids"] == ["c10", "c11", "c12", "c13", "c14"]
        assert main(["state", "get", APP_REF, "acc-9"]) == 1
        assert "no state for aggregate 'acc-9'" in capsys.readouterr().err

    # ---- 2. rebuild into a new generation --------------------------------------------------
    with pytest.raises(CheckpointExistsError, match="new folder"):
        rebuild_state(spark, cfg, opts_a, ck_a)
    messages: list[str] = []
    report = rebuild_state(spark, cfg, opts_a, ck_b, progress=messages.append)
    print(f"rebuild: {report}")
    assert report.generation == 2
    assert report.events_read == FIRST_EVENTS
    assert report.results_read == len(WORKLOAD)
    assert report.aggregates == len(EXPECTED) and report.deleted == 1
    assert report.commands_processed == 0  # every command was answered before
    command_ends = {rec.partition: rec.offset + 1
                    for rec in read_to_end(cfg, [topics.commands])}
    assert {p: o for p, o in report.starting_offsets.items() if o >= 0} == command_ends
    assert any("reading" in m and "events" in m for m in messages)

    states_b = _states(cfg, topics)  # generation 2 is current now
    assert states_b == states_a  # version, deleted, decoded state, remembered command ids
    assert _raw(cfg, topics, 2) == _raw(cfg, topics, 1)  # and byte for byte (snapshots, results)

    # ---- 3. continue on the rebuilt state, two commands per batch --------------------------
    _send(cfg, topics.commands, MORE, 100)
    t = time.monotonic()
    query = start_processor(spark, cfg, opts_b)
    try:
        deadline = time.monotonic() + 180
        while len(read_to_end(cfg, [topics.results])) < len(WORKLOAD) + len(MORE):
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, "the processor on B did not answer in 180 s"
            time.sleep(0.25)
        with StateReader(app, cfg, topics=topics) as reader:  # read while the query runs
            acc0 = reader.get("acc-0", min_version=6, timeout=60)
        assert query.isActive
    finally:
        query.stop()
    print(f"processor on B: {time.monotonic() - t:.1f}s")
    assert acc0 is not None and acc0.version == 6 and acc0.state.balance == 78

    states_c = _states(cfg, topics)
    assert states_c[(ACCOUNT, "acc-1")].version == 3  # the re-sent c11 did not run again
    assert states_c[(ACCOUNT, "acc-2")].deleted
    assert states_c[(ACCOUNT, "acc-6")].version == 1
    assert states_c[(ACCOUNT, "acc-6")].state.owner == "fay"
    for key in set(states_a) - {(ACCOUNT, "acc-0"), (ACCOUNT, "acc-1"), (ACCOUNT, "acc-2")}:
        assert states_c[key] == states_a[key]

    events_after = _events_by_aggregate(cfg, topics.events)
    for agg, versions in events_after.items():
        assert versions == list(range(1, len(versions) + 1)), (agg, versions)  # once, contiguous
    assert {a: len(v) for a, v in events_after.items()} == {
        **{a: len(v) for a, v in events_before.items()}, "acc-0": 6, "acc-6": 1}

    results = read_to_end(cfg, [topics.results])
    per_id = Counter(m.key.decode() for m in results if m.key)
    # old commands were not read again (no second copy of their results); c11 was re-sent once
    assert len(results) == len(WORKLOAD) + len(MORE)
    assert per_id["c11"] == 2 and per_id["c00"] == 1 and per_id["m01"] == 1
    c11 = [m.value for m in results if m.key == b"c11"]
    assert c11[0] == c11[1]  # the re-sent id got its first result back
    codec, schemas = state_codec(cfg, app, topics)
    try:
        m02: CommandResult = codec.decode(next(m.value for m in results if m.key == b"m02"))
    finally:
        schemas.close()
    assert (m02.status, m02.code) == ("rejected", "aggregate_deleted")
