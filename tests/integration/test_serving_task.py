"""A processor task that serves, on the real Kafka and Cassandra without Spark: it goes on with
commands that arrive after its planned range, records how far it got, the next task starts
there, and a worker trusts its cached states only while the recorded position is its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import attrs
import pytest

from cqrs.client import encode_command
from cqrs.config import CqrsConfig
from cqrs.kafka_io import make_producer, read_to_end, watermarks
from cqrs.processor.workers import ProcessorOptions, worker_for
from cqrs.processor.partition import Worker, run_task
from cqrs.processor.state import StateReader
from cqrs.processor.state_table import Position, open_state_table
from cqrs.testing.example import Deposit, OpenAccount
from cqrs.testing.example_app import app
from bank_worker import bank_options
from cqrs.topics import AppTopics

pytestmark = pytest.mark.integration


@attrs.define
class Fixture:
    cfg: CqrsConfig
    topics: AppTopics
    worker: Worker
    opts: ProcessorOptions

    def send(self, *commands: tuple[str, object]) -> int:
        """Commands onto partition 0 of the commands topic; its end offset afterwards."""
        producer = make_producer(self.cfg)
        for agg, cmd in commands:
            _, key, value, headers = encode_command(app, agg, cmd)
            producer.produce(self.topics.commands, value, key, 0, headers=headers)
        assert producer.flush(30) == 0
        return self.end()

    def end(self) -> int:
        return watermarks(self.cfg, self.topics.commands)[0][1]

    def other_worker(self) -> Worker:
        """A second worker process's worker: same table and step, its own token and cache."""
        mine = self.worker
        return Worker(self.cfg, mine.step, open_state_table(self.cfg, self.topics), mine.generation,
                      make_producer(self.cfg, **{"on_delivery": lambda *_: None}))

    def position(self) -> Position:
        return self.worker.table.positions(self.worker.generation, self.topics.commands)[0]


@pytest.fixture
def fx(cqrs_config: CqrsConfig, unique_name: str) -> Iterator[Fixture]:
    opts = bank_options(cqrs_config, unique_name)
    yield Fixture(cqrs_config, opts.topics, worker_for(cqrs_config, opts), opts)


def _balance(fx: Fixture, agg: str) -> tuple[int, int]:
    with StateReader(app, fx.cfg, topics=fx.topics) as reader:
        s = reader.get(agg)
    assert s is not None
    return s.version, s.state.balance


def test_a_serving_task_goes_on_past_its_range_and_the_next_starts_where_it_got(fx: Fixture) -> None:
    planned = fx.send(("acc-1", OpenAccount("ann")), ("acc-1", Deposit(1)))
    later = threading.Timer(0.5, lambda: fx.send(("acc-1", Deposit(2)), ("acc-1", Deposit(3))))
    later.start()
    started = time.monotonic()
    served = run_task(fx.worker, fx.topics.commands, {0: (0, planned)}, time.monotonic() + 2.0)
    later.join()
    assert time.monotonic() - started >= 2.0  # it served until its time was up
    assert (served.commands, served.accepted, served.skipped) == (4, 4, 0)
    pos = fx.position()  # bridged: the worker serves on until the next task takes over
    assert (pos.next_offset, pos.owner) == (4, fx.worker.token) and pos.lease_until is not None
    assert _balance(fx, "acc-1") == (4, 6)

    # the next micro-batch plans (2, 4): those were served already, so nothing is re-read
    again = run_task(fx.worker, fx.topics.commands, {0: (planned, fx.end())})
    assert (again.commands, again.records) == (0, 0)
    assert fx.position() == Position(4, fx.worker.token)  # the bridge ended: a plain position

    # the same worker goes on from its cache
    end = fx.send(("acc-1", Deposit(4)))
    cached = run_task(fx.worker, fx.topics.commands, {0: (4, end)})
    assert (cached.commands, cached.cache_hits, cached.state_reads) == (1, 1, 0)
    assert fx.position() == Position(5, fx.worker.token)
    events = read_to_end(fx.cfg, [fx.topics.events])
    assert len(events) == 5  # each command's event once, nothing re-emitted


