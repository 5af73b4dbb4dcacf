"""One slow or hung handler holds up its own aggregate only (cqrs.processor.lanes), on the real
Kafka and Cassandra without Spark: a processor task's commands, all on one partition, some to
an aggregate whose handler sleeps or spins, the others quick."""

from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from cqrs.client import encode_command
from cqrs.config import CqrsConfig
from cqrs.deadletters import parse_dead_letter
from cqrs.envelope import from_kafka
from cqrs.kafka_io import make_producer, read_to_end, watermarks
from cqrs.processor.workers import worker_for
from cqrs.processor.partition import Worker, process_slice, run_task
from cqrs.processor.state_table import HELD_MARK, open_state_table
from cqrs.results import CommandResult
from cqrs.topics import AppTopics

sys.path.insert(0, str(Path(__file__).parent / "apps"))
from bank_worker import processor_options  # noqa: E402
from slow_app import Spin, Tick, Work, app  # noqa: E402

pytestmark = pytest.mark.integration

SLOW_S, BUDGET_S = 0.2, 1.5


@attrs.define
class Fixture:
    cfg: CqrsConfig
    topics: AppTopics
    worker: Worker
    t0: float = 0.0

    def send(self, *commands: tuple[str, object, str]) -> int:
        """(aggregate, command, command id) onto partition 0; its end offset afterwards."""
        producer = make_producer(self.cfg)
        for agg, cmd, cid in commands:
            _, key, value, headers = encode_command(app, agg, cmd, command_id=cid)
            producer.produce(self.topics.commands, value, key, 0, headers=headers)
        assert producer.flush(30) == 0
        self.t0 = time.time()
        return watermarks(self.cfg, self.topics.commands)[0][1]

    def results(self) -> dict[str, list[tuple[CommandResult, float]]]:
        """Every answer per command id, with when it was written (s after the last send)."""
        out: dict[str, list[tuple[CommandResult, float]]] = defaultdict(list)
        for r in read_to_end(self.cfg, [self.topics.results]):
            result = app.codec.decode(r.value)
            out[result.command_id].append((result, r.timestamp_ms / 1000 - self.t0))
        return out

    def events(self, agg: str) -> list[int]:
        versions = []
        for r in read_to_end(self.cfg, [self.topics.events]):
            env, _ = from_kafka(r.key, r.value, r.headers)
            if env.aggregate_id == agg:
                versions.append(env.version)
        return versions

    def other_worker(self) -> Worker:
        mine = self.worker
        return Worker(self.cfg, mine.step, open_state_table(self.cfg, self.topics), mine.generation,
                      make_producer(self.cfg))


@pytest.fixture
def fx(cqrs_config: CqrsConfig, unique_name: str) -> Iterator[Fixture]:
    cfg = cqrs_config.with_overrides(processor={"slow_decision_s": SLOW_S,
                                                "decision_budget_s": BUDGET_S})
    opts = processor_options(cfg, unique_name, app, "slow_app:app")
    assert opts.topics is not None
    yield Fixture(cfg, opts.topics, worker_for(cfg, opts))


def test_a_slow_aggregate_holds_up_only_itself(fx: Fixture) -> None:
    """Three 1-second commands to one aggregate, interleaved with quick ones to others on the
    same partition: the others are answered before the slow one's first answer (not behind
    it), the slow one's in order, one a second."""
    sent = []
    for i in range(3):
        sent += [("slow", Work(1.0), f"w{i}"), (f"quick-{i}", Tick(i), f"q{i}")]
    end = fx.send(*sent)
    run_task(fx.worker, fx.topics.commands, {0: (0, end)}, time.monotonic() + 5.0)
    results = fx.results()
    assert sorted(results) == sorted(cid for _, _, cid in sent)
    assert all(len(v) == 1 for v in results.values()), "a command answered twice"
    quick = [results[f"q{i}"][0] for i in range(3)]
    assert all(r.status == "accepted" for r, _ in quick)
    slow = [results[f"w{i}"][0] for i in range(3)]
    # not behind the slow aggregate: every quick answer was written before its first answer,
    # which its 1-s handler holds back a second whatever the machine's speed (held up behind
    # it, q1 and q2 would come after w0 and w1)
    assert max(t for _, t in quick) < slow[0][1], (quick, slow)
    assert [(r.status, r.version) for r, _ in slow] == [("accepted", 1), ("accepted", 2), ("accepted", 3)]
    assert slow[2][1] >= 2.9  # one after the other, in order
    assert fx.events("slow") == [1, 2, 3]
    assert not fx.worker.lanes  # the lane emptied: the aggregate is back with the others


def test_a_hung_decision_is_answered_failed_at_the_budget_and_its_aggregate_goes_on(fx: Fixture) -> None:
    end = fx.send(("hung", Work(600.0), "h1"), ("hung", Tick(1), "h2"),
                  ("spinning", Spin(600.0), "s1"), ("spinning", Tick(1), "s2"),
                  ("other", Tick(1), "o1"), ("other", Tick(2), "o2"))
    run_task(fx.worker, fx.topics.commands, {0: (0, end)}, time.monotonic() + 5.0)
    results = fx.results()
    for cid in ("h1", "s1"):
        (result, at), = results[cid]
        assert (result.status, result.error_type) == ("failed", "DecisionTimeoutError"), result
        assert "past the processor's budget" in (result.message or "")
        # at its budget, not before (and answered by the time the 5-s task is over: not at the
        # default budget's 30 s nor after the handler's 600 s)
        assert BUDGET_S <= at, at
    for cid, version in (("h2", 1), ("s2", 1)):  # the aggregate goes on from its state before
        (result, _), = results[cid]
        assert (result.status, result.version) == ("accepted", version)
    assert [r.version for (r, t) in (results["o1"][0], results["o2"][0])] == [1, 2], results
    # not behind the hung ones: answered before either of them, whose answers wait their budget
    assert max(results["o2"][0][1], results["o1"][0][1]) < min(
        results[cid][0][1] for cid in ("h1", "s1")), results
    letters = [parse_dead_letter(r) for r in read_to_end(fx.cfg, [fx.topics.dead_letters])]
    assert sorted((d.command_id, d.error_type) for d in letters) == [
        ("h1", "DecisionTimeoutError"), ("s1", "DecisionTimeoutError")]
    time.sleep(0.5)  # the spinning thread was told to stop: it does at its next instruction
    assert not [t for t in threading.enumerate() if t.name.startswith("cqrs-lane-spinning")]


