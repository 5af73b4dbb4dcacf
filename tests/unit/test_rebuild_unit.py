"""The rebuild's per-aggregate fold and offsets, without Spark or Kafka: the processor's own step
produces the events and results, the fold must give back the step's record."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pandas as pd
import attrs
import pytest

from cqrs.cli.main import build_parser
from cqrs.cli.state_cmd import state_as_json
from cqrs.client import encode_command
from cqrs.config import CqrsConfig
from cqrs.envelope import from_kafka
from cqrs.errors import ReplayError
from cqrs.processor import workers
from cqrs.processor.workers import ProcessorOptions
from cqrs.processor.partition import Worker
from cqrs.processor.rebuild import EVENT, RESULT, _fold_group, starting_offsets_json
from cqrs.processor.state import AggregateState
from cqrs.processor.step import AggregateStep, DedupPolicy, InputRecord, OutputRecord
from cqrs.results import AggregateRecord
from cqrs.testing.example import (
    Account, CloseAccount, Deposit, Explode, OpenAccount, Withdraw,
)
from cqrs.testing.example_app import app
from cqrs.topics import topics_for

TOPICS = topics_for("unit-rebuild")
ACCOUNT = "example.bank.Account"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture
def opts() -> Iterator[tuple[CqrsConfig, ProcessorOptions, AggregateStep]]:
    """The fold's step (normally built on the executor) with the app's in-memory codec."""
    cfg = CqrsConfig()
    options = ProcessorOptions("cqrs.testing.example_app:app", topics=TOPICS,
                               dedup=DedupPolicy(window_ms=10_000, max_per_aggregate=3))
    step = AggregateStep(app, app.codec, TOPICS, options.dedup)
    key = workers.config_key(cfg, options, False)  # the key step_for looks it up by
    workers._WORKERS[key] = Worker(cfg, step, None, 0, None)  # type: ignore[arg-type]  # noqa: SLF001
    try:
        yield cfg, options, step
    finally:
        workers._WORKERS.pop(key, None)  # noqa: SLF001


def _run(step: AggregateStep, batches: list[list[tuple[object, str]]], agg: str = "acc-1",
         ) -> tuple[AggregateRecord | None, list[OutputRecord]]:
    """Feed batches of (command, command id) to the step like the processor does."""
    state: AggregateRecord | None = None
    out: list[OutputRecord] = []
    offset = 0
    for batch in batches:
        records = []
        for cmd, cid in batch:
            _, key, value, headers = encode_command(
                app, agg, cmd, command_id=cid, timestamp=T0 + dt.timedelta(seconds=offset))
            records.append(InputRecord(key, value, headers, 2, offset, TOPICS.commands))
            offset += 1
        new, written = step.run(ACCOUNT, agg, state, records)
        state = new if new is not None else state
        out.extend(written)
    return state, out


def _rows(out: list[OutputRecord]) -> pd.DataFrame:
    rows = []
    for i, rec in enumerate(out):
        if rec.topic == TOPICS.events:
            env, _ = from_kafka(rec.key, rec.value, rec.headers)
            rows.append((EVENT, ACCOUNT, "acc-1", env.version, rec.value, 0, i))
        elif rec.topic == TOPICS.results:
            rows.append((RESULT, ACCOUNT, "acc-1", -1, rec.value, 1, i))
    return pd.DataFrame(rows, columns=["kind", "aggregate_type", "aggregate_id", "version",
                                       "value", "partition", "offset"])


def test_fold_gives_back_the_processors_record(opts: tuple) -> None:
    cfg, options, step = opts
    state, out = _run(step, [
        [(OpenAccount("ann"), "a"), (Deposit(10), "b"), (Withdraw(99), "c")],
        [(Deposit(5), "d"), (Deposit(5), "d"), (Explode("x"), "e")],  # duplicate id, crash
        [(Withdraw(3), "f")],
    ])
    assert state is not None
    row = _fold_group(cfg, options)((ACCOUNT, "acc-1"), _rows(out)).iloc[0]
    assert bytes(row["record"]) == step.dump_state(state)  # byte for byte
    rebuilt = app.codec.decode(bytes(row["record"]))
    assert rebuilt.version == 4 and [s.command_id for s in rebuilt.seen] == ["d", "e", "f"]
    assert app.codec.decode(rebuilt.snapshot) == Account(owner="ann", is_open=True, balance=12)
    assert (row["version"], row["deleted"], row["events"]) == (4, False, 4)
    assert list(row["source_partitions"]) == [2] and list(row["source_offsets"]) == [6]


def test_fold_drops_rewritten_events_and_keeps_deletions(opts: tuple) -> None:
    cfg, options, step = opts
    state, out = _run(step, [[(OpenAccount("bo"), "a"), (Deposit(4), "b"), (CloseAccount(), "c")]])
    rows = _rows(out)
    doubled = pd.concat([rows, rows[rows["kind"] == EVENT]], ignore_index=True)  # at-least-once
    row = _fold_group(cfg, options)((ACCOUNT, "acc-1"), doubled).iloc[0]
    assert state is not None and bytes(row["record"]) == step.dump_state(state)
    assert (row["version"], row["deleted"]) == (4, True)


def test_fold_refuses_a_gap_in_the_versions(opts: tuple) -> None:
    cfg, options, step = opts
    _, out = _run(step, [[(OpenAccount("bo"), "a"), (Deposit(4), "b"), (Deposit(5), "c")]])
    rows = _rows(out)
    rows = rows[~((rows["kind"] == EVENT) & (rows["version"] == 2))]
    with pytest.raises(ReplayError, match="jump from version 1 to 3"):
        _fold_group(cfg, options)((ACCOUNT, "acc-1"), rows)


def test_results_only_aggregate_keeps_its_dedup_memory(opts: tuple) -> None:
    cfg, options, step = opts
    state, out = _run(step, [[(Deposit(1), "z")]])  # rejected: not open
    row = _fold_group(cfg, options)((ACCOUNT, "acc-1"), _rows(out)).iloc[0]
    assert state is not None and bytes(row["record"]) == step.dump_state(state)
    assert row["version"] == 0 and row["events"] == 0


def test_starting_offsets_follow_the_last_answered_command() -> None:
    text = starting_offsets_json("t.commands", [0, 1, 2], {0: 9, 2: 0})
    assert json.loads(text) == {"t.commands": {"0": 10, "1": -2, "2": 1}}


def test_cli_registers_state_get_and_rebuild_state() -> None:
    parser = build_parser()
    args = parser.parse_args(["state", "get", "m:app", "acc-1", "--type", "T", "--version", "3"])
    assert (args.aggregate_id, args.aggregate_type, args.min_version) == ("acc-1", "T", 3)
    assert callable(args.run)
    args = parser.parse_args(["rebuild-state", "m:app", "--checkpoint", "/ck/new",
                              "--generation", "4"])
    assert (args.checkpoint, args.generation) == ("/ck/new", 4) and callable(args.run)
    printed = json.loads(state_as_json(
        AggregateState(ACCOUNT, "acc-1", 2, False, Account(owner="ann", is_open=True, balance=5), ("a", "b"))))
    assert printed["state"] == {"owner": "ann", "is_open": True, "balance": 5}
    assert printed["seen_command_ids"] == ["a", "b"]


def test_state_get_prints_values_as_the_http_service_does() -> None:
    import datetime as dt
    import enum

    from cqrs.client.json_commands import to_jsonable

    class Tier(enum.Enum):
        GOLD = "gold"

    @attrs.define
    class Member:
        tier: Tier = Tier.GOLD
        since: dt.datetime = dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.timezone.utc)
        photo: bytes = b"\x00\x01"

    state = AggregateState(ACCOUNT, "m-1", 1, False, Member(), ())
    printed = json.loads(state_as_json(state))
    assert printed == json.loads(json.dumps(to_jsonable(state)))  # the same JSON as GET /aggregates
    assert printed["state"]["tier"] == "GOLD" and printed["state"]["since"].startswith("2026-01-02T03:04")
