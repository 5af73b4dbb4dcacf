"""The step's straight line for one command record (``AggregateStep._one``, the common case at
large key spaces) writes what its general path writes: the same records, state and deadlines,
whatever the command does (accepted, rejected, crashing, scheduling, over the record limit, a
duplicate, a process manager's derived id, a payload that cannot be read)."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cqrs.app import App
from cqrs.client import encode_command
from cqrs.domain import Aggregate, CommandHandler, Event, Rejected, Schedule, command, event
from cqrs.processor import AggregateStep, InputRecord
from cqrs.processor.partition import group_by_aggregate
from cqrs.processor.state_table import StoredAggregate
from cqrs.processor.step import UNDECODED, DedupPolicy, StepResult
from cqrs.results import AggregateRecord
from cqrs.testing.example import Deposit, Explode, OpenAccount, Withdraw, make_app
from cqrs.topics import topics_for

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
LIMIT = 3_000  # bytes: a small record limit, so that some outputs do not fit


@command(name="one.Write")
class Write:
    text: str


@command(name="one.WriteLater")
class WriteLater:
    text: str


@command(name="one.Refuse")
class Refuse:
    text: str


@command(name="one.Nothing")
class Nothing:
    n: int


@event(name="one.Written")
class Written:
    text: str


class Note(Aggregate, name="one.Note"):
    chars: int = 0

    def apply_written(self, e: Written) -> None:
        self.chars += len(e.text)


class NoteHandler(CommandHandler[Note]):
    def write(self, note: Note, cmd: Write) -> list[Event]:
        return [Written(cmd.text), Written("!")] if cmd.text.endswith("!") else [Written(cmd.text)]

    def write_later(self, note: Note, cmd: WriteLater) -> list[Any]:
        return [Written("x"), Schedule(Write(cmd.text), after=dt.timedelta(minutes=1))]

    def refuse(self, note: Note, cmd: Refuse) -> list[Event]:
        raise Rejected(cmd.text, code="refused")

    def nothing(self, note: Note, cmd: Nothing) -> None:
        return None


NOTES = App("one-notes", aggregates=[Note], handlers=[NoteHandler])
BANK = make_app("one-bank")
TOPICS = topics_for("one-test")
NOTE, ACCOUNT = "one.Note", "example.bank.Account"

texts = st.one_of(st.text(max_size=8), st.integers(1, 2 * LIMIT).map(lambda n: "t" * n))
note_commands = st.one_of(st.builds(Write, texts), st.builds(Write, texts.map(lambda t: t + "!")),
                          st.builds(WriteLater, texts), st.builds(Refuse, texts),
                          st.builds(Nothing, st.integers(0, 3)))
bank_commands = st.one_of(st.builds(OpenAccount, st.text(max_size=5)),
                          st.builds(Deposit, st.integers(1, 50)),
                          st.builds(Withdraw, st.integers(1, 80)), st.builds(Explode, st.text(max_size=5)))
# a few ids, so some repeat (duplicates); some of a process manager's form (derived ids)
command_ids = st.one_of(st.sampled_from(["a", "b", "c", "d"]),
                        st.builds(lambda v, i: f"pm:pay:{ACCOUNT}:{v}:{i}:src-1",
                                  st.integers(1, 3), st.integers(0, 1)),
                        st.uuids().map(str))
sends = st.tuples(st.booleans(), st.one_of(st.none(), st.integers(0, 5)), command_ids, st.one_of(st.none(), st.integers(0, 4)),
                  st.integers(0, 90), st.booleans())


def _read(app: App, aggregate_id: str, cmd: object, cid: str, expected: int | None, seconds: int,
          offset: int, garble: bool, reply: int | None) -> InputRecord:
    """One command record as the processor's hot path reads it (envelope and payload)."""
    _, key, value, headers = encode_command(app, aggregate_id, cmd, expected_version=expected,
                                            command_id=cid, timestamp=T0 + dt.timedelta(seconds=seconds),
                                            reply_partition=reply, max_record_bytes=100 * LIMIT)
    ((_, records),) = group_by_aggregate(TOPICS.commands, 0, [(key, value, headers, offset)]).items()
    rec = records[0]
    assert rec.envelope is not None and rec.payload is not None
    if garble:  # a payload the codec cannot read: the general path dead-letters it
        rec.payload = rec.payload[:-1]
    return rec


def _written(result: StepResult) -> tuple[Any, ...]:
    return (result.record, result.state,
            [(o.topic, o.key, o.value, o.headers, o.partition, o.status) for o in result.out],
            result.deadlines)


