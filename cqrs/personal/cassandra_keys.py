"""The data subjects' keys in Cassandra: table ``cqrs_subject_keys`` of the app keyspace.

One row per subject: ``subject text PRIMARY KEY, wrapped blob, created timestamp``, the key
wrapped by the master key (:class:`~cqrs.personal.cipher.MasterKey`), so the table alone
opens nothing. A first key is inserted with ``IF NOT EXISTS`` (a lightweight transaction): two
processes making a subject's key at once end up with the same one. Each key is also copied to
``cqrs_subject_key_copies`` (``bucket int, subject text, wrapped blob``, 64 partitions), where
many are read at once (see :class:`CassandraKeyStore`). ``forget`` deletes the copy and the row,
after recording the subject in ``cqrs_forgotten_subjects`` (``day int, at timestamp, subject
text``, a partition a day, rows kept :data:`~cqrs.personal.keys.FORGET_LOG_KEEP_S`): the record
the processes' key caches read to drop a forgotten subject's key, instead of reading every key
again each TTL (:meth:`~cqrs.personal.keys.KeyStore.forgotten_since`). Delete keys only through
``forget``: a key row deleted otherwise goes unnoticed by the caches while they keep checking.
"""

from __future__ import annotations

import datetime as _dt
import time
import zlib
from collections.abc import Collection, Sequence

from cqrs.cassandra_io import CassandraSession
from cqrs.config import CqrsConfig
from cqrs.errors import KeyStoreError
from cqrs.personal.cipher import MasterKey, SubjectKey
from cqrs.personal.keys import FORGET_LOG_KEEP_S, FORGET_LOG_MARGIN_S, KeyCache, KeyStore

__all__ = ["COPY_TABLE", "FORGOTTEN_TABLE", "KEY_TABLE", "CassandraKeyStore", "copy_bucket",
           "open_key_store"]

KEY_TABLE = "cqrs_subject_keys"
COPY_TABLE = "cqrs_subject_key_copies"
COPY_BUCKETS = 64
"""Partitions of :data:`COPY_TABLE` (part of its layout: never change it for a table)."""
COPY_SHADOW_US = 3_600_000_000
"""How far ahead of its clock a forget dates the deletion of a copy: a copy of the forgotten
key written late, by a process whose clock is behind by up to this much, stays deleted (a key
made again for the subject within the hour is read from its own row meanwhile)."""
CREATE_ATTEMPTS = 3
CREATE_RETRY_S = 0.5  # before the second attempt (twice that before the third)
FORGOTTEN_TABLE = "cqrs_forgotten_subjects"
_DAY_S = 86400


def copy_bucket(subject: str) -> int:
    """The partition of :data:`COPY_TABLE` that holds ``subject``'s copy."""
    return zlib.crc32(subject.encode()) % COPY_BUCKETS


