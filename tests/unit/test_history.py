"""An aggregate's history without services: rows from the events the processor's step writes
(through LocalRunner), the reader's paging over small buckets, state at a version or a time,
the range errors, the CLI's parser and the HTTP routes on an in-memory table; and a property
test: for random command sequences the history equals the events written, and the state at
version N equals the fold of the first N events."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cqrs.domain.decision import replay
from cqrs.envelope import from_kafka
from cqrs.history import (
    HistoryRangeError, HistoryReader, HistoryRequestError, HistoryRow, HistoryTimeError,
    MemoryHistoryTable, decode_row, row_from_record,
)
from cqrs.history.job import HistoryRun
from cqrs.testing.example import (
    Account, AccountClosed, CloseAccount, Deposit, OpenAccount, Withdraw,
)
from cqrs.testing.example_app import app
from cqrs.testing.runner import LocalRunner

ACCOUNT = "example.bank.Account"
T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def recorded_ms(offset: int) -> int:
    return T0_MS + offset * 1000  # one event a second, as Kafka would stamp them


def history_rows(runner: LocalRunner) -> list[HistoryRow]:
    """What the history job writes for the events the runner's processor wrote."""
    records = [(k, v, h, 0, off, recorded_ms(off)) for k, v, h, off in runner._events]  # noqa: SLF001
    rows, skipped = HistoryRun.rows(records)
    assert skipped == 0
    return rows


def reader_over(rows: list[HistoryRow], bucket_size: int = 3,
                now: dt.datetime | None = None) -> HistoryReader:
    table = MemoryHistoryTable(bucket_size=bucket_size)
    table.write(rows)
    clock = (lambda: now) if now is not None else None
    return HistoryReader(app, table=table, codec=app.codec, clock=clock)


@pytest.fixture
def ann() -> LocalRunner:
    runner = LocalRunner(app)
    runner.send_and_wait("acc-1", OpenAccount("ann"), expected_version=0)
    for amount in (10, 20, 30, 40):
        runner.send_and_wait("acc-1", Deposit(amount))
    runner.send_and_wait("acc-1", Withdraw(5), command_id="w-1", correlation_id="conv-9")
    runner.send_and_wait("acc-2", OpenAccount("bob"))
    return runner


def test_a_row_keeps_the_envelope_and_the_payload_bytes(ann: LocalRunner) -> None:
    key, value, headers, _ = ann._events[-2]  # noqa: SLF001 - acc-1's Withdrawn
    row = row_from_record(key, value, headers, 2, 17, T0_MS)
    assert row is not None
    env, payload = from_kafka(key, value, headers)
    assert (row.aggregate_type, row.aggregate_id, row.version) == (ACCOUNT, "acc-1", 6)
    assert (row.event_id, row.command_id, row.correlation_id, row.causation_id) == (
        env.message_id, "w-1", "conv-9", "w-1")
    assert row.payload == payload and (row.partition, row.offset, row.recorded_ms) == (2, 17, T0_MS)
    e = decode_row(app.codec, row)
    assert e.event == ann.events("acc-1")[-1] and e.timestamp == env.timestamp
    assert e.recorded_at == dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    assert (e.schema_type, e.schema_version) == ("example.bank.Withdrawn", 1)


def test_records_that_are_not_events_are_passed_over() -> None:
    rows, skipped = HistoryRun.rows([(b"acc-1", b"garbage", [], 0, 0, T0_MS)])
    assert rows == [] and skipped == 1


def test_pages_cross_buckets_in_version_order(ann: LocalRunner) -> None:
    history = reader_over(history_rows(ann), bucket_size=3)  # versions 1-2 | 3-5 | 6
    page = history.events("acc-1", limit=4)
    assert [e.version for e in page.events] == [1, 2, 3, 4] and page.next_version == 5
    rest = history.events("acc-1", page_token=page.next_page_token, limit=4)
    assert [e.version for e in rest.events] == [5, 6] and rest.next_page_token is None
    assert [e.event for e in page.events + rest.events] == ann.events("acc-1")
    exact = history.events("acc-1", from_version=3, limit=4)
    assert [e.version for e in exact.events] == [3, 4, 5, 6] and exact.next_version is None
    assert history.events("nobody").events == ()
    assert [e.version for e in history.iter_events("acc-1", from_version=2)] == [2, 3, 4, 5, 6]


