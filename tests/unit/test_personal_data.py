"""Personal data (#26): declarations and their checks, the cipher, key wrapping, the memory key
store and the cache, and the codec sealing and opening personal fields."""

from __future__ import annotations

import base64
from typing import Annotated, Any

import attrs
import pytest

from cqrs import Aggregate, App, CommandHandler, command, event
from cqrs.codec import Codec, InMemorySchemaStore, schema_for, upcaster
from cqrs.config import load_config
from cqrs.domain import FORGOTTEN, personal, personal_fields
from cqrs.errors import (
    ConfigError,
    EncodeError,
    KeyStoreError,
    MissingKeyStoreError,
    PersonalDataDeclarationError,
    TamperedDataError,
)
from cqrs.personal import SEALED_PREFIX, KeyCache, MasterKey, MemoryKeyStore, SubjectKey
from cqrs.personal.cipher import OpenedText, open_sealed, open_text, parse_sealed, seal_text
from cqrs.testing.key_stores import KeyStoreContract

# ---- a small model with personal data ----------------------------------------------------------


@event(name="shop.CustomerRegistered", subject="customer_id")
class CustomerRegistered:
    customer_id: str
    email: str = personal()
    nickname: str | None = personal(default=None, replacement="")
    plan: str = "basic"
    visits: int = 0


@command(name="shop.Register", subject="customer_id")
class Register:
    customer_id: str
    email: str = personal()


@event(name="shop.PlanChanged")
class PlanChanged:  # no personal data: the codec's usual paths
    plan: str


class Customer(Aggregate, name="shop.Customer", subject="customer_id"):
    customer_id: str = ""
    email: str = personal(default="")
    plan: str = "basic"

    def apply_customer_registered(self, e: CustomerRegistered) -> None:
        self.customer_id, self.email = e.customer_id, e.email

    def apply_plan_changed(self, e: PlanChanged) -> None:
        self.plan = e.plan


class CustomerHandler(CommandHandler[Customer]):
    def register(self, customer: Customer, cmd: Register) -> list[CustomerRegistered]:
        return [CustomerRegistered(cmd.customer_id, cmd.email)]


def make_app() -> App:
    return App("shop", aggregates=[Customer], handlers=[CustomerHandler], events=[PlanChanged])


ANN = CustomerRegistered("c-1", "ann@example.com", "annie", "gold", 3)


@pytest.fixture
def keys() -> MemoryKeyStore:
    return MemoryKeyStore()


@pytest.fixture
def codec(keys: MemoryKeyStore) -> Codec:
    return make_app().codec_for(InMemorySchemaStore(), key_store=keys)


# ---- declarations and the model checks ---------------------------------------------------------


def test_declarations_are_read_from_the_fields_and_decorators() -> None:
    declared = personal_fields(CustomerRegistered)
    assert declared is not None
    assert declared.subject == "customer_id"
    assert declared.fields == (("email", FORGOTTEN), ("nickname", ""))
    assert personal_fields(Customer).fields == (("email", FORGOTTEN),)  # type: ignore[union-attr]
    assert personal_fields(PlanChanged) is None
    assert make_app().personal_classes == (Register, CustomerRegistered, Customer)


def test_the_schema_does_not_change() -> None:
    @event(name="shop.CustomerRegistered", subject="customer_id")
    class Plain:  # the same fields, none personal
        customer_id: str
        email: str
        nickname: str | None = None
        plan: str = "basic"
        visits: int = 0

    assert schema_for(CustomerRegistered) == schema_for(Plain)


@event(name="bad.NoSubject")
class NoSubject:
    email: str = personal()


@event(name="bad.MissingSubject", subject="customer")
class MissingSubject:
    customer_id: str
    email: str = personal()


@event(name="bad.IntSubject", subject="customer_id")
class IntSubject:
    customer_id: int
    email: str = personal()


@event(name="bad.OptionalSubject", subject="customer_id")
class OptionalSubject:
    customer_id: str | None
    email: str = personal()


@event(name="bad.PersonalSubject", subject="email")
class PersonalSubject:
    email: str = personal()


@event(name="bad.PersonalInt", subject="customer_id")
class PersonalInt:
    customer_id: str
    age: int = personal()


@event(name="bad.PersonalBytes", subject="customer_id")
class PersonalBytes:
    customer_id: str
    photo: bytes | None = personal(default=None)


@attrs.frozen
class Address:
    street: str = personal()


@event(name="bad.Nested", subject="customer_id")
class Nested:
    customer_id: str
    addresses: list[Address]


@event(name="ok.Annotated", subject="customer_id")
class AnnotatedFields:
    customer_id: Annotated[str, "id"]
    email: Annotated[str, "mail"] = personal()


