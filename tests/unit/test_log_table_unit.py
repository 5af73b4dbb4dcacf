"""The log as a table, the parts without Spark: which columns an event type and a state become,
history rows, events and states to Arrow and back, the fold of one aggregate's rows the executors
run for states_as_of, view names, the app's reference, and the CLI's parser and printers."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from typing import Any

import attrs
import pyarrow as pa
import pytest

from cqrs import Aggregate, App, event
from cqrs.cli.main import build_parser
from cqrs.codec import upcaster
from cqrs.history import LogTableError, decode_row, rows_from_records
from cqrs.history.columns import (
    ENVELOPE_COLUMNS, EventLayout, StateLayout, aware_time, check_range,
    event_type_names, rows_from_arrow, rows_to_arrow, view_names, written_type_names,
)
from cqrs.domain.messages import type_name
from cqrs.history.batches import lean_event_columns
from cqrs.history.frames import (
    RECORD_COLUMNS, decode_record_batch, _history_rows, state_of,
)
from cqrs.loading import AppReferenceError, app_reference
from cqrs.testing.example import Account, CloseAccount, Deposit, OpenAccount, Withdraw
from cqrs.testing.example_app import app
from cqrs.testing.runner import LocalRunner

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


class Colour(enum.Enum):
    RED = 1
    BLUE = 2


@attrs.frozen
class Line:
    sku: str
    placed: dt.datetime


@event(name="unit.log.Everything")
class Everything:
    text: str
    count: int
    small: int = attrs.field(metadata={"avro.type": "int"})
    ratio: float
    flag: bool
    blob: bytes
    at: dt.datetime
    day: dt.date  # the archive's partition column: event_day
    price: decimal.Decimal
    ident: uuid.UUID
    colour: Colour
    maybe: int | None
    lines: tuple[Line, ...]
    tags: dict[str, int]
    version: int  # named like an envelope column: the column is event_version


@event(name="unit.log.Bare")
class Bare:
    pass


@event(name="other.log.Bare")
class OtherBare:
    pass


class Thing(Aggregate, name="unit.log.Thing"):
    seen: int = 0

    def apply_everything(self, e: Everything) -> None:
        self.seen += 1

    def apply_bare(self, e: Bare) -> None:
        pass

    def apply_other_bare(self, e: OtherBare) -> None:
        pass


things = App("unit-log-things", aggregates=[Thing], handlers=[])

EVERYTHING = Everything(
    "t", 2**40, 7, 0.5, True, b"\x00\x01", T0, dt.date(2026, 3, 1), decimal.Decimal("12.50"),
    uuid.UUID(int=5), Colour.BLUE, None, (Line("s-1", T0),), {"a": 1}, 3)


@pytest.fixture(scope="module")
def ann() -> LocalRunner:
    runner = LocalRunner(app, start=T0)
    runner.send_and_wait("acc-1", OpenAccount("ann"), expected_version=0)
    for amount in (10, 20):
        runner.advance(dt.timedelta(hours=1))
        runner.send_and_wait("acc-1", Deposit(amount))
    runner.send_and_wait("acc-1", Withdraw(5), command_id="w-1", correlation_id="conv-9")
    runner.send_and_wait("acc-2", OpenAccount("bob"))
    runner.send_and_wait("acc-2", CloseAccount())
    return runner


def test_every_field_type_has_a_column_type() -> None:
    layout = EventLayout(things, ["unit.log.Everything"], flat=True)
    schema = layout.schema()
    assert schema.names[:len(ENVELOPE_COLUMNS)] == list(ENVELOPE_COLUMNS)
    fields = {f.name: f.type for f in schema}
    assert fields["text"] == pa.string() and fields["count"] == pa.int64()
    assert fields["small"] == pa.int32() and fields["ratio"] == pa.float64()
    assert fields["flag"] == pa.bool_() and fields["blob"] == pa.binary()
    assert fields["at"] == pa.timestamp("us", tz="UTC") and fields["event_day"] == pa.date32()
    assert fields["price"] == fields["ident"] == fields["colour"] == pa.string()
    assert fields["maybe"] == pa.int64()
    assert fields["lines"] == pa.list_(pa.struct([("sku", pa.string()),
                                                  ("placed", pa.timestamp("us", tz="UTC"))]))
    assert fields["tags"] == pa.map_(pa.string(), pa.int64())
    assert "event_version" in fields and fields["version"] == pa.int64()  # the envelope's


def test_an_event_becomes_a_row_of_plain_values() -> None:
    payload = things.codec.encode(EVERYTHING)
    [row] = rows_from_records([_record(things, "t-1", 1, EVERYTHING)])
    e = decode_row(things.codec, row)
    batch = EventLayout(things, ["unit.log.Everything"], flat=True, payload=True).batch([e], [payload])
    [got] = batch.to_pylist()
    assert got["event_type"] == "unit.log.Everything" and got["version"] == 1
    assert got["payload"] == payload and got["schema_version"] == 1
    assert (got["text"], got["count"], got["small"], got["ratio"], got["flag"], got["blob"]) == (
        "t", 2**40, 7, 0.5, True, b"\x00\x01")
    assert got["at"] == T0 and got["event_day"] == dt.date(2026, 3, 1)
    assert (got["price"], got["ident"], got["colour"]) == ("12.50", str(uuid.UUID(int=5)), "BLUE")
    assert got["maybe"] is None and got["lines"] == [{"sku": "s-1", "placed": T0}]
    assert got["tags"] == [("a", 1)] and got["event_version"] == 3


def test_several_types_share_a_row_shape_with_a_struct_per_type(ann: LocalRunner) -> None:
    rows = rows_from_records(ann.event_records())
    events = [decode_row(app.codec, r) for r in rows]
    names = event_type_names(app, None)
    layout = EventLayout(app, names, flat=False)
    out = layout.batch(events).to_pylist()
    assert [o["event_type"] for o in out] == [e.event_type for e in events]
    deposit = out[1]
    assert deposit["Deposited"] == {"amount": 10} and deposit["AccountOpened"] is None
    assert deposit["timestamp"] == events[1].timestamp
    assert deposit["recorded_at"] == events[1].recorded_at
    assert [o["version"] for o in out if o["aggregate_id"] == "acc-1"] == [1, 2, 3, 4]
    empty = EventLayout(things, ["unit.log.Bare", "unit.log.Everything"], flat=False).schema()
    assert empty.field("Bare").type == pa.struct([])  # a type without fields


def test_history_rows_go_through_arrow_unchanged(ann: LocalRunner) -> None:
    rows = rows_from_records(ann.event_records())
    batch = rows_to_arrow(rows)
    assert rows_from_arrow(batch) == rows
    assert rows_from_arrow(pa.Table.from_batches([batch])) == rows
    assert rows_from_arrow(rows_to_arrow([])) == []


def _kafka_batch(records: list[Any]) -> pa.RecordBatch:
    """Records as Spark's Kafka source hands them to mapInArrow (RECORD_COLUMNS)."""
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.RecordBatch.from_arrays([
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([None if r.headers is None else [{"key": k, "value": v} for k, v in r.headers]
                  for r in records], headers),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp_ms * 1000 for r in records], pa.timestamp("us", tz="UTC")),
    ], names=list(RECORD_COLUMNS))


