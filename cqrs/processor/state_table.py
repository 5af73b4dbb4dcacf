"""The aggregate-state table: the processor's KTable, one Cassandra row per aggregate.

Each row holds, packed into one cell (``state``: :meth:`StoredAggregate.packed`), the
:class:`~cqrs.results.AggregateRecord` (version, snapshot, recent command ids and their first
results) and the fence that makes re-runs harmless:

* ``source_partition`` / ``applied_offset``: the commands-topic position of the last command
  applied to the aggregate. A command at or below it was applied already (its events and result
  were written to Kafka before the row was), so a re-run micro-batch skips it;
* ``commands``: how many commands the row has absorbed. Every write is ``USING TIMESTAMP
  commands``, so a stale writer (a zombie task, a re-run after a newer batch) can never
  overwrite a newer row, and a repeated write of the same row changes nothing.

Beside the rows, ``cqrs_processor_positions`` holds per state table and commands partition the
offset below which every command was applied (records and rows written), and which worker wrote
it last: a task starts reading there, and a worker trusts its in-memory cache of a partition
only while the position is still the one it wrote itself (see :mod:`cqrs.processor.partition`).
``cqrs_processor_share_claims`` records which task of a micro-batch took which share of its
partitions (see :mod:`cqrs.processor.source`), for a day.

Rows live in one table per generation (``state_<app>_g<n>``); ``cqrs_state_generations`` names
the current one, so a rebuild fills a new generation while the old one serves reads. Nothing
about Spark's partitioning is stored: any number of Spark partitions reads and writes it.

A generation's rows are spread over a fixed number of Cassandra partitions, its *buckets*
(``crc32(aggregate id) % buckets``, the count recorded in ``cqrs_state_layouts`` when the
generation is made, ``[processor] state_buckets``): a micro-batch's rows then share few
partitions, and Cassandra reads and writes a group of them as one single-partition request,
about a third of the CPU of the same rows over as many partitions as aggregates. One cell per
row rather than a column per field: Cassandra spends per cell (a row of eight cells cost it
~16 us of CPU to write and flush, the packed one ~11), and a worker keeps the same bytes for
the states it evicts from its decoded cache (see :class:`cqrs.processor.partition.StateCache`).
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import attrs

from cqrs.cassandra_io import CassandraSession, cql_bigint, cql_int
from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.topics import AppTopics

__all__ = ["BRIDGE_MARK", "HELD_MARK", "Position", "bridged", "StateTable", "StateTableError", "StoredAggregate", "open_state_table",
           "state_bucket", "state_table_name"]

_UNSAFE = re.compile(r"[^a-z0-9_]")
CLAIMS_TTL_S = 86_400  # a micro-batch's claims outlive any re-run of it
CLAIM_ATTEMPTS = 4
T = TypeVar("T")
_COLUMNS = ("aggregate_id", "aggregate_type", "state")
_LAYOUT = {"bucket", *_COLUMNS}  # a generation's columns
# a packed state: format, version, deleted, source partition, applied offset, commands; then
# the record
_PACKED = struct.Struct(">BqBiqq")
_PACKED_FORMAT = 1
_APPLIED = struct.Struct(">iq")  # source partition and applied offset, after format, version, deleted
_APPLIED_AT = struct.calcsize(">BqB")


class StateTableError(CqrsError, RuntimeError):
    """The aggregate-state table cannot be read or written."""


@attrs.define(slots=True)
class StoredAggregate:
    """One row of the aggregate-state table. Not frozen, but never changed once made: the
    processor makes one per aggregate per chunk, and a frozen class's ``__init__`` costs ~3x."""

    aggregate_id: str
    aggregate_type: str
    version: int
    deleted: bool
    record: bytes  # the AggregateRecord, app-codec encoded
    source_partition: int  # commands-topic partition of the last command applied
    applied_offset: int  # its offset (-1: none, e.g. a rebuilt row with no result)
    commands: int  # commands absorbed so far: the row's write timestamp
    # packed(), made once: a row goes to the changelog, then packed into the worker's cache
    _packed: bytes | None = attrs.field(default=None, init=False, eq=False, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.aggregate_type, self.aggregate_id

    def packed(self) -> bytes:
        """Everything but the key, as one value: the table's ``state`` cell."""
        blob = self._packed
        if blob is None:
            blob = self._packed = _PACKED.pack(
                _PACKED_FORMAT, self.version, self.deleted, self.source_partition,
                self.applied_offset, self.commands) + self.record
        return blob

    @staticmethod
    def applied_in(state: bytes) -> tuple[int, int]:
        """The source partition and applied offset of the row whose :meth:`packed` value is
        ``state`` (a state the worker packed itself), without unpacking the rest."""
        return _APPLIED.unpack_from(state, _APPLIED_AT)  # type: ignore[return-value]

    @staticmethod
    def unpacked(aggregate_id: str, aggregate_type: str, state: bytes) -> StoredAggregate:
        """The row whose :meth:`packed` value is ``state``."""
        try:
            form, version, deleted, partition, offset, commands = _PACKED.unpack_from(state)
        except struct.error:
            form = None
        if form != _PACKED_FORMAT:
            raise StateTableError(
                f"the state of aggregate {aggregate_type} {aggregate_id!r} is not a packed state "
                f"of this cqrs version ({len(state)} bytes, starting {bytes(state[:1])!r}): was "
                "the table written by another version? Rebuild it with `cqrs rebuild-state`")
        return StoredAggregate(aggregate_id, aggregate_type, version, bool(deleted),
                               state[_PACKED.size:], partition, offset, commands)


@attrs.frozen(slots=True)
class Position:
    """Where a commands partition's processing stands: every command below ``next_offset`` was
    applied, by the worker ``writer`` last. A *held* position (``writer`` ends in
    :data:`HELD_MARK`) stands at a command a lane of that worker still holds (see
    :mod:`cqrs.processor.lanes`): commands after it may be applied already, and the next task
    starts there whatever Spark planned."""

    next_offset: int
    writer: str

    @property
    def held(self) -> bool:
        return self.writer.endswith(HELD_MARK)

    @property
    def owner(self) -> str:
        """The worker that wrote it."""
        return self.writer.split("/", 1)[0]

    @property
    def lease_until(self) -> float | None:
        """For a *bridged* position (``writer`` ends in :data:`BRIDGE_MARK` and a time): until
        when (``time.time()``) its writer's worker may go on serving the partition past
        ``next_offset`` (see :class:`cqrs.processor.partition.Bridge`); else None."""
        mark = self.writer.find(BRIDGE_MARK)
        if mark < 0:
            return None
        return int(self.writer[mark + len(BRIDGE_MARK):]) / 1000


HELD_MARK = "/held"
BRIDGE_MARK = "/bridge@"


def bridged(writer: str, until: float) -> str:
    """The writer of a bridged position: ``writer`` serves on until ``until`` (time.time())."""
    return f"{writer}{BRIDGE_MARK}{int(until * 1000)}"


def state_bucket(aggregate_id: str, buckets: int) -> int:
    """The bucket (Cassandra partition) of an aggregate's rows in a table of ``buckets``."""
    return zlib.crc32(aggregate_id.encode("utf-8")) % buckets


@functools.lru_cache(maxsize=256)
def state_table_name(app_name: str, generation: int) -> str:
    """``state_<app>_g<n>``, within Cassandra's 48 characters (hashed when longer)."""
    app = _UNSAFE.sub("_", app_name.lower())
    name = f"state_{app}_g{generation}"
    if len(name) <= 48:
        return name
    digest = hashlib.sha1(app_name.encode()).hexdigest()[:10]
    return f"state_{app[:20]}_{digest}_g{generation}"[:48]


class StateTable:
    """The aggregate-state table of one app, over a :class:`CassandraSession`."""

    def __init__(self, cassandra: CassandraSession, app_name: str, buckets: int = 64) -> None:
        if buckets < 1:
            raise StateTableError(f"state buckets must be at least 1, not {buckets}: set "
                                  "[processor] state_buckets (CQRS_PROCESSOR_STATE_BUCKETS)")
        self.cassandra = cassandra
        self.app_name = app_name  # with the topic prefix, if any
        self.buckets = buckets  # of the generations this table makes
        self._layouts: dict[int, int] = {}  # buckets per generation, read once
        cassandra.execute("CREATE TABLE IF NOT EXISTS cqrs_state_generations "
                          "(app text PRIMARY KEY, current int)")
        cassandra.execute("CREATE TABLE IF NOT EXISTS cqrs_state_layouts "
                          "(state_table text PRIMARY KEY, buckets int)")
        cassandra.execute("CREATE TABLE IF NOT EXISTS cqrs_processor_positions (state_table text, "
                          "topic text, partition int, next_offset bigint, writer text, "
                          "PRIMARY KEY ((state_table), topic, partition))")
        # a partition per share: tasks taking different shares never contend in Paxos
        cassandra.execute("CREATE TABLE IF NOT EXISTS cqrs_processor_share_claims (state_table "
                          "text, plan text, share int, task int, PRIMARY KEY ((state_table, plan, "
                          f"share))) WITH default_time_to_live = {CLAIMS_TTL_S}")

    # ---- generations ---------------------------------------------------------------------------

    def current_generation(self) -> int | None:
        row = self.cassandra.execute("SELECT current FROM cqrs_state_generations WHERE app = %s",
                                     (self.app_name,)).one()
        return None if row is None else row[0]

    def ensure_current(self) -> int:
        """The current generation, creating generation 1 when the app has none yet."""
        current = self.current_generation()
        if current is None:
            current = 1
            self.ensure(current)
            self.set_current(current)
        return current

    def ensure(self, generation: int) -> None:
        """Create the generation's table if missing, with :attr:`buckets` buckets (a table made
        before keeps its own count)."""
        name = state_table_name(self.app_name, generation)
        made = self.cassandra.table_columns(name) is not None
        self.cassandra.execute(
            f"CREATE TABLE IF NOT EXISTS {name} ("
            "bucket int, aggregate_id text, aggregate_type text, state blob, "
            "PRIMARY KEY ((bucket), aggregate_id, aggregate_type))")
        if not made:  # a new table (a dropped one's layout row is replaced)
            self.cassandra.execute("INSERT INTO cqrs_state_layouts (state_table, buckets) "
                                   "VALUES (%s, %s)", (name, self.buckets))
            self._layouts.pop(generation, None)
        self.buckets_of(generation)

    def buckets_of(self, generation: int) -> int:
        """How many buckets the generation's rows are spread over."""
        found = self._layouts.get(generation)
        if found is not None:
            return found
        name = state_table_name(self.app_name, generation)
        row = self.cassandra.execute("SELECT buckets FROM cqrs_state_layouts WHERE state_table = %s",
                                     (name,)).one()
        table = self.cassandra.table_columns(name)
        if table is not None and table != _LAYOUT:
            earlier = ("one partition per aggregate, no bucket column" if "bucket" not in table
                       else "a column per field, not one packed state")
            raise StateTableError(
                f"aggregate-state table {name!r} has the layout of an earlier cqrs version "
                f"({earlier}): rebuild the state into a new generation with `cqrs "
                f"rebuild-state` (it reads the event log), or drop {name!r} and the app's "
                "processor checkpoint to start empty")
        if row is None or row[0] is None:
            raise StateTableError(
                f"aggregate-state table {name!r} has no layout in cqrs_state_layouts: is "
                f"generation {generation} made (the processor makes it when it starts)?")
        self._layouts[generation] = int(row[0])
        return self._layouts[generation]

    def set_current(self, generation: int) -> None:
        self.cassandra.execute("INSERT INTO cqrs_state_generations (app, current) VALUES (%s, %s)",
                               (self.app_name, generation))

    def drop(self, generation: int) -> None:
        name = state_table_name(self.app_name, generation)
        self.cassandra.execute(f"DROP TABLE IF EXISTS {name}")
        self.cassandra.execute("DELETE FROM cqrs_processor_positions WHERE state_table = %s", (name,))
        self.cassandra.execute("DELETE FROM cqrs_state_layouts WHERE state_table = %s", (name,))
        self._layouts.pop(generation, None)

    # ---- rows ------------------------------------------------------------------------------------

    def _select(self, generation: int) -> str:
        return f"SELECT {', '.join(_COLUMNS)} FROM {state_table_name(self.app_name, generation)}"

    @staticmethod
    def _row(row: Sequence[Any]) -> StoredAggregate:
        return StoredAggregate.unpacked(row[0], row[1], row[2])

    def _by_bucket(self, generation: int, aggregate_ids: Sequence[str]) -> dict[int, list[int]]:
        buckets = self.buckets_of(generation)
        out: dict[int, list[int]] = {}
        for i, agg_id in enumerate(aggregate_ids):
            out.setdefault(state_bucket(agg_id, buckets), []).append(i)
        return out

    def read(self, generation: int, aggregate_ids: Sequence[str]) -> dict[tuple[str, str], StoredAggregate]:
        """The rows of these aggregate ids (every type), by (aggregate type, aggregate id): a
        request per bucket and ``rows_per_request`` ids."""
        buckets = self.buckets_of(generation)
        rows = self.cassandra.read_in_buckets(self._select(generation), "aggregate_id",
                                              aggregate_ids, lambda a: state_bucket(a, buckets))
        row = self._row
        return {(r[1], r[0]): row(r) for r in rows}

    def get(self, generation: int, aggregate_id: str) -> list[StoredAggregate]:
        """The rows of one aggregate id (one per aggregate type that has it)."""
        stmt = self.cassandra.prepare(self._select(generation) +
                                      " WHERE bucket = ? AND aggregate_id = ?")
        bucket = state_bucket(aggregate_id, self.buckets_of(generation))
        return [self._row(r) for r in self.cassandra.execute(stmt, (bucket, aggregate_id))]

    def scan(self, generation: int) -> Iterator[StoredAggregate]:
        """Every row (for tests, comparisons and small tables)."""
        for r in self.cassandra.execute(self._select(generation)):
            yield self._row(r)

    def write(self, generation: int, rows: Sequence[StoredAggregate]) -> None:
        """Write rows, each ``USING TIMESTAMP`` its ``commands`` count (see the module doc)."""
        self.start_writing(generation, rows)()

    def start_writing(self, generation: int, rows: Sequence[StoredAggregate]) -> Callable[[], object]:
        """:meth:`write`, started: call what this returns to wait until the rows are written.
        Rows of the same aggregate may be in flight in several writes at once: the newest
        (its ``commands`` count, the write timestamp) wins whatever the order they land in."""
        if not rows:
            return list
        stmt = self.cassandra.prepare(
            f"INSERT INTO {state_table_name(self.app_name, generation)} (bucket, "
            f"{', '.join(_COLUMNS)}) VALUES ({', '.join('?' * (len(_COLUMNS) + 1))}) "
            "USING TIMESTAMP ?", write=True)
        groups = self._by_bucket(generation, [r.aggregate_id for r in rows])
        i32, i64 = cql_int, cql_bigint
        batches = []
        for bucket, idx in groups.items():
            b = i32(bucket)
            batches.append([[b, r.aggregate_id.encode("utf-8"), r.aggregate_type.encode("utf-8"),
                             r.packed(), i64(r.commands)] for r in (rows[i] for i in idx)])
        sizes = [[len(rows[i].record) + 64 for i in idx] for idx in groups.values()]
        return self.cassandra.start_writing_partitions(stmt, batches, sizes)

    # ---- positions -------------------------------------------------------------------------------

    def positions(self, generation: int, topic: str) -> dict[int, Position]:
        """The recorded position of each partition of ``topic`` that has one."""
        stmt = self.cassandra.prepare("SELECT partition, next_offset, writer FROM "
                                      "cqrs_processor_positions WHERE state_table = ? AND topic = ?")
        rows = self.cassandra.execute(stmt, (state_table_name(self.app_name, generation), topic))
        return {r[0]: Position(r[1], r[2]) for r in rows}

    def write_positions(self, generation: int, topic: str, positions: dict[int, Position]) -> None:
        """Record positions, after the rows they cover. A stale writer (a zombie task) may move
        one back: harmless, its reader then re-reads commands the rows' fences skip, and trusts
        no cache (the writer is not itself)."""
        stmt = self.cassandra.prepare(
            "INSERT INTO cqrs_processor_positions (state_table, topic, partition, next_offset, "
            "writer) VALUES (?, ?, ?, ?, ?)", write=True)
        table = state_table_name(self.app_name, generation)
        self.cassandra.concurrent(stmt, [(table, topic, p, pos.next_offset, pos.writer)
                                         for p, pos in positions.items()])

    # ---- claims --------------------------------------------------------------------------------

    def claims(self, generation: int, plan: str, shares: int) -> dict[int, int]:
        """Which task of micro-batch ``plan`` holds each of its ``shares``: ``{share: task}``
        (read at serial consistency: a claim whose transaction timed out is settled first)."""
        from cassandra import ConsistencyLevel
        from cassandra.query import BoundStatement

        stmt = self.cassandra.prepare("SELECT share, task FROM cqrs_processor_share_claims WHERE "
                                      "state_table = ? AND plan = ? AND share IN ?")
        bound = BoundStatement(stmt, consistency_level=ConsistencyLevel.LOCAL_SERIAL)
        bound.bind((state_table_name(self.app_name, generation), plan, list(range(shares))))
        return _retried(lambda: {r[0]: r[1] for r in self.cassandra.execute(bound)})

    def claim(self, generation: int, plan: str, share: int, task: int) -> bool:
        """Take ``share`` of micro-batch ``plan`` for ``task`` unless another task holds it (a
        lightweight transaction, tried again when it times out): whether ``task`` holds it."""
        stmt = self.cassandra.prepare(
            "INSERT INTO cqrs_processor_share_claims (state_table, plan, share, task) VALUES "
            "(?, ?, ?, ?) IF NOT EXISTS", write=True)
        table = state_table_name(self.app_name, generation)

        def holder() -> int | None:
            found = self.cassandra.execute(stmt, (table, plan, share, task))
            row = found.one()
            if row[0]:
                return task
            # not applied: the answer holds the claim there is (of another task, or of this
            # one, through an attempt that timed out but took effect)
            return dict(zip(found.column_names, row, strict=True)).get("task")

        return _retried(holder) == task

    def close(self) -> None:
        self.cassandra.close()


def _retried(call: Callable[[], T]) -> T:
    """``call()``, tried again after a :class:`StateTableError` (a lightweight transaction or
    serial read timing out under contention), :data:`CLAIM_ATTEMPTS` times in all."""
    for attempt in range(CLAIM_ATTEMPTS - 1):
        try:
            return call()
        except StateTableError:
            time.sleep(0.05 * (attempt + 1))
    return call()


def open_state_table(cfg: CqrsConfig, topics: AppTopics) -> StateTable:
    """The state table of the app whose topics are ``topics`` (the topic prefix separates
    environments sharing a cluster, so it names the table too), on the configured Cassandra
    (the ``[processor]`` settings, ``state_buckets`` for the generations it makes)."""
    p = cfg.processor
    session = CassandraSession(
        cfg.cassandra, read_consistency=p.read_consistency, write_consistency=p.write_consistency,
        concurrency=p.concurrency, rows_per_request=p.rows_per_request,
        error=lambda msg: StateTableError(f"aggregate state: {msg}"))
    try:
        return StateTable(session, topics.base, p.state_buckets)
    except Exception:
        session.close()
        raise