def test_a_worker_trusts_its_cache_only_while_the_position_is_its_own(fx: Fixture) -> None:
    end = fx.send(("acc-1", OpenAccount("ann")), ("acc-1", Deposit(1)))
    run_task(fx.worker, fx.topics.commands, {0: (0, end)})
    other = fx.other_worker()
    try:
        # another worker process gets the next task: it reads the state from Cassandra
        end2 = fx.send(("acc-1", Deposit(2)))
        theirs = run_task(other, fx.topics.commands, {0: (end, end2)})
        assert (theirs.commands, theirs.cache_hits, theirs.state_reads) == (1, 0, 1)
        assert fx.position() == Position(3, other.token)
        # back on the first worker, whose cache stopped at offset 2: it must not be used
        # (acc-1 is at version 3 now, not 2)
        end3 = fx.send(("acc-1", Deposit(3)))
        mine = run_task(fx.worker, fx.topics.commands, {0: (end2, end3)})
        assert (mine.commands, mine.cache_hits, mine.state_reads, mine.accepted) == (1, 0, 1, 1)
    finally:
        other.table.close()
    assert _balance(fx, "acc-1") == (4, 6)
    assert len(read_to_end(fx.cfg, [fx.topics.events])) == 4  # each command's event once


def test_a_task_without_serving_stops_at_its_planned_end(fx: Fixture) -> None:
    end = fx.send(("acc-1", OpenAccount("ann")), ("acc-1", Deposit(1)))
    fx.send(("acc-1", Deposit(2)))  # beyond the planned range
    stats = run_task(fx.worker, fx.topics.commands, {0: (0, end)})
    assert (stats.commands, stats.accepted) == (2, 2)
    assert fx.position() == Position(end, fx.worker.token)
    assert _balance(fx, "acc-1") == (2, 1)


def test_each_task_of_a_batch_takes_its_own_share_the_one_its_worker_wrote_first(fx: Fixture) -> None:
    from cqrs.processor.source import Slices, claim_share

    table, gen, topic = fx.worker.table, fx.worker.generation, fx.topics.commands
    other = fx.other_worker()
    shares: list[dict[int, tuple[int, int]]] = [{0: (0, 0), 2: (0, 0)}, {1: (0, 0), 3: (0, 0)}]
    # the last batch: this worker ran the second share, the other worker the first
    table.write_positions(gen, topic, {0: Position(0, other.token), 2: Position(0, other.token),
                                       1: Position(0, fx.worker.token), 3: Position(0, fx.worker.token)})
    positions = table.positions(gen, topic)
    tasks = [Slices(share, None, "plan-a", i, shares) for i, share in enumerate(shares)]
    # Spark hands task 0 to this worker and task 1 to the other: each takes what it wrote
    assert claim_share(fx.worker, tasks[0], positions) == shares[1]
    assert claim_share(other, tasks[1], positions) == shares[0]
    # a retry of a task takes the share that task holds, whatever its worker wrote
    assert claim_share(other, tasks[0], positions) == shares[1]
    assert table.claims(gen, "plan-a", 2) == {1: 0, 0: 1}


