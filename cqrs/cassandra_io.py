"""The framework's Cassandra session, built in one place from the configuration.

Both the command processor's aggregate-state table and the projections' Cassandra store talk to
Cassandra through :class:`CassandraSession`: prepared statements executed concurrently, rows as
plain tuples, and rows grouped by replica set so that an ``IN`` read or an unlogged batch never
makes a coordinator fan out. A request per row costs the Python driver about 0.2 ms of CPU; a
request of 32 rows about 1 ms, which is why reads and writes travel in groups.
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from cqrs.config import CassandraSettings
from cqrs.errors import CqrsError

__all__ = ["CQL_PROTOCOL_VERSION", "MAX_BATCH_BYTES", "UNSENT_RETRY_S", "CassandraSession",
           "CassandraUnavailableError", "InvalidIdentifierError", "consistency_level",
           "cql_bigint", "cql_cluster", "cql_int", "identifier", "quote", "replication_map"]

CQL_PROTOCOL_VERSION = 4
"""The native protocol every connection of the framework (and of its tests) asks for. Version 5
wraps every frame in checksummed segments, which the driver builds and checks in Python: a 5 KB
state row cost ~25 % more CPU to write, ~50 % more to read; and a connection the driver opens
with it now and then fails at once with "CRC mismatch on header" (a driver issue, PYTHON-1337;
seen in CI while a test polled the schema)."""


def cql_cluster(contact_points: Sequence[str], port: int, **options: Any) -> Any:
    """A cassandra-driver ``Cluster`` of ``contact_points`` that asks for
    :data:`CQL_PROTOCOL_VERSION` (``options``: the driver's other arguments): how every
    connection is opened, :class:`CassandraSession`'s, the dev stack's and the tests'."""
    from cassandra.cluster import Cluster

    return Cluster(list(contact_points), port=port, protocol_version=CQL_PROTOCOL_VERSION,
                   **options)


UNSENT_RETRY_S = 10.0
"""How long :meth:`CassandraSession.execute` sends again a statement that reached no node."""

# Cassandra warns about a batch over 5 KiB and refuses one over 50 KiB by default (the dev
# stack allows 64 / 640): larger rows are written in smaller batches, a very large one alone
MAX_BATCH_BYTES = 40_000

cql_int = struct.Struct(">i").pack  # CQL int, serialized (see start_writing_partitions)
cql_bigint = struct.Struct(">q").pack  # CQL bigint


class CassandraUnavailableError(CqrsError, RuntimeError):
    """Cassandra cannot be reached, or a statement failed."""


_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")
_REPLICATION = re.compile(
    r"\{\s*'\w+'\s*:\s*(?:'[\w.]+'|\d+)(?:\s*,\s*'\w+'\s*:\s*(?:'[\w.]+'|\d+))*\s*\}")


class InvalidIdentifierError(CqrsError, ValueError):
    """A name that would end up in CQL is not a plain identifier (or a replication map is not
    a plain map literal)."""


def identifier(name: str, what: str = "CQL identifier") -> str:
    """``name`` if it is a plain CQL identifier (a letter, then letters, digits and ``_``, at
    most 48 characters), else :class:`InvalidIdentifierError` naming it: names are never
    escaped into CQL, values never put in it (they are bound)."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise InvalidIdentifierError(
            f"{what} {name!r} is not a plain CQL identifier: use a letter, then letters, digits "
            "and '_', at most 48 characters"
        )
    return name


def replication_map(text: str) -> str:
    """``cassandra.replication`` if it is a plain map literal such as ``{'class':
    'SimpleStrategy', 'replication_factor': 1}`` (it is written into CREATE KEYSPACE)."""
    if not _REPLICATION.fullmatch(text.strip()):
        raise InvalidIdentifierError(
            f"cassandra.replication {text!r} is not a plain map literal such as "
            "{'class': 'NetworkTopologyStrategy', 'dc1': 3}"
        )
    return text.strip()


def quote(name: str) -> str:
    """A CQL identifier, checked (:func:`identifier`) and double-quoted."""
    return f'"{identifier(name)}"'


def consistency_level(name: str, setting: str) -> int:
    """The driver's consistency level for ``name`` (e.g. ``LOCAL_QUORUM``); ``setting`` names
    the configuration entry in the error."""
    from cassandra import ConsistencyLevel

    try:
        return ConsistencyLevel.name_to_value[name.upper()]
    except KeyError:
        raise CassandraUnavailableError(
            f"unknown Cassandra consistency level {name!r} in {setting}; use e.g. ONE, "
            "LOCAL_QUORUM, QUORUM"
        ) from None


def _emptied_after(wait: Callable[[], list[Any]], batches: list[Any]) -> Callable[[], list[Any]]:
    """``wait``, which then empties ``batches``. The driver's futures sit in reference cycles
    (timers, query plans) that only the cyclic collector frees, and each keeps its batch, with
    every row's values, until then: emptied, the rows go at once, and the processor's collection
    at the end of a task frees a few objects per request instead of a few per row (20,000
    state rows: 53,000 objects and ~130 ms -> ~5,000 and ~60 ms). Only after success: when one
    request failed, others may still be in flight, or be retried by the driver."""

    def waited() -> list[Any]:
        result = wait()
        for batch in batches:
            batch.clear()
        return result

    return waited


_SCHEMA_CHANGE = re.compile(r"\s*(CREATE|ALTER|DROP)\s", re.IGNORECASE)


class CassandraSession:
    """A connected session on one keyspace (created when missing), with the helpers every
    Cassandra user of the framework needs. Thread-safe; close it when done."""

    def __init__(self, cassandra: CassandraSettings, *, keyspace: str | None = None,
                 read_consistency: str = "LOCAL_QUORUM", write_consistency: str = "LOCAL_QUORUM",
                 concurrency: int = 128, rows_per_request: int = 32,
                 error: Callable[[str], Exception] = CassandraUnavailableError) -> None:
        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, ExecutionProfile
        from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
        from cassandra.query import tuple_factory

        self.error = error
        # checked before anything connects: a bad name is a bug to fix, not an outage
        keyspace = identifier(keyspace or cassandra.keyspace, "keyspace (cassandra.keyspace)")
        replication = replication_map(cassandra.replication)
        if rows_per_request < 1:
            raise error(f"rows_per_request = {rows_per_request}: use 1 (a request per row) or more")
        self.keyspace = keyspace
        self.concurrency = concurrency
        self.rows_per_request = rows_per_request
        try:
            read_cl = consistency_level(read_consistency, "read_consistency")
            self.write_cl = consistency_level(write_consistency, "write_consistency")
        except CassandraUnavailableError as exc:
            raise error(str(exc)) from None
        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(cassandra.local_dc)),
            consistency_level=read_cl, request_timeout=30,
            # rows as plain tuples: the default builds a namedtuple class per result set, which
            # was 7 % of a projector worker's time
            row_factory=tuple_factory)
        kwargs: dict[str, Any] = {}
        if cassandra.username:
            kwargs["auth_provider"] = PlainTextAuthProvider(cassandra.username, cassandra.password)
        if cassandra.ssl_ca_location:
            import ssl

            kwargs["ssl_context"] = ssl.create_default_context(cafile=cassandra.ssl_ca_location)
        try:
            from cassandra.io.libevreactor import LibevConnection
            kwargs["connection_class"] = LibevConnection
        except ImportError:  # the asyncore/asyncio default works, slower
            pass
        # TCP_NODELAY: the driver leaves Nagle's algorithm on, and a request over one segment
        # (a batch of 32 state rows) then waited for the server's delayed ACK: 40+ ms a batch
        # on loopback instead of 2-3 ms
        import socket

        self.cluster = cql_cluster(cassandra.contact_points(), cassandra.port,
                                   execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                                   sockopts=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)], **kwargs)
        try:
            self.session = self._connect(replication)
        except Exception as exc:
            self.cluster.shutdown()
            raise error(
                f"cannot use Cassandra at {cassandra.hosts}:{cassandra.port} keyspace "
                f"{self.keyspace!r}: {exc}; is it running (`cqrs dev status`)?"
            ) from exc
        self._prepared: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _connect(self, replication: str) -> Any:
        """A session whose every connection uses the keyspace, created first when missing.

        The keyspace is given to ``connect`` rather than set with ``USE`` afterwards: the
        driver reports ``USE`` done when one node of several could not run it (its callback
        passes on the errors of the last pool only), and that node's connection then fails
        every unqualified statement with "No keyspace has been specified" (seen on two nodes,
        with a keyspace another process had created a moment before). A session made with
        the keyspace sets it on each connection as it opens, or keeps the node down until it
        can. Schema agreement first, so that every node knows the keyspace; then a ``USE`` of
        it on the setup session, until the node answers it: a ``CREATE KEYSPACE IF NOT EXISTS``
        sent while another process's creation of it is still being applied (the first schema
        change after a restart took ~2 s) returns at once, before the node can use it, and the
        session's connections then failed their ``USE`` (the driver marked the node down and
        closed them, under the first statements: seen as the demo's five processors started
        on a freshly restarted Cassandra)."""
        import time

        from cassandra import InvalidRequest
        from cassandra.cluster import NoHostAvailable

        setup = self.cluster.connect()
        try:
            if self.keyspace not in self.cluster.metadata.keyspaces:
                setup.execute(f"CREATE KEYSPACE IF NOT EXISTS {quote(self.keyspace)} WITH "
                              f"replication = {replication}")
            self._await_schema_agreement()
            deadline = time.monotonic() + 60
            while True:
                try:
                    setup.execute(f"USE {quote(self.keyspace)}")
                    break
                except InvalidRequest:  # "Keyspace ... does not exist", yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            setup.shutdown()

        deadline = time.monotonic() + 60
        while True:  # a node may still lack a keyspace made a moment ago by another process
            try:
                return self.cluster.connect(self.keyspace)
            except NoHostAvailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
                self._await_schema_agreement()

    def _await_schema_agreement(self, timeout_s: float = 120.0) -> None:
        """Wait until every node reports the same schema. The driver's wait gives up quietly;
        on a starved node a schema change took longer than its 10 s, and reads of the new
        table then failed there (``INCOMPATIBLE_SCHEMA``)."""
        import time

        deadline = time.monotonic() + timeout_s
        while not self.cluster.control_connection.wait_for_schema_agreement(wait_time=10):
            if time.monotonic() > deadline:
                raise self.error(f"the Cassandra nodes do not agree on the schema after "
                                 f"{timeout_s:.0f} s: is one of them down or overloaded?")

    def prepare(self, cql: str, write: bool = False) -> Any:
        """The prepared statement of ``cql`` (writes at the write consistency), prepared once."""
        with self._lock:
            stmt = self._prepared.get(cql)
        if stmt is None:
            try:
                stmt = self.session.prepare(cql)
            except Exception as exc:
                raise self.error(f"cannot prepare Cassandra statement {cql!r}: {exc}") from exc
            if write:
                stmt.consistency_level = self.write_cl
            with self._lock:
                self._prepared[cql] = stmt
        return stmt

    def execute(self, cql: str | Any, params: Sequence[Any] = ()) -> Any:
        """One statement, synchronously. After a schema change (``CREATE``, ``ALTER``, ``DROP``)
        it waits until every node has the new schema: the driver does so only when the
        statement changed something, not when ``IF NOT EXISTS`` found what another process
        created a moment before, and a node that has not seen that table yet fails reads of
        it (``INCOMPATIBLE_SCHEMA``).

        A statement the driver sent to no node at all (``NoHostAvailable`` with no node's
        error: its query plan was empty for a moment) is sent again, for up to
        :data:`UNSENT_RETRY_S`: it cannot have run anywhere. Seen once as the demo's five
        processors prepared at once on a loaded machine, at their first ``CREATE TABLE``."""
        try:
            result = self._execute_sent(cql, params)
            if isinstance(cql, str) and _SCHEMA_CHANGE.match(cql):
                self._await_schema_agreement()
            return result
        except Exception as exc:
            shown = getattr(cql, "query_string", cql)
            raise self.error(f"Cassandra statement {shown!r} failed: {exc}") from exc

    def _execute_sent(self, cql: str | Any, params: Sequence[Any]) -> Any:
        """``session.execute``, again while the driver reports it reached no node."""
        import time

        from cassandra.cluster import NoHostAvailable

        deadline = time.monotonic() + UNSENT_RETRY_S
        while True:
            try:
                return self.session.execute(cql, params)
            except NoHostAvailable as exc:
                if exc.errors or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def concurrent(self, stmt: Any, params: Sequence[Sequence[Any]]) -> list[Any]:
        """``stmt`` once per row of ``params``, concurrently; the results in order."""
        return self.concurrent_statements([(stmt, p) for p in params],
                                          f"Cassandra statement {stmt.query_string!r}")

    def concurrent_statements(self, statements: Sequence[tuple[Any, Sequence[Any]]],
                              what: str) -> list[Any]:
        """Several (statement, params) pairs, concurrently; the results in order."""
        return self.concurrent_started(statements, what)()

    def concurrent_started(self, statements: Sequence[tuple[Any, Sequence[Any]]],
                           what: str) -> Callable[[], list[Any]]:
        """Start several (statement, params) pairs concurrently; call what this returns to
        wait for their results (in order; it raises if one failed)."""
        from cassandra.concurrent import execute_concurrent_async

        if not statements:
            return list
        try:
            future = execute_concurrent_async(self.session, statements,
                                              concurrency=self.concurrency, raise_on_first_error=True)
        except Exception as exc:
            raise self.error(f"{what} failed: {_cause(exc)}") from exc

        def wait() -> list[Any]:
            try:
                return [r for _, r in future.result()]
            except Exception as exc:
                raise self.error(f"{what} failed: {_cause(exc)}") from exc

        return wait

    def groups(self, keys: Sequence[str], sizes: Sequence[int] | None = None) -> list[list[int]]:
        """Indices of ``keys`` (partition keys, text) in groups of at most ``rows_per_request``,
        each group's keys owned by the same replicas; with ``sizes`` (bytes per row), a group
        also stays under :data:`MAX_BATCH_BYTES` (a larger row goes alone)."""
        n = self.rows_per_request
        by_replicas: dict[Any, list[int]] = {}
        metadata = self.cluster.metadata
        for i, key in enumerate(keys):
            replicas = metadata.get_replicas(self.keyspace, key.encode())
            by_replicas.setdefault(tuple(sorted(h.host_id for h in replicas)), []).append(i)
        if sizes is None:
            return [idx[j:j + n] for idx in by_replicas.values() for j in range(0, len(idx), n)]
        return [g for idx in by_replicas.values() for g in self._split(idx, sizes)]

    def _split(self, idx: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
        """``idx`` in runs of at most ``rows_per_request`` whose ``sizes`` stay under
        :data:`MAX_BATCH_BYTES` (a larger row goes alone)."""
        n = self.rows_per_request
        out: list[list[int]] = []
        group: list[int] = []
        total = 0
        for i in idx:
            if group and (len(group) == n or total + sizes[i] > MAX_BATCH_BYTES):
                out.append(group)
                group, total = [], 0
            group.append(i)
            total += sizes[i]
        if group:
            out.append(group)
        return out

    def read_in(self, select: str, key_column: str, keys: Sequence[str]) -> list[Any]:
        """Rows of ``select`` (a SELECT without WHERE) whose ``key_column`` (the partition key)
        is one of ``keys``: ``IN`` reads grouped by replica, or a read per key."""
        if not keys:
            return []
        if self.rows_per_request == 1:
            stmt = self.prepare(f"{select} WHERE {quote(key_column)} = ?")
            params: list[tuple[Any]] = [(k,) for k in keys]
        else:
            stmt = self.prepare(f"{select} WHERE {quote(key_column)} IN ?")
            params = [([keys[i] for i in group],) for group in self.groups(keys)]
        return [row for rows in self.concurrent(stmt, params) for row in rows]

    def read_in_buckets(self, select: str, key_column: str, keys: Sequence[str],
                        bucket_of: Callable[[str], int], bucket_column: str = "bucket") -> list[Any]:
        """Rows of ``select`` (a SELECT without WHERE) of a table partitioned by
        ``bucket_column`` and clustered by ``key_column``, whose key is one of ``keys``
        (``bucket_of`` gives a key's bucket): a read per bucket and ``rows_per_request`` keys,
        or a read per key."""
        if not keys:
            return []
        n = self.rows_per_request
        by_bucket: dict[int, list[str]] = {}
        for k in keys:
            by_bucket.setdefault(bucket_of(k), []).append(k)
        where = f" WHERE {quote(bucket_column)} = ? AND {quote(key_column)}"
        params: list[tuple[Any, ...]]
        if n == 1:
            stmt = self.prepare(select + where + " = ?")
            params = [(b, k) for b, group in by_bucket.items() for k in group]
        else:
            stmt = self.prepare(select + where + " IN ?")
            params = [(b, group[i:i + n]) for b, group in by_bucket.items()
                      for i in range(0, len(group), n)]
        return [row for rows in self.concurrent(stmt, params) for row in rows]

    def write_rows(self, stmt: Any, keys: Sequence[str], params: Sequence[Sequence[Any]],
                   sizes: Sequence[int] | None = None) -> None:
        """``stmt`` once per row of ``params`` (``keys``: each row's partition key), as
        unlogged batches grouped by replica (and by ``sizes``, see :meth:`groups`), or a
        request per row."""
        self.start_writing_rows(stmt, keys, params, sizes)()

    def start_writing_rows(self, stmt: Any, keys: Sequence[str], params: Sequence[Sequence[Any]],
                           sizes: Sequence[int] | None = None) -> Callable[[], list[Any]]:
        """:meth:`write_rows`, started: call what this returns to wait until written."""
        from cassandra.query import BatchStatement, BatchType

        if self.rows_per_request == 1:
            return self.concurrent_started([(stmt, p) for p in params],
                                           f"Cassandra statement {stmt.query_string!r}")
        batches = []
        for group in self.groups(keys, sizes):
            batch = BatchStatement(BatchType.UNLOGGED, consistency_level=self.write_cl)
            for i in group:
                batch.add(stmt, params[i])
            batches.append((batch, ()))
        return _emptied_after(self.concurrent_started(batches, f"a batch of {stmt.query_string!r}"),
                              [b for b, _ in batches])

    def start_writing_partitions(self, stmt: Any, rows: Sequence[Sequence[list[bytes | None]]],
                                 sizes: Sequence[Sequence[int]]) -> Callable[[], list[Any]]:
        """Write rows given per Cassandra partition: ``rows[k]`` the rows of one partition, each
        the values of ``stmt``'s markers already serialized in CQL's binary form (see
        :data:`cql_int`, :data:`cql_bigint`; text as UTF-8), ``sizes[k]``
        their bytes. Unlogged batches of one partition each (see :meth:`_split`), or a request
        per row; call what this returns to wait.

        The driver binds a row in Python column by column (~7 us for nine columns); a caller
        that knows its columns' types serializes them in ~2."""
        from cassandra.query import BatchStatement, BatchType, BoundStatement

        def bound(values: list[bytes | None]) -> Any:
            out = BoundStatement(stmt)
            out.values = values
            return out

        if self.rows_per_request == 1:
            return self.concurrent_started([(bound(v), ()) for part in rows for v in part],
                                           f"Cassandra statement {stmt.query_string!r}")
        query_id = stmt.query_id
        batches = []
        for part, part_sizes in zip(rows, sizes, strict=True):
            for group in self._split(range(len(part)), part_sizes):
                batch = BatchStatement(BatchType.UNLOGGED, consistency_level=self.write_cl)
                batch.add(bound(part[group[0]]))  # the batch's routing key and keyspace
                add = batch._add_statement_and_params  # what add() does for a bound statement
                for i in group[1:]:
                    add(True, query_id, part[i])
                batches.append((batch, ()))
        return _emptied_after(self.concurrent_started(batches, f"a batch of {stmt.query_string!r}"),
                              [b for b, _ in batches])

    def table_columns(self, table: str) -> set[str] | None:
        """The column names of ``table`` in the keyspace, as the driver's schema metadata knows
        them (None: no such table)."""
        keyspace = self.cluster.metadata.keyspaces.get(self.keyspace)
        found = None if keyspace is None else keyspace.tables.get(table)
        return None if found is None else set(found.columns)

    def close(self) -> None:
        self.cluster.shutdown()


def _cause(exc: BaseException) -> BaseException:
    """The error to report for ``exc``: the driver's concurrent executor, when a statement
    fails at once, can raise ``InvalidStateError: FINISHED`` while setting that failure on its
    future; the statement's own error is then the one it was handling."""
    from concurrent.futures import InvalidStateError

    if isinstance(exc, InvalidStateError) and exc.__context__ is not None:
        return exc.__context__
    return exc