def test_bad_requests_say_what_to_pass(ann: LocalRunner) -> None:
    history = reader_over(history_rows(ann))
    with pytest.raises(HistoryRequestError, match="limit 0 is not between 1 and 10000"):
        history.events("acc-1", limit=0)
    with pytest.raises(HistoryRequestError, match="versions start at 1"):
        history.events("acc-1", from_version=0)
    with pytest.raises(HistoryRequestError, match="page token 'x'"):
        history.events("acc-1", page_token="x")
    with pytest.raises(HistoryRequestError, match="not in app"):
        history.events("acc-1", "no.Such")
    with pytest.raises(HistoryRequestError, match="one of version=N or at=TIME"):
        history.state_at("acc-1")


def test_state_at_a_version_is_the_fold_of_that_prefix(ann: LocalRunner) -> None:
    history = reader_over(history_rows(ann))
    at2 = history.state_at("acc-1", version=2)
    assert at2 is not None and (at2.version, at2.state.balance, at2.deleted) == (2, 10, False)
    now = history.state_at("acc-1", version=6)
    assert now is not None and now.state == ann.state("acc-1")
    assert history.state_at("nobody", version=1) is None
    with pytest.raises(HistoryRangeError, match=r"version 9 is outside the history of "
                       r"example.bank.Account 'acc-1': its versions are 1 to 6"):
        history.state_at("acc-1", version=9)
    with pytest.raises(HistoryRangeError, match="version 0 is before the history"):
        history.state_at("acc-1", version=0)


def test_state_at_a_time_counts_the_events_recorded_by_then(ann: LocalRunner) -> None:
    history = reader_over(history_rows(ann), now=dt.datetime(2027, 1, 1, tzinfo=dt.timezone.utc))
    utc = dt.timezone.utc
    # acc-1's events are offsets 0..5, recorded at T0 + offset seconds
    third = history.state_at("acc-1", at=dt.datetime(2026, 1, 1, 0, 0, 2, 500_000, tzinfo=utc))
    assert third is not None and (third.version, third.state.balance) == (3, 30)
    assert third.recorded_at == dt.datetime(2026, 1, 1, 0, 0, 2, tzinfo=utc)
    exact = history.state_at("acc-1", at=dt.datetime(2026, 1, 1, 0, 0, 3, tzinfo=utc))
    assert exact is not None and exact.version == 4
    later = history.state_at("acc-1", at=dt.datetime(2026, 6, 1, tzinfo=utc))
    assert later is not None and later.version == 6
    with pytest.raises(HistoryRangeError, match=r"before the history of .*'acc-1': its first "
                       r"event was recorded at 2026-01-01T00:00:00\+00:00"):
        history.state_at("acc-1", at=dt.datetime(2025, 12, 31, tzinfo=utc))
    with pytest.raises(HistoryRangeError, match="in the future"):
        history.state_at("acc-1", at=dt.datetime(2030, 1, 1, tzinfo=utc))
    with pytest.raises(HistoryTimeError, match="no UTC offset"):
        history.state_at("acc-1", at=dt.datetime(2026, 1, 1))  # noqa: DTZ001


def test_a_terminal_event_leaves_a_deleted_state() -> None:
    runner = LocalRunner(app)
    runner.send_and_wait("acc-9", OpenAccount("cyd"))
    runner.send_and_wait("acc-9", Deposit(20))
    runner.send_and_wait("acc-9", CloseAccount())  # Withdrawn(20) + AccountClosed
    history = reader_over(history_rows(runner))
    closed = history.state_at("acc-9", version=4)
    assert closed is not None and closed.deleted and closed.state is None
    events = history.events("acc-9").events
    assert isinstance(events[-1].event, AccountClosed)
    assert events[-1].command_id == events[-2].command_id  # one command, two events


def test_an_id_under_two_types_needs_the_type() -> None:
    from cqrs.processor.state import AmbiguousAggregateError
    from domain_examples.lending import app as orders

    types = sorted(orders.model.aggregates)
    assert len(types) > 1
    table = MemoryHistoryTable()
    row = HistoryRow(types[0], "x-1", 1, "e1", "t", 0, T0_MS, "c", "c", "c", b"", 0, 0)
    table.write([row, HistoryRow(types[1], "x-1", 1, "e2", "t", 0, T0_MS, "c", "c", "c", b"", 0, 1)])
    history = HistoryReader(orders, table=table, codec=orders.codec)
    with pytest.raises(AmbiguousAggregateError, match="several types"):
        history.events("x-1")


