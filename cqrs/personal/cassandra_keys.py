"""The data subjects' keys in Cassandra: table ``cqrs_subject_keys`` of the app keyspace.

One row per subject: ``subject text PRIMARY KEY, wrapped blob, created timestamp``, the key
wrapped by the master key (:class:`~cqrs.personal.cipher.MasterKey`), so the table alone
opens nothing. A first key is inserted with ``IF NOT EXISTS`` (a lightweight transaction): two
processes making a subject's key at once end up with the same one. ``forget`` deletes the row.
"""

from __future__ import annotations

from collections.abc import Collection

from cqrs.cassandra_io import CassandraSession
from cqrs.config import CqrsConfig
from cqrs.errors import KeyStoreError
from cqrs.personal.cipher import MasterKey, SubjectKey
from cqrs.personal.keys import KeyCache, KeyStore

__all__ = ["KEY_TABLE", "CassandraKeyStore", "open_key_store"]

KEY_TABLE = "cqrs_subject_keys"


class CassandraKeyStore(KeyStore):
    """Keys wrapped by ``master`` in :data:`KEY_TABLE` of ``session``'s keyspace (created when
    missing). Reads of many subjects are ``IN`` requests grouped by replica."""

    def __init__(self, session: CassandraSession, master: MasterKey) -> None:
        self.session = session
        self.master = master
        session.execute(f"CREATE TABLE IF NOT EXISTS {KEY_TABLE} (subject text PRIMARY KEY, "
                        "wrapped blob, created timestamp)")

    def get_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        rows = self.session.read_in(f"SELECT subject, wrapped FROM {KEY_TABLE}", "subject",
                                    list(dict.fromkeys(subjects)))
        return {row[0]: self.master.unwrap(bytes(row[1]), row[0]) for row in rows}

    def get_or_create_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        found = self.get_many(subjects)
        missing = [s for s in dict.fromkeys(subjects) if s not in found]
        if not missing:
            return found
        insert = self.session.prepare(
            f"INSERT INTO {KEY_TABLE} (subject, wrapped, created) VALUES (?, ?, "
            "toTimestamp(now())) IF NOT EXISTS", write=True)
        made = {s: SubjectKey.new() for s in missing}
        results = self.session.concurrent(
            insert, [(s, self.master.wrap(made[s], s)) for s in missing])
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
        delete = self.session.prepare(f"DELETE FROM {KEY_TABLE} WHERE subject = ? IF EXISTS",
                                      write=True)
        return bool(self.session.execute(delete, (subject,)).was_applied)

    def close(self) -> None:
        self.session.close()


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

