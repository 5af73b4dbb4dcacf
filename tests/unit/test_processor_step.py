"""The processor's per-aggregate step, without Spark: the same code the Spark job calls."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cqrs.app import App
from cqrs.client import encode_command
from cqrs.domain import Aggregate, CommandHandler, Event, Rejected, Schedule, command, event
from cqrs.envelope import MAX_STATE_KEY_BYTES, from_kafka, record_size, to_kafka
from cqrs.errors import MalformedHeaderError
from cqrs.processor import AggregateStep, DedupPolicy, InputRecord, OutputRecord
from cqrs.processor.step import DUPLICATE_HEADER
from cqrs.results import AggregateRecord, CommandResult
from cqrs.retries import RetryPolicy
from cqrs.testing.example import (
    Account, Deposit, Deposited, Explode, OpenAccount, Withdraw, Withdrawn, make_app,
)
from cqrs.topics import topics_for

APP = make_app("step-test")
TOPICS = topics_for("step-test")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _record(command: object, offset: int, *, aggregate_id: str = "acc-1", expected: int | None = None,
            command_id: str | None = None, at: dt.datetime = T0, partition: int = 0,
            reply: int | None = None) -> InputRecord:
    _, key, value, headers = encode_command(APP, aggregate_id, command, expected_version=expected,
                                            command_id=command_id or f"c{offset}", timestamp=at,
                                            reply_partition=reply)
    return InputRecord(key, value, headers, partition, offset, TOPICS.commands)


def _step(**dedup: int) -> AggregateStep:
    return AggregateStep(APP, APP.codec, TOPICS, DedupPolicy(**dedup))


def _results(out: list[OutputRecord]) -> list[CommandResult]:
    return [APP.codec.decode(r.value) for r in out if r.topic == TOPICS.results]


def _events(out: list[OutputRecord]) -> list[object]:
    return [APP.codec.decode(r.value) for r in out if r.topic == TOPICS.events]


def test_results_go_to_the_reply_partition_the_sender_asked_for() -> None:
    step = AggregateStep(APP, APP.codec, TOPICS, results_partitions=4)
    state, out = step.run("example.bank.Account", "acc-1", None, [
        _record(OpenAccount("ann"), 1, command_id="a", reply=3),
        _record(Deposit(5), 2, command_id="b"),  # no reply partition: key partitioning
        _record(Deposit(6), 3, command_id="c", reply=4),  # out of range: key partitioning
    ])
    assert [(r.key, r.partition) for r in out if r.topic == TOPICS.results] == [
        (b"a", 3), (b"b", None), (b"c", None)]
    assert {r.partition for r in out if r.topic != TOPICS.results} == {None}
    # a retry from another client gets the first result on its own partition
    _, again = step.run("example.bank.Account", "acc-1", state,
                        [_record(OpenAccount("ann"), 4, command_id="a", reply=1)])
    first = next(r for r in out if r.key == b"a")
    assert [(r.value, r.partition) for r in again] == [(first.value, 1)]
    # marked as an answer given again (counts of results leave it out); the first is bare
    assert [r.headers for r in again] == [[DUPLICATE_HEADER]] and first.headers == []


def test_a_negative_reply_partition_is_refused_at_the_client() -> None:
    with pytest.raises(MalformedHeaderError, match="reply partition -1"):
        _record(Deposit(5), 1, reply=-1)


def test_commands_are_applied_in_offset_order_whatever_order_they_arrive_in() -> None:
    records = [_record(Withdraw(30), 3), _record(OpenAccount("ann"), 1), _record(Deposit(50), 2)]
    state, out = _step().run("example.bank.Account", "acc-1", None, records)
    assert [r.status for r in _results(out)] == ["accepted", "accepted", "accepted"]
    assert [r.version for r in _results(out)] == [1, 2, 3]
    assert _events(out)[1:] == [Deposited(50), Withdrawn(30)]
    assert state is not None and state.version == 3
    account = APP.codec.decode(state.snapshot)
    assert isinstance(account, Account) and account.balance == 20
    for rec in out:
        if rec.topic == TOPICS.events:
            assert rec.key == b"acc-1"


def test_expected_version_mismatch_is_rejected_with_current_version() -> None:
    state, _ = _step().run("example.bank.Account", "acc-1", None, [_record(OpenAccount("ann"), 1)])
    state2, out = _step().run("example.bank.Account", "acc-1", state,
                              [_record(Deposit(5), 2, expected=0), _record(Deposit(7), 3, expected=1)])
    first, second = _results(out)
    assert (first.status, first.code, first.version) == ("rejected", "wrong_expected_version", 1)
    assert (second.status, second.version) == ("accepted", 2)
    assert _events(out) == [Deposited(7)]


def test_duplicate_command_ids_return_the_first_result_and_run_nothing() -> None:
    step = _step()
    state, out1 = step.run("example.bank.Account", "acc-1", None,
                           [_record(OpenAccount("ann"), 1, command_id="x"),
                            _record(OpenAccount("ann"), 2, command_id="x")])  # same batch
    assert len(_events(out1)) == 1
    r1 = [r.value for r in out1 if r.topic == TOPICS.results]
    assert len(r1) == 2 and r1[0] == r1[1]
    state2, out2 = step.run("example.bank.Account", "acc-1", state,
                            [_record(OpenAccount("ann"), 3, command_id="x")])  # later batch
    assert _events(out2) == [] and state2 is None  # nothing to store
    assert [r.value for r in out2 if r.topic == TOPICS.results] == [r1[0]]


def test_dedup_window_is_bounded_by_command_time_and_count() -> None:
    step = _step(window_ms=60_000, max_per_aggregate=2)
    state, _ = step.run("example.bank.Account", "a", None, [_record(OpenAccount("o"), 1, aggregate_id="a")])
    for i in range(2, 6):
        state, _ = step.run("example.bank.Account", "a", state,
                            [_record(Deposit(1), i, aggregate_id="a", at=T0 + dt.timedelta(seconds=i))])
    assert [s.command_id for s in state.seen] == ["c4", "c5"]
    state, _ = step.run("example.bank.Account", "a", state,
                        [_record(Deposit(1), 9, aggregate_id="a", at=T0 + dt.timedelta(hours=1))])
    assert [s.command_id for s in state.seen] == ["c9"]


def test_handler_crash_is_dead_lettered_and_the_aggregate_stays_usable() -> None:
    records = [_record(OpenAccount("ann"), 1), _record(Explode("x"), 2), _record(Deposit(5), 3)]
    state, out = _step().run("example.bank.Account", "acc-1", None, records)
    statuses = [(r.status, r.version) for r in _results(out)]
    assert statuses == [("accepted", 1), ("failed", 1), ("accepted", 2)]
    dead = [r for r in out if r.topic == TOPICS.dead_letters]
    assert len(dead) == 1
    headers = dict(dead[0].headers)
    assert headers["cqrs.dlq.stage"] == b"handler"
    assert b"crashed on purpose" in headers["cqrs.dlq.error"]
    assert headers["cqrs.dlq.offset"] == b"2"
    assert dead[0].value == records[1].value  # the original bytes


def _with_payload(rec: InputRecord, change: Callable[[bytes], bytes]) -> InputRecord:
    """``rec`` with its command payload changed (its envelope intact)."""
    env, payload = from_kafka(rec.key, rec.value, rec.headers)
    key, value, headers = to_kafka(env, change(payload))
    return InputRecord(key, value, headers, rec.partition, rec.offset, rec.topic)


@pytest.mark.parametrize(
    ("mangle", "stage"),
    [
        (lambda r: _with_payload(r, lambda p: b"\x00garbage"), "decode"),
        (lambda r: _with_payload(r, lambda p: p[:5]), "decode"),
        (lambda r: InputRecord(r.key, r.value[:20], r.headers, 0, r.offset), "envelope"),
        (lambda r: InputRecord(r.key, b"\x00garbage", r.headers, 0, r.offset), "envelope"),
    ],
)
def test_poison_records_are_dead_lettered_and_later_commands_still_succeed(mangle, stage) -> None:  # type: ignore[no-untyped-def]
    records = [_record(OpenAccount("ann"), 1), mangle(_record(Deposit(5), 2)), _record(Deposit(6), 3)]
    state, out = _step().run("example.bank.Account", "acc-1", None, records)
    dead = [r for r in out if r.topic == TOPICS.dead_letters]
    assert [dict(d.headers)["cqrs.dlq.stage"] for d in dead] == [stage.encode()]
    assert _events(out)[-1] == Deposited(6)
    assert state.version == 2


def test_records_without_aggregate_are_dead_lettered_and_no_state_is_touched() -> None:
    rec = _record(OpenAccount("ann"), 1)
    state, out = _step().run(None, None, None, [rec])
    assert state is None and [r.topic for r in out] == [TOPICS.dead_letters]
    state, out = _step().run("no.such.Aggregate", "acc-1", None, [rec])
    assert state is None
    assert sorted(r.topic for r in out) == sorted([TOPICS.dead_letters, TOPICS.results])


def test_a_rerun_writes_byte_identical_records() -> None:
    records = [_record(OpenAccount("ann"), 1), _record(Deposit(5), 2), _record(Explode(), 3)]
    first = _step().run("example.bank.Account", "acc-1", None, records)
    again = _step().run("example.bank.Account", "acc-1", None, list(reversed(records)))
    assert first == again


def test_an_accepted_result_written_from_its_fields_is_the_result_object_encoded() -> None:
    """The step writes an accepted command's result from its fields (no CommandResult object):
    the same records and state as through the object and the codec's encode."""
    records = [_record(OpenAccount("ann"), 1), _record(Deposit(5), 2), _record(Deposit(7), 3),
               _record(Withdraw(1_000), 4), _record(Explode(), 5)]
    plain = _step()
    plain._write_result = None  # the path through CommandResult
    assert _step()._write_result is not None
    assert _step().run("example.bank.Account", "acc-1", None, records) == \
        plain.run("example.bank.Account", "acc-1", None, records)