def _both(step: AggregateStep, agg_type: str, aggregate_id: str, state: AggregateRecord | None,
          decoded: Any, rec: InputRecord) -> StepResult:
    """apply (which takes the straight line where it can) against the general path alone."""
    fast = step.apply(agg_type, aggregate_id, state, [rec], decoded)
    entry = step.app.model.entry(agg_type)
    slow = step._general(entry, agg_type, aggregate_id,  # noqa: SLF001
                         state if state is not None else AggregateRecord(), [rec], decoded, None)
    assert _written(fast) == _written(slow)
    if state is not None and step._packed_step is not None:  # noqa: SLF001
        _packed_as_unpacked(step, agg_type, aggregate_id, state, rec, fast)
    return fast


PACKED_PATHS: dict[str, int] = {"native": 0, "handed over": 0, "not taken": 0}


def _packed_as_unpacked(step: AggregateStep, agg_type: str, aggregate_id: str,
                        state: AggregateRecord, rec: InputRecord, fast: StepResult) -> None:
    """apply_packed on the state's packed row writes what apply writes on the row unpacked:
    the same records, aggregate and deadlines, and (made natively) the row apply's record
    makes, byte for byte."""
    row = StoredAggregate(aggregate_id, agg_type, state.version, state.deleted,
                          step.dump_state(state), rec.partition, rec.offset - 1, rec.offset)
    packed = step.apply_packed(agg_type, aggregate_id, row.packed(), [rec])
    if packed is None:
        PACKED_PATHS["not taken"] += 1
        return
    if packed.row is None:
        PACKED_PATHS["handed over"] += 1
        assert _written(packed) == _written(fast)
        return
    PACKED_PATHS["native"] += 1
    assert packed.record is None and fast.record is not None
    assert _written(step.recorded(packed)) == _written(fast)
    made = StoredAggregate(aggregate_id, agg_type, fast.record.version, fast.record.deleted,
                           step.dump_state(fast.record), rec.partition, rec.offset, rec.offset + 1)
    assert packed.row == made and packed.row.packed() == made.packed()


def _run(app: App, agg_type: str, commands: list[object], plan: list[tuple[Any, ...]],
         dedup: DedupPolicy = DedupPolicy()) -> None:
    step = AggregateStep(app, app.codec, TOPICS, dedup, results_partitions=4, max_record_bytes=LIMIT)
    state: AggregateRecord | None = None
    decoded: Any = UNDECODED
    for n, (cmd, (keep_decoded, reply, cid, expected, seconds, garble)) in enumerate(
            zip(commands, plan, strict=False)):
        rec = _read(app, "id-1", cmd, cid, expected, seconds, n, garble and n % 3 == 2, reply)
        result = _both(step, agg_type, "id-1", state, decoded if keep_decoded else UNDECODED, rec)
        if result.record is not None:
            state = result.record
        decoded = result.state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(note_commands, min_size=1, max_size=8), st.lists(sends, min_size=8, max_size=8))
def test_one_note_command_at_a_time_writes_what_the_general_path_writes(
        commands: list[object], plan: list[tuple[Any, ...]]) -> None:
    _run(NOTES, NOTE, commands, plan)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(bank_commands, min_size=1, max_size=8), st.lists(sends, min_size=8, max_size=8))
def test_one_bank_command_at_a_time_writes_what_the_general_path_writes(
        commands: list[object], plan: list[tuple[Any, ...]]) -> None:
    _run(BANK, ACCOUNT, [OpenAccount("ann"), *commands], [(True, None, "open", None, 0, False), *plan])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(bank_commands, min_size=1, max_size=8), st.lists(sends, min_size=8, max_size=8))
def test_a_small_dedup_memory_trims_as_the_general_path_does(
        commands: list[object], plan: list[tuple[Any, ...]]) -> None:
    """Three ids within 30 s remembered: commands fall out of the memory (by count and by time)."""
    _run(BANK, ACCOUNT, [OpenAccount("ann"), *commands], [(True, None, "open", None, 0, False), *plan],
         DedupPolicy(window_ms=30_000, max_per_aggregate=3))


def test_the_packed_path_is_taken_natively_for_a_plain_acceptance() -> None:
    """A deposit on an open account, its row packed: decided in the native step (with the
    native module installed), the row made there."""
    step = AggregateStep(BANK, BANK.codec, TOPICS, results_partitions=4, max_record_bytes=LIMIT)
    if os.environ.get("CQRS_TEST_NATIVE") != "1":
        pytest.skip("CQRS_TEST_NATIVE=1 is not set: the native module is optional")
    assert step.packs, "the native module did not load: is native/ installed (pip install ./native)?"
    opened = step.apply(ACCOUNT, "id-1", None, [_read(BANK, "id-1", OpenAccount("ann"), "open", None,
                                                      0, 0, False, None)])
    assert opened.record is not None
    rec = _read(BANK, "id-1", Deposit(5), "dep-1", 1, 1, 1, False, 2)
    before = dict(PACKED_PATHS)
    fast = step.apply(ACCOUNT, "id-1", opened.record, [rec])
    _packed_as_unpacked(step, ACCOUNT, "id-1", opened.record, rec, fast)
    assert PACKED_PATHS["native"] == before["native"] + 1