def test_records_become_the_history_jobs_rows_in_the_dataframes_pass(ann: LocalRunner) -> None:
    records = ann.event_records()
    without = attrs.evolve(records[0], headers=None, offset=99)  # not an event: passed over
    batch = _kafka_batch([*records, without])
    assert _history_rows(batch) == rows_from_records(records)
    # a slice (Arrow keeps the whole header array under it) reads the same rows
    assert _history_rows(batch.slice(2, 3)) == rows_from_records(records[2:5])


def _exact(records: list[Any], layout: EventLayout, codec: Any = None) -> list[dict[str, Any]]:
    """The layout's rows of ``records`` read record by record (the history job's and reader's
    functions)."""
    from cqrs.history.job import HistoryRun

    rows, _ = HistoryRun.rows([(r.key, r.value, r.headers, r.partition, r.offset, r.timestamp_ms)
                               for r in records])  # unreadable ones passed over, as the job does
    events = [decode_row(codec or app.codec, r) for r in rows]
    return layout.batch([e for e in events if type_name(e.event) in layout.names]).to_pylist()


@pytest.mark.parametrize("flat", [False, True])
def test_lean_events_read_column_at_a_time_as_record_by_record(ann: LocalRunner,
                                                                flat: bool) -> None:
    records = ann.event_records()
    names = ("example.bank.Deposited",) if flat else event_type_names(app, None)
    layout = EventLayout(app, names, flat=flat)
    batch = _kafka_batch(records)
    assert lean_event_columns(batch) is not None  # the column path is the one taken
    got = decode_record_batch(batch, app.codec, layout, set(names)).to_pylist()
    assert got == _exact(records, layout) and len(got) == (2 if flat else len(records))


