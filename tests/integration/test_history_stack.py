"""An aggregate's history on the real stack: the processor (Spark) writes events, the history job
(a Kafka consumer thread) writes the history table in Cassandra, and the reader, the CLI and the
HTTP service answer from it without Spark.

One workload on topics of its own:

1. the processor (availableNow) and the history job (availableNow); the history of every
   aggregate equals the events topic, envelope and record timestamp included; the state at the
   last version equals the processor's state row, the state at each version the fold of that
   prefix; out-of-range versions and times are named;
2. the history job again (restart: nothing new to write) and a replay into another table: the
   rebuilt rows equal the live ones;
3. ``cqrs history`` (table and JSON), ``cqrs state get --at-version / --at / --version``;
4. ``GET /aggregates/{id}/events`` (pages), ``?at_version=`` and ``?at=``.

docs/history.md's live blocks run in tests/unit/test_docs_examples.py (every page's, with a
processor of this app serving), once per run.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cqrs.cli.main import main
from cqrs.client import encode_command
from cqrs.config import CqrsConfig
from cqrs.domain.decision import replay
from cqrs.envelope import from_kafka
from cqrs.history import HistoryRangeError, HistoryReader
from cqrs.history.job import HistoryOptions, start_history
from cqrs.history.table import open_history_table
from cqrs.kafka_io import make_producer, read_to_end
from cqrs.processor.job import start_processor
from cqrs.processor.workers import ProcessorOptions
from cqrs.processor.state import StateReader
from cqrs.testing.example import (
    Account, CloseAccount, Deposit, Explode, OpenAccount, Withdraw,
)
from cqrs.testing.example_app import app
from cqrs.topics import ensure_topics, topics_for

pytestmark = pytest.mark.integration

APP_REF = "cqrs.testing.example_app:app"
ACCOUNT = "example.bank.Account"
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

WORKLOAD: list[tuple[str, object, str, int | None]] = [
    ("acc-0", OpenAccount("ann"), "c00", 0),
    ("acc-0", Deposit(100), "c01", None),
    ("acc-0", Withdraw(30), "c02", 2),
    ("acc-0", Deposit(5), "c03", None),
    ("acc-1", OpenAccount("bob"), "c10", None),
    ("acc-1", Withdraw(500), "c11", None),  # rejected: no event
    ("acc-1", Deposit(10), "c12", None),
    ("acc-2", OpenAccount("cyd"), "c20", None),
    ("acc-2", Deposit(20), "c21", None),
    ("acc-2", CloseAccount(), "c22", None),  # two events, the last terminal
    ("acc-3", OpenAccount("dee"), "c30", None),
    ("acc-3", Explode("boom"), "c31", None),  # failed: no event
    ("acc-0", Deposit(2), "c04", None),
    *[("acc-4", Deposit(1) if i else OpenAccount("eve"), f"c4{i:02d}", None) for i in range(25)],
]


def _send(cfg: CqrsConfig, topic: str) -> None:
    producer = make_producer(cfg)
    for i, (agg, cmd, cid, expected) in enumerate(WORKLOAD):
        _, key, value, headers = encode_command(app, agg, cmd, expected_version=expected,
                                                command_id=cid, correlation_id=f"corr-{cid}",
                                                timestamp=T0 + dt.timedelta(seconds=i))
        producer.produce(topic, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0


def _log(cfg: CqrsConfig, topic: str) -> dict[str, list[Any]]:
    """The events topic by aggregate: (envelope, payload, record timestamp ms, partition, offset)."""
    by_agg: dict[str, list[Any]] = defaultdict(list)
    for rec in sorted(read_to_end(cfg, [topic]), key=lambda r: (r.partition, r.offset)):
        env, payload = from_kafka(rec.key, rec.value, rec.headers)
        by_agg[env.aggregate_id].append((env, payload, rec.timestamp_ms, rec.partition, rec.offset))
    return dict(by_agg)


def test_history_on_the_stack(cqrs_config: CqrsConfig, spark: Any,
                              unique_names: Callable[[str], str], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = unique_names("hist") + "-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix},
                                     spark={"checkpoint_dir": str(tmp_path)})
    topics = topics_for(app.name, prefix)
    ensure_topics(cfg, topics, partitions=3)

    # ---- 1. processor, history job, reader --------------------------------------------------
    _send(cfg, topics.commands)
    query = start_processor(spark, cfg, ProcessorOptions(
        app_ref=APP_REF, topics=topics, checkpoint=cfg.spark.checkpoint_location(prefix, "p")),
        available_now=True)
    query.awaitTermination()
    assert query.exception() is None
    t = time.monotonic()
    job = start_history(cfg, HistoryOptions(APP_REF, topics=topics), available_now=True)
    job.awaitTermination(120)
    assert job.exception() is None and not job.isActive
    notes = [f"history job over the log: {time.monotonic() - t:.1f}s"]

    log = _log(cfg, topics.events)
    assert sorted(log) == ["acc-0", "acc-1", "acc-2", "acc-3", "acc-4"]
    with HistoryReader(app, cfg, topics=topics) as history, \
            StateReader(app, cfg, topics=topics) as states:
        for agg, written in log.items():
            seen = list(history.iter_events(agg))
            assert [e.version for e in seen] == [env.version for env, *_ in written] == \
                list(range(1, len(written) + 1)), agg
            for e, (env, payload, ts_ms, partition, offset) in zip(seen, written, strict=True):
                assert (e.event_id, e.event_type, e.timestamp, e.command_id, e.correlation_id,
                        e.causation_id) == (env.message_id, env.message_type, env.timestamp,
                                            env.command_id, env.correlation_id, env.causation_id)
                assert e.event == history._codec.decode(payload)  # noqa: SLF001
                assert (e.recorded_at - EPOCH) // dt.timedelta(milliseconds=1) == ts_ms
                assert (e.partition, e.offset, e.schema_version) == (partition, offset, 1)
                assert e.correlation_id == f"corr-{e.command_id}"
            events = [e.event for e in seen]
            for n in range(1, len(seen) + 1):
                at = history.state_at(agg, version=n)
                assert at is not None and (at.state, at.version) == replay(Account, events[:n])
            current = states.get(agg)
            assert current is not None
            last = history.state_at(agg, version=len(seen))
            assert last is not None and (last.version, last.state, last.deleted) == (
                current.version, current.state, current.deleted)
            assert history.state_at(agg, at=seen[-1].recorded_at) == last
        with pytest.raises(HistoryRangeError, match=r"its versions are 1 to 5"):
            history.state_at("acc-0", version=6)
        with pytest.raises(HistoryRangeError, match="before the history"):
            history.state_at("acc-0", at=T0 - dt.timedelta(days=3650))
        assert history.state_at("acc-2", version=4).deleted  # type: ignore[union-attr]
        page = history.events("acc-4", limit=10)
        assert [e.version for e in page.events] == list(range(1, 11))
        assert page.next_page_token == "11"
        t = time.perf_counter()
        for _ in range(20):
            history.events("acc-4", limit=25)
        notes.append(f"a page of 25 events: {(time.perf_counter() - t) / 20 * 1000:.1f} ms")
        assert history.events("no-such").events == ()

    # ---- 2. restart, and a replay into another table --------------------------------------
    again = start_history(cfg, HistoryOptions(APP_REF, topics=topics), available_now=True)
    again.awaitTermination(60)
    assert again.exception() is None
    rebuilt = start_history(cfg, HistoryOptions(APP_REF, topics=topics, replay=True,
                                                table="cqrs_history_rebuilt"), available_now=True)
    rebuilt.awaitTermination(120)
    assert rebuilt.exception() is None
    live = open_history_table(cfg, topics.base)
    other = open_history_table(cfg, topics.base, table="cqrs_history_rebuilt")
    try:
        for agg in log:
            assert live.read(ACCOUNT, agg, 0, 1, 1000) == other.read(ACCOUNT, agg, 0, 1, 1000), agg
    finally:
        live.close()
        other.close()

    # ---- 3. the CLI -----------------------------------------------------------------------
    monkeypatch.setenv("CQRS_KAFKA_TOPIC_PREFIX", prefix)
    capsys.readouterr()
    assert main(["history", APP_REF, "acc-0"]) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["version", "type", "time", "recorded"]
    assert "example.bank.Withdrawn" in lines[4] and "corr-c02" in lines[4]
    assert main(["history", APP_REF, "acc-4", "--from-version", "20", "--limit", "3",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["version"] for e in out["events"]] == [20, 21, 22] and out["next_version"] == 23
    assert out["events"][0]["data"] == {"amount": 1}
    assert main(["state", "get", APP_REF, "acc-0", "--at-version", "3"]) == 0
    at3 = json.loads(capsys.readouterr().out)
    assert (at3["version"], at3["state"]["balance"]) == (3, 70)
    assert main(["state", "get", APP_REF, "acc-0", "--at", at3["recorded_at"]]) == 0
    assert json.loads(capsys.readouterr().out)["version"] >= 3
    assert main(["state", "get", APP_REF, "acc-0", "--at-version", "9"]) == 2
    assert "its versions are 1 to 5" in capsys.readouterr().err
    assert main(["state", "get", APP_REF, "acc-0", "--version", "5"]) == 0
    done = capsys.readouterr()
    assert json.loads(done.out)["version"] == 5 and "deprecated" in done.err
    assert main(["history", APP_REF, "nobody"]) == 1
    capsys.readouterr()
    assert main(["run", "history", APP_REF, "--available-now"]) == 0  # nothing new: it ends
    assert "consumer group cqrs-history-" in capsys.readouterr().out
    assert main(["run", "history", APP_REF, "--replay", "--available-now"]) == 0
    assert "history rows written" in capsys.readouterr().out
    assert main(["history", APP_REF, "acc-0"]) == 0
    assert capsys.readouterr().out == table  # the replay wrote the same rows

    # ---- 4. HTTP --------------------------------------------------------------------------
    from fastapi.testclient import TestClient

    from cqrs.http import HttpContext, create_http_app

    ctx = HttpContext(app, cfg)
    with TestClient(create_http_app(ctx)) as http:
        first = http.get("/aggregates/acc-4/events", params={"limit": 20}).json()
        rest = http.get("/aggregates/acc-4/events",
                        params={"limit": 20, "page_token": first["next_page_token"]}).json()
        versions = [e["version"] for e in first["events"] + rest["events"]]
        assert versions == list(range(1, 26)) and rest["next_page_token"] is None
        t = time.perf_counter()
        for _ in range(20):
            assert http.get("/aggregates/acc-4/events", params={"limit": 25}).status_code == 200
        notes.append(f"GET /aggregates/acc-4/events (25): "
                     f"{(time.perf_counter() - t) / 20 * 1000:.1f} ms")
        r = http.get("/aggregates/acc-0", params={"at_version": 2})
        assert r.status_code == 200 and r.json()["state"]["balance"] == 100
        r = http.get("/aggregates/acc-0", params={"at": first["events"][0]["recorded_at"]})
        assert r.status_code == 200
        r = http.get("/aggregates/acc-0", params={"at_version": 99})
        assert r.status_code == 404 and "1 to 5" in r.json()["message"]
        r = http.get("/aggregates/acc-0", params={"wait_for_version": 5, "timeout": 5})
        assert r.status_code == 200 and r.json()["version"] == 5
        assert http.get("/aggregates/acc-0", params={"version": 5}).json()["version"] == 5
    ctx.close()

    notes.append(table)
    with capsys.disabled():
        print("\n".join(notes))


def test_a_history_table_of_the_earlier_shape_is_refused(cqrs_config: CqrsConfig) -> None:
    """A table written before the envelope became one cell (a column per envelope field) is
    named, with the way out, instead of failing on its first write."""
    from cqrs.cassandra_io import CassandraSession
    from cqrs.history.table import CassandraHistoryTable, HistoryStoreError

    import uuid

    name = f"old_history_{uuid.uuid4().hex[:8]}"  # table names: 48 characters at most
    db = CassandraSession(cqrs_config.cassandra)
    try:
        db.execute(f"CREATE TABLE {name} (app text, aggregate_type text, aggregate_id text, "
                   "bucket bigint, version bigint, event_id text, payload blob, "
                   "PRIMARY KEY ((app, aggregate_type, aggregate_id, bucket), version))")
        with pytest.raises(HistoryStoreError, match=rf"DROP TABLE \w+\.{name}.*--replay"):
            CassandraHistoryTable(db, "app", table=name)
        db.execute(f"DROP TABLE {name}")
        table = CassandraHistoryTable(db, "app", table=name)  # the current shape, created
        assert table.read(ACCOUNT, "acc-0", 0, 1, 10) == []
    finally:
        db.execute(f"DROP TABLE IF EXISTS {name}")
        db.close()