@pytest.mark.parametrize(("cls", "words"), [
    (NoSubject, ["NoSubject.email is personal()", "names no data subject",
                 "subject='<field holding the person's id>'"]),
    (MissingSubject, ["names 'customer' as its data subject", "no such field",
                      "['customer_id', 'email']"]),
    (IntSubject, ["IntSubject.customer_id is typed", "must be a str field"]),
    (OptionalSubject, ["OptionalSubject.customer_id", "must be a str field", "never None"]),
    (PersonalSubject, ["both the data subject and personal()"]),
    (PersonalInt, ["PersonalInt.age is personal() but typed", "str or str | None"]),
    (PersonalBytes, ["PersonalBytes.photo is personal() but typed"]),
    (Nested, ["Address.street is personal()", "nested in Nested.addresses", "move the field"]),
    (Address, ["Address.street is personal()", "neither a command, an event nor an aggregate"]),
])
def test_declarations_the_codec_cannot_honour_are_refused_by_name(
        cls: type, words: list[str]) -> None:
    with pytest.raises(PersonalDataDeclarationError) as err:
        personal_fields(cls)
    for w in words:
        assert w in str(err.value)


class Bad(Aggregate, name="bad.Customer"):
    email: str = personal(default="")

    def apply_plan_changed(self, e: PlanChanged) -> None: ...


class BadHandler(CommandHandler[Bad]):
    def change(self, agg: Bad, cmd: Register) -> list[PlanChanged]:
        return []


def test_app_build_refuses_a_personal_field_without_a_subject() -> None:
    with pytest.raises(PersonalDataDeclarationError, match="Bad.email is personal"):
        App("bad", aggregates=[Bad], handlers=[BadHandler])


def test_annotated_str_fields_are_allowed() -> None:
    assert personal_fields(AnnotatedFields).fields == (("email", FORGOTTEN),)  # type: ignore[union-attr]


def test_bad_arguments_are_refused_early() -> None:
    with pytest.raises(PersonalDataDeclarationError, match="give a str"):
        personal(replacement=None)  # type: ignore[arg-type]
    with pytest.raises(PersonalDataDeclarationError, match="subject=3"):
        event(subject=3)(type("X", (), {"__annotations__": {"a": "str"}}))  # type: ignore[arg-type]


# ---- the cipher and key wrapping ----------------------------------------------------------------


def test_seal_and_open_round_trip_with_a_self_describing_text() -> None:
    key = SubjectKey.new()
    text = seal_text(key, "ann@example.com", "c-1", "email")
    assert text.startswith(f"{SEALED_PREFIX}{key.key_id.hex()}:")
    assert "ann" not in text
    # sealed again, the same bytes (a re-run batch writes byte-identical records); another
    # value, another key or another place, other bytes
    assert text == seal_text(key, "ann@example.com", "c-1", "email")
    assert len({text, seal_text(key, "ann@example.org", "c-1", "email"),
                seal_text(SubjectKey.new(), "ann@example.com", "c-1", "email"),
                seal_text(key, "ann@example.com", "c-1", "nickname")}) == 4
    sealed = parse_sealed(text, "here")
    assert sealed is not None and sealed.key_id == key.key_id
    assert open_text(key, sealed, "c-1", "shop.CustomerRegistered", "email") == "ann@example.com"
    assert parse_sealed("ann@example.com", "here") is None  # plain text: not sealed


@pytest.mark.parametrize("where", [
    ("c-2", "shop.CustomerRegistered", "email"),      # another subject
    ("c-1", "shop.CustomerRegistered", "nickname"),   # another field
])
def test_a_sealed_text_opens_only_where_it_was_written(where: tuple[str, str, str]) -> None:
    key = SubjectKey.new()
    text = seal_text(key, "x", "c-1", "email")
    sealed = parse_sealed(text, "f")
    assert sealed is not None and sealed.version == 2
    with pytest.raises(TamperedDataError, match="does not authenticate"):
        open_text(key, sealed, *where)
    # the message type is not bound: the person's e-mail is the same text in every message
    assert open_text(key, sealed, "c-1", "shop.Other", "email") == "x"
    # nor once the key remembers the text as opened where it was written
    assert open_sealed(key, sealed, text, "c-1", "shop.Other", "email") == "x"
    with pytest.raises(TamperedDataError, match="does not authenticate"):
        open_sealed(key, sealed, text, *where)


def test_format_1_values_still_open_bound_to_their_message_type() -> None:
    from cqrs.personal import cipher

    key = SubjectKey.new()
    aad = cipher._aad_v1(key.key_id, "c-1", "shop.CustomerRegistered", "email")  # noqa: SLF001
    text = cipher._seal(key, b"ann@example.com", aad, "cqrs-pd1:")  # noqa: SLF001
    sealed = parse_sealed(text, "f")
    assert sealed is not None and sealed.version == 1
    assert open_text(key, sealed, "c-1", "shop.CustomerRegistered", "email") == "ann@example.com"
    for where in (("c-1", "shop.Other", "email"), ("c-2", "shop.CustomerRegistered", "email")):
        with pytest.raises(TamperedDataError, match="does not authenticate"):
            open_text(key, sealed, *where)


def test_a_changed_byte_is_detected() -> None:
    key = SubjectKey.new()
    text = seal_text(key, "ann@example.com", "c-1", "f")
    head, body = text.rsplit(":", 1)
    flipped = body[:-3] + ("A" if body[-3] != "A" else "B") + body[-2:]
    sealed = parse_sealed(f"{head}:{flipped}", "T.f")
    assert sealed is not None
    with pytest.raises(TamperedDataError):
        open_text(key, sealed, "c-1", "T", "f")
    for broken in (f"{SEALED_PREFIX}zz:abc", f"{SEALED_PREFIX}{'0' * 16}:", SEALED_PREFIX):
        with pytest.raises(TamperedDataError, match="T.f"):
            parse_sealed(broken, "T.f")


