"""CassandraKeyStore on the real Cassandra: the key store contract, what a row holds, and a
codec sealing personal fields with keys from the configured store, then forgotten."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator

import pytest

from cqrs.cassandra_io import CassandraSession
from cqrs.codec import Codec
from cqrs.config import CqrsConfig
from cqrs.domain import FORGOTTEN, event, personal
from cqrs.errors import KeyStoreError
from cqrs.personal import (
    KEY_TABLE,
    CassandraKeyStore,
    KeyCache,
    MasterKey,
    open_key_store,
)
from cqrs.personal.cipher import SubjectKey
from cqrs.testing.key_stores import KeyStoreContract

MASTER = MasterKey(b"M" * 32)


@pytest.fixture(scope="module")
def keyspace(cqrs_config: CqrsConfig) -> Iterator[str]:
    """One keyspace for the module's stores (the contract's subjects are unique per test)."""
    name = f"t_keys_{uuid.uuid4().hex[:10]}"
    yield name
    session = CassandraSession(cqrs_config.cassandra, keyspace=name)
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {name}")
    finally:
        session.close()


def _store(cfg: CqrsConfig, keyspace: str, **options: int) -> Iterator[CassandraKeyStore]:
    session = CassandraSession(cfg.cassandra, keyspace=keyspace, **options)
    store = CassandraKeyStore(session, MASTER)
    yield store
    store.close()


@pytest.fixture(scope="module")
def cassandra_store(cqrs_config: CqrsConfig, keyspace: str) -> Iterator[CassandraKeyStore]:
    yield from _store(cqrs_config, keyspace)


@pytest.fixture(scope="module")
def row_by_row_store(cqrs_config: CqrsConfig, keyspace: str) -> Iterator[CassandraKeyStore]:
    """A store whose session reads and writes a row per request (``rows_per_request = 1``)."""
    yield from _store(cqrs_config, keyspace, rows_per_request=1)


class TestCassandraKeyStore(KeyStoreContract):
    @pytest.fixture
    def key_store(self, cassandra_store: CassandraKeyStore) -> CassandraKeyStore:
        return cassandra_store


class TestCassandraKeyStoreRowByRow(KeyStoreContract):
    @pytest.fixture
    def key_store(self, row_by_row_store: CassandraKeyStore) -> CassandraKeyStore:
        return row_by_row_store


def test_a_row_holds_the_key_wrapped_and_only_the_master_key_opens_it(
        cassandra_store: CassandraKeyStore) -> None:
    subject = f"ann-{uuid.uuid4().hex[:8]}"
    key = cassandra_store.get_or_create(subject)
    (row,) = list(cassandra_store.session.execute(
        f"SELECT subject, wrapped, created FROM {KEY_TABLE} WHERE subject = %s", (subject,)))
    assert row[0] == subject and row[2] is not None
    assert key.secret not in bytes(row[1])
    other = CassandraKeyStore(cassandra_store.session, MasterKey(b"N" * 32))
    with pytest.raises(KeyStoreError, match="master_key"):
        other.get(subject)


@event(name="keys_it.Registered", subject="customer_id")
class Registered:
    customer_id: str
    email: str = personal()
    plan: str = "basic"


def test_a_codec_seals_with_the_configured_store_and_forgets_through_it(
        cqrs_config: CqrsConfig, keyspace: str) -> None:
    cfg = cqrs_config.with_overrides(
        cassandra={"keyspace": keyspace},
        personal_data={"master_key": base64.b64encode(b"M" * 32).decode()})
    keys, reader_keys = open_key_store(cfg), open_key_store(cfg)  # two processes, one table
    try:
        assert isinstance(keys, KeyCache) and isinstance(keys.store, CassandraKeyStore)
        message = Registered(f"c-{uuid.uuid4().hex[:8]}", "ann@example.com", "gold")
        data = Codec([Registered], key_store=keys).encode(message)
        assert Codec([Registered], key_store=reader_keys).decode(data) == message
        assert keys.forget(message.customer_id)
        # another process's cache keeps the key until its entry is old; a process without
        # it reads the replacement at once
        fresh = Codec([Registered], key_store=CassandraKeyStore(keys.store.session, MASTER))
        assert fresh.decode(data) == Registered(message.customer_id, FORGOTTEN, "gold")
    finally:
        keys.close()
        reader_keys.close()


def test_a_forget_is_recorded_and_another_processs_cache_drops_the_key_at_its_next_check(
        cassandra_store: CassandraKeyStore) -> None:
    import time

    subject = f"ann-{uuid.uuid4().hex[:8]}"
    now = [0.0]
    elsewhere = KeyCache(cassandra_store, ttl_s=60, clock=lambda: now[0])
    key = elsewhere.prefetch([subject])[subject]
    before = time.time()
    assert subject not in cassandra_store.forgotten_since(before - 1)
    assert KeyCache(cassandra_store).forget(subject)  # another process's cache
    assert subject in cassandra_store.forgotten_since(before - 1)
    assert subject not in cassandra_store.forgotten_since(time.time() + 5)
    assert elsewhere.cached(subject) is key  # until its next check of the record
    now[0] = 15.0  # a quarter of the TTL on: checked, dropped, and read as gone
    assert elsewhere.prefetch([subject], create=False) == {}
    assert elsewhere.key_for(subject, key.key_id) is None


def test_keys_are_read_through_their_copies_and_a_late_copy_never_brings_one_back(
        cassandra_store: CassandraKeyStore) -> None:
    from cqrs.personal.cassandra_keys import COPY_TABLE, copy_bucket

    session = cassandra_store.session
    made = {f"cp-{uuid.uuid4().hex[:8]}-{n}": SubjectKey.new() for n in range(3)}

    def copies() -> set[str]:
        return {s for s in made for _ in session.execute(
            f"SELECT subject FROM {COPY_TABLE} WHERE bucket = %s AND subject = %s",
            (copy_bucket(s), s))}

    # keys in their own rows only (made before the copies existed): read, and copied then
    for subject, key in made.items():
        session.execute(f"INSERT INTO {KEY_TABLE} (subject, wrapped, created) VALUES "
                        "(%s, %s, toTimestamp(now()))", (subject, MASTER.wrap(key, subject)))
    assert copies() == set() and cassandra_store.get_many(list(made)) == made
    assert copies() == set(made)
    # a reader that saw a key before its forget copies it after: the copy stays deleted
    ann, bo, _ = made
    (seen,) = list(session.execute(
        f"SELECT wrapped, WRITETIME(wrapped) FROM {KEY_TABLE} WHERE subject = %s", (ann,)))
    assert cassandra_store.forget(ann) is True and copies() == set(made) - {ann}
    cassandra_store._copy([(ann, bytes(seen[0]), seen[1])])  # noqa: SLF001 - the late reader
    assert ann not in copies() and cassandra_store.get_many([ann]) == {}
    # a key made for the subject again is read (from its own row while its copy is shadowed)
    again = cassandra_store.get_or_create(ann)
    assert again.key_id != made[ann].key_id and cassandra_store.get(ann) == again
    # a new subject's first key is copied when it is made
    new = f"cp-{uuid.uuid4().hex[:8]}-new"
    key = cassandra_store.get_or_create(new)
    assert list(session.execute(f"SELECT subject FROM {COPY_TABLE} WHERE bucket = %s AND "
                                "subject = %s", (copy_bucket(new), new)))
    assert cassandra_store.get(new) == key and cassandra_store.get(bo) == made[bo]