def test_state_round_trips_through_the_codec() -> None:
    state, _ = _step().run("example.bank.Account", "acc-1", None, [_record(OpenAccount("ann"), 1)])
    step = _step()
    assert step.load_state(step.dump_state(state)) == state
    assert step.load_state(None) == AggregateRecord()


def test_packed_dedup_memory_round_trips_and_trims_like_the_policy() -> None:
    from cqrs.results import SeenCommand, kept_indices

    seen = [SeenCommand(f"c{i}", 1000 * i, bytes([i]) * (i + 1)) for i in range(6)]
    record = AggregateRecord.of(3, False, b"s", seen[:4])
    assert record.seen == seen[:4] and record.seen_command_ids() == ["c0", "c1", "c2", "c3"]
    assert APP.codec.decode(APP.codec.encode(record)) == record
    nxt = record.remember(5, False, b"t", seen[4:], window_ms=3000, max_count=3)
    assert nxt.seen == [seen[i] for i in kept_indices([s.timestamp_ms for s in seen], 3000, 3)]
    assert [s.command_id for s in nxt.seen] == ["c3", "c4", "c5"]
    assert (nxt.version, nxt.snapshot) == (5, b"t")


def test_command_ids_with_nul_are_refused_at_the_client() -> None:
    from cqrs.errors import MalformedHeaderError

    with pytest.raises(MalformedHeaderError, match="NUL"):
        encode_command(APP, "acc-1", Deposit(1), command_id="a\0b")


