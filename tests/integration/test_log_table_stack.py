"""The event log as Spark tables on the real stack (issue 25, items 3 and 4): log_table against
the history the history job keeps, an upcast event in the DataFrame, states_as_of against the
live aggregate-state table and against HistoryReader.state_at, an archive written and read back
without the framework (pyarrow) and by log_table(source=...), cqrs sql, and log_stream.

Two apps on topics of their own:

- the example bank, driven by commands through the processor (availableNow) and the history job;
- a till whose refunds changed shape (``apps/log_till_app.py``): its events are written straight
  to its events topic, version-1 refunds with the old class and version-2 ones with today's, at
  chosen Kafka timestamps (so "as of" falls between them).

Spark work is kept to a few small jobs on the shared session (see the figures it prints).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cqrs.cli.main import main
from cqrs.client import encode_command
from cqrs.codec import Codec
from cqrs.codec.kafka_schema_store import KafkaSchemaStore
from cqrs.config import CqrsConfig
from cqrs.domain import event
from cqrs.domain.decision import NewEvent, event_id_for
from cqrs.domain.messages import type_name
from cqrs.envelope import event_to_kafka
from cqrs.history import (
    ENVELOPE_COLUMNS, ArchiveError, ArchiveExistsError, HistoryReader, LogTableError, log_stream,
    log_table, states_as_of, write_archive,
)
from cqrs.history.job import HistoryOptions, start_history
from cqrs.kafka_io import make_producer
from cqrs.processor.job import start_processor
from cqrs.processor.workers import ProcessorOptions
from cqrs.processor.state import StateReader
from cqrs.testing.example import (
    Account, CloseAccount, Deposit, Explode, OpenAccount, Withdraw,
)
from cqrs.testing.example_app import app
from cqrs.topics import AppTopics, ensure_topics, topics_for

APPS = Path(__file__).parent / "apps"
sys.path.insert(0, str(APPS))
import log_till_app  # noqa: E402

pytestmark = pytest.mark.integration

APP_REF = "cqrs.testing.example_app:app"
TILL_REF = "log_till_app:app"
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 3, 1, tzinfo=UTC)
TILL_T = [dt.datetime(2026, 3, 2, 9, m, tzinfo=UTC) for m in range(6)]  # Kafka timestamps

WORKLOAD: list[tuple[str, object]] = [
    ("acc-0", OpenAccount("ann")), ("acc-0", Deposit(100)), ("acc-0", Withdraw(30)),
    ("acc-1", OpenAccount("bob")), ("acc-1", Withdraw(500)),  # rejected: no event
    ("acc-1", Deposit(10)), ("acc-2", OpenAccount("cyd")), ("acc-2", Deposit(20)),
    ("acc-2", CloseAccount()),  # two events, the last terminal
    ("acc-3", OpenAccount("dee")), ("acc-3", Explode("boom")),  # failed: no event
    ("acc-0", Deposit(2)),
]


@event(name="itest.till.Refunded", version=1)
class RefundedV1:
    """What an older release wrote: whole euros."""

    amount: int


def _till_events(cfg: CqrsConfig, topics: AppTopics) -> None:
    """till-1: opened, a refund of 3 euros (v1), one of 250 cents (v2); till-2: opened, 1 euro
    (v1); each at its TILL_T time."""
    store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, topics.schemas, cfg.kafka.client_options())
    old, today = Codec([RefundedV1], store=store), log_till_app.app.codec_for(store)
    written = [("till-1", log_till_app.TillOpened("ann"), today), ("till-1", RefundedV1(3), old),
               ("till-2", log_till_app.TillOpened("bob"), today),
               ("till-1", log_till_app.Refunded(250), today), ("till-2", RefundedV1(1), old)]
    producer = make_producer(cfg)
    versions: dict[str, int] = {}
    sent = []
    for (till, ev, codec), at in zip(written, TILL_T, strict=False):
        v = versions[till] = versions.get(till, 0) + 1
        new = NewEvent(event_id_for("itest.till.Till", till, v), till, "itest.till.Till", v,
                       type_name(ev), ev, at, f"c-{till}-{v}", f"c-{till}-{v}")
        key, value, headers = event_to_kafka(new, codec.encode(ev))
        sent.append((key, value, headers, int(at.timestamp() * 1000)))
    sent.append(sent[1])  # a copy of till-1's version 2, as a re-run batch writes it (offset 5)
    for key, value, headers, ms in sent:
        producer.produce(topics.events, key=key, value=value, headers=headers, timestamp=ms)
    assert producer.flush(30) == 0
    store.close()


def _rows(frame: Any) -> list[dict[str, Any]]:
    """A DataFrame's rows with timezone-aware times (through Arrow)."""
    return sorted(frame.toArrow().to_pylist(), key=lambda r: (r["aggregate_id"], r["version"]))


def _envelope(e: Any) -> tuple[Any, ...]:
    return (e.aggregate_type, e.aggregate_id, e.version, type_name(e.event), e.event_id,
            e.timestamp, e.recorded_at, e.command_id, e.correlation_id, e.causation_id,
            e.schema_type, e.schema_version, e.partition, e.offset)


