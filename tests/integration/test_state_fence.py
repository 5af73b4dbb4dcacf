"""The aggregate-state table's fence on the real Kafka and Cassandra, without Spark: a re-run
slice applies nothing twice, a stale writer cannot overwrite a newer row, the worker cache is
used only when the worker saw the partition's previous commands."""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import pytest

from cqrs.config import CqrsConfig
from cqrs.kafka_io import read_to_end
from cqrs.processor.workers import worker_for
from cqrs.processor.state import StateReader
from cqrs.processor.state_table import StoredAggregate
from cqrs.testing.example import Deposit, OpenAccount
from cqrs.testing.example_app import app
from bank_worker import BankSlices, bank_options

pytestmark = pytest.mark.integration


Fixture = BankSlices


@pytest.fixture
def fx(cqrs_config: CqrsConfig, unique_name: str) -> Iterator[Fixture]:
    opts = bank_options(cqrs_config, unique_name)
    yield Fixture(cqrs_config, opts.topics, worker_for(cqrs_config, opts))


def _balance(fx: Fixture, agg: str) -> tuple[int, int]:
    with StateReader(app, fx.cfg, topics=fx.topics) as reader:
        s = reader.get(agg)
    assert s is not None
    return s.version, s.state.balance


def test_a_rerun_slice_applies_nothing_twice(fx: Fixture) -> None:
    opened = fx.slice(("acc-1", OpenAccount("ann")), ("acc-2", OpenAccount("bob")))
    fx.run(opened)
    deposits = fx.slice(("acc-1", Deposit(5)), ("acc-2", Deposit(7)), ("acc-1", Deposit(1)))
    first = fx.run(deposits)
    assert (first.skipped, first.records) == (0, 6)  # 3 events + 3 results
    fx.worker.cache.drop((fx.worker.table.app_name, fx.worker.generation, fx.topics.commands, 0))
    again = fx.run(deposits)  # the same batch once more (e.g. its commit was lost)
    assert (again.skipped, again.records, again.cache_hits) == (3, 0, 0)
    assert _balance(fx, "acc-1") == (3, 6) and _balance(fx, "acc-2") == (2, 7)
    events = [r for r in read_to_end(fx.cfg, [fx.topics.events])]
    assert len(events) == 5  # 2 opened + 3 deposited, once each


def test_a_stale_writer_cannot_overwrite_a_newer_row(fx: Fixture) -> None:
    table = fx.worker.table
    fx.run(fx.slice(("acc-1", OpenAccount("ann")), ("acc-1", Deposit(5))))
    (newer,) = table.get(fx.worker.generation, "acc-1")
    assert (newer.version, newer.commands, newer.applied_offset) == (2, 2, 1)
    stale = attrs.evolve(newer, version=1, commands=1, applied_offset=0, record=b"stale")
    table.write(fx.worker.generation, [stale])  # a zombie task of an older batch
    assert table.get(fx.worker.generation, "acc-1") == [newer]
    assert _balance(fx, "acc-1") == (2, 5)


def test_the_cache_is_used_only_after_the_partitions_previous_slice(fx: Fixture) -> None:
    fx.run(fx.slice(("acc-1", OpenAccount("ann"))))
    follows = fx.run(fx.slice(("acc-1", Deposit(1))))
    assert (follows.cache_hits, follows.state_reads) == (1, 0)
    fx.offset += 10  # another worker processed offsets in between: this cache is stale
    gap = fx.run(fx.slice(("acc-1", Deposit(2))))
    assert (gap.cache_hits, gap.state_reads) == (0, 1)
    assert _balance(fx, "acc-1") == (3, 3)