def test_commands_in_the_older_header_form_are_processed_alike() -> None:
    new = _record(Deposit(5), 2, command_id="d1")
    env, payload = from_kafka(new.key, new.value, new.headers)
    key, value, headers = to_kafka(attrs.evolve(env, kind="event"), payload)  # header form...
    headers = [(k, b"command" if k == "cqrs.kind" else v) for k, v in headers]  # ...of a command
    legacy = InputRecord(key, value, headers, 0, 2, TOPICS.commands)
    outs = [_step().run("example.bank.Account", "acc-1", None, [_record(OpenAccount("ann"), 1), rec])[1]
            for rec in (new, legacy)]
    assert outs[0] == outs[1]  # byte-identical events and results


def test_a_transient_failure_is_not_answered_until_its_attempts_are_used_up() -> None:
    from cqrs.app import App
    from cqrs.retries import ATTEMPT_HEADER, Backoff, RetryPolicy
    from cqrs.testing.example import AccountHandler

    app = App("step-retry", aggregates=[Account], handlers=[AccountHandler],
              retries=RetryPolicy(transient=[LookupError, RuntimeError], default=Backoff(max_attempts=3)))
    step = AggregateStep(app, app.codec, TOPICS)
    opened, _ = step.run("example.bank.Account", "acc-1", None, [_record(OpenAccount("ann"), 1)])

    def attempt(n: int | None, offset: int) -> tuple[AggregateRecord | None, list[OutputRecord]]:
        rec = _record(Explode("flaky"), offset, command_id="x1")
        extra = [] if n is None else [(ATTEMPT_HEADER, str(n).encode())]
        rec = InputRecord(rec.key, rec.value, [*rec.headers, *extra], 0, offset, TOPICS.commands)
        return step.run("example.bank.Account", "acc-1", opened, [rec])

    for n, offset in ((None, 2), (2, 3)):
        state, out = attempt(n, offset)
        assert state is None  # nothing remembered: the same id runs again
        (dead,) = out  # a dead letter and no result: the sender keeps waiting
        headers = dict(dead.headers)
        assert dead.topic == TOPICS.dead_letters
        assert (headers["cqrs.dlq.transient"], headers["cqrs.dlq.attempt"], headers["cqrs.dlq.final"]) == (
            b"1", str(n or 1).encode(), b"0")
    state, out = attempt(3, 4)  # the last attempt: its failure is the answer, and remembered
    assert [r.topic for r in out] == [TOPICS.dead_letters, TOPICS.results]
    assert dict(out[0].headers)["cqrs.dlq.final"] == b"1"
    assert _results(out)[0].status == "failed" and state is not None
    assert state.seen_command_ids() == ["c1", "x1"]


