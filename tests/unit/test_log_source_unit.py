"""The log table's reading of the events topic, the parts without Kafka or Spark: a chunk of
librdkafka's messages -> the batch of records Spark's Kafka source would give, its filters, and
the last written of each copy kept while the partition is read backwards."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.domain.decision import event_id_for
from cqrs.history.batches import header_values
from cqrs.history.columns import EventLayout
from cqrs.history.frames import RECORD_COLUMNS, LogSpec, decode_record_batch
from cqrs.history.log_source import LogRead, Seen, _versions, chunks, record_batch
from cqrs.kafka_io import KafkaRecord
from cqrs.testing.example import CloseAccount, Deposit, OpenAccount, Withdraw
from cqrs.testing.example_app import app
from cqrs.testing.runner import LocalRunner

UTC = dt.timezone.utc


class Message:
    """What the reader calls of a librdkafka message, over a record."""

    def __init__(self, record: KafkaRecord) -> None:
        self._r = record

    def key(self) -> bytes | None:
        return self._r.key

    def value(self) -> bytes | None:
        return self._r.value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return list(self._r.headers) if self._r.headers else None  # librdkafka: None, not []

    def offset(self) -> int:
        return self._r.offset

    def timestamp(self) -> tuple[int, int]:
        return 1, self._r.timestamp_ms  # (create time, ms)


def _read(**kw: Any) -> LogRead:
    from cqrs.config import load_config

    names = tuple(sorted(app.model.events))
    return LogRead(LogSpec(load_config(), "cqrs.testing.example_app:app", "schemas"),
                   "events", names, False, False, **kw)


def _record(offset: int, headers: list[tuple[str, bytes | None]] | None, key: bytes | None = b"a",
            ms: int = 1_000) -> KafkaRecord:
    return KafkaRecord("events", 0, offset, key, b"v", headers or [], ms)


@pytest.fixture(scope="module")
def records() -> list[KafkaRecord]:
    runner = LocalRunner(app)
    for agg, cmd in [("acc-1", OpenAccount("ann")), ("acc-1", Deposit(25)),
                     ("acc-2", OpenAccount("bob")), ("acc-1", Withdraw(5)),
                     ("acc-2", CloseAccount())]:
        runner.send(agg, cmd)
    runner.run()
    return [KafkaRecord(r.topic, 0, i, r.key, r.value, r.headers, r.timestamp_ms)
            for i, r in enumerate(runner.event_records())]


def test_a_chunk_is_the_batch_sparks_kafka_source_gives(records: list[KafkaRecord]) -> None:
    batch = record_batch([Message(r) for r in records], 0, _read(dedupe=False), None)
    assert batch.schema.names == list(RECORD_COLUMNS)
    assert batch.column("key").to_pylist() == [r.key for r in records]
    assert batch.column("value").to_pylist() == [r.value for r in records]
    assert [[(h["key"], h["value"]) for h in hs] for hs in batch.column("headers").to_pylist()] \
        == [list(r.headers) for r in records]
    assert batch.column("offset").to_pylist() == [r.offset for r in records]
    assert batch.column("timestamp").to_pylist() == [
        dt.datetime.fromtimestamp(r.timestamp_ms / 1000, UTC) for r in records]
    layout = EventLayout(app, tuple(sorted(app.model.events)), flat=False)
    decoded = decode_record_batch(batch, app.codec, layout, set(layout.names)).to_pylist()
    assert sorted((r["aggregate_id"], r["version"], r["event_type"]) for r in decoded) == [
        ("acc-1", 1, "example.bank.AccountOpened"), ("acc-1", 2, "example.bank.Deposited"),
        ("acc-1", 3, "example.bank.Withdrawn"), ("acc-2", 1, "example.bank.AccountOpened"),
        ("acc-2", 2, "example.bank.AccountClosed")]
    assert [r["event_id"] for r in decoded] == [
        event_id_for(r["aggregate_type"], r["aggregate_id"], r["version"]) for r in decoded]
    # the ids the processor's events do not carry are left to Spark when asked to
    undecided = decode_record_batch(batch, app.codec, layout, set(layout.names),
                                    derive_ids=False).to_pylist()
    assert [r["event_id"] for r in undecided] == [None] * 5
    assert [{**r, "event_id": None} for r in decoded] == undecided


def test_the_filters_keep_what_the_connectors_path_kept(records: list[KafkaRecord]) -> None:
    messages = [Message(r) for r in records]
    times = [r.timestamp_ms for r in records]

    def kept(read: LogRead) -> list[int]:
        return record_batch(messages, 0, read, None).column("offset").to_pylist()

    assert kept(_read(dedupe=False, since_us=times[2] * 1000)) == [
        r.offset for r in records if r.timestamp_ms >= times[2]]
    assert kept(_read(dedupe=False, until_us=times[2] * 1000)) == [
        r.offset for r in records if r.timestamp_ms < times[2]]
    assert kept(_read(dedupe=False, until_us=times[2] * 1000, until_inclusive=True)) == [
        r.offset for r in records if r.timestamp_ms <= times[2]]
    opened = [r.offset for r in records if (
        "cqrs.message_type", b"example.bank.AccountOpened") in r.headers]
    assert len(opened) == 2
    assert kept(_read(dedupe=False, written_types=("example.bank.AccountOpened",))) == opened
    assert kept(_read(dedupe=False, aggregate_type="example.bank.Account")) == [0, 1, 2, 3, 4]
    assert kept(_read(dedupe=False, aggregate_type="example.bank.Other")) == []


def test_a_header_reads_as_the_first_of_its_name() -> None:
    batch = record_batch([Message(_record(0, [("cqrs.version", b"1"), ("cqrs.version", b"2")])),
                          Message(_record(1, None)),
                          Message(_record(2, [("x", b"y"), ("cqrs.version", b" 7 ")]))],
                         0, _read(dedupe=False), None)
    assert header_values(batch.column("headers"), "cqrs.version").to_pylist() == [
        b"1", None, b" 7 "]
    assert header_values(batch.column("headers"), "nobody").to_pylist() == [None] * 3
    assert _versions(pa.array([b" 7 ", None, b"12"], pa.binary())) == [7, None, 12]
    assert _versions(pa.array([b"x", b"3", b"\xff"], pa.binary())) == [None, 3, None]


def test_chunks_cover_the_range_the_last_first() -> None:
    assert chunks(5, 17, 5) == [(12, 17), (7, 12), (5, 7)]
    assert chunks(3, 3, 5) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"a", b"b", None]), st.sampled_from(["A", "B"]),
                          st.one_of(st.none(), st.integers(1, 4))), max_size=40),
       st.integers(1, 12))
def test_read_backwards_the_last_written_of_each_version_is_kept(
        written: list[tuple[bytes | None, str, int | None]], size: int) -> None:
    """Whatever the copies and the chunks: one record per aggregate type, aggregate id and
    version, the one written last; none without a key or a version."""
    messages = [Message(_record(i, [("cqrs.aggregate_type", kind.encode())] + (
        [] if version is None else [("cqrs.version", str(version).encode())]), key=key))
        for i, (key, kind, version) in enumerate(written)]
    seen, kept = Seen(), []
    for start, end in chunks(0, len(messages), size):
        kept += record_batch(messages[start:end], 0, _read(), seen).column("offset").to_pylist()
    last: dict[tuple[bytes, str, int], int] = {}
    for i, (key, kind, version) in enumerate(written):
        if key is not None and version is not None:
            last[(key, kind, version)] = i
    assert sorted(kept) == sorted(last.values())


def test_a_copy_outside_the_time_asked_for_does_not_hide_the_one_inside() -> None:
    """The filters first, then the last written of what they kept (as the history table of a
    range, and states_as_of before a time, read it): a re-run's copy recorded after ``until``
    leaves the version's first copy, recorded before it."""
    headers = [("cqrs.aggregate_type", b"A"), ("cqrs.version", b"1")]
    messages = [Message(_record(0, headers, ms=1_000)), Message(_record(1, headers, ms=5_000))]
    before = record_batch(messages, 0, _read(until_us=2_000_000), Seen())
    assert before.column("offset").to_pylist() == [0]
    assert record_batch(messages, 0, _read(), Seen()).column("offset").to_pylist() == [1]
