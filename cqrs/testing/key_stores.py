"""The contract every :class:`~cqrs.personal.KeyStore` keeps, as a reusable pytest class.

Subclass it in a test module with a ``key_store`` fixture giving the store under test (one
store may serve every test: subjects are unique per test), e.g. for a store of your own
over a KMS::

    class TestMyKmsKeyStore(KeyStoreContract):
        @pytest.fixture
        def key_store(self):
            return MyKmsKeyStore(...)

The framework runs it for :class:`~cqrs.personal.MemoryKeyStore`, for a
:class:`~cqrs.personal.KeyCache` and for :class:`~cqrs.personal.CassandraKeyStore` (on the
real Cassandra).
"""

from __future__ import annotations

import threading
import uuid

from cqrs.personal.keys import KeyStore

__all__ = ["KeyStoreContract"]


def _subject(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


class KeyStoreContract:
    """Tests taking the store under test as the ``key_store`` fixture."""

    def test_a_subject_without_a_key_has_none(self, key_store: KeyStore) -> None:
        ann = _subject("ann")
        assert key_store.get(ann) is None
        assert key_store.get_many([ann, _subject("bob")]) == {}
        assert key_store.key_for(ann, b"\0" * 8) is None

    def test_get_or_create_makes_one_key_per_subject_and_keeps_it(
            self, key_store: KeyStore) -> None:
        ann, bob = _subject("ann"), _subject("bob")
        key = key_store.get_or_create(ann)
        assert key_store.get_or_create(ann) == key
        assert key_store.get(ann) == key
        assert key_store.key_for(ann, key.key_id) == key
        other = key_store.get_or_create(bob)
        assert (other.key_id, other.secret) != (key.key_id, key.secret)
        assert key_store.key_for(bob, key.key_id) is None  # ann's key id is not bob's

    def test_many_subjects_at_once(self, key_store: KeyStore) -> None:
        old, new1, new2 = _subject("old"), _subject("new1"), _subject("new2")
        first = key_store.get_or_create(old)
        keys = key_store.get_or_create_many([old, new1, new2, new1])
        assert set(keys) == {old, new1, new2}
        assert keys[old] == first
        assert key_store.get_many([new1, new2, _subject("none")]) == {
            new1: keys[new1], new2: keys[new2]}

    def test_forget_deletes_the_key_and_a_later_key_is_another(
            self, key_store: KeyStore) -> None:
        ann, bob = _subject("ann"), _subject("bob")
        key = key_store.get_or_create(ann)
        kept = key_store.get_or_create(bob)
        assert key_store.forget(ann) is True
        assert key_store.get(ann) is None
        assert key_store.key_for(ann, key.key_id) is None
        assert key_store.forget(ann) is False
        assert key_store.get(bob) == kept  # others untouched
        again = key_store.get_or_create(ann)
        assert again.key_id != key.key_id and again.secret != key.secret
        assert key_store.key_for(ann, key.key_id) is None  # old values stay unreadable

    def test_any_text_is_a_subject(self, key_store: KeyStore) -> None:
        odd = [_subject("zoë@example.com"), _subject("顧客 1"), _subject("a'b\"c;--"),
               _subject("x" * 300)]
        keys = key_store.get_or_create_many(odd)
        assert key_store.get_many(odd) == keys
        assert len({k.key_id for k in keys.values()}) == len(odd)

    def test_racing_first_uses_agree_on_one_key(self, key_store: KeyStore) -> None:
        ann = _subject("ann")
        got: list[object] = []
        start = threading.Barrier(4)

        def make() -> None:
            start.wait()
            got.append(key_store.get_or_create(ann))

        threads = [threading.Thread(target=make) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and all(k == got[0] for k in got)
        assert key_store.get(ann) == got[0]