def test_a_failure_the_app_does_not_declare_transient_is_answered_at_once() -> None:
    state, out = _step().run("example.bank.Account", "acc-1", None,
                             [_record(OpenAccount("ann"), 1), _record(Explode("bug"), 2)])
    dead = [r for r in out if r.topic == TOPICS.dead_letters]
    assert "cqrs.dlq.transient" not in dict(dead[0].headers)
    assert [r.status for r in _results(out)] == ["accepted", "failed"]


def test_a_result_record_is_its_command_id_and_value_alone() -> None:
    """No headers (each costs the producer and the broker per record): readers count and
    group by the first fields of the value, and the slice counts by ``status``."""
    from cqrs.results import result_head

    _, out = _step().run("example.bank.Account", "acc-1", None, [
        _record(OpenAccount("ann"), 1), _record(Withdraw(10**6), 2), _record(Explode("x"), 3)])
    results = [r for r in out if r.topic == TOPICS.results]
    assert [r.headers for r in results] == [[], [], []]
    assert [r.status for r in results] == ["accepted", "rejected", "failed"]
    heads = [result_head(r.value) for r in results]
    assert [(h.status, h.aggregate_type, h.aggregate_id, h.command_id.encode())
            for h in heads if h is not None] == [
        (r.status, "example.bank.Account", "acc-1", r.key) for r in results]


# ---- limits: outputs over Kafka's record limit, keys over Cassandra's ---------------------------


@command(name="limits.Write")
class Write:
    text: str


@command(name="limits.Blow")
class Blow:
    """Write ``n`` bytes: a small command with a large event."""

    n: int


@command(name="limits.Tick")
class Tick:
    n: int


@command(name="limits.Crash")
class Crash:
    text: str


@command(name="limits.Refuse")
class Refuse:
    text: str


@command(name="limits.WriteLater")
class WriteLater:
    """Write "x" now and ``text`` in a minute (a deadline whose command is as large as text)."""

    text: str


@event(name="limits.Written")
class Written:
    text: str


@event(name="limits.Ticked")
class Ticked:
    i: int


class Pad(Aggregate, name="limits.Pad"):
    chars: int = 0
    ticks: int = 0

    def apply_written(self, e: Written) -> None:
        self.chars += len(e.text)

    def apply_ticked(self, e: Ticked) -> None:
        self.ticks += 1


class PadHandler(CommandHandler[Pad]):
    def write(self, pad: Pad, cmd: Write) -> list[Event]:
        return [Written(cmd.text)]

    def blow(self, pad: Pad, cmd: Blow) -> list[Event]:
        return [Written("b" * cmd.n)]

    def tick(self, pad: Pad, cmd: Tick) -> list[Event]:
        return [Ticked(i) for i in range(cmd.n)]

    def write_later(self, pad: Pad, cmd: WriteLater) -> list[Any]:
        return [Written("x"), Schedule(Write(cmd.text), after=dt.timedelta(minutes=1))]

    def crash(self, pad: Pad, cmd: Crash) -> list[Event]:
        raise RuntimeError(cmd.text)

    def refuse(self, pad: Pad, cmd: Refuse) -> list[Event]:
        raise Rejected(cmd.text, code="refused")