# ---- the property --------------------------------------------------------------------------

commands = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]),
              st.one_of(st.builds(OpenAccount, st.sampled_from(["ann", "bob"])),
                        st.builds(Deposit, st.integers(-5, 50)),
                        st.builds(Withdraw, st.integers(0, 60)),
                        st.just(CloseAccount()))),
    max_size=25)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands, st.integers(1, 4))
def test_history_is_the_log_and_state_at_n_is_the_fold_of_n_events(
        sequence: list[tuple[str, Any]], bucket_size: int) -> None:
    runner = LocalRunner(app)
    for aggregate_id, command in sequence:
        runner.send(aggregate_id, command)
    runner.run()
    history = reader_over(history_rows(runner), bucket_size=bucket_size)
    for aggregate_id in ("a", "b", "c"):
        written = runner.events(aggregate_id)
        seen = list(history.iter_events(aggregate_id))
        assert [e.event for e in seen] == written
        assert [e.version for e in seen] == list(range(1, len(written) + 1))
        paged: list[Any] = []
        page = history.events(aggregate_id, limit=2)
        while True:
            paged += page.events
            if page.next_page_token is None:
                break
            page = history.events(aggregate_id, limit=2, page_token=page.next_page_token)
        assert paged == seen
        for n in range(1, len(written) + 1):
            at = history.state_at(aggregate_id, version=n)
            expected_state, expected_version = replay(Account, written[:n])
            assert at is not None and (at.state, at.version) == (expected_state, expected_version)
            assert at.deleted == (expected_state is None)
        if written:
            assert history.state_at(aggregate_id, version=len(written)).state == runner.state(aggregate_id)  # type: ignore[union-attr]
            with pytest.raises(HistoryRangeError):
                history.state_at(aggregate_id, version=len(written) + 1)
        else:
            assert history.state_at(aggregate_id, version=1) is None


# ---- CLI and HTTP ----------------------------------------------------------------------------

def test_state_get_keeps_version_as_a_deprecated_wait(capsys: pytest.CaptureFixture[str]) -> None:
    from cqrs.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["state", "get", "m:app", "acc-1", "--version", "3"])
    assert (args.min_version, args.deprecated_wait) == (3, True)
    args = parser.parse_args(["state", "get", "m:app", "acc-1", "--wait-for-version", "3"])
    assert (args.min_version, args.deprecated_wait) == (3, False)
    args = parser.parse_args(["state", "get", "m:app", "acc-1", "--at-version", "2"])
    assert args.at_version == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["state", "get", "m:app", "acc-1", "--at-version", "2", "--at", "x"])
    assert "at-version" in capsys.readouterr().err
    args = parser.parse_args(["history", "m:app", "acc-1", "--from-version", "5", "--limit", "2",
                              "--json"])
    assert (args.from_version, args.limit, args.json) == (5, 2, True)
    assert parser.parse_args(["run", "history", "m:app", "--replay"]).replay


def test_the_history_table_shows_both_clocks(ann: LocalRunner) -> None:
    from cqrs.cli.history_cmd import history_table

    text = history_table(reader_over(history_rows(ann)).events("acc-1").events)
    lines = text.splitlines()
    assert lines[0].split() == ["version", "type", "time", "recorded", "command", "correlation",
                                "data"]
    assert "example.bank.Withdrawn" in lines[-1] and "conv-9" in lines[-1]
    assert '{"amount": 5}' in lines[-1] and "2026-01-01T00:00:05.000+00:00" in lines[-1]


@pytest.fixture
def http(ann: LocalRunner) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from cqrs.config import load_config
    from cqrs.http import HttpContext, create_http_app

    ctx = HttpContext(app, load_config(env={}))
    ctx._history = reader_over(history_rows(ann))  # noqa: SLF001
    with TestClient(create_http_app(ctx)) as client:
        yield client