def test_states_evicted_from_the_cache_are_kept_packed_and_not_read_again(fx: Fixture) -> None:
    """With one decoded state cached, the others are kept packed (the worker's store): the next
    slice finds them there, not in the table, and decides on the states a read would give; a
    gap (another worker's commands in between) drops both. A full cache keeps the state it
    holds decoded against a sweep (acc-2 and acc-3 stay packed), and admits an aggregate that
    keeps getting commands after at most ADMIT_EVERY of them."""
    from cqrs.processor.partition import ADMIT_EVERY

    fx.worker.cache.capacity = 1
    fx.run(fx.slice(("acc-1", OpenAccount("ann")), ("acc-2", OpenAccount("bob")),
                    ("acc-3", OpenAccount("cy"))))
    later = fx.run(fx.slice(("acc-1", Deposit(5)), ("acc-2", Deposit(6)), ("acc-3", Deposit(7))))
    assert (later.cache_hits, later.store_hits, later.state_reads, later.accepted) == (1, 2, 0, 3)
    again = fx.run(fx.slice(("acc-2", Deposit(1)), ("acc-3", Deposit(1))))
    assert (again.cache_hits, again.store_hits, again.state_reads) == (0, 2, 0)
    fx.offset += 10
    gap = fx.run(fx.slice(("acc-1", Deposit(1)), ("acc-2", Deposit(1))))
    assert (gap.cache_hits, gap.store_hits, gap.state_reads) == (0, 0, 2)
    assert [_balance(fx, a) for a in ("acc-1", "acc-2", "acc-3")] == [(3, 6), (4, 8), (3, 8)]
    found = [fx.run(fx.slice(("acc-2", Deposit(1)))) for _ in range(ADMIT_EVERY + 1)]
    assert [(f.cache_hits + f.store_hits, f.accepted) for f in found] == [(1, 1)] * len(found)
    assert found[-1].cache_hits == 1, [f.cache_hits for f in found]  # admitted by then
    assert _balance(fx, "acc-2") == (4 + len(found), 8 + len(found))


def test_large_rows_are_written_in_batches_cassandra_accepts(fx: Fixture) -> None:
    """Rows with a long de-duplication memory are large: a batch of 32 of them would pass
    Cassandra's batch size limit (640 KiB here, 50 KiB by default), so batches are cut by size."""
    table = fx.worker.table
    big = [StoredAggregate(f"big-{i}", "example.bank.Account", 1, False, bytes([i]) * 150_000, 0, i, 1)
           for i in range(8)]
    table.write(fx.worker.generation, big)
    found = table.read(fx.worker.generation, [r.aggregate_id for r in big])
    assert {k: v.record[:1] * len(v.record) == v.record for k, v in found.items()} == {
        r.key: True for r in big}