def test_key_wrapping_binds_the_key_to_its_subject_and_master_key() -> None:
    master = MasterKey(b"m" * 32)
    key = SubjectKey.new()
    wrapped = master.wrap(key, "c-1")
    assert key.secret not in wrapped
    assert master.unwrap(wrapped, "c-1") == key
    with pytest.raises(KeyStoreError, match="'c-2' does not unwrap"):
        master.unwrap(wrapped, "c-2")
    with pytest.raises(KeyStoreError, match="master_key"):
        MasterKey(b"n" * 32).unwrap(wrapped, "c-1")
    assert "m" not in repr(master) and key.secret.hex() not in repr(key)


def test_the_master_key_setting_says_how_to_make_one() -> None:
    with pytest.raises(ConfigError, match="CQRS_PERSONAL_DATA_MASTER_KEY"):
        load_config(env={}).personal_data.master_key_bytes()
    with pytest.raises(ConfigError, match="not base64"):
        load_config(env={"CQRS_PERSONAL_DATA_MASTER_KEY": "??"}).personal_data.master_key_bytes()
    short = base64.b64encode(b"k" * 16).decode()
    with pytest.raises(ConfigError, match="16 bytes once decoded"):
        load_config(env={"CQRS_PERSONAL_DATA_MASTER_KEY": short}).personal_data.master_key_bytes()
    good = base64.b64encode(b"k" * 32).decode()
    cfg = load_config(env={"CQRS_PERSONAL_DATA_MASTER_KEY": good})
    assert cfg.personal_data.master_key_bytes() == b"k" * 32
    assert good not in repr(cfg)


# ---- key stores ---------------------------------------------------------------------------------


class TestMemoryKeyStore(KeyStoreContract):
    @pytest.fixture
    def key_store(self) -> MemoryKeyStore:
        return MemoryKeyStore()


class TestKeyCache(KeyStoreContract):
    @pytest.fixture
    def key_store(self) -> KeyCache:
        return KeyCache(MemoryKeyStore(), size=3)