LIMITS_APP = App("limits", aggregates=[Pad], handlers=[PadHandler])
LIMIT = 4_000  # bytes: a small record limit, so the tests build small records
PAD = "limits.Pad"


def _pad_record(command: object, offset: int, app: App = LIMITS_APP, aggregate_id: str = "pad-1",
                cid: str | None = None) -> InputRecord:
    _, key, value, headers = encode_command(app, aggregate_id, command,
                                            command_id=cid or f"c{offset}", timestamp=T0,
                                            max_record_bytes=100 * LIMIT)  # the client lets them by
    return InputRecord(key, value, headers, 0, offset, TOPICS.commands)


def _limited(app: App = LIMITS_APP, limit: int = LIMIT) -> AggregateStep:
    return AggregateStep(app, app.codec, TOPICS, max_record_bytes=limit)


def _by_topic(out: list[OutputRecord], topic: str) -> list[OutputRecord]:
    return [r for r in out if r.topic == topic]


def _fits(out: list[OutputRecord], limit: int = LIMIT) -> None:
    sizes = [record_size(r.key, r.value, r.headers) for r in out]
    assert max(sizes, default=0) <= limit, sizes


def test_a_command_whose_event_is_over_the_record_limit_fails_and_writes_nothing() -> None:
    state, out = _limited().run(PAD, "pad-1", None, [
        _pad_record(Write("ok"), 1), _pad_record(Blow(LIMIT), 2), _pad_record(Write("after"), 3)])
    _fits(out)
    results = [LIMITS_APP.codec.decode(r.value) for r in _by_topic(out, TOPICS.results)]
    assert [(r.status, r.version) for r in results] == [("accepted", 1), ("failed", 1), ("accepted", 2)]
    failed = results[1]
    assert failed.error_type == "RecordTooLargeError"
    for part in ("'c2'", "limits.Written (version 2, event 1 of 1)", "4,000 bytes",
                 "message.max.bytes", "make the event smaller"):
        assert part in (failed.message or ""), failed.message
    # the events of the commands that fit, versions 1 and 2: "after" was decided on the state
    # before the command that did not fit
    events = _by_topic(out, TOPICS.events)
    assert [LIMITS_APP.codec.decode(e.value) for e in events] == [Written("ok"), Written("after")]
    assert [dict(e.headers)["cqrs.version"] for e in events] == [b"1", b"2"]
    (dead,) = _by_topic(out, TOPICS.dead_letters)
    headers = dict(dead.headers)
    assert (headers["cqrs.dlq.stage"], headers["cqrs.dlq.error_type"]) == (b"output", b"RecordTooLargeError")
    assert dead.value == _pad_record(Blow(LIMIT), 2).value  # the command, whole: it fits
    assert state is not None and state.version == 2
    assert LIMITS_APP.codec.decode(state.snapshot).chars == len("okafter")
    assert state.seen_command_ids() == ["c1", "c2", "c3"]  # a resend gets the same answer
    _, again = _limited().run(PAD, "pad-1", state, [_pad_record(Blow(LIMIT), 9, cid="c2")])
    assert [r.value for r in again] == [r.value for r in _by_topic(out, TOPICS.results)[1:2]]


def test_a_command_whose_deadline_is_over_the_record_limit_fails_and_writes_nothing() -> None:
    """The deadline's command is stored to be sent later: one over the record limit could never
    be sent (the scheduler would fail on it every round), so its command fails now."""
    result = _limited().apply(PAD, "pad-1", None, [
        _pad_record(WriteLater("small"), 1), _pad_record(WriteLater("b" * LIMIT), 2),
        _pad_record(Write("after"), 3)])
    _fits(result.out)
    results = [LIMITS_APP.codec.decode(r.value) for r in _by_topic(result.out, TOPICS.results)]
    assert [(r.status, r.version) for r in results] == [("accepted", 1), ("failed", 1), ("accepted", 2)]
    assert results[1].error_type == "RecordTooLargeError"
    assert "deadline 'limits.Write'" in (results[1].message or "") and "4,000 bytes" in results[1].message
    assert [LIMITS_APP.codec.decode(e.value) for e in _by_topic(result.out, TOPICS.events)] == [
        Written("x"), Written("after")]
    (kept,) = result.deadlines  # the first command's: the second's is not stored
    _, payload = from_kafka(kept.key, kept.value, [])
    assert LIMITS_APP.codec.decode(payload) == Write("small") and kept.due_ms is not None


