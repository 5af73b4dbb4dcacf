"""Where data subjects' keys live: the :class:`KeyStore` interface, a memory store and a cache.

A key store gives each data subject one key, made on first use, until the subject is
forgotten: ``forget`` deletes the key, and every value sealed with it reads as its field's
replacement from then on (a later ``get_or_create`` makes a new key with a new id: old values
stay unreadable). The methods take many subjects at once (one request for a batch), with
one-subject shorthands. To keep keys elsewhere (a KMS, a vault), subclass :class:`KeyStore`
and implement the three abstract methods; wrap it in a :class:`KeyCache`. A store that also
records its forgets (:meth:`KeyStore.forgotten_since`) spares its caches reading every key
again each TTL.
"""

from __future__ import annotations

import abc
import collections
import threading
import time
from collections.abc import Callable, Collection

from cqrs.errors import KeyStoreError
from cqrs.personal.cipher import SubjectKey

__all__ = ["FORGET_LOG_MARGIN_S", "FORGET_LOG_KEEP_S", "KeyCache", "KeyStore", "MemoryKeyStore"]

FORGET_LOG_KEEP_S = 7 * 86400.0
"""How long a store's record of forgets (:meth:`KeyStore.forgotten_since`) is kept."""

FORGET_LOG_MARGIN_S = 60.0
"""How far before the last check a :class:`KeyCache` asks for forgets again: the clocks of the
processes that forget and of the cache may disagree by up to this much."""


class KeyStore(abc.ABC):
    """The data keys of data subjects (a subject is a person's id, e.g. a customer id)."""

    @abc.abstractmethod
    def get_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        """The keys of those of ``subjects`` that have one."""

    @abc.abstractmethod
    def get_or_create_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        """The key of every one of ``subjects``, made now for those without one. Two processes
        making a subject's first key at once get the same key."""

    @abc.abstractmethod
    def forget(self, subject: str) -> bool:
        """Delete ``subject``'s key (True if it had one): its sealed values are unreadable
        from now on, everywhere they were copied."""

    def get(self, subject: str) -> SubjectKey | None:
        """``subject``'s key, or None (never had one, or forgotten)."""
        return self.get_many((subject,)).get(subject)

    def get_or_create(self, subject: str) -> SubjectKey:
        """``subject``'s key, made now if it has none."""
        return self.get_or_create_many((subject,))[subject]

    def prefetch(self, subjects: Collection[str], *, create: bool = True) -> dict[str, SubjectKey]:
        """The keys of a batch's data subjects at once (``create``: made now for those without
        one): what a job asks before it decodes (and encodes) a batch of their messages, so
        that the messages' own look-ups find them (in a :class:`KeyCache`: the batch costs one
        request to the store however many subjects it has, not one each)."""
        return self.get_or_create_many(subjects) if create else self.get_many(subjects)

    def key_for(self, subject: str, key_id: bytes) -> SubjectKey | None:
        """The key with ``key_id`` if it is still ``subject``'s key (what opening a sealed
        value needs), else None: the value was sealed before the subject was forgotten."""
        key = self.get(subject)
        return key if key is not None and key.key_id == key_id else None

    def forgotten_since(self, since: float) -> Collection[str] | None:
        """The subjects forgotten at or after ``since`` (``time.time()`` seconds), from a
        record the store writes before it deletes a key and keeps for
        :data:`FORGET_LOG_KEEP_S`: what lets a :class:`KeyCache` keep its keys without reading
        each again every TTL. None (the default): the store keeps no such record (a cache
        then reads each key again once it is a TTL old)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections (a memory store has none)."""


