"""The dedup memory's shortcut (append without unpacking) agrees with the full trim."""

from __future__ import annotations

# numpy imported here, not by the first long memory: its ~0.4 s would count against that
# test case's deadline
import numpy  # noqa: F401
from hypothesis import given
from hypothesis import strategies as st

from cqrs.results import AggregateRecord, SeenCommand

seen_commands = st.lists(
    st.builds(SeenCommand, st.text(st.characters(blacklist_characters="\0"), min_size=1, max_size=8),
              st.integers(0, 10_000), st.binary(max_size=12)),
    max_size=12)


@given(seen_commands, seen_commands, st.integers(0, 12_000), st.integers(0, 14))
def test_remember_equals_the_full_trim(old: list[SeenCommand], new: list[SeenCommand],
                                       window_ms: int, max_count: int) -> None:
    record = AggregateRecord.of(3, False, b"s", old)
    fast = record.remember(4, False, b"t", new, window_ms, max_count)
    assert fast == record._remember_trimmed(4, False, b"t", new, window_ms, max_count)  # noqa: SLF001


many_seen = st.lists(
    st.builds(SeenCommand, st.text(st.characters(blacklist_characters="\0"), min_size=1, max_size=4),
              st.integers(-2**40, 2**40), st.binary(max_size=3)),
    min_size=60, max_size=150)


@given(many_seen, seen_commands, st.integers(0, 2**41), st.integers(0, 170))
def test_a_long_memory_is_remembered_as_the_full_trim_does(
        old: list[SeenCommand], new: list[SeenCommand], window_ms: int, max_count: int) -> None:
    """Memories of 64 commands and more find their times' bounds another way (numpy)."""
    record = AggregateRecord.of(3, False, b"s", old)
    fast = record.remember(4, False, b"t", new, window_ms, max_count)
    assert fast == record._remember_trimmed(4, False, b"t", new, window_ms, max_count)  # noqa: SLF001


@given(seen_commands, st.lists(seen_commands, max_size=6), st.integers(0, 12_000),
       st.integers(0, 14))
def test_a_chain_of_remembers_keeps_its_bounds_as_the_full_trim_does(
        old: list[SeenCommand], batches: list[list[SeenCommand]], window_ms: int,
        max_count: int) -> None:
    """Each record remember makes carries its times' bounds to the next (not stored): a chain
    of steps agrees with the full trim at every link, and the bounds with the times."""
    fast = slow = AggregateRecord.of(3, False, b"s", old)
    for n, new in enumerate(batches):
        fast = fast.remember(4 + n, False, b"t", new, window_ms, max_count)
        slow = slow._remember_trimmed(4 + n, False, b"t", new, window_ms, max_count)  # noqa: SLF001
        assert fast == slow
        times = [s.timestamp_ms for s in fast.seen]
        if times:
            assert fast.time_bounds() == (min(times), max(times))


in_order = st.lists(st.integers(0, 50), min_size=1, max_size=150).map(
    lambda steps: [sum(steps[:i + 1]) for i in range(len(steps))])  # times that only go forward


@given(in_order, st.integers(1, 40), st.integers(0, 1_500), st.integers(1, 120))
def test_a_busy_memory_drops_its_oldest_as_the_full_trim_does(
        times: list[int], batch: int, window_ms: int, max_count: int) -> None:
    """A memory fed in time order, in batches: full, or its oldest ids expiring (the steady
    state of a busy aggregate, where the oldest are cut off without unpacking the memory)."""
    seen = [SeenCommand(f"c{i}", t, bytes([i % 7]) * (i % 5)) for i, t in enumerate(times)]
    fast = slow = AggregateRecord()
    for start in range(0, len(seen), batch):
        new = seen[start:start + batch]
        fast = fast.remember(1, False, None, new, window_ms, max_count)
        slow = slow._remember_trimmed(1, False, None, new, window_ms, max_count)  # noqa: SLF001
        assert fast == slow
        kept = [s.timestamp_ms for s in fast.seen]
        if kept:
            assert fast.time_bounds() == (min(kept), max(kept))