def test_a_batch_with_a_record_the_column_path_does_not_read_is_read_record_by_record(
        ann: LocalRunner) -> None:
    records = ann.event_records()
    layout = EventLayout(app, event_type_names(app, None), flat=False)
    first = records[0]
    odd = [
        attrs.evolve(first, headers=[*first.headers, ("cqrs.kind", b"event")]),  # not lean
        attrs.evolve(first, headers=[(k, b"2026-03-01T09:00:00Z" if k == "cqrs.timestamp" else v)
                                     for k, v in first.headers]),  # another spelling of a time
        attrs.evolve(first, headers=[*first.headers, ("cqrs.command_id", b"twice")]),
        attrs.evolve(first, headers=[(k, v) for k, v in first.headers
                                     if k != "cqrs.timestamp"]),  # unreadable: passed over
    ]
    for record in odd:
        batch = _kafka_batch([*records, record])
        assert lean_event_columns(batch) is None
        wanted = set(layout.names)
        assert decode_record_batch(batch, app.codec, layout, wanted).to_pylist() == _exact(
            [*records, record], layout)


def test_a_state_folds_the_dense_prefix_of_its_rows(ann: LocalRunner) -> None:
    rows = [r for r in rows_from_records(ann.event_records()) if r.aggregate_id == "acc-1"]
    history = ann.history()
    s = state_of(Account, app.codec, rows)
    assert s == history.state_at("acc-1", version=4)
    copy = attrs.evolve(rows[1], offset=99, recorded_ms=rows[1].recorded_ms + 5)
    again = state_of(Account, app.codec, [rows[0], rows[1], copy, *rows[2:]])
    assert again is not None and again.state == s.state  # type: ignore[union-attr]
    cut = state_of(Account, app.codec, [rows[0], rows[1], rows[3]])  # version 3 not yet
    assert cut == history.state_at("acc-1", version=2)
    assert state_of(Account, app.codec, rows[1:]) is None  # no version 1: it did not exist
    closed = [r for r in rows_from_records(ann.event_records()) if r.aggregate_id == "acc-2"]
    gone = state_of(Account, app.codec, closed)
    assert gone is not None and gone.deleted and gone.state is None
    [out] = StateLayout(Account).batch([gone]).to_pylist()
    assert out["deleted"] and out["balance"] is None and out["version"] == gone.version
    [live] = StateLayout(Account).batch([s]).to_pylist()  # type: ignore[list-item]
    assert (live["owner"], live["is_open"], live["balance"]) == ("ann", True, 25)


def test_view_names_are_short_unless_two_types_share_one() -> None:
    assert view_names(["example.bank.Deposited", "example.bank.Withdrawn"]) == {
        "example.bank.Deposited": "Deposited", "example.bank.Withdrawn": "Withdrawn"}
    assert view_names(["unit.log.Bare", "other.log.bare", "a.events", "b.Version"]) == {
        "unit.log.Bare": "unit_log_Bare", "other.log.bare": "other_log_bare",
        "a.events": "a_events", "b.Version": "b_Version"}
    assert view_names(["x.y-z.Moved-On"]) == {"x.y-z.Moved-On": "Moved_On"}
    with pytest.raises(LogTableError, match="'a.b-c.D' and 'a.b.c.D' both make the view and "
                       "column name 'a_b_c_D'"):
        view_names(["a.b-c.D", "a.b.c.D"])


def test_event_types_are_checked_against_the_app() -> None:
    assert event_type_names(app, None) == tuple(sorted(app.model.events))
    assert event_type_names(app, "example.bank.Deposited") == ("example.bank.Deposited",)
    from cqrs.testing.example import Deposited, Withdrawn

    assert event_type_names(app, [Withdrawn, Deposited, Withdrawn]) == (
        "example.bank.Withdrawn", "example.bank.Deposited")
    with pytest.raises(LogTableError, match=r"'example.bank.Nope' is not an event of app "
                       r"'example-bank' \(its events: \["):
        event_type_names(app, ["example.bank.Nope"])
    with pytest.raises(LogTableError, match="event_types is empty"):
        event_type_names(app, [])


def test_renamed_types_are_read_under_their_old_names_too() -> None:
    @upcaster("old.log.Bare", 1, to_type_name="unit.log.Bare")
    def moved(data: dict[str, Any]) -> dict[str, Any]:
        return data

    @upcaster("older.log.Bare", 3, to_type_name="old.log.Bare", to_version=1)
    def moved_twice(data: dict[str, Any]) -> dict[str, Any]:
        return data

    renamed = App("unit-log-renamed", aggregates=[Thing], handlers=[],
                  upcasters=[moved, moved_twice])
    assert written_type_names(renamed, ["unit.log.Bare"]) == {
        "unit.log.Bare", "old.log.Bare", "older.log.Bare"}
    assert written_type_names(renamed, ["unit.log.Everything"]) == {"unit.log.Everything"}


