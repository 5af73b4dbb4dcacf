"""The processor worker's state cache: pure code, no services."""

from __future__ import annotations

from cqrs.processor.partition import PACKED_OVERHEAD, StateCache, States, _Cached
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


def test_states_evicted_from_the_decoded_ones_are_kept_packed_within_the_store() -> None:
    cache = StateCache(2, store_bytes=3 * (len(_row("a1").packed()) + PACKED_OVERHEAD))
    cache.serving = {PART_A}
    cache.put(PART_A, 5, _entries("a1", "a2", "a3", "a4"))
    states = cache.take(PART_A, 5)
    assert list(states) == [("T", "a3"), ("T", "a4")]
    assert list(states.packed) == [("T", "a1"), ("T", "a2")]
    assert states.unpack(("T", "a1")) == _row("a1")
    assert states.unpack(("T", "a1")) is None  # taken out: decided on, it is decoded again
    cache.put(PART_A, 6, states)
    cache.put(PART_A, 6, _with(cache.take(PART_A, 6), "a5", "a6", "a7"))  # 3 more evicted
    states = cache.take(PART_A, 6)
    assert list(states) == [("T", "a6"), ("T", "a7")]
    assert list(states.packed) == [("T", "a3"), ("T", "a4"), ("T", "a5")]  # a2 dropped, oldest
    assert states.packed_bytes == cache.store_bytes


def test_a_store_of_no_bytes_keeps_nothing_packed() -> None:
    cache = StateCache(1, store_bytes=0)
    cache.put(PART_A, 5, _entries("a1", "a2"))
    states = cache.take(PART_A, 5)
    assert (list(states), states.packed, states.packed_bytes) == ([("T", "a2")], {}, 0)


def test_a_partition_the_running_task_does_not_serve_goes_whole_packed_states_too() -> None:
    cache = StateCache(2, store_bytes=1 << 20)
    cache.put(PART_A, 5, _entries("a1", "a2", "a3"))  # a1 packed
    assert list(cache.entries(PART_A).packed) == [("T", "a1")]
    cache.serving = {PART_B}
    cache.put(PART_B, 9, _entries("b1", "b2"))
    assert cache.entries(PART_A) is None


def test_a_state_set_aside_leaves_both_kinds() -> None:
    states = _entries("a1", "a2")
    states.keep(("T", "a1"), _row("a1"))
    del states[("T", "a1")]
    states.forget(("T", "a1"))
    states.forget(("T", "a2"))
    assert (list(states), states.packed, states.packed_bytes) == ([], {}, 0)


def _row(i: str) -> StoredAggregate:
    return StoredAggregate(i, "T", 1, False, i.encode(), 0, 7, 1)


def _with(states: States, *ids: str) -> States:
    for key, cached in _entries(*ids).items():
        states[key] = cached
    return states


def test_a_cache_holding_all_packs_what_it_evicts_and_drops_no_state() -> None:
    """With the states in a changelog (no read by key), a worker keeps every state of its
    partitions: over capacity they are packed, other partitions' too, whatever the store's
    bytes; none is dropped, and even a cache of no decoded states keeps them packed."""
    cache = StateCache(2, store_bytes=1, hold_all=True)
    cache.put(PART_A, 5, _entries("a1", "a2", "a3"))
    cache.serving = {PART_B}
    cache.put(PART_B, 9, _entries("b1", "b2"))  # over capacity: A's states packed, not dropped
    a, b = cache.entries(PART_A), cache.entries(PART_B)
    assert a is not None and b is not None
    assert (list(a), sorted(a.packed)) == ([], [("T", "a1"), ("T", "a2"), ("T", "a3")])
    assert (list(b), b.packed) == ([("T", "b1"), ("T", "b2")], {})
    assert a.unpack(("T", "a3")) == _row("a3")
    none_decoded = StateCache(0, hold_all=True)
    none_decoded.put(PART_A, 5, _entries("a1"))
    states = none_decoded.take(PART_A, 5)
    assert (list(states), list(states.packed)) == ([], [("T", "a1")])
