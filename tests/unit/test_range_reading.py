"""The pure parts of a rebuild's range tasks (projections/job.py): the Kafka records read as event
records, the chunks read ahead of the fold, and the offsets handed to Spark. The real stack:
tests/integration/test_projector.py (rebuilds) and bench/projector.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from projections.job import _read_ahead, balanced_shares, offsets_json
from projections.records import EventRecord, event_record, event_record_or_none

HEADERS = [("cqrs.message_type", b"example.bank.Deposited"),
           ("cqrs.aggregate_type", b"example.bank.Account"),
           ("cqrs.timestamp", b"2026-11-27T10:00:00+00:00"), ("cqrs.version", b"12"),
           ("cqrs.command_id", b"c-1")]


def test_an_event_record_is_read_from_its_headers_in_one_pass() -> None:
    rec = event_record(b"acc-1", b"\x01", HEADERS, 3, 40)
    assert rec == EventRecord("acc-1", "example.bank.Account", "example.bank.Deposited", 12,
                              b"\x01", "2026-11-27T10:00:00+00:00", 3, 40)
    assert hash(rec) == hash(EventRecord(*rec))  # a value: equal records hash alike
    with pytest.raises(AttributeError):
        rec.version = 13  # type: ignore[misc]
    # the last of a repeated header wins, as a dict of them would have it
    assert event_record(b"a", b"", [*HEADERS, ("cqrs.version", b"13")]).version == 13


@pytest.mark.parametrize("key, headers", [
    (None, HEADERS), (b"", HEADERS),
    (b"acc-1", [h for h in HEADERS if h[0] != "cqrs.version"]),
    (b"acc-1", [("cqrs.version", None), *HEADERS[:3]]),
])
def test_a_record_that_is_no_event_is_passed_over(key: bytes | None, headers: list) -> None:
    assert event_record_or_none(key, b"x", headers, 0, 7) is None
    with pytest.raises(KeyError, match="offset 7 of partition 0 is not an event record"):
        event_record(key, b"x", headers, 0, 7)


def _chunks(n: int, fail_at: int | None = None, read: list[int] | None = None) -> Iterator[list[int]]:
    for i in range(n):
        if i == fail_at:
            raise ValueError(f"the broker went away at chunk {i}")
        time.sleep(0.005)
        if read is not None:
            read.append(i)
        yield [i]


def test_chunks_read_ahead_come_in_order_and_no_more_than_one_ahead() -> None:
    read: list[int] = []
    seen = []
    for chunk in _read_ahead(_chunks(6, read=read)):
        time.sleep(0.03)  # the fold: the reader is at most one chunk ahead of it
        assert len(read) <= chunk[0] + 2  # this chunk and the next
        seen.append(chunk[0])
    assert seen == list(range(6))


def test_the_readers_error_is_raised_in_the_folding_thread() -> None:
    got = []
    with pytest.raises(ValueError, match="at chunk 3"):
        for chunk in _read_ahead(_chunks(6, fail_at=3)):
            got.append(chunk[0])
    assert got == [0, 1, 2]


def test_a_fold_that_stops_early_stops_the_reader() -> None:
    before = {t.ident for t in threading.enumerate()}
    ahead = _read_ahead(_chunks(1000))
    assert next(ahead) == [0]
    ahead.close()
    left = [t for t in threading.enumerate() if t.ident not in before]
    assert left == []


def test_offsets_cover_every_partition_unknown_ones_at_the_earliest() -> None:
    assert json.loads(offsets_json("t.events", {0: 5, 2: 9}, {0: (0, 10), 1: (0, 4), 2: (3, 9)})) \
        == {"t.events": {"0": 5, "1": -2, "2": 9}}
    assert json.loads(offsets_json("t.events", {1: 7})) == {"t.events": {"1": 7}}


def test_ranges_are_dealt_into_a_share_per_core_of_about_equal_length() -> None:
    ranges = [(0, 0, 100), (1, 0, 100), (2, 50, 100), (3, 0, 40), (4, 0, 10)]
    shares = balanced_shares(ranges, 2)
    assert sorted(r for share in shares for r in share) == sorted(ranges)  # each range once
    assert sorted(sum(e - s for _, s, e in share) for share in shares) == [150, 150]
    assert balanced_shares(ranges[:1], 4) == [[(0, 0, 100)]]  # no empty share
    assert len(balanced_shares(ranges, 8)) == 5