def test_a_command_whose_result_is_over_the_record_limit_fails_and_writes_nothing() -> None:
    """200 events fit one by one; the result listing their 200 ids (37 bytes each) does not."""
    state, out = _limited().run(PAD, "pad-1", None, [_pad_record(Tick(200), 1), _pad_record(Tick(3), 2)])
    _fits(out)
    results = [LIMITS_APP.codec.decode(r.value) for r in _by_topic(out, TOPICS.results)]
    assert [(r.status, r.version) for r in results] == [("failed", 0), ("accepted", 3)]
    assert "its result (accepted with 200 events)" in (results[0].message or "")
    assert "return fewer events" in (results[0].message or "")
    assert [LIMITS_APP.codec.decode(e.value) for e in _by_topic(out, TOPICS.events)] == [
        Ticked(0), Ticked(1), Ticked(2)]
    assert state is not None and state.version == 3


def test_a_rejection_whose_result_is_over_the_limit_fails_and_a_crash_is_cut_to_fit() -> None:
    huge = "why " * LIMIT
    state, out = _limited().run(PAD, "pad-1", None, [
        _pad_record(Refuse(huge), 1), _pad_record(Crash(huge), 2), _pad_record(Write("ok"), 3)])
    _fits(out)
    refused, crashed, ok = [LIMITS_APP.codec.decode(r.value) for r in _by_topic(out, TOPICS.results)]
    assert (refused.status, refused.error_type) == ("failed", "RecordTooLargeError")
    assert "its result (rejected, its reason 16,000 bytes)" in (refused.message or "")
    # a crash keeps its answer, its message cut (with its size) so that the result fits
    assert (crashed.status, crashed.error_type) == ("failed", "RuntimeError")
    assert crashed.message.startswith("why why") and "16,000 bytes in all" in crashed.message
    assert (ok.status, ok.version) == ("accepted", 1)
    stages = [dict(d.headers)["cqrs.dlq.stage"] for d in _by_topic(out, TOPICS.dead_letters)]
    assert stages == [b"output", b"handler"]
    assert state is not None and state.version == 1


def test_a_dead_letter_over_the_record_limit_is_cut_with_its_original_size() -> None:
    command = Crash("c" * (LIMIT - 150))  # its record fits; with the dead letter's headers, not
    rec = _pad_record(command, 1)
    assert record_size(rec.key, rec.value, rec.headers) <= LIMIT
    state, out = _limited().run(PAD, "pad-1", None, [rec])
    _fits(out)
    (dead,) = _by_topic(out, TOPICS.dead_letters)
    headers = dict(dead.headers)
    assert headers["cqrs.dlq.value_size"] == str(len(rec.value)).encode()
    assert rec.value.startswith(dead.value) and len(dead.value) < len(rec.value)  # its beginning
    assert (dead.key, headers["cqrs.dlq.stage"], headers["cqrs.dlq.error_type"]) == (
        b"pad-1", b"handler", b"RuntimeError")
    (result,) = [LIMITS_APP.codec.decode(r.value) for r in _by_topic(out, TOPICS.results)]
    assert (result.status, result.error_type) == ("failed", "RuntimeError")


def test_a_transient_failure_whose_dead_letter_is_cut_is_answered_at_once() -> None:
    """The retry job could not deliver a cut command again: the failure is final (parked)."""
    app = App("limits-retry", aggregates=[Pad], handlers=[PadHandler],
              retries=RetryPolicy(transient=[RuntimeError]))
    state, out = _limited(app).run(PAD, "pad-1", None, [
        _pad_record(Crash("small"), 1, app), _pad_record(Crash("c" * (LIMIT - 150)), 2, app)])
    _fits(out)
    letters = [dict(d.headers) for d in _by_topic(out, TOPICS.dead_letters)]
    assert [(h["cqrs.dlq.final"], "cqrs.dlq.value_size" in h) for h in letters] == [
        (b"0", False), (b"1", True)]
    assert [r.key for r in _by_topic(out, TOPICS.results)] == [b"c2"]  # only the cut one answered