def test_written_rows_leave_the_cyclic_collector_a_few_objects_per_request_not_per_row(
        fx: Fixture) -> None:
    """The driver's futures are freed by the cyclic collector only, at a task's end; a batch
    they kept would keep every row's values with it, and the collection costs per object.

    The collector also frees what the session's other threads left meanwhile (a shared
    Spark session's listener calls, other tests' driver sessions): on a busy machine that
    once came to ~900 objects. So the least of three writes counts; a batch that kept its
    rows' values would leave thousands every time."""
    import gc

    table = fx.worker.table
    rows = [StoredAggregate(f"gc-{i}", "example.bank.Account", 1, False, b"x" * 40, 0, i, 1)
            for i in range(3000)]
    table.write(fx.worker.generation, rows[:100])  # warm: prepared statements, connections
    enabled = gc.isenabled()
    counts = []
    for _ in range(3):
        gc.collect()
        gc.disable()
        try:
            table.write(fx.worker.generation, rows)
            counts.append(gc.collect())
        finally:
            if enabled:
                gc.enable()
        if counts[-1] < len(rows):
            break
    freed = min(counts)
    requests = -(-len(rows) // fx.cfg.processor.rows_per_request) + fx.cfg.processor.state_buckets
    assert freed < 100 * requests
    assert freed < len(rows), f"{counts} objects freed for {len(rows)} rows (three writes)"
    found = table.read(fx.worker.generation, [r.aggregate_id for r in rows])
    assert len(found) == len(rows)


def test_a_generation_keeps_the_bucket_count_it_was_made_with(fx: Fixture) -> None:
    """Rows are spread over the generation's buckets; a table opened with another
    ``state_buckets`` (a changed setting) still finds them, by the count recorded at creation."""
    from cqrs.processor.state_table import StateTable, state_bucket, state_table_name

    table = fx.worker.table
    generation = fx.worker.generation
    made_with = table.buckets_of(generation)
    rows = [StoredAggregate(f"b-{i}", "example.bank.Account", 1, False, b"x", 0, i, 1)
            for i in range(300)]
    table.write(generation, rows)
    assert len({state_bucket(r.aggregate_id, made_with) for r in rows}) > 1
    other = StateTable(table.cassandra, table.app_name, buckets=made_with * 2 + 1)
    other.ensure(generation)  # exists: keeps its count
    assert other.buckets_of(generation) == made_with
    assert other.read(generation, [r.aggregate_id for r in rows]) == {r.key: r for r in rows}
    assert other.get(generation, "b-7") == [rows[7]]
    name = state_table_name(table.app_name, generation)
    counted = table.cassandra.execute(f"SELECT count(*) FROM {name}").one()[0]
    assert counted == 300


def test_a_table_of_the_earlier_layout_is_refused_with_what_to_do(fx: Fixture) -> None:
    """A state table of an earlier layout (one partition per aggregate; a column per field) is
    not misread."""
    from cqrs.processor.state_table import StateTable, StateTableError, state_table_name

    table = fx.worker.table
    old = StateTable(table.cassandra, table.app_name + "_old")
    table.cassandra.execute(
        f"CREATE TABLE {state_table_name(old.app_name, 1)} (aggregate_id text, aggregate_type "
        "text, version bigint, deleted boolean, record blob, source_partition int, applied_offset "
        "bigint, commands bigint, PRIMARY KEY ((aggregate_id), aggregate_type))")
    with pytest.raises(StateTableError, match="earlier cqrs version.*no bucket.*cqrs rebuild-state"):
        old.ensure(1)
    columns = StateTable(table.cassandra, table.app_name + "_columns")  # bucketed, unpacked
    table.cassandra.execute(
        f"CREATE TABLE {state_table_name(columns.app_name, 1)} (bucket int, aggregate_id text, "
        "aggregate_type text, version bigint, deleted boolean, record blob, source_partition int, "
        "applied_offset bigint, commands bigint, PRIMARY KEY ((bucket), aggregate_id, "
        "aggregate_type))")
    with pytest.raises(StateTableError, match="earlier cqrs version.*packed.*cqrs rebuild-state"):
        columns.ensure(1)
    with pytest.raises(StateTableError, match="bucket"):
        StateTable(table.cassandra, table.app_name, buckets=0)


def test_a_slice_never_reads_a_row_its_worker_has_not_written_yet(fx: Fixture) -> None:
    """Slices decided back to back (a serving task) leave their rows unwritten until Kafka has
    their records: an aggregate dropped from the cache meanwhile is read only once its row is
    written, never as the older row (or none) the table still holds."""
    from cqrs.processor.partition import process_slices

    fx.worker.cache.capacity = 1  # acc-1 does not stay cached, nor packed
    fx.worker.cache.store_bytes = 0
    opened = fx.slice(("acc-1", OpenAccount("ann")), ("acc-2", OpenAccount("bob")))
    process_slices(fx.worker, fx.topics.commands, {0: (opened, None)}, wait=False)
    assert fx.worker.sent is not None  # records sent, rows not written
    deposit = fx.slice(("acc-1", Deposit(5)))
    second = process_slices(fx.worker, fx.topics.commands, {0: (deposit, None)}, wait=False)
    assert (second.cache_hits, second.state_reads, second.accepted) == (0, 1, 1)
    fx.worker.finish_sent()
    fx.worker.settle()
    assert _balance(fx, "acc-1") == (2, 5)
    events = read_to_end(fx.cfg, [fx.topics.events])
    assert sorted(int(dict(e.headers)["cqrs.version"]) for e in events if e.key == b"acc-1") == [1, 2]