def test_a_lane_that_outlives_its_task_holds_the_position_for_whoever_serves_next(fx: Fixture) -> None:
    end = fx.send(("slow", Work(1.2), "w1"), ("slow", Tick(1), "w2"), ("quick", Tick(1), "q1"),
                  ("quick", Tick(2), "q2"))
    run_task(fx.worker, fx.topics.commands, {0: (0, end)}, time.monotonic() + 0.5)
    pos = fx.worker.table.positions(fx.worker.generation, fx.topics.commands)[0]
    assert (pos.next_offset, pos.writer) == (0, fx.worker.token + HELD_MARK)
    assert sorted(fx.results()) == ["q1", "q2"]  # the quick ones were answered
    # the next task runs in another worker: it starts at the held position, skips what was
    # applied (the quick ones) and decides the slow aggregate's commands itself
    other = fx.other_worker()
    run_task(other, fx.topics.commands, {0: (end, end)}, time.monotonic() + 3.5)
    results = fx.results()
    assert sorted(results) == ["q1", "q2", "w1", "w2"]
    assert all(len(v) == 1 for v in results.values()), results
    assert [results[c][0][0].version for c in ("w1", "w2")] == [1, 2], results
    assert fx.events("slow") == [1, 2] and fx.events("quick") == [1, 2]
    # the first worker's lane finished meanwhile; serving the partition again it finds the
    # position another worker's, drops the lane and writes nothing of it
    run_task(fx.worker, fx.topics.commands, {0: (end, end)}, time.monotonic() + 0.5)
    assert not fx.worker.lanes
    assert all(len(v) == 1 for v in fx.results().values())
    assert fx.events("slow") == [1, 2]


def test_a_lane_done_between_two_slices_is_written_before_what_the_next_one_decided(fx: Fixture) -> None:
    """A lane that finished after its task returned gives its state back to the next slice of
    its partition, which decides the aggregate's next command on it: the lane's event and row
    go to Kafka before that command's (a CI run under load once wrote version 160 of an
    aggregate set aside for a moment before its 159)."""
    def message(agg: str, cmd: object, cid: str, offset: int) -> tuple[bytes, bytes, list, int]:
        _, key, value, headers = encode_command(app, agg, cmd, command_id=cid)
        return key, value, list(headers or []), offset

    topic = fx.topics.commands
    process_slice(fx.worker, topic, 0, [message("slow", Work(0.6), "w1", 0)])
    assert fx.worker.lanes  # set aside, still deciding when its task's slice returned
    time.sleep(1.0)  # its decision done, collected by the next slice
    process_slice(fx.worker, topic, 0, [message("slow", Tick(1), "t1", 1)])
    assert not fx.worker.lanes
    results = fx.results()
    assert [results[c][0][0].version for c in ("w1", "t1")] == [1, 2], results
    assert fx.events("slow") == [1, 2]  # in the order of their versions


def test_a_slow_decision_on_a_state_kept_packed_is_set_aside_with_that_state(
        cqrs_config: CqrsConfig, unique_name: str) -> None:
    """No state kept decoded (``state_cache_aggregates`` 0): the aggregate's second command is
    decided on its packed row (natively, with the native module) and runs long. Its lane
    starts from that row's state and takes the decision made on it; the next command goes on
    from there: versions 1, 2, 3."""
    cfg = cqrs_config.with_overrides(processor={"slow_decision_s": SLOW_S,
                                                "decision_budget_s": BUDGET_S,
                                                "state_cache_aggregates": 0})
    opts = processor_options(cfg, unique_name, app, "slow_app:app")
    assert opts.topics is not None
    fx = Fixture(cfg, opts.topics, worker_for(cfg, opts))
    first = fx.send(("packed", Tick(1), "p1"))
    run_task(fx.worker, fx.topics.commands, {0: (0, first)}, time.monotonic() + 1.0)
    second = fx.send(("packed", Work(1.0), "p2"), ("quick", Tick(1), "q1"))  # p2 alone: one command
    run_task(fx.worker, fx.topics.commands, {0: (first, second)}, time.monotonic() + 3.0)
    end = fx.send(("packed", Tick(2), "p3"))
    run_task(fx.worker, fx.topics.commands, {0: (second, end)}, time.monotonic() + 1.0)
    results = fx.results()
    assert [(results[c][0][0].status, results[c][0][0].version) for c in ("p1", "p2", "p3")] == [
        ("accepted", 1), ("accepted", 2), ("accepted", 3)], results
    assert results["q1"][0][1] < results["p2"][0][1]  # not behind the slow one
    assert fx.events("packed") == [1, 2, 3]
    assert not fx.worker.lanes
