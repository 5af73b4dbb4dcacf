"""The processor worker's state cache: pure code, no services."""

from __future__ import annotations

from cqrs.processor.partition import StateCache, States, _Cached
from cqrs.processor.state_table import StoredAggregate
from cqrs.processor.step import UNDECODED

PART_A = ("bank", 1, "bank.commands", 0)
PART_B = ("bank", 1, "bank.commands", 1)


def _entries(*ids: str) -> States:
    return States(
        (("T", i), _Cached(StoredAggregate(i, "T", 1, False, i.encode(), 0, 7, 1), None, UNDECODED))
        for i in ids)


def test_a_partitions_states_are_valid_only_where_its_last_slice_ended() -> None:
    cache = StateCache(10)
    cache.put(PART_A, 5, _entries("a", "b"))
    assert list(cache.take(PART_A, 4)) == []  # a slice from elsewhere: dropped
    assert list(cache.take(PART_A, 5)) == []  # ...for good
    cache.put(PART_A, 5, _entries("a", "b"))
    assert list(cache.take(PART_A, 5)) == [("T", "a"), ("T", "b")]


def test_partitions_the_running_task_does_not_serve_go_first() -> None:
    cache = StateCache(4)
    cache.put(PART_A, 5, _entries("a1", "a2", "a3"))
    cache.serving = {PART_B}
    cache.put(PART_B, 9, _entries("b1", "b2"))  # over capacity: all of A goes, not B's
    assert cache.next_offset(PART_A) is None and cache.next_offset(PART_B) == 9
    cache.put(PART_B, 10, _entries("b1", "b2", "b3", "b4", "b5"))
    assert list(cache.take(PART_B, 10)) == [("T", "b2"), ("T", "b3"), ("T", "b4"), ("T", "b5")]


def test_the_partitions_of_the_running_task_are_evicted_last() -> None:
    cache = StateCache(4)
    cache.serving = {PART_A, PART_B}
    cache.put(PART_A, 5, _entries("a1", "a2"))
    cache.put(PART_B, 9, _entries("b1", "b2", "b3"))  # A is served: B's oldest state goes
    assert list(cache.take(PART_A, 5)) == [("T", "a1"), ("T", "a2")]
    assert list(cache.take(PART_B, 9)) == [("T", "b2"), ("T", "b3")]