class MemoryKeyStore(KeyStore):
    """Keys in a dict: for tests, the in-process runner and examples (lost on exit)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._keys: dict[str, SubjectKey] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._forgotten: collections.deque[tuple[float, str]] = collections.deque()

    def get_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        with self._lock:
            return {s: self._keys[s] for s in subjects if s in self._keys}

    def get_or_create_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        with self._lock:
            return {s: self._keys.get(s) or self._keys.setdefault(s, SubjectKey.new())
                    for s in subjects}

    def forget(self, subject: str) -> bool:
        with self._lock:
            now = self._clock()
            self._forgotten.append((now, subject))  # recorded first, as the table's
            while self._forgotten[0][0] < now - FORGET_LOG_KEEP_S:
                self._forgotten.popleft()
            return self._keys.pop(subject, None) is not None

    def forgotten_since(self, since: float) -> Collection[str] | None:
        with self._lock:
            return {s for at, s in self._forgotten if at >= since}

    def __len__(self) -> int:
        return len(self._keys)


class KeyCache(KeyStore):
    """A :class:`KeyStore` in front of another, keeping up to ``size`` keys for ``ttl_s``
    seconds each (least recently used out first): a message's fields cost one dict look-up,
    and the store is asked once per subject per ``ttl_s``.

    A key forgotten through this cache is dropped at once; one forgotten by another process
    is used here until its entry is ``ttl_s`` old. That a key id is gone is remembered for
    good (an id is never made again), so old values of a forgotten subject cost no request.

    When the store records its forgets (:meth:`KeyStore.forgotten_since`), the cache asks it,
    every quarter of the TTL as it is used (one small request), which subjects were forgotten
    since it last asked, drops their keys, and counts every other key checked then (its
    *vouched* time): a key cached stays fresh while the cache keeps asking, instead of being
    read again every TTL (at 100,000 subjects, 100,000 reads). The bound holds either way: a
    key is used at most ``ttl_s`` after the later of its load and the last check that would
    have seen its subject's forget.
    """

    def __init__(self, store: KeyStore, *, size: int = 100_000, ttl_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        if size < 1:
            raise ValueError(f"KeyCache size={size}: keep at least one key (e.g. 100000)")
        self.store = store
        self.size = size
        self.ttl_s = ttl_s
        self._clock = clock
        self._keys: collections.OrderedDict[str, tuple[SubjectKey, float]] = (
            collections.OrderedDict())
        self._gone: collections.OrderedDict[tuple[str, bytes], None] = collections.OrderedDict()
        self._lock = threading.Lock()
        # the forget record: every key cached at clock reading _vouched (and not dropped
        # since) was checked against it; _asked: the time.time() of that check
        self._vouched = float("-inf")
        self._asked: float | None = None
        self._asking = threading.Lock()
        self._recorded = True  # whether the store records its forgets (until it says not)
        self._wall = wall
        # how many times a key handed out may have stopped being its subject's (see drops),
        # and the last entry looked up by a message (subject, entry, drops then): the event
        # and the state a command writes seal the same person's values one after the other
        self._drops = 0
        self._last: tuple[str, tuple[SubjectKey, float], int] | None = None

    def _vouch(self) -> None:
        """Ask the store for the subjects forgotten since the last check (when it is a quarter
        of the TTL old) and drop their keys; then every key still cached counts as checked
        now. Nothing when the store keeps no record, or when the request fails (the keys
        then age as their TTL says)."""
        now = self._clock()
        if not self._recorded or now - self._vouched < self.ttl_s / 4 or \
                not self._asking.acquire(blocking=False):
            return
        try:
            wall = self._wall()
            # since the last check (at most a TTL back: older keys are stale anyway)
            since = max(self._asked or wall - self.ttl_s, wall - self.ttl_s) - FORGET_LOG_MARGIN_S
            if since < wall - FORGET_LOG_KEEP_S:
                return
            try:
                forgotten = self.store.forgotten_since(since)
            except KeyStoreError:
                return
            if forgotten is None:  # the store keeps no record: its keys age by the TTL
                self._recorded = False
                return
            with self._lock:
                for subject in forgotten:
                    self._keys.pop(subject, None)
                if forgotten:
                    self._drops += 1
            self._asked, self._vouched = wall, now
        finally:
            self._asking.release()

    def _stale_before(self, max_age_s: float) -> float:
        """The clock reading before which a key loaded is too old (``max_age_s``), unless
        vouched for since: -inf when the last check of the forget record is that recent."""
        stale = self._clock() - max_age_s
        return float("-inf") if self._vouched > stale else stale

    def _cached(self, subjects: Collection[str], max_age_s: float | None = None,
                ) -> tuple[dict[str, SubjectKey], list[str]]:
        found: dict[str, SubjectKey] = {}
        missing: list[str] = []
        stale = self._stale_before(self.ttl_s if max_age_s is None else max_age_s)
        with self._lock:
            for s in subjects:
                entry = self._keys.get(s)
                if entry is not None and entry[1] > stale:
                    self._keys.move_to_end(s)
                    found[s] = entry[0]
                else:
                    missing.append(s)
        return found, missing

    def _keep(self, keys: dict[str, SubjectKey]) -> None:
        """Cache ``keys`` (loaded now). A key loaded again unchanged keeps its cached object,
        and with it the values it sealed lately (its memo, see cqrs.personal.cipher.seal_text):
        ``keys`` is updated to hold those objects."""
        now = self._clock()
        changed = False  # another key than one handed out before
        with self._lock:
            for s, key in keys.items():
                entry = self._keys.get(s)
                if entry is not None:
                    if entry[0] == key:
                        key = keys[s] = entry[0]
                    else:
                        changed = True
                self._keys[s] = (key, now)
                self._keys.move_to_end(s)
            if changed:  # after the keys changed (see cached)
                self._drops += 1
            while len(self._keys) > self.size:
                self._keys.popitem(last=False)

    def _through(self, subjects: Collection[str],
                 load: Callable[[Collection[str]], dict[str, SubjectKey]],
                 max_age_s: float | None = None) -> dict[str, SubjectKey]:
        """The cached keys of ``subjects`` (at most ``max_age_s`` old; default: the TTL), and
        the others from ``load`` (kept)."""
        self._vouch()
        found, missing = self._cached(subjects, max_age_s)
        if missing:
            loaded = load(missing)
            self._keep(loaded)
            found.update(loaded)
        return found

    def clear(self) -> None:
        """Drop every cached key (what a new process starts with; the keys stay in the
        store)."""
        with self._lock:
            self._keys.clear()
            self._drops += 1

    def get_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        return self._through(subjects, self.store.get_many)

    def prefetch(self, subjects: Collection[str], *, create: bool = True) -> dict[str, SubjectKey]:
        """:meth:`KeyStore.prefetch`: one request to the store for the subjects not cached,
        and for those cached more than half the TTL ago (so that no key the batch was checked
        with expires while the batch runs: a job decoding and encoding it uses these keys
        throughout; a subject forgotten elsewhere is still noticed within the TTL)."""
        load = self.store.get_or_create_many if create else self.store.get_many
        return self._through(subjects, load, self.ttl_s / 2)

    @property
    def drops(self) -> int:
        """A count that moves whenever a key this cache handed out may have stopped being its
        subject's key: a forget through the cache or seen in the store's record, a key found
        changed, a :meth:`clear`. While it stays the same and :meth:`fresh_after` is -inf,
        every key id the cache handed out since is still its subject's (a key that left the
        cache for room does not move it: its subject's forget is still seen in the record)."""
        return self._drops

    def fresh_after(self) -> float:
        """The clock reading after which a key loaded needs no reading again before a batch
        (half the TTL ago, as :meth:`prefetch` has it; -inf while the forget record was
        checked since: every key cached is fresh). Checks the record when that is due."""
        self._vouch()
        return self._stale_before(self.ttl_s / 2)

    def recent_key_id(self, subject: str | None, loaded_after: float) -> bytes | None:
        """The id of ``subject``'s cached key if it was loaded after ``loaded_after`` (a
        :meth:`fresh_after` reading), else None: no request, no lock. A key dropped (forgotten
        through this cache, or found changed) is no longer cached, so a state decided with it
        does not match."""
        entry = self._keys.get(subject)  # type: ignore[arg-type]
        return entry[0].key_id if entry is not None and entry[1] > loaded_after else None

    def cached(self, subject: str) -> SubjectKey | None:
        """``subject``'s cached key if it is fresh (the path of every sealed message: no lock,
        each dict operation is atomic on its own)."""
        last, drops = self._last, self._drops  # drops read first: a drop after it voids _last
        if last is not None and last[0] == subject and last[2] == drops and \
                last[1][1] > self._clock() - self.ttl_s:
            return last[1][0]  # the message before was this person's (its move_to_end done)
        entry = self._keys.get(subject)
        if entry is None or entry[1] <= self._clock() - self.ttl_s and \
                entry[1] <= self._stale_before(self.ttl_s):
            return None
        self._last = (subject, entry, drops)
        try:
            self._keys.move_to_end(subject)
        except KeyError:  # dropped by another thread meanwhile: still the key it was
            pass
        return entry[0]

    def get(self, subject: str) -> SubjectKey | None:
        return self.cached(subject) or self.get_many((subject,)).get(subject)

    def get_or_create(self, subject: str) -> SubjectKey:
        entry = self._keys.get(subject)  # cached(), inline: the path of every sealed message
        if entry is not None and (entry[1] > self._clock() - self.ttl_s or
                                  entry[1] > self._stale_before(self.ttl_s)):
            try:
                self._keys.move_to_end(subject)
            except KeyError:
                pass
            return entry[0]
        return self.get_or_create_many((subject,))[subject]

    def get_or_create_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        return self._through(subjects, self.store.get_or_create_many)

    def forget(self, subject: str) -> bool:
        with self._lock:
            entry = self._keys.pop(subject, None)
            self._drops += 1
        if entry is not None:
            self._remember_gone(subject, entry[0].key_id)
        return self.store.forget(subject)

    def key_for(self, subject: str, key_id: bytes) -> SubjectKey | None:
        with self._lock:
            if (subject, key_id) in self._gone:
                return None
        key = self.get(subject)
        if key is not None and key.key_id != key_id:  # maybe a key made since we cached ours
            with self._lock:
                self._keys.pop(subject, None)
                self._drops += 1
            key = self.get(subject)
        if key is not None and key.key_id == key_id:
            return key
        self._remember_gone(subject, key_id)
        return None

    def _remember_gone(self, subject: str, key_id: bytes) -> None:
        with self._lock:
            self._gone[(subject, key_id)] = None
            while len(self._gone) > self.size:
                self._gone.popitem(last=False)

    def close(self) -> None:
        self.store.close()
