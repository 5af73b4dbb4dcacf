"""The data subjects' keys in Cassandra: table ``cqrs_data_keys`` of the app keyspace.

One row per subject: ``bucket int, subject text, wrapped blob, created timestamp, PRIMARY KEY
((bucket), subject)``, the key wrapped by the master key
(:class:`~cqrs.personal.cipher.MasterKey`), so the table alone opens nothing. The subjects are
spread over :data:`KEY_BUCKETS` partitions (:func:`key_bucket`, a CRC-32 of the subject), so
the keys of a batch's thousands of subjects are read as the processor reads its states: a few
single-partition requests per bucket, not a partition per subject (which cost a process that
had not seen a batch's subjects ~35 µs a subject). A first key is inserted with ``IF NOT
EXISTS`` (a lightweight transaction): two processes making a subject's key at once end up with
the same one. Keys of the table of releases before 2026-11-27 (``cqrs_subject_keys``, a
partition a subject) are moved here the first time a store opens the keyspace, and that table
is dropped (:meth:`CassandraKeyStore.move_legacy_keys`). ``forget`` deletes the row,
after recording the subject in ``cqrs_forgotten_subjects`` (``day int, at timestamp, subject
text``, a partition a day, rows kept :data:`~cqrs.personal.keys.FORGET_LOG_KEEP_S`): the record
the processes' key caches read to drop a forgotten subject's key, instead of reading every key
again each TTL (:meth:`~cqrs.personal.keys.KeyStore.forgotten_since`). Delete keys only through
``forget``: a key row deleted otherwise goes unnoticed by the caches while they keep checking.
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
import zlib
from collections.abc import Collection, Sequence
from typing import Any

from cqrs.cassandra_io import CassandraSession
from cqrs.config import CqrsConfig
from cqrs.errors import KeyStoreError
from cqrs.personal.cipher import MasterKey, SubjectKey
from cqrs.personal.keys import FORGET_LOG_KEEP_S, FORGET_LOG_MARGIN_S, KeyCache, KeyStore

__all__ = ["FORGOTTEN_TABLE", "KEY_BUCKETS", "KEY_TABLE", "LEGACY_KEY_TABLE", "CassandraKeyStore",
           "key_bucket", "open_key_store"]

KEY_TABLE = "cqrs_data_keys"
LEGACY_KEY_TABLE = "cqrs_subject_keys"
"""The key table of releases before 2026-11-27 (a partition per subject): moved on open."""
FORGOTTEN_TABLE = "cqrs_forgotten_subjects"
KEY_BUCKETS = 64
"""Partitions of :data:`KEY_TABLE` (part of the table's layout: never change it for a table)."""
_DAY_S = 86400
_log = logging.getLogger(__name__)


def key_bucket(subject: str) -> int:
    """The partition of :data:`KEY_TABLE` that holds ``subject``'s key."""
    return zlib.crc32(subject.encode()) % KEY_BUCKETS


class CassandraKeyStore(KeyStore):
    """Keys wrapped by ``master`` in :data:`KEY_TABLE` of ``session``'s keyspace (created when
    missing; a legacy table's keys moved into it). Reads of many subjects are ``IN`` requests
    per bucket, ``[cassandra] rows_per_request`` subjects each."""

    def __init__(self, session: CassandraSession, master: MasterKey) -> None:
        self.session = session
        self.master = master
        session.execute(f"CREATE TABLE IF NOT EXISTS {KEY_TABLE} (bucket int, subject text, "
                        "wrapped blob, created timestamp, PRIMARY KEY ((bucket), subject))")
        session.execute(f"CREATE TABLE IF NOT EXISTS {FORGOTTEN_TABLE} (day int, at timestamp, "
                        "subject text, PRIMARY KEY ((day), at, subject))")
        self.move_legacy_keys()

    def move_legacy_keys(self) -> int:
        """Move the keys of :data:`LEGACY_KEY_TABLE` (if the keyspace has it) into
        :data:`KEY_TABLE` and drop it; the number moved. Each is inserted ``IF NOT EXISTS``
        (a key made in the new table meanwhile wins), and the table is dropped only after every
        key is in: a move stopped part-way is finished by the next store opened. Stop the
        processes of releases before 2026-11-27 first: they read and forget in the old table."""
        found = list(self.session.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s AND "
            "table_name = %s", (self.session.keyspace, LEGACY_KEY_TABLE)))
        if not found:
            return 0
        insert = self.session.prepare(
            f"INSERT INTO {KEY_TABLE} (bucket, subject, wrapped, created) VALUES (?, ?, ?, ?) "
            "IF NOT EXISTS", write=True)
        rows = [(key_bucket(r[0]), r[0], r[1], r[2]) for r in self.session.execute(
            f"SELECT subject, wrapped, created FROM {LEGACY_KEY_TABLE}")]
        self.session.concurrent(insert, rows)
        self.session.execute(f"DROP TABLE IF EXISTS {LEGACY_KEY_TABLE}")
        _log.warning("moved %d data keys from %s.%s to %s (a table per bucket of subjects)",
                     len(rows), self.session.keyspace, LEGACY_KEY_TABLE, KEY_TABLE)
        return len(rows)

    def get_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        wanted = list(dict.fromkeys(subjects))
        if not wanted:
            return {}
        n = self.session.rows_per_request
        params: list[Sequence[Any]] = []
        if n == 1:
            stmt = self.session.prepare(
                f"SELECT subject, wrapped FROM {KEY_TABLE} WHERE bucket = ? AND subject = ?")
            params = [(key_bucket(s), s) for s in wanted]
        else:
            stmt = self.session.prepare(
                f"SELECT subject, wrapped FROM {KEY_TABLE} WHERE bucket = ? AND subject IN ?")
            by_bucket: dict[int, list[str]] = {}
            for s in wanted:
                by_bucket.setdefault(key_bucket(s), []).append(s)
            params = [(b, group[i:i + n]) for b, group in by_bucket.items()
                      for i in range(0, len(group), n)]
        unwrap = self.master.unwrap
        return {row[0]: unwrap(bytes(row[1]), row[0])
                for rows in self.session.concurrent(stmt, params) for row in rows}

    def get_or_create_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        found = self.get_many(subjects)
        missing = [s for s in dict.fromkeys(subjects) if s not in found]
        if not missing:
            return found
        insert = self.session.prepare(
            f"INSERT INTO {KEY_TABLE} (bucket, subject, wrapped, created) VALUES (?, ?, ?, "
            "toTimestamp(now())) IF NOT EXISTS", write=True)
        made = {s: SubjectKey.new() for s in missing}
        results = self.session.concurrent(
            insert, [(key_bucket(s), s, self.master.wrap(made[s], s)) for s in missing])
        raced = []
        for subject, result in zip(missing, results):
            if result.was_applied:
                found[subject] = made[subject]
            else:  # another process made it first: theirs is the key
                raced.append(subject)
        if raced:
            found.update(self.get_many(raced))
        return found

    def forget(self, subject: str) -> bool:
        record = self.session.prepare(
            f"INSERT INTO {FORGOTTEN_TABLE} (day, at, subject) VALUES (?, ?, ?) "
            f"USING TTL {int(FORGET_LOG_KEEP_S + 2 * _DAY_S)}", write=True)
        now = time.time()
        self.session.execute(record, (int(now // _DAY_S), _timestamp(now), subject))  # first
        delete = self.session.prepare(
            f"DELETE FROM {KEY_TABLE} WHERE bucket = ? AND subject = ? IF EXISTS", write=True)
        return bool(self.session.execute(delete, (key_bucket(subject), subject)).was_applied)

    def forgotten_since(self, since: float) -> Collection[str]:
        """The subjects recorded by :meth:`forget` (in any process) at or after ``since``: one
        request over the days from ``since`` to now (and a clock margin beyond)."""
        read = self.session.prepare(
            f"SELECT subject FROM {FORGOTTEN_TABLE} WHERE day IN ? AND at >= ?")
        last = int((time.time() + FORGET_LOG_MARGIN_S) // _DAY_S)
        days = list(range(int(since // _DAY_S), last + 1))
        return {row[0] for row in self.session.execute(read, (days, _timestamp(since)))}

    def close(self) -> None:
        self.session.close()


def _timestamp(seconds: float) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)


def open_key_store(cfg: CqrsConfig) -> KeyStore:
    """A new key store as configured: a :class:`KeyCache` (``[personal_data]`` sizes) over a
    :class:`CassandraKeyStore` in ``[cassandra] keyspace``, its keys wrapped by
    ``[personal_data] master_key``. Close it when done."""
    settings = cfg.personal_data
    master = MasterKey(settings.master_key_bytes())  # checked before anything connects
    session = CassandraSession(cfg.cassandra,
                               error=lambda msg: KeyStoreError(f"key store: {msg}"))
    try:
        store = CassandraKeyStore(session, master)
    except Exception:
        session.close()
        raise
    return KeyCache(store, size=settings.key_cache_size, ttl_s=settings.key_cache_seconds)

