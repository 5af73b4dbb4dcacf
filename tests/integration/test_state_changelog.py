"""The aggregate states in a Kafka changelog (``[processor] state_store = "kafka"``) on the real
Kafka and Cassandra, without Spark: what holds for either store (a re-run applies nothing twice,
a gap drops the cache, queries read the newest state), and what only the changelog does: a
partition taken over is restored from it, whose fence stops the worker that had it, and no
aggregate is read from Cassandra."""

from __future__ import annotations

import pytest

from cqrs.config import CqrsConfig
from cqrs.kafka_io import make_producer, murmur2_partition, read_to_end
from cqrs.processor.changelog import (
    ChangelogError, ChangelogView, changelog_topic, check_state_store, reset_changelog,
    split_changelog_key, write_rebuilt,
)
from cqrs.processor.partition import Worker, process_slices
from cqrs.processor.state import StateReader
from cqrs.processor.state_table import Position, StoredAggregate, open_state_table
from cqrs.processor.workers import worker_for
from cqrs.testing.example import Deposit, OpenAccount
from cqrs.testing.example_app import app
from bank_worker import BankSlices, bank_options
from cqrs.topics import list_topics

pytestmark = pytest.mark.integration


class Fixture(BankSlices):

    def balance(self, agg: str) -> tuple[int, int]:
        with StateReader(app, self.cfg, topics=self.topics) as reader:
            s = reader.get(agg)
        assert s is not None
        return s.version, s.state.balance

    def other_worker(self) -> Worker:
        """A second worker of the same processor (another Python process, as far as the
        positions and the changelog's fence can tell)."""
        w = self.worker
        other = Worker(self.cfg, w.step, open_state_table(self.cfg, self.topics), w.generation,
                       None)
        other.producer = make_producer(self.cfg, **{"on_delivery": other.on_delivery,
                                                    "delivery.report.only.error": True})
        return other


def _fixture(cfg: CqrsConfig, name: str) -> Fixture:
    opts = bank_options(cfg, name)
    return Fixture(cfg, opts.topics, worker_for(cfg, opts))


@pytest.fixture(params=["cassandra", "kafka"])
def either(request: pytest.FixtureRequest, cqrs_config: CqrsConfig, unique_name: str) -> Fixture:
    """A worker of each store: the same behaviour is asserted of both."""
    return _fixture(cqrs_config.with_overrides(processor={"state_store": request.param}),
                    f"{unique_name}-{request.param[0]}")


@pytest.fixture
def fx(cqrs_config: CqrsConfig, unique_name: str) -> Fixture:
    return _fixture(cqrs_config.with_overrides(processor={"state_store": "kafka"}), unique_name)


def _events(fx: Fixture) -> list[bytes | None]:
    return [r.value for r in read_to_end(fx.cfg, [fx.topics.events])]


def test_either_store_applies_a_rerun_slice_once_and_answers_queries(either: Fixture) -> None:
    fx = either
    fx.run(fx.slice(("acc-1", OpenAccount("ann")), ("acc-2", OpenAccount("bob"))))
    deposits = fx.slice(("acc-1", Deposit(5)), ("acc-2", Deposit(7)), ("acc-1", Deposit(1)))
    first = fx.run(deposits)
    assert (first.skipped, first.records) == (0, 6)  # 3 events + 3 results
    fx.worker.cache.drop(fx.worker.part(fx.topics.commands, 0))
    again = fx.run(deposits)  # the same batch once more (e.g. its commit was lost)
    assert (again.skipped, again.records, again.cache_hits) == (3, 0, 0)
    assert fx.balance("acc-1") == (3, 6) and fx.balance("acc-2") == (2, 7)
    assert len(_events(fx)) == 5  # 2 opened + 3 deposited, once each


def test_either_store_drops_the_cache_after_a_gap(either: Fixture) -> None:
    fx = either
    fx.run(fx.slice(("acc-1", OpenAccount("ann"))))
    follows = fx.run(fx.slice(("acc-1", Deposit(1))))
    assert (follows.cache_hits, follows.state_reads, follows.restored) == (1, 0, 0)
    fx.offset += 10  # another worker processed offsets in between: this cache is stale
    gap = fx.run(fx.slice(("acc-1", Deposit(2))))
    # the table is asked for the one aggregate; the changelog restores the partition
    kafka = fx.worker.changelog is not None
    assert (gap.cache_hits, gap.state_reads, gap.restored) == ((0, 0, 1) if kafka else (0, 1, 0))
    assert fx.balance("acc-1") == (3, 3)