def test_an_aggregate_id_whose_state_key_is_over_cassandras_limit_is_a_dead_letter() -> None:
    at_limit = "k" * (MAX_STATE_KEY_BYTES - len(PAD))
    state, out = _limited(limit=200_000).run(PAD, at_limit, None, [
        _pad_record(Write("x"), 1, aggregate_id=at_limit)])
    assert [r.status for r in out if r.topic == TOPICS.results] == ["accepted"]
    assert state is not None and state.version == 1

    over = at_limit[1:] + "é"  # one character more, two bytes of UTF-8: one byte over
    records = [InputRecord(over.encode(), r.value, r.headers, 0, 1, TOPICS.commands)
               for r in [_pad_record(Write("x"), 1, aggregate_id="short")]]
    state, out = _limited(limit=200_000).run(PAD, over, None, records)
    assert state is None  # no state row
    (dead,) = _by_topic(out, TOPICS.dead_letters)
    headers = dict(dead.headers)
    assert (headers["cqrs.dlq.stage"], headers["cqrs.dlq.error_type"]) == (b"envelope", b"MalformedHeaderError")
    assert b"65,536-byte key" in headers["cqrs.dlq.error"] and b"65,525 bytes" in headers["cqrs.dlq.error"]
    (result,) = [LIMITS_APP.codec.decode(r.value) for r in _by_topic(out, TOPICS.results)]
    assert (result.status, result.error_type) == ("failed", "MalformedHeaderError")  # no one waits


def test_a_repeated_command_after_a_transient_failure_in_the_same_batch_is_not_answered() -> None:
    """Both copies wait for the retry job (the first has no answer to repeat yet)."""
    app = App("limits-retry", aggregates=[Pad], handlers=[PadHandler],
              retries=RetryPolicy(transient=[RuntimeError]))
    state, out = _limited(app).run(PAD, "pad-1", None, [
        _pad_record(Crash("flaky"), 1, app, cid="x"), _pad_record(Crash("flaky"), 2, app, cid="x")])
    assert [r.topic for r in out] == [TOPICS.dead_letters] and state is None


_COMMANDS = st.one_of(
    st.builds(Write, st.integers(0, 2 * LIMIT).map(lambda n: "w" * n)),
    st.builds(Blow, st.integers(0, 2 * LIMIT)),
    st.builds(Tick, st.integers(0, 150)),
    st.builds(Crash, st.integers(0, 2 * LIMIT).map(lambda n: "c" * n)),
    st.builds(Refuse, st.integers(0, 2 * LIMIT).map(lambda n: "r" * n)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_COMMANDS, max_size=8))
def test_every_output_fits_and_what_fits_is_decided_as_if_the_rest_had_not_been_sent(
    commands: list[object],
) -> None:
    """Under the limit: every record fits, every command has one answer, the event log has no
    gap, and the commands that were not refused for size get exactly the events and answers
    they get when sent alone under no limit (the refused ones changed nothing)."""
    records = [_pad_record(c, i + 1) for i, c in enumerate(commands)]
    state, out = _limited().run(PAD, "pad-1", None, records)
    _fits(out)
    results = {r.command_id: r for r in (LIMITS_APP.codec.decode(o.value)
                                         for o in _by_topic(out, TOPICS.results))}
    assert sorted(results) == sorted(f"c{i + 1}" for i in range(len(commands)))
    events = _by_topic(out, TOPICS.events)
    assert [int(dict(e.headers)["cqrs.version"]) for e in events] == list(range(1, len(events) + 1))
    assert (state.version if state is not None else 0) == len(events)
    kept = [r for r in records if results[f"c{r.offset}"].error_type != "RecordTooLargeError"]
    _, alone = _limited(limit=100 * LIMIT).run(PAD, "pad-1", None, kept)
    assert [e.value for e in _by_topic(alone, TOPICS.events)] == [e.value for e in events]
    answers = [LIMITS_APP.codec.decode(r.value) for r in _by_topic(alone, TOPICS.results)]
    assert [(a.command_id, a.status, a.version, a.error_type) for a in answers] == [
        (a.command_id, a.status, a.version, a.error_type) for a in results.values()
        if a.error_type != "RecordTooLargeError"]
    _, rerun = _limited().run(PAD, "pad-1", None, records)  # a re-run writes the same bytes
    assert rerun == out