def test_http_events_page_with_tokens(http: Any) -> None:
    first = http.get("/aggregates/acc-1/events", params={"limit": 4}).json()
    assert [e["version"] for e in first["events"]] == [1, 2, 3, 4]
    assert first["next_page_token"] == "5"
    e = first["events"][1]
    assert e["type"] == "example.bank.Deposited" and e["data"] == {"amount": 10}
    assert set(e) >= {"event_id", "timestamp", "recorded_at", "command_id", "correlation_id",
                      "causation_id", "schema_version"}
    rest = http.get("/aggregates/acc-1/events",
                    params={"limit": 4, "page_token": first["next_page_token"]}).json()
    assert [e["version"] for e in rest["events"]] == [5, 6] and rest["next_page_token"] is None
    bad = http.get("/aggregates/acc-1/events", params={"page_token": "nope"})
    assert bad.status_code == 400 and "page token" in bad.json()["message"]
    assert http.get("/aggregates/nobody/events").json()["events"] == []


def test_http_events_are_the_json_forms_the_cli_writes(http: Any, ann: LocalRunner) -> None:
    """The page hands its times to orjson unformatted: the text must still be event_json's."""
    from cqrs.history.forms import event_json

    page = reader_over(history_rows(ann)).events("acc-1", limit=10)
    assert http.get("/aggregates/acc-1/events", params={"limit": 10}).json()["events"] == \
        [event_json(e) for e in page.events]


def test_http_state_at_a_version_or_a_time(http: Any) -> None:
    r = http.get("/aggregates/acc-1", params={"at_version": 2})
    assert r.status_code == 200 and r.json()["state"]["balance"] == 10 and r.json()["version"] == 2
    r = http.get("/aggregates/acc-1", params={"at": "2026-01-01T00:00:02.5Z"})
    assert r.status_code == 200 and r.json()["version"] == 3
    r = http.get("/aggregates/acc-1", params={"at_version": 7})
    assert r.status_code == 404 and "its versions are 1 to 6" in r.json()["message"]
    assert r.json()["error"] == "HistoryRangeError"
    r = http.get("/aggregates/acc-1", params={"at": "yesterday"})  # a bad request, not "not found"
    assert r.status_code == 400 and "ISO-8601" in r.json()["message"]
    assert r.json()["error"] == "HistoryTimeError"
    r = http.get("/aggregates/acc-1/events", params={"page_token": "2", "from_version": 1})
    assert r.status_code == 400 and "not both" in r.json()["message"]
    r = http.get("/aggregates/acc-1", params={"at_version": 2, "wait_for_version": 2})
    assert r.status_code == 400 and "wait_for_version" in r.json()["message"]
    assert http.get("/aggregates/nobody", params={"at_version": 1}).status_code == 404
    params = {p["name"]: p for p in
              http.get("/openapi.json").json()["paths"]["/aggregates/{aggregate_id}"]["get"]["parameters"]}
    assert params["version"].get("deprecated") and "wait_for_version" in params




def test_run_app_supervises_the_history_job() -> None:
    from cqrs.cli.app_cmd import _history_spec
    from cqrs.cli.main import build_parser
    from cqrs.config import load_config
    from cqrs.ops.board import StatusBoard

    spec = _history_spec(load_config(env={}), "cqrs.testing.example_app:app",
                         StatusBoard("example-bank"), "events-topic")
    assert (spec.name, spec.kind, spec.input_topic) == ("history", "history", "events-topic")
    assert build_parser().parse_args(["run", "app", "m:app", "--no-history"]).no_history


def test_the_history_job_commits_under_a_group_of_its_own() -> None:
    from cqrs.history.job import group_id_for
    from cqrs.topics import topics_for

    topics = topics_for("bank", "dev.")
    assert group_id_for(topics) == f"cqrs-history-{topics.base}"
    assert group_id_for(topics, "cqrs_history_rebuilt").endswith("-cqrs_history_rebuilt")