def test_new_aggregates_are_not_read_and_rows_are_not_in_cassandra(fx: Fixture) -> None:
    stats = fx.run(fx.slice(*((f"acc-{n}", OpenAccount(f"o{n}")) for n in range(50))))
    assert (stats.accepted, stats.state_reads, stats.restored) == (50, 0, 0)
    assert fx.worker.table.get(fx.worker.generation, "acc-7") == []  # the table holds no rows
    view = ChangelogView(fx.cfg, changelog_topic(fx.topics.base, fx.worker.generation))
    assert sorted(r.aggregate_id for r in view.scan()) == sorted(f"acc-{n}" for n in range(50))
    assert fx.balance("acc-7") == (1, 0)


def test_a_partition_taken_over_is_restored_and_its_old_writer_fenced(fx: Fixture) -> None:
    fx.run(fx.slice(("acc-1", OpenAccount("ann")), ("acc-2", OpenAccount("bob"))))
    # the first worker decides a slice and sends its records; its rows go into a transaction
    # it has not committed when a second worker takes the partition over
    sent = fx.slice(("acc-1", Deposit(5)), ("acc-2", Deposit(7)))
    process_slices(fx.worker, fx.topics.commands, {0: (sent, None)}, wait=False)
    fx.worker.finish_sent()
    other = fx.other_worker()
    taken = fx.run(sent, worker=other)  # its position said nothing of these: it applies them
    assert (taken.restored, taken.skipped, taken.accepted, taken.state_reads) == (2, 0, 2, 0)
    with pytest.raises(ChangelogError, match="another worker took the partition over"):
        fx.worker.settle()  # the first worker's commit is refused: fenced
    assert fx.worker.cache.entries(fx.worker.part(fx.topics.commands, 0)) is None
    assert fx.balance("acc-1") == (2, 5) and fx.balance("acc-2") == (2, 7)
    # the records of the fenced worker's slice were acknowledged before its rows: the same
    # ones, written again by the one that took over
    events = _events(fx)
    assert len(events) == 6 and len(set(events)) == 4
    # and the first worker, given the partition back, restores it too
    back = fx.run(fx.slice(("acc-1", Deposit(1))))
    assert (back.restored, back.accepted) == (2, 1)
    assert fx.balance("acc-1") == (3, 6)


def test_switching_stores_is_refused_as_it_would_move_no_state(cqrs_config: CqrsConfig,
                                                               unique_name: str) -> None:
    on_cassandra = _fixture(cqrs_config, unique_name)
    on_cassandra.run(on_cassandra.slice(("acc-1", OpenAccount("ann"))))
    table = on_cassandra.worker.table
    table.write_positions(on_cassandra.worker.generation, on_cassandra.topics.commands,
                          {0: Position(1, on_cassandra.worker.token)})
    kafka = cqrs_config.with_overrides(processor={"state_store": "kafka"})
    with pytest.raises(ChangelogError, match="is in the Cassandra state table"):
        check_state_store(kafka, table, on_cassandra.topics, on_cassandra.worker.generation)
    on_kafka = _fixture(kafka, unique_name + "-k")
    on_kafka.run(on_kafka.slice(("acc-1", OpenAccount("ann"))))
    topic = changelog_topic(on_kafka.topics.base, on_kafka.worker.generation)
    assert topic in list_topics(cqrs_config, topic)
    with pytest.raises(ChangelogError, match="is in the changelog"):
        check_state_store(cqrs_config, on_kafka.worker.table, on_kafka.topics,
                          on_kafka.worker.generation)


def test_a_rebuild_writes_rows_into_their_partitions_of_a_changelog_emptied_first(
        fx: Fixture) -> None:
    cfg, base = fx.cfg, fx.topics.base
    topic = reset_changelog(cfg, base, 7, 3)
    rows = [StoredAggregate(f"acc-{n}", "bank.Account", 1, False, b"r%d" % n, -1, -1, 1)
            for n in range(30)]
    assert write_rebuilt(cfg, topic, 3, iter(rows)) == 30
    written = {split_changelog_key(r.key)[1]: r.partition for r in read_to_end(cfg, [topic])}
    assert written == {r.aggregate_id: murmur2_partition(r.aggregate_id.encode(), 3) for r in rows}
    assert len(set(written.values())) == 3
    # a second attempt into the same generation starts from an empty topic
    assert reset_changelog(cfg, base, 7, 3) == topic and read_to_end(cfg, [topic]) == []
    elsewhere = murmur2_partition(b"acc-1", 3) + 1
    with pytest.raises(ChangelogError, match="partition count changed"):
        write_rebuilt(cfg, topic, 3, [StoredAggregate("acc-1", "bank.Account", 1, False, b"r",
                                                      elsewhere % 3, 4, 1)])