def test_the_log_as_tables(cqrs_config: CqrsConfig, spark: Any,
                           unique_names: Callable[[str], str], tmp_path: Path,
                           capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = unique_names("logt") + "-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix},
                                     spark={"checkpoint_dir": str(tmp_path)})
    topics, till_topics = topics_for(app.name, prefix), topics_for(log_till_app.app.name, prefix)
    ensure_topics(cfg, topics, partitions=2)
    ensure_topics(cfg, till_topics, partitions=1)
    spark.sparkContext.addPyFile(str(APPS / "log_till_app.py"))  # the executors import it
    notes: list[str] = []

    def timed(label: str, since: float) -> None:
        notes.append(f"{label}: {time.monotonic() - since:.1f}s")

    # ---- the logs: the bank through its processor, the till written as older code wrote it ----
    producer = make_producer(cfg)
    for i, (agg, cmd) in enumerate(WORKLOAD):
        _, key, value, headers = encode_command(app, agg, cmd, command_id=f"c{i:02d}",
                                                timestamp=T0 + dt.timedelta(seconds=i))
        producer.produce(topics.commands, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0
    _till_events(cfg, till_topics)
    t = time.monotonic()
    query = start_processor(spark, cfg, ProcessorOptions(
        app_ref=APP_REF, topics=topics, checkpoint=str(tmp_path / "processor")), available_now=True)
    query.awaitTermination()
    assert query.exception() is None
    timed("processor", t)
    for ref, the_topics in ((APP_REF, topics), (TILL_REF, till_topics)):
        job = start_history(cfg, HistoryOptions(ref, topics=the_topics), available_now=True)
        job.awaitTermination(120)
        assert job.exception() is None and not job.isActive

    # ---- 1. the DataFrame of every event equals the history ----------------------------------
    t = time.monotonic()
    every = _rows(log_table(spark, app, cfg=cfg, topics=topics))
    timed("log_table, every type", t)
    with HistoryReader(app, cfg, topics=topics) as history:
        expected = [e for agg in ("acc-0", "acc-1", "acc-2", "acc-3")
                    for e in history.iter_events(agg)]
        assert len(every) == len(expected) == 11
        for row, e in zip(every, expected, strict=True):
            assert tuple(row[c] for c in ENVELOPE_COLUMNS) == _envelope(e)
            view = type_name(e.event).rsplit(".", 1)[1]
            assert row[view] == {f: getattr(e.event, f) for f in row[view]}
            assert all(row[v] is None for v in ("AccountOpened", "Deposited", "Withdrawn",
                                                 "AccountClosed") if v != view)
        deposits = _rows(log_table(spark, app, event_types="example.bank.Deposited", cfg=cfg,
                                   topics=topics))
        assert [(r["aggregate_id"], r["version"], r["amount"]) for r in deposits] == [
            (e.aggregate_id, e.version, e.event.amount) for e in expected
            if e.event_type == "example.bank.Deposited"]
        # ---- 2. states as of now: the live state table; as of a time: state_at -----------------
        t = time.monotonic()
        states = {r["aggregate_id"]: r for r in _rows(states_as_of(spark, app, Account, cfg=cfg,
                                                                   topics=topics))}
        timed("states_as_of", t)
        with StateReader(app, cfg, topics=topics) as live:
            current = {s.aggregate_id: s for s in live.all() if s.version > 0}
        assert sorted(states) == sorted(current) == ["acc-0", "acc-1", "acc-2", "acc-3"]
        for agg, s in current.items():
            row = states[agg]
            assert (row["version"], row["deleted"]) == (s.version, s.deleted), agg
            fields = None if s.state is None else (s.state.owner, s.state.is_open,
                                                   s.state.balance)
            assert (None if row["deleted"] else (row["owner"], row["is_open"],
                                                 row["balance"])) == fields, agg
            assert row["recorded_at"] == history.state_at(agg, version=s.version).recorded_at

    with HistoryReader(log_till_app.app, cfg, topics=till_topics) as till_history:
        for at in (TILL_T[1], TILL_T[3] - dt.timedelta(seconds=1), TILL_T[4]):
            as_of = {r["aggregate_id"]: r for r in _rows(states_as_of(
                spark, TILL_REF, "itest.till.Till", at, cfg=cfg, topics=till_topics))}
            for till in ("till-1", "till-2"):
                past = (till_history.state_at(till, at=at)
                        if at >= till_history.events(till).events[0].recorded_at else None)
                got = as_of.get(till)
                assert (None if past is None else (past.version, past.state.refunded_cents)) == (
                    None if got is None else (got["version"], got["refunded_cents"])), (till, at)
    assert as_of["till-1"]["refunded_cents"] == 550 and as_of["till-2"]["refunded_cents"] == 100

    # ---- 3. an upcast event class shows its old events in today's shape ----------------------
    refunds = _rows(log_table(spark, TILL_REF, event_types=[log_till_app.Refunded], cfg=cfg,
                              topics=till_topics))
    assert [(r["aggregate_id"], r["amount_cents"], r["schema_version"]) for r in refunds] == [
        ("till-1", 300, 1), ("till-1", 250, 2), ("till-2", 100, 1)]
    assert refunds[0]["offset"] == 5  # of the two copies, the one written last
    assert "amount" not in refunds[0] and refunds[0]["event_type"] == "itest.till.Refunded"

    # ---- 4. the archive: plain Parquet, read back by pyarrow and by log_table ------------------
    archive = str(tmp_path / "archive")
    t = time.monotonic()
    lines: list[str] = []
    report = write_archive(spark, app, archive, cfg=cfg, topics=topics, progress=lines.append)
    timed("write_archive", t)
    assert report.events == 11 and report.event_types == {
        "example.bank.AccountClosed": 1, "example.bank.AccountOpened": 4,
        "example.bank.Deposited": 4, "example.bank.Withdrawn": 2}
    assert lines[0].startswith("reading ") and lines[-1].startswith("archived 11 events")
    import pyarrow.dataset as ds

    for name, count in report.event_types.items():
        table = ds.dataset(f"{archive}/event_type={name}", format="parquet",
                           partitioning="hive").to_table()
        assert table.num_rows == count
        got = sorted(table.to_pylist(), key=lambda r: (r["aggregate_id"], r["version"]))
        want = [r for r in every if r["event_type"] == name]
        view = name.rsplit(".", 1)[1]
        for g, w in zip(got, want, strict=True):
            assert {c: g[c] for c in ENVELOPE_COLUMNS if c != "event_type"} == {
                c: w[c] for c in ENVELOPE_COLUMNS if c != "event_type"}
            assert {f: g[f] for f in w[view]} == w[view]
            assert g["payload"][:2] == b"\xc3\x01" and str(g["day"]) == str(
                w["recorded_at"].date())
    with pytest.raises(ArchiveExistsError, match="exists: archive into a new folder"):
        write_archive(spark, app, archive, cfg=cfg, topics=topics)
    (tmp_path / "not-an-archive").mkdir()
    (tmp_path / "not-an-archive" / "notes.txt").write_text("mine")
    with pytest.raises(ArchiveExistsError, match="is not an archive"):
        write_archive(spark, app, str(tmp_path / "not-an-archive"), overwrite=True, cfg=cfg,
                      topics=topics)
    with pytest.raises(ArchiveError, match="has no _cqrs_archive.json"):
        log_table(spark, app, source=str(tmp_path / "not-an-archive"), cfg=cfg, topics=topics)
    with pytest.raises(LogTableError, match="'no.Such' is not in app 'example-bank'"):
        states_as_of(spark, app, "no.Such", cfg=cfg, topics=topics)
    assert _rows(log_table(spark, app, source=archive, cfg=cfg, topics=topics)) == every
    assert _rows(states_as_of(spark, app, Account, source=archive, cfg=cfg,
                              topics=topics)) == sorted(states.values(),
                                                        key=lambda r: r["aggregate_id"])

    # ---- 5. cqrs sql: a count per type, and a view of one type -------------------------------
    monkeypatch.setenv("CQRS_KAFKA_TOPIC_PREFIX", prefix)
    capsys.readouterr()
    t = time.monotonic()
    assert main(["sql", APP_REF, "SELECT event_type, count(*) AS n FROM events GROUP BY "
                 "event_type ORDER BY event_type", "--json"]) == 0
    timed("cqrs sql", t)
    counts = json.loads(capsys.readouterr().out)
    assert {c["event_type"]: c["n"] for c in counts} == report.event_types
    assert main(["sql", APP_REF, "SELECT aggregate_id, sum(amount) AS total FROM Deposited "
                 "GROUP BY aggregate_id ORDER BY aggregate_id"]) == 0
    table_out = capsys.readouterr().out.splitlines()
    assert table_out[0].split() == ["aggregate_id", "total"]
    assert [line.split() for line in table_out[2:]] == [["acc-0", "102"], ["acc-1", "10"],
                                                         ["acc-2", "20"]]
    assert main(["sql", APP_REF, "SELECT * FROM Nope"]) == 2
    assert "the views of app 'example-bank' are ['AccountClosed'" in capsys.readouterr().err

    # ---- 6. the same as a stream -------------------------------------------------------------
    t = time.monotonic()
    stream = (log_stream(spark, app, event_types=["example.bank.Deposited",
                                                  "example.bank.Withdrawn"],
                         cfg=cfg, topics=topics)
              .writeStream.format("memory").queryName("log_stream_deposits")
              .option("checkpointLocation", str(tmp_path / "stream"))
              .trigger(availableNow=True).start())
    stream.awaitTermination(120)
    assert stream.exception() is None
    streamed = _rows(spark.table("log_stream_deposits"))
    timed("log_stream", t)
    assert [(r["aggregate_id"], r["version"], r["event_type"]) for r in streamed] == [
        (r["aggregate_id"], r["version"], r["event_type"]) for r in every
        if r["event_type"] in ("example.bank.Deposited", "example.bank.Withdrawn")]
    assert streamed[0]["Deposited"] == {"amount": 100} and streamed[0]["Withdrawn"] is None
    with capsys.disabled():
        print("\n" + "; ".join(notes))