class _Counting(MemoryKeyStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[list[str]] = []

    def get_many(self, subjects):  # type: ignore[no-untyped-def]
        self.reads.append(list(subjects))
        return super().get_many(subjects)


def test_the_cache_asks_the_store_once_per_subject_until_its_entry_is_old() -> None:
    now = [0.0]
    store = _Counting()
    cache = KeyCache(store, size=10, ttl_s=60, clock=lambda: now[0])
    key = cache.get_or_create("ann")
    assert cache.get("ann") == key and cache.key_for("ann", key.key_id) == key
    assert store.reads == []  # made through the cache: known since
    store.forget("ann")  # by another process: seen here once the entry is old
    assert cache.key_for("ann", key.key_id) == key
    now[0] = 61
    assert cache.key_for("ann", key.key_id) is None
    assert store.reads == [["ann"]]
    assert cache.key_for("ann", key.key_id) is None  # a gone key id costs no request
    assert store.reads == [["ann"]]


def test_the_cache_reloads_a_subject_whose_key_is_newer_than_its_own() -> None:
    store = MemoryKeyStore()
    cache = KeyCache(store)
    old = cache.get_or_create("ann")
    store.forget("ann")
    new = store.get_or_create("ann")  # forgotten and made again elsewhere
    assert cache.key_for("ann", new.key_id) == new
    assert cache.key_for("ann", old.key_id) is None


def test_the_cache_keeps_at_most_size_keys() -> None:
    store = _Counting()
    cache = KeyCache(store, size=2)
    cache.get_or_create_many(["a", "b", "c"])
    store.reads.clear()
    cache.get_many(["b", "c"])
    assert store.reads == []
    cache.get_many(["a"])
    assert store.reads == [["a"]]


class _CountingCreates(_Counting):
    def __init__(self) -> None:
        super().__init__()
        self.creates: list[list[str]] = []

    def get_or_create_many(self, subjects):  # type: ignore[no-untyped-def]
        self.creates.append(sorted(subjects))
        return super().get_or_create_many(subjects)


class _Unrecorded(_CountingCreates):
    """A store that keeps no record of its forgets (a KMS, say)."""

    def forgotten_since(self, since):  # type: ignore[no-untyped-def]
        return None


def test_a_batch_prefetch_is_one_request_and_refreshes_keys_past_half_their_age() -> None:
    now = [0.0]
    store = _Unrecorded()  # no record of forgets to check instead
    cache = KeyCache(store, size=100, ttl_s=60, clock=lambda: now[0])
    subjects = [f"s-{n}" for n in range(40)]
    keys = cache.prefetch(subjects)
    assert sorted(keys) == sorted(subjects) and store.creates == [sorted(subjects)]
    for s in subjects:  # the messages' own look-ups: from the cache
        assert cache.get_or_create(s) is keys[s] and cache.key_for(s, keys[s].key_id) is keys[s]
    assert store.creates == [sorted(subjects)] and store.reads == []
    now[0] = 29.0  # younger than half the TTL: nothing asked
    assert cache.prefetch(subjects[:2]) == {s: keys[s] for s in subjects[:2]}
    assert len(store.creates) == 1
    now[0] = 31.0  # older: asked again, at once, so no key expires while a batch runs
    store.forget("s-0")  # by another process
    again = cache.prefetch(subjects[:2])
    assert store.creates[1:] == [["s-0", "s-1"]]
    assert again["s-1"] == keys["s-1"] and again["s-0"].key_id != keys["s-0"].key_id


def test_a_store_that_records_its_forgets_spares_the_cache_reading_every_key_again() -> None:
    now, wall = [0.0], [1_000_000.0]
    store = _CountingCreates()
    store._clock = lambda: wall[0]  # noqa: SLF001 - the record's clock, the test's
    cache = KeyCache(store, size=100, ttl_s=60, clock=lambda: now[0], wall=lambda: wall[0])
    other = KeyCache(store, size=100, ttl_s=60, clock=lambda: now[0], wall=lambda: wall[0])
    subjects = [f"s-{n}" for n in range(40)]
    keys = cache.prefetch(subjects)
    assert other.get("s-0") == keys["s-0"]
    for t in (14.0, 29.0, 44.0, 59.0, 74.0, 89.0, 120.0, 600.0):  # long past the TTL:
        now[0], wall[0] = t, 1_000_000.0 + t  # each batch checks the record when it is due
        assert cache.prefetch(subjects) == keys and cache.fresh_after() == float("-inf")
        assert cache.get_or_create("s-3") is keys["s-3"]
    assert store.creates == [sorted(subjects)]  # no key read again (the other cache's own:)
    assert store.reads == [["s-0"]]
    other.forget("s-0")  # by another process: the next check (a quarter TTL on) drops it
    assert cache.cached("s-0") is keys["s-0"]
    now[0], wall[0] = 616.0, 1_000_616.0
    assert cache.fresh_after() == float("-inf")
    assert cache.cached("s-0") is None and cache.key_for("s-0", keys["s-0"].key_id) is None
    assert cache.cached("s-1") is keys["s-1"]
    # the bound holds without checks too: a key is used at most a TTL after the last check
    now[0], wall[0] = 676.5, 1_000_676.5
    assert cache.cached("s-1") is None


def test_the_drops_count_moves_whenever_a_key_handed_out_may_be_gone() -> None:
    """What lets the processor skip checking a cached state's key: the count is unchanged
    while no key the cache handed out can have stopped being its subject's."""
    now, wall = [0.0], [1_000_000.0]
    store = _CountingCreates()
    store._clock = lambda: wall[0]  # noqa: SLF001
    cache = KeyCache(store, size=3, ttl_s=60, clock=lambda: now[0], wall=lambda: wall[0])
    other = KeyCache(store, size=3, ttl_s=60, clock=lambda: now[0], wall=lambda: wall[0])
    keys = cache.prefetch(["a", "b", "c"])
    start = cache.drops
    cache.prefetch(["d", "e"])  # "a" and "b" leave for room: still their subjects' keys
    assert cache.cached("c") is keys["c"] and cache.drops == start
    other.forget("a")  # elsewhere, while "a" is not even cached here: seen in the record
    now[0], wall[0] = 16.0, 1_000_016.0
    assert cache.fresh_after() == float("-inf") and cache.drops == start + 1
    cache.forget("c")  # through the cache
    assert cache.drops == start + 2 and cache.cached("c") is None
    store.forget("d")
    store.get_or_create("d")  # a new key made elsewhere, found when read again
    cache._keep(store.get_many(["d"]))  # noqa: SLF001 - what a read of the store does
    assert cache.drops == start + 3
    cache.clear()
    assert cache.drops == start + 4


def test_the_last_key_a_message_used_is_not_used_after_it_was_forgotten() -> None:
    store = MemoryKeyStore()
    cache = KeyCache(store, size=10, ttl_s=60)
    key = cache.get_or_create("ann")
    assert cache.cached("ann") is key and cache.cached("ann") is key  # the second: no look-up
    cache.forget("ann")
    assert cache.cached("ann") is None
    new = cache.get_or_create("ann")
    assert new.key_id != key.key_id and cache.cached("ann") is new


def test_a_failed_check_of_the_forget_record_leaves_the_keys_to_their_ttl() -> None:
    from cqrs.errors import KeyStoreError

    class Failing(_CountingCreates):
        fail = False

        def forgotten_since(self, since):  # type: ignore[no-untyped-def]
            if self.fail:
                raise KeyStoreError("key store: Cassandra is down")
            return super().forgotten_since(since)

    now = [0.0]
    store = Failing()
    cache = KeyCache(store, size=10, ttl_s=60, clock=lambda: now[0])
    key = cache.get_or_create("ann")
    store.fail = True
    now[0] = 61.0
    assert cache.fresh_after() == 31.0  # not vouched for: ages by its TTL
    assert cache.prefetch(["ann"])["ann"] == key and store.creates[-1] == ["ann"]  # read again


def test_sealing_the_same_value_again_is_remembered_by_the_key() -> None:
    from cqrs.personal.cipher import SEALED_PER_KEY, SubjectKey, open_text, parse_sealed, seal_text

    key = SubjectKey.new()
    first = seal_text(key, "Ann", "c-1", "name")
    assert seal_text(key, "Ann", "c-1", "name") is first  # not sealed again
    assert seal_text(key, "Ann", "c-1", "email") != first  # bound to the field
    for n in range(2 * SEALED_PER_KEY):
        sealed = seal_text(key, f"v{n}", "c-1", "name")
        assert open_text(key, parse_sealed(sealed, "x"), "c-1", "shop.Customer", "name") == f"v{n}"
    assert len(key._sealed) == SEALED_PER_KEY  # noqa: SLF001 - bounded
    again = seal_text(key, "Ann", "c-1", "name")  # forgotten by the memo:
    assert again == first and again is not first  # sealed again, to the same text


def test_the_codec_peeks_at_a_messages_subject_without_a_key(
        codec: Codec, keys: MemoryKeyStore) -> None:
    data = codec.encode(ANN)
    state = codec.encode(Customer("c-7", "x@example.com"))
    plain = codec.encode(PlanChanged("gold"))
    looked_up = _Counting()
    peeking = make_app().codec_for(codec.store, key_store=looked_up)
    assert peeking.personal and peeking.peek_subject(data) == "c-1"
    assert peeking.peek_subject(state) == "c-7"
    assert peeking.peek_subject(plain) is None and peeking.peek_subject(b"junk") is None
    assert looked_up.reads == []  # nothing was opened
    assert peeking.subject_of(ANN) == "c-1" and peeking.subject_of(PlanChanged("gold")) is None


def test_a_batch_of_events_is_decoded_after_one_request_for_its_subjects_keys(
        codec: Codec, keys: MemoryKeyStore) -> None:
    events = [codec.encode(CustomerRegistered(f"c-{n}", f"{n}@example.com")) for n in range(30)]
    events.append(codec.encode(PlanChanged("gold")))  # no personal fields: not looked at
    store = _CountingCreates()
    store._keys.update(keys._keys)  # noqa: SLF001 - the same keys, counted
    reader = make_app().codec_for(codec.store, key_store=KeyCache(store))
    assert reader.prefetch_keys(events) == 30
    assert [sorted(r) for r in store.reads] == [sorted(f"c-{n}" for n in range(30))]  # once
    assert store.creates == []  # decoding makes no keys
    assert [reader.decode(e) for e in events[:30]] == [
        CustomerRegistered(f"c-{n}", f"{n}@example.com") for n in range(30)]
    assert len(store.reads) == 1  # the decodes found every key cached
    assert make_app().codec_for(codec.store).prefetch_keys(events) == 0  # no key store: no-op


def test_sealed_fields_written_by_the_generated_writer_are_fastavros_bytes(
        codec: Codec, keys: MemoryKeyStore) -> None:
    class Reference(Codec):
        _generated = False  # fastavro only, from a sealed copy of the message

    reference = Reference([r.cls for r in codec.registered()], store=codec.store, key_store=keys)
    for obj in (ANN, Customer("c-2", "bob@example.com", "gold"), CustomerRegistered("c-3", "", None),
                attrs.evolve(ANN, nickname=FORGOTTEN)):
        assert codec.encode(obj) == reference.encode(obj)  # sealing is deterministic
        assert codec.encode(obj) == codec.encode(obj)  # and again, from the key's memo
        assert codec.decode(codec.encode(obj)) == obj


# ---- the codec -----------------------------------------------------------------------------------


def test_personal_fields_are_sealed_on_the_wire_and_opened_by_the_codec(
        codec: Codec, keys: MemoryKeyStore) -> None:
    data = codec.encode(ANN)
    assert b"ann@example.com" not in data and b"annie" not in data
    assert b"c-1" in data and b"gold" in data  # the subject and other fields stay plain
    assert data.count(SEALED_PREFIX.encode()) == 2
    assert codec.decode(data) == ANN
    assert len(keys) == 1


def test_one_key_per_subject_shared_by_its_messages_and_state(
        codec: Codec, keys: MemoryKeyStore) -> None:
    codec.decode(codec.encode(ANN))
    state = Customer("c-1", "ann@example.com", "gold")
    assert codec.decode(codec.encode(state)) == state
    assert codec.decode(codec.encode(Register("c-1", "ann@example.com"))) == Register(
        "c-1", "ann@example.com")
    codec.encode(Register("c-2", "bob@example.com"))
    assert len(keys) == 2


def test_a_forgotten_subject_reads_as_the_replacements_and_nothing_else_changes(
        codec: Codec, keys: MemoryKeyStore) -> None:
    event_bytes = codec.encode(ANN)
    state_bytes = codec.encode(Customer("c-1", "ann@example.com", "gold"))
    other = codec.encode(CustomerRegistered("c-2", "bob@example.com"))
    assert keys.forget("c-1")
    assert codec.decode(event_bytes) == attrs.evolve(ANN, email=FORGOTTEN, nickname="")
    assert codec.decode(state_bytes) == Customer("c-1", FORGOTTEN, "gold")
    assert codec.decode(other) == CustomerRegistered("c-2", "bob@example.com")
    # a new message of the subject gets a new key; the old ones stay forgotten
    again = codec.encode(attrs.evolve(ANN, email="new@example.com"))
    assert codec.decode(again).email == "new@example.com"
    assert codec.decode(event_bytes).email == FORGOTTEN


def test_values_that_say_nothing_need_no_key(codec: Codec, keys: MemoryKeyStore) -> None:
    for obj in (CustomerRegistered("c-9", "", None), Customer(), Customer("c-9", FORGOTTEN)):
        assert codec.decode(codec.encode(obj)) == obj
    assert len(keys) == 0


def test_the_subject_must_be_known_to_seal(codec: Codec) -> None:
    with pytest.raises(EncodeError, match="Customer.customer_id = '' is the data subject"):
        codec.encode(Customer("", "ann@example.com"))
    with pytest.raises(EncodeError, match="CustomerRegistered.email = 3"):
        codec.encode(CustomerRegistered("c-1", 3))  # type: ignore[arg-type]


def test_without_a_key_store_a_personal_class_fails_clearly_and_others_work() -> None:
    app = make_app()
    assert app.codec.decode(app.codec.encode(PlanChanged("gold"))) == PlanChanged("gold")
    with pytest.raises(MissingKeyStoreError, match="shop.CustomerRegistered has personal "
                       r"fields \(email, nickname\).*use_key_store"):
        app.codec.encode(ANN)
    keys = MemoryKeyStore()
    data = app.codec_for(InMemorySchemaStore(), key_store=keys).encode(ANN)
    with pytest.raises(MissingKeyStoreError):
        app.codec.decode(data)
    app.use_key_store(keys)
    assert app.codec.decode(data) == ANN
    assert app.codec_for(app.codec.store).decode(data) == ANN  # later codecs use it too


def test_classes_without_personal_fields_keep_the_generated_fast_paths(codec: Codec) -> None:
    codec.decode(codec.encode(PlanChanged("gold")))
    codec.decode(codec.encode(ANN))
    assert PlanChanged in codec._writes and CustomerRegistered not in codec._writes  # noqa: SLF001
    assert codec.lookup(PlanChanged).header in codec._reads  # noqa: SLF001
    assert codec.lookup(CustomerRegistered).header not in codec._reads  # noqa: SLF001


def test_the_fastavro_paths_seal_and_open_too(keys: MemoryKeyStore) -> None:
    class Reference(Codec):
        _generated = False

    ref = Reference([CustomerRegistered], key_store=keys)
    fast = Codec([CustomerRegistered], key_store=keys)
    assert fast.decode(ref.encode(ANN)) == ANN
    assert ref.decode(fast.encode(ANN)) == ANN


def test_plain_text_written_before_a_field_was_personal_is_read_as_it_is(
        keys: MemoryKeyStore) -> None:
    @event(name="shop.CustomerRegistered")
    class Before:
        customer_id: str
        email: str
        nickname: str | None = None
        plan: str = "basic"
        visits: int = 0

    store = InMemorySchemaStore()
    old = Codec([Before], store=store).encode(Before("c-1", "ann@example.com"))
    codec = Codec([CustomerRegistered], store=store, key_store=keys)
    assert codec.decode(old) == CustomerRegistered("c-1", "ann@example.com")
    # beside a sealed value: what was read is not remembered as what to write (the opened
    # message's memo entry would write the clear value again)
    sealed_nick = seal_text(keys.get_or_create("c-1"), "annie", "c-1", "nickname")
    opened = codec.decode(Codec([Before], store=store).encode(
        Before("c-1", "ann@example.com", sealed_nick)))
    assert (opened.email, opened.nickname) == ("ann@example.com", "annie")
    again = codec.encode(opened)
    assert b"ann@example.com" not in again and codec.decode(again) == opened


def test_a_tampered_field_is_an_error_not_a_replacement(codec: Codec) -> None:
    data = codec.encode(CustomerRegistered("c-1", "ann@example.com"))
    start = data.index(SEALED_PREFIX.encode()) + len(SEALED_PREFIX) + 17
    tampered = data[:start] + (b"A" if data[start:start + 1] != b"A" else b"B") + data[start + 1:]
    with pytest.raises(TamperedDataError, match="shop.CustomerRegistered.email"):
        codec.decode(tampered)


@event(name="shop.Registered", version=1, subject="customer_id")
class RegisteredV1:
    customer_id: str
    mail: str = personal()


@event(name="shop.Signup", version=2, subject="customer_id")
class SignupV2:
    customer_id: str
    mail: str = personal()
    source: str = "web"


@upcaster("shop.Registered", from_version=1, to_type_name="shop.Signup")
def _registered_to_signup(data: dict[str, object]) -> dict[str, object]:
    return {**data, "source": "legacy"}


def test_an_upcast_message_opens_with_the_type_name_it_was_written_under(
        keys: MemoryKeyStore) -> None:
    store = InMemorySchemaStore()
    old = Codec([RegisteredV1], store=store, key_store=keys).encode(RegisteredV1("c-1", "a@b"))
    new = Codec([SignupV2], upcasters=[_registered_to_signup], store=store, key_store=keys)
    assert new.decode(old) == SignupV2("c-1", "a@b", "legacy")
    keys.forget("c-1")
    assert new.decode(old) == SignupV2("c-1", FORGOTTEN, "legacy")


@upcaster("shop.Registered", from_version=1, to_type_name="shop.Signup")
def _lowercase_mail(data: dict[str, object]) -> dict[str, object]:
    mail = data["mail"]
    return {**data, "mail": mail.lower() if isinstance(mail, str) else mail, "source": "legacy"}


def test_an_upcaster_that_changes_a_personal_field_sees_the_plaintext_or_the_replacement(
        keys: MemoryKeyStore) -> None:
    store = InMemorySchemaStore()
    old = Codec([RegisteredV1], store=store, key_store=keys).encode(RegisteredV1("c-2", "Ann@B.example"))
    assert b"Ann@B" not in old and b"ann@b" not in old
    new = Codec([SignupV2], upcasters=[_lowercase_mail], store=store, key_store=keys)
    assert new.decode(old) == SignupV2("c-2", "ann@b.example", "legacy")
    again = new.encode(new.decode(old))  # written in today's shape: sealed again
    assert b"ann@b" not in again
    keys.forget("c-2")
    assert new.decode(old) == SignupV2("c-2", FORGOTTEN.lower(), "legacy")
    assert new.decode(again).mail == FORGOTTEN


def test_the_aggregate_test_kit_round_trips_personal_fields() -> None:
    from cqrs.testing import AggregateTest

    AggregateTest(make_app(), Customer).when(Register("c-1", "ann@example.com")).then(
        CustomerRegistered("c-1", "ann@example.com"))


def test_a_value_opened_is_sealed_again_to_the_same_text_without_encrypting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a state read from its row, decided and written back (and the events copying its values)
    # must give the bytes it was read from, without an AES call per field
    from cqrs.personal import cipher
    from cqrs.personal.cipher import open_sealed

    key = SubjectKey.new()
    text = seal_text(key, "Ann", "c-1", "name")
    key._sealed.clear()  # noqa: SLF001 - as a key just loaded from the store
    sealed = parse_sealed(text, "x")
    assert sealed is not None
    assert open_sealed(key, sealed, text, "c-1", "shop.Customer", "name") == "Ann"
    monkeypatch.setattr(cipher, "_seal", lambda *a: pytest.fail("encrypted again"))
    monkeypatch.setattr(cipher, "open_text", lambda *a: pytest.fail("decrypted again"))
    assert seal_text(key, "Ann", "c-1", "name") == text
    assert open_sealed(key, sealed, text, "c-1", "shop.Customer", "name") == "Ann"


def test_a_message_decoded_is_encoded_again_from_the_keys_memo(
        codec: Codec, keys: MemoryKeyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # a state read cold from its row and written back after a command: the whole message's
    # sealed values are remembered when it is opened, not sealed again field by field
    from cqrs.personal import fields

    data = codec.encode(CustomerRegistered("c-1", "ann@example.com", "annie"))
    key = keys.get("c-1")
    assert key is not None
    key._sealed.clear()  # noqa: SLF001 - as a key just loaded from the store
    key._last = None  # noqa: SLF001
    opened = codec.decode(data)
    assert (opened.email, opened.nickname) == ("ann@example.com", "annie")
    monkeypatch.setattr(fields, "seal_text", lambda *a: pytest.fail("sealed field by field"))
    assert codec.encode(opened) == data
    assert codec.encode(attrs.evolve(opened, plan="gold")) != data  # same person, same texts


def test_an_opened_value_is_written_again_as_its_sealed_text_with_no_key_asked_for(
        codec: Codec, keys: MemoryKeyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # what a handler copies from a state into an event, and the state written back after a
    # command: the text it was read from. Even after the subject was forgotten: that text no
    # longer opens, and a value held in memory is never sealed again under a new key
    data = codec.encode(ANN)
    opened = codec.decode(data)
    assert type(opened.email) is OpenedText and opened.email == "ann@example.com"
    assert opened.email.sealed in data.decode("latin-1")
    state_bytes = codec.encode(Customer("c-1", opened.email, "gold"))
    assert keys.forget("c-1")
    with monkeypatch.context() as m:
        for method in ("get_many", "get_or_create_many"):
            m.setattr(keys, method, lambda *a: pytest.fail("a key was asked for"))
        assert codec.encode(opened) == data
        assert codec.encode(Customer("c-1", opened.email, "gold")) == state_bytes
        # a new value beside it is sealed (a new key); the opened one keeps its text
        mixed = attrs.evolve(opened, nickname="nan")
        m.undo()
        mixed_bytes = codec.encode(mixed)
    assert opened.email.sealed in mixed_bytes.decode("latin-1")
    assert codec.decode(state_bytes) == Customer("c-1", FORGOTTEN, "gold")
    assert codec.decode(mixed_bytes) == attrs.evolve(ANN, email=FORGOTTEN, nickname="nan")


def test_an_opened_value_copied_to_another_subject_or_field_is_sealed_there() -> None:
    keys = MemoryKeyStore()
    codec = make_app().codec_for(InMemorySchemaStore(), key_store=KeyCache(keys))
    opened = codec.decode(codec.encode(ANN))
    copied = CustomerRegistered("c-2", opened.email, opened.email)  # Bob's, and a nickname
    data = codec.encode(copied)
    assert opened.email.sealed not in data.decode("latin-1")
    keys.forget("c-1")
    assert codec.decode(data) == CustomerRegistered("c-2", "ann@example.com", "ann@example.com")


def test_an_opened_value_pickles_and_copies_with_its_sealed_text(codec: Codec) -> None:
    import copy
    import pickle

    email = codec.decode(codec.encode(ANN)).email
    for again in (pickle.loads(pickle.dumps(email)), copy.deepcopy(email), copy.copy(email)):
        assert type(again) is OpenedText and again == email
        assert (again.sealed, again.subject, again.field) == (email.sealed, "c-1", "email")


class _TableSession:
    """What CassandraKeyStore asks of its session, its tables dicts: the first ``failures``
    inserts of a first key fail with ``error`` (applied or not: a busy node's IF NOT EXISTS
    that timed out leaves either)."""

    rows_per_request = 32

    def __init__(self, failures: int, error: type[Exception], applied: bool = True) -> None:
        self.rows: dict[str, bytes] = {}  # the key table
        self.copies: dict[str, bytes] = {}  # the copy table
        self.failures, self.error, self.applied, self.inserts = failures, error, applied, 0

    def execute(self, *args: object, **kwargs: object) -> list[object]:
        return []

    def prepare(self, query: str, write: bool = False) -> str:
        return query

    def read_in(self, select: str, column: str, keys: list[str]) -> list[tuple[str, bytes, int]]:
        return [(s, self.rows[s], 1) for s in keys if s in self.rows]

    def read_in_buckets(self, select: str, column: str, keys: list[str],
                        bucket_of: Any) -> list[tuple[str, bytes]]:  # of the copies
        return [(s, self.copies[s]) for s in keys if s in self.copies]

    def concurrent(self, stmt: str, params: list[tuple[Any, ...]]) -> list[Any]:
        import types

        from cqrs.errors import KeyStoreError
        from cqrs.personal.cassandra_keys import COPY_TABLE

        if COPY_TABLE in stmt:
            self.copies.update((s, w) for _, s, w, _ in params)
            return [None] * len(params)
        self.inserts += 1
        if self.failures and not self.applied:
            self.failures -= 1
            raise KeyStoreError("key store: Cassandra statement 'INSERT ...' failed") \
                from self.error("timed out")
        out = [types.SimpleNamespace(was_applied=self.rows.setdefault(s, w) is w)
               for s, w in params]
        if self.failures:
            self.failures -= 1
            raise KeyStoreError("key store: Cassandra statement 'INSERT ...' failed") \
                from self.error("timed out")
        return out


def test_a_first_key_whose_insert_timed_out_is_asked_for_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cassandra import InvalidRequest, OperationTimedOut

    from cqrs.errors import KeyStoreError
    from cqrs.personal import cassandra_keys

    monkeypatch.setattr(cassandra_keys, "CREATE_RETRY_S", 0.0)
    master = MasterKey(b"M" * 32)
    for applied in (True, False):  # written, or not, before the answer was lost
        session = _TableSession(failures=2, error=OperationTimedOut, applied=applied)
        store = cassandra_keys.CassandraKeyStore(session, master)  # type: ignore[arg-type]
        keys = store.get_or_create_many(["ann", "bo"])
        assert keys == store.get_many(["ann", "bo"])  # the stored keys, whichever were made
        assert session.copies == session.rows  # copied too (when read, if not when made)
        assert session.inserts == (1 if applied else 3)
    session = _TableSession(failures=3, error=OperationTimedOut, applied=False)  # said so
    with pytest.raises(KeyStoreError, match="INSERT"):
        cassandra_keys.CassandraKeyStore(session, master).get_or_create_many(["ann"])  # type: ignore[arg-type]
    session = _TableSession(failures=1, error=InvalidRequest)  # not a timeout: not again
    with pytest.raises(KeyStoreError):
        cassandra_keys.CassandraKeyStore(session, master).get_or_create_many(["ann"])  # type: ignore[arg-type]
    assert session.inserts == 1


def test_a_cached_keys_last_values_are_written_again_until_the_subject_is_forgotten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the generated first check of a codec over a KeyCache (an event and the state after it
    # carry the same person's values): the same bytes without sealing, never after a forget
    from cqrs.personal import fields

    cache = KeyCache(MemoryKeyStore(), size=10, ttl_s=60)
    codec = make_app().codec_for(InMemorySchemaStore(), key_store=cache)
    sealer = codec._sealers[CustomerRegistered]  # noqa: SLF001
    assert sealer.sealed_values.__code__.co_filename.startswith("<cqrs sealed values")
    ann = CustomerRegistered("c-1", "ann@example.com", "annie")
    data = codec.encode(ann)
    with monkeypatch.context() as m:
        m.setattr(fields, "seal_text", lambda *a: pytest.fail("sealed again"))
        assert codec.encode(ann) == data
        assert codec.encode(attrs.evolve(ann, plan="gold")) != data  # other bytes, same texts
    old_key = cache.cached("c-1")
    assert old_key is not None
    cache.forget("c-1")
    again = codec.encode(ann)  # a new key: sealed again, not the forgotten key's texts
    assert again != data and old_key.key_id.hex() not in again.decode("latin-1")
    assert codec.decode(again) == ann and codec.decode(data).email == FORGOTTEN
    with pytest.raises(EncodeError, match="data subject"):
        codec.encode(attrs.evolve(ann, customer_id=""))