def test_the_job_writes_each_record_once_whatever_runs_it_again(ann: LocalRunner) -> None:
    from cqrs.history.job import HistoryQuery

    class Message:  # what librdkafka hands the loop
        def __init__(self, r: Any) -> None:
            self.r = r

        def key(self) -> bytes:
            return self.r.key  # type: ignore[no-any-return]

        def value(self) -> bytes:
            return self.r.value  # type: ignore[no-any-return]

        def headers(self) -> list[tuple[str, bytes]]:
            return self.r.headers  # type: ignore[no-any-return]

        def partition(self) -> int:
            return 0

        def offset(self) -> int:
            return self.r.offset  # type: ignore[no-any-return]

        def timestamp(self) -> tuple[int, int]:
            return 1, self.r.timestamp_ms

    records = [HistoryQuery._record(None, Message(r)) for r in ann.event_records()]  # type: ignore[arg-type]
    table = MemoryHistoryTable()
    run = HistoryRun(table)
    report = run.run(records)
    assert (report.events, report.skipped) == (len(records), 0)
    before = {k: dict(v) for k, v in table.rows.items()}
    run.run(records[2:])  # a restart from an earlier offset
    assert table.rows == before
    history = HistoryReader(app, table=table, codec=app.codec)
    assert [e.event for e in history.iter_events("acc-1")] == ann.events("acc-1")


def test_an_id_too_long_for_the_partition_key_is_stored_under_its_digest() -> None:
    from cqrs.envelope import MAX_STATE_KEY_BYTES
    from cqrs.history import partition_of

    app_base, kind = "t-app-1-bank", ACCOUNT
    fits = "k" * (MAX_STATE_KEY_BYTES - 20 - len(app_base) - len(kind))  # 4 parts framed + bucket
    assert partition_of(app_base, kind, fits, 3) == (fits, 3)
    longer = fits + "k"  # one byte more: the key would be 65,536 bytes
    stored, bucket = partition_of(app_base, kind, longer, 3)
    assert stored.startswith("sha256:") and len(stored) == 71 and bucket == -4
    assert partition_of(app_base, kind, longer + "x", 3)[0] != stored  # another id, another digest
    assert partition_of(app_base, kind, "é" * 40_000, 0)[1] == -1  # bytes count, not characters


_ids = st.none() | st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_int64 = st.integers(-(2**63), 2**63 - 1)


@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40), _ids,
       _int64, _int64, _ids, _ids, _ids, st.integers(0, 2**31 - 1), _int64, st.binary(max_size=64))
def test_a_rows_envelope_cell_gives_back_every_field(
        event_id: str, command_id: str | None, timestamp_us: int, recorded_ms: int,
        correlation_id: str | None, causation_id: str | None, event_type: str | None,
        partition: int, offset: int, payload: bytes) -> None:
    """What the Cassandra table writes in a row's ``envelope`` cell reads back as the same row
    (any text, null ids, the whole 64-bit range)."""
    from cqrs.history.table import envelope_text, row_from_cells

    row = HistoryRow("example.bank.Account", "acc-ü", 7, event_id, event_type or "t",
                     timestamp_us, recorded_ms, command_id, correlation_id, causation_id, payload,
                     partition, offset)
    assert row_from_cells(row.aggregate_type, row.aggregate_id, 7, envelope_text(row),
                          payload) == row


def test_times_that_are_not_times_say_how_to_write_one() -> None:
    from cqrs.history.forms import parse_time

    assert parse_time("2026-11-26T18:36:21Z") == dt.datetime(2026, 11, 26, 18, 36, 21,
                                                             tzinfo=dt.timezone.utc)
    with pytest.raises(HistoryTimeError, match=r"is a date, not a time: write e.g. 2026-11-26T00:00:00Z"):
        parse_time("2026-11-26Z")
    with pytest.raises(HistoryTimeError, match=r"a '\+' arrives as a space.*%2B00:00"):
        parse_time("2026-11-26T18:36:21.715 00:00")  # ?at=...+00:00 unencoded
    with pytest.raises(HistoryTimeError, match="no UTC offset"):
        parse_time("2026-11-26T18:36:21")
    assert issubclass(HistoryTimeError, HistoryRequestError)  # a bad request (HTTP 400)


def test_a_page_token_and_a_from_version_together_are_refused(ann: LocalRunner) -> None:
    history = reader_over(history_rows(ann))
    first = history.events("acc-1", limit=2)
    assert first.next_page_token is not None
    with pytest.raises(HistoryRequestError, match="not both"):
        history.events("acc-1", limit=2, from_version=1, page_token=first.next_page_token)
    with pytest.raises(HistoryRequestError, match="not a whole number"):
        history.state_at("acc-1", version="2")  # type: ignore[arg-type]