@pytest.mark.parametrize("attempt", [None, 0], ids=["retried", "first-attempt"])
def test_tasks_that_claim_at_once_never_take_the_same_share(fx: Fixture, attempt: int | None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Retried tasks read the claims first; first attempts go straight to the transactions."""
    import cqrs.processor.source as source
    from cqrs.processor.source import Slices, claim_share

    monkeypatch.setattr(source, "_attempt", lambda: attempt)

    shares: list[dict[int, tuple[int, int]]] = [{p: (0, 0)} for p in range(4)]
    # every task prefers share 0 (its worker wrote partition 0's position): one gets it, the
    # others fall back to a free share
    positions = {0: Position(0, fx.worker.token)}
    for round_ in range(5):
        tasks = [Slices(share, None, f"plan-{attempt}-{round_}", i, shares)
                 for i, share in enumerate(shares)]
        taken: list[dict[int, tuple[int, int]]] = [{} for _ in tasks]

        def run(i: int) -> None:
            taken[i] = claim_share(fx.worker, tasks[i], positions)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(p for share in taken for p in share) == [0, 1, 2, 3]


def _results(fx: Fixture) -> list[bytes | None]:
    return [r.key for r in read_to_end(fx.cfg, [fx.topics.results])]


def test_a_bridge_serves_between_tasks_and_the_next_task_of_its_worker_takes_over(fx: Fixture) -> None:
    """A serving task's worker goes on serving after the task returned (between two
    micro-batches); the next task of that worker stops the bridge and counts what it did."""
    end = fx.send(("acc-1", OpenAccount("ann")))
    run_task(fx.worker, fx.topics.commands, {0: (0, end)}, time.monotonic() + 0.3)
    pos = fx.position()
    assert pos.owner == fx.worker.token and pos.lease_until is not None
    assert pos.lease_until > time.time()
    fx.send(("acc-1", Deposit(5)))  # no task runs now: the bridge answers it
    deadline = time.monotonic() + 10
    while len(_results(fx)) < 2:
        assert time.monotonic() < deadline, "the bridge did not answer the command"
        time.sleep(0.02)
    took = run_task(fx.worker, fx.topics.commands, {0: (end, end)})  # the next micro-batch's task
    assert (took.commands, took.accepted) == (1, 1)  # the bridge's command, counted with it
    assert fx.position() == Position(end + 1, fx.worker.token)
    assert _balance(fx, "acc-1") == (2, 5)
    assert len(read_to_end(fx.cfg, [fx.topics.events])) == 2 and len(_results(fx)) == 2


def test_a_bridge_that_records_no_end_is_waited_for_past_its_lease_then_said_and_overtaken(
        fx: Fixture, capsys: pytest.CaptureFixture[str]) -> None:
    """A worker that died while bridging (its lease ran out 1 s ago, no end recorded): the next
    task waits until LEASE_MARGIN_S past the lease, says so, and goes on from the position."""
    from cqrs.processor.partition import LEASE_MARGIN_S
    from cqrs.processor.state_table import bridged

    end = fx.send(("acc-1", OpenAccount("ann")))
    lease = time.time() - 1.0
    fx.worker.table.write_positions(fx.worker.generation, fx.topics.commands,
                                    {0: Position(0, bridged("a-dead-worker", lease))})
    took = run_task(fx.worker, fx.topics.commands, {0: (0, end)})
    assert time.time() >= lease + LEASE_MARGIN_S  # it waited for the bridge's end
    assert took.commands == 1 and fx.position() == Position(end, fx.worker.token)
    assert "another worker's bridge recorded no end" in capsys.readouterr().err


def test_a_task_of_another_worker_waits_for_the_bridge_and_goes_on_from_where_it_got(fx: Fixture) -> None:
    end = fx.send(("acc-1", OpenAccount("ann")))
    run_task(fx.worker, fx.topics.commands, {0: (0, end)}, time.monotonic() + 0.3)
    end2 = fx.send(("acc-1", Deposit(5)))  # the bridge serves it, or the other worker does
    other = fx.other_worker()
    try:
        theirs = run_task(other, fx.topics.commands, {0: (end, end2)})
        pos = fx.position()
        assert pos.lease_until is None and pos.next_offset == end2  # the bridge ended first
        assert theirs.commands + (1 if pos.owner == fx.worker.token else 0) == 1
    finally:
        other.table.close()
    assert _balance(fx, "acc-1") == (2, 5)
    assert len(read_to_end(fx.cfg, [fx.topics.events])) == 2 and len(_results(fx)) == 2