class CassandraKeyStore(KeyStore):
    """Keys wrapped by ``master`` in :data:`KEY_TABLE` of ``session``'s keyspace (created when
    missing), and a copy of each in :data:`COPY_TABLE` for reading many at once.

    :data:`KEY_TABLE` has a partition per subject: where a first key is made (``IF NOT
    EXISTS``, a lightweight transaction per subject, which never contend) and forgotten. Read
    a partition each, the keys of a batch's thousands of subjects cost a process that had not
    seen them ~35 µs a subject; so each key is also written to :data:`COPY_TABLE` (``((bucket),
    subject)``, :data:`COPY_BUCKETS` partitions), read as the processor reads its states: a few
    requests per bucket. A subject missing there (a key made before the copies, or a copy not
    written) is read from :data:`KEY_TABLE` and copied then. A copy is written with the
    timestamp of its key's row (``USING TIMESTAMP``: the key's maker's clock before the
    insert, or the row's ``WRITETIME``), and ``forget`` deletes the copy before the key, dated
    :data:`COPY_SHADOW_US` ahead: a copy written late by a process that saw the key before the
    forget is older than the deletion, so it never brings a forgotten key back."""

    def __init__(self, session: CassandraSession, master: MasterKey) -> None:
        self.session = session
        self.master = master
        session.execute(f"CREATE TABLE IF NOT EXISTS {KEY_TABLE} (subject text PRIMARY KEY, "
                        "wrapped blob, created timestamp)")
        session.execute(f"CREATE TABLE IF NOT EXISTS {COPY_TABLE} (bucket int, subject text, "
                        "wrapped blob, PRIMARY KEY ((bucket), subject))")
        session.execute(f"CREATE TABLE IF NOT EXISTS {FORGOTTEN_TABLE} (day int, at timestamp, "
                        "subject text, PRIMARY KEY ((day), at, subject))")

    def get_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        wanted = list(dict.fromkeys(subjects))
        rows = self._copies(wanted)
        if len(rows) < len(wanted):  # not copied yet: the keys' own rows, copied now
            missing = [s for s in wanted if s not in rows]
            found = self.session.read_in(
                f"SELECT subject, wrapped, WRITETIME(wrapped) FROM {KEY_TABLE}", "subject",
                missing)
            self._copy([(row[0], bytes(row[1]), row[2]) for row in found])
            rows.update((row[0], bytes(row[1])) for row in found)
        unwrap = self.master.unwrap
        return {subject: unwrap(wrapped, subject) for subject, wrapped in rows.items()}

    def _copies(self, subjects: Sequence[str]) -> dict[str, bytes]:
        """The wrapped keys of those of ``subjects`` that :data:`COPY_TABLE` holds."""
        rows = self.session.read_in_buckets(f"SELECT subject, wrapped FROM {COPY_TABLE}",
                                            "subject", subjects, copy_bucket)
        return {row[0]: bytes(row[1]) for row in rows}

    def _copy(self, keys: Sequence[tuple[str, bytes, int]]) -> None:
        """Write ``(subject, wrapped, timestamp of the key's row)`` to :data:`COPY_TABLE`."""
        if keys:
            insert = self.session.prepare(
                f"INSERT INTO {COPY_TABLE} (bucket, subject, wrapped) VALUES (?, ?, ?) "
                "USING TIMESTAMP ?", write=True)
            self.session.concurrent(insert, [(copy_bucket(s), s, w, t) for s, w, t in keys])

    def get_or_create_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        """:meth:`KeyStore.get_or_create_many`; a request that timed out is tried again (up to
        :data:`CREATE_ATTEMPTS` times): a first key's ``IF NOT EXISTS`` may time out on a busy
        node with its outcome unknown, and asking again is safe (the subjects whose keys were
        written are read, the others inserted again; no key is used before it is stored)."""
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            try:
                return self._get_or_create_many(subjects)
            except KeyStoreError as exc:
                if attempt == CREATE_ATTEMPTS or not _timed_out(exc):
                    raise
                time.sleep(CREATE_RETRY_S * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _get_or_create_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        found = self.get_many(subjects)
        missing = [s for s in dict.fromkeys(subjects) if s not in found]
        if not missing:
            return found
        insert = self.session.prepare(
            f"INSERT INTO {KEY_TABLE} (subject, wrapped, created) VALUES (?, ?, "
            "toTimestamp(now())) IF NOT EXISTS", write=True)
        made = {s: SubjectKey.new() for s in missing}
        wrapped = {s: self.master.wrap(made[s], s) for s in missing}
        # before the rows are written: older than their writetime, and than any later forget
        before_us = time.time_ns() // 1000 - 1
        results = self.session.concurrent(insert, [(s, wrapped[s]) for s in missing])
        raced, applied = [], []
        for subject, result in zip(missing, results):
            if result.was_applied:
                found[subject] = made[subject]
                applied.append((subject, wrapped[subject], before_us))
            else:  # another process made it first: theirs is the key
                raced.append(subject)
        self._copy(applied)
        if raced:
            found.update(self.get_many(raced))
        return found

    def forget(self, subject: str) -> bool:
        record = self.session.prepare(
            f"INSERT INTO {FORGOTTEN_TABLE} (day, at, subject) VALUES (?, ?, ?) "
            f"USING TTL {int(FORGET_LOG_KEEP_S + 2 * _DAY_S)}", write=True)
        now = time.time()
        self.session.execute(record, (int(now // _DAY_S), _timestamp(now), subject))  # first
        uncopy = self.session.prepare(
            f"DELETE FROM {COPY_TABLE} USING TIMESTAMP ? WHERE bucket = ? AND subject = ?",
            write=True)
        self.session.execute(uncopy, ((time.time_ns() // 1000) + COPY_SHADOW_US,
                                      copy_bucket(subject), subject))  # then the copy
        delete = self.session.prepare(f"DELETE FROM {KEY_TABLE} WHERE subject = ? IF EXISTS",
                                      write=True)
        return bool(self.session.execute(delete, (subject,)).was_applied)

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


def _timed_out(exc: BaseException) -> bool:
    """Whether a key store error was a request that timed out (its outcome unknown)."""
    from cassandra import OperationTimedOut, ReadTimeout, WriteTimeout

    cause = exc.__cause__
    return isinstance(cause, (OperationTimedOut, ReadTimeout, WriteTimeout))


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

