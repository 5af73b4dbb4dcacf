"""The decision function: no version gaps, no repeats, replay rebuilds state, determinism."""

from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.domain import Accepted, CommandInput, DomainModel, decide, replay
from cqrs.testing.example import (
    Account,
    AccountHandler,
    CloseAccount,
    Deposit,
    OpenAccount,
    Withdraw,
)

SETTINGS = settings(max_examples=80, deadline=None)
ENTRY = DomainModel([Account], [AccountHandler]).entry(Account)
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)

commands = st.one_of(
    st.builds(OpenAccount, st.sampled_from(["ann", "bob"])),
    st.builds(Deposit, st.integers(-5, 100)),
    st.builds(Withdraw, st.integers(-5, 100)),
    st.just(CloseAccount()),
)
inputs = st.lists(
    st.tuples(commands, st.none() | st.integers(0, 8)), max_size=12
).map(
    lambda cs: [CommandInput(f"c{i}", c, ev, T0 + dt.timedelta(seconds=i)) for i, (c, ev) in enumerate(cs)]
)


def _events(outcomes: tuple[object, ...]) -> list:  # type: ignore[type-arg]
    return [e for o in outcomes if isinstance(o, Accepted) for e in o.events]


@SETTINGS
@given(inputs)
def test_versions_are_gapless_and_replay_rebuilds_state(cmds: list[CommandInput]) -> None:
    d = decide(ENTRY, "acc", None, 0, cmds)
    events = _events(d.outcomes)
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    assert len({e.event_id for e in events}) == len(events)
    assert d.version == len(events)
    assert replay(Account, events) == (d.state, d.version)
    for o in d.outcomes:
        if isinstance(o, Accepted) and o.events:
            assert o.version == o.events[-1].version


@SETTINGS
@given(inputs, st.integers(0, 12))
def test_split_batches_equal_one_batch(cmds: list[CommandInput], cut: int) -> None:
    whole = decide(ENTRY, "acc", None, 0, cmds)
    first = decide(ENTRY, "acc", None, 0, cmds[:cut])
    rest = decide(ENTRY, "acc", first.state, first.version, cmds[cut:])
    assert (rest.state, rest.version) == (whole.state, whole.version)
    assert first.outcomes + rest.outcomes == whole.outcomes


@SETTINGS
@given(inputs, st.integers(0, 12))
def test_snapshot_plus_rest_equals_full_replay(cmds: list[CommandInput], cut: int) -> None:
    events = _events(decide(ENTRY, "acc", None, 0, cmds).outcomes)
    head_state, head_version = replay(Account, events[:cut])
    before = None if head_state is None else Account(head_state.owner, head_state.is_open, head_state.balance)
    if head_state is None and head_version > 0:
        return  # deleted at the cut: nothing may follow
    assert replay(Account, events[cut:], head_state, head_version) == replay(Account, events)
    assert head_state == before  # replay from a snapshot did not mutate it


@SETTINGS
@given(inputs)
def test_decide_is_deterministic(cmds: list[CommandInput]) -> None:
    assert decide(ENTRY, "acc", None, 0, cmds) == decide(ENTRY, "acc", None, 0, cmds)