def test_times_need_an_offset_and_ranges_an_order() -> None:
    assert aware_time(dt.datetime(2026, 3, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2))),
                      "since") == dt.datetime(2026, 3, 1, 10, tzinfo=UTC)
    with pytest.raises(LogTableError, match="since datetime.datetime.*no.*UTC offset|UTC offset"):
        aware_time(dt.datetime(2026, 3, 1), "since")
    with pytest.raises(LogTableError, match="is not before until"):
        check_range(T0, T0)
    check_range(T0, None)


def test_a_field_that_cannot_take_its_column_name_is_named() -> None:
    @event(name="unit.log.Clash")
    class Clash:
        offset: int
        event_offset: int

    class Clasher(Aggregate, name="unit.log.Clasher"):
        def apply_clash(self, e: Clash) -> None:
            pass

    clashing = App("unit-log-clash", aggregates=[Clasher], handlers=[])
    with pytest.raises(LogTableError, match=r"Clash.event_offset is named like an envelope "
                       r"column|its column is 'event_offset'"):
        EventLayout(clashing, ["unit.log.Clash"], flat=True)


def test_an_app_is_found_by_its_module_attribute() -> None:
    assert app_reference(app) == "cqrs.testing.example_app:app"
    assert app_reference("cqrs.testing.example_app:app") == "cqrs.testing.example_app:app"
    with pytest.raises(AppReferenceError, match="'unit-log-things' is not an attribute of any "
                       "importable module"):
        app_reference(App("unit-log-things", aggregates=[Thing], handlers=[]))
    with pytest.raises(AppReferenceError, match="not a cqrs App"):
        app_reference(42)  # type: ignore[arg-type]


def test_the_cli_parses_sql_and_archive() -> None:
    parser = build_parser()
    args = parser.parse_args(["sql", "m:app", "SELECT 1", "--json", "--since",
                              "2026-03-01T00:00:00Z", "--source", "/a"])
    assert (args.query, args.json, args.since, args.source, args.max_rows) == (
        "SELECT 1", True, "2026-03-01T00:00:00Z", "/a", 1000)
    args = parser.parse_args(["archive", "m:app", "/arch", "--event-type", "a.B",
                              "--event-type", "a.C", "--overwrite"])
    assert (args.path, args.event_types, args.overwrite) == ("/arch", ["a.B", "a.C"], True)


def test_sql_rows_print_as_a_table_and_as_json() -> None:
    from cqrs.cli.log_cmd import arrow_rows, rows_json, rows_table

    table = pa.table({
        "event_type": ["example.bank.Deposited", "example.bank.Withdrawn"], "n": [2, 10],
        "at": pa.array([T0, None], pa.timestamp("us", tz="UTC")),
        "s": pa.array([{"amount": 5}, None], pa.struct([("amount", pa.int64())])),
        "m": pa.array([{"a": [1]}, None], pa.map_(pa.string(), pa.list_(pa.int64()))),
        "b": [b"\x01", None]})
    columns, rows = arrow_rows(table)
    assert columns == ["event_type", "n", "at", "s", "m", "b"]
    assert rows[0][3:5] == ({"amount": 5}, {"a": [1]})
    lines = rows_table(columns, rows).splitlines()
    assert lines[0].split() == columns
    assert lines[2].startswith("example.bank.Deposited   2  2026-03-01T09:00:00+00:00")
    assert '{"amount": 5}' in lines[2] and '{"a": [1]}' in lines[2] and "AQ==" in lines[2]
    assert lines[3].startswith("example.bank.Withdrawn  10  -")
    import json

    assert json.loads(rows_json(columns, rows))[0] == {
        "event_type": "example.bank.Deposited", "n": 2, "at": "2026-03-01T09:00:00+00:00",
        "s": {"amount": 5}, "m": {"a": [1]}, "b": "AQ=="}
    assert arrow_rows(table.select([0, 0]))[1][0] == ("example.bank.Deposited",) * 2  # a join's


def _record(the_app: App, aggregate_id: str, version: int, ev: Any) -> Any:
    """An events-topic record of ``ev``, as the processor writes it."""
    from cqrs.domain.decision import NewEvent, event_id_for
    from cqrs.domain.messages import type_name
    from cqrs.envelope import event_to_kafka
    from cqrs.kafka_io import KafkaRecord

    agg = next(iter(the_app.model.aggregates))
    new = NewEvent(event_id_for(agg, aggregate_id, version), aggregate_id, agg, version,
                   type_name(ev), ev, T0, "c-1", "c-1")
    key, value, headers = event_to_kafka(new, the_app.codec.encode(ev))
    return KafkaRecord("t", 0, version, key, value, headers, 1_772_355_600_000)
