"""The processor's hot path with personal data (#26), on the real Kafka and Cassandra without
Spark (a worker driven in this process, as tests/integration/test_serving_task.py does):

- a slice of commands about many data subjects asks the key store once for all their keys,
  not once per subject, and nothing after that asks it again;
- a state the worker keeps cached (decoded, in clear) is dropped once its subject is forgotten
  by another process and the worker's key cache has noticed (``key_cache_seconds``): the next
  command runs on the state row, which reads as the replacement, so the new event and state
  hold the replacement, never the old values under the subject's new key.

The worker's key store is a ``KeyCache`` of its own over a ``CassandraKeyStore``, counted by a
wrapper that delegates every call to it; the forget goes through ``forget_subject`` (the
process's configured store: another cache, as in another process).
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Collection, Iterator

import attrs
import pytest

from cqrs.cassandra_io import CassandraSession
from cqrs.client import encode_command
from cqrs.codec.kafka_schema_store import KafkaSchemaStore
from cqrs.codec.registry import Codec
from cqrs.config import CqrsConfig
from cqrs.domain import FORGOTTEN
from cqrs.kafka_io import make_producer, read_to_end, watermarks
from cqrs.personal import CassandraKeyStore, KeyCache, KeyStore, MasterKey, SubjectKey
from cqrs.personal.stack import close_key_stores, forget_subject
from cqrs.processor.partition import Worker, run_task
from cqrs.processor.state import StateReader
from cqrs.processor.state_table import open_state_table
from cqrs.processor.step import AggregateStep
from cqrs.topics import AppTopics
from bank_worker import processor_options
from domain_examples.personal_bank import COMMANDS, app

pytestmark = pytest.mark.integration

APP_REF = "domain_examples.personal_bank:app"
KEY_CACHE_S = 1.0
OPEN, DEPOSIT = COMMANDS[app.name].open_account, COMMANDS[app.name].deposit


class CountingKeyStore(KeyStore):
    """Delegates to ``store``, noting each request: (method, number of subjects). Its record
    of forgets is the store's only once ``recorded`` is set (before the worker's first
    slice): else the worker's key cache reads each key again once it is a TTL old."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        self.requests: list[tuple[str, int]] = []
        self.recorded = False

    def forgotten_since(self, since: float) -> Collection[str] | None:
        return self.store.forgotten_since(since) if self.recorded else None

    def get_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        self.requests.append(("get_many", len(subjects)))
        return self.store.get_many(subjects)

    def get_or_create_many(self, subjects: Collection[str]) -> dict[str, SubjectKey]:
        self.requests.append(("get_or_create_many", len(subjects)))
        return self.store.get_or_create_many(subjects)

    def forget(self, subject: str) -> bool:
        self.requests.append(("forget", 1))
        return self.store.forget(subject)


@attrs.define
class Fixture:
    cfg: CqrsConfig
    topics: AppTopics
    worker: Worker
    counted: CountingKeyStore
    client_codec: Codec  # the sender's: its own key cache over the same table
    prefix: str

    def send(self, *commands: tuple[str, object]) -> int:
        """Commands onto partition 0 of the commands topic; its end offset afterwards."""
        producer = make_producer(self.cfg)
        for agg, cmd in commands:
            _, key, value, headers = encode_command(app, agg, cmd, codec=self.client_codec)
            producer.produce(self.topics.commands, value, key, 0, headers=headers)
        assert producer.flush(30) == 0
        return watermarks(self.cfg, self.topics.commands)[0][1]

    def run(self, start: int, end: int):  # type: ignore[no-untyped-def]
        return run_task(self.worker, self.topics.commands, {0: (start, end)})


@pytest.fixture
def fx(cqrs_config: CqrsConfig, unique_name: str, request: pytest.FixtureRequest) -> Iterator[Fixture]:
    """``key_cache_seconds``: the test's parameter, else :data:`KEY_CACHE_S`; a parameter
    ``(seconds, store)`` names the ``[processor] state_store`` too."""
    param = getattr(request, "param", KEY_CACHE_S)
    ttl, store = param if isinstance(param, tuple) else (param, "cassandra")
    master = base64.b64encode(os.urandom(32)).decode()
    cfg = cqrs_config.with_overrides(personal_data={"master_key": master,
                                                    "key_cache_seconds": ttl},
                                     processor={"state_store": store})
    opts = processor_options(cfg, unique_name, app, APP_REF)
    assert opts.topics is not None
    session = CassandraSession(cfg.cassandra)
    table_store = CassandraKeyStore(session, MasterKey(cfg.personal_data.master_key_bytes()))
    counted = CountingKeyStore(table_store)
    schemas = KafkaSchemaStore(cfg.kafka.bootstrap_servers, opts.topics.schemas,
                               cfg.kafka.client_options())
    codec = app.codec_for(schemas, key_store=KeyCache(counted, ttl_s=ttl))
    step = AggregateStep(app, codec, opts.topics, results_partitions=opts.results_partitions,
                         max_record_bytes=cfg.kafka.max_record_bytes())
    worker = Worker(cfg, step, open_state_table(cfg, opts.topics), opts.state_generation or 0,
                    make_producer(cfg, **{"on_delivery": lambda *_: None}))
    client_codec = app.codec_for(schemas, key_store=KeyCache(table_store))
    try:
        yield Fixture(cfg, opts.topics, worker, counted, client_codec, unique_name)
    finally:
        worker.table.close()
        close_key_stores()
        session.close()


@pytest.mark.parametrize("fx", [300.0], indirect=True)  # no key gets old during the test
def test_a_slice_about_many_subjects_asks_the_key_store_once(fx: Fixture) -> None:
    accounts = [f"{fx.prefix}-acc-{n}" for n in range(40)]  # 40 subjects the worker never saw
    end = fx.send(*[(a, OPEN(a, f"Holder {n}", f"holder{n}@example.com"))
                    for n, a in enumerate(accounts)])
    stats = fx.run(0, end)
    assert (stats.commands, stats.accepted, stats.subject_keys) == (40, 40, 40)
    # one request for the 40 keys (message by message, it was 40 requests), and none for the
    # 40 commands opened, 40 events and 40 states sealed after it
    assert fx.counted.requests == [("get_or_create_many", 40)]

    end2 = fx.send(*[(a, DEPOSIT(5)) for a in accounts])
    stats2 = fx.run(end, end2)
    assert (stats2.accepted, stats2.cache_hits, stats2.stale_states) == (40, 40, 0)
    assert fx.counted.requests == [("get_or_create_many", 40)]  # all cached

    with StateReader(app, fx.cfg, topics=fx.topics) as reader:
        state = reader.get(accounts[7])
    assert state is not None and (state.state.holder, state.state.balance) == ("Holder 7", 5)


@pytest.mark.parametrize("recorded", [False, True], ids=["by-age", "by-record"])
def test_a_cached_state_of_a_forgotten_subject_is_not_written_again_under_a_new_key(
        fx: Fixture, recorded: bool) -> None:
    # the worker's key cache notices the forget by the key's age, or in the store's record
    fx.counted.recorded = recorded
    acc = f"{fx.prefix}-acc-ann"
    name, email = "Ann Quillfeather", "ann.quillfeather@example.com"
    end = fx.send((acc, OPEN(acc, name, email)), (acc, DEPOSIT(5)))
    assert fx.run(0, end).accepted == 2

    assert forget_subject(fx.cfg, app, acc) is True  # by "another process": another key cache
    time.sleep(KEY_CACHE_S + 0.2)  # the bound: the worker's key cache notices within this
    end2 = fx.send((acc, DEPOSIT(7)))
    stats = fx.run(end, end2)
    # the cached state (with the old name in clear) was dropped and the row read instead
    assert (stats.accepted, stats.stale_states, stats.state_reads, stats.cache_hits) == (1, 1, 1, 0)

    events = read_to_end(fx.cfg, [fx.topics.events])
    assert len(events) == 3
    assert all(name.encode() not in e.value and email.encode() not in e.value for e in events)
    reading = app.codec_for(fx.client_codec.store, key_store=KeyCache(fx.counted.store))
    last = reading.decode(events[-1].value)
    assert (last.amount, last.holder, last.email) == (7, FORGOTTEN, FORGOTTEN)
    with StateReader(app, fx.cfg, topics=fx.topics) as reader:
        state = reader.get(acc)
    assert state is not None and state.version == 3  # the command succeeded on the replacement
    assert (state.state.holder, state.state.email, state.state.balance) == (FORGOTTEN, FORGOTTEN, 12)
    row = fx.worker.table.read(fx.worker.generation, [acc])
    assert all(name.encode() not in r.record and email.encode() not in r.record for r in row.values())

    # the subject's new key is the cached state's now: the next command is a cache hit
    end3 = fx.send((acc, DEPOSIT(1)))
    again = fx.run(end2, end3)
    assert (again.accepted, again.cache_hits, again.stale_states) == (1, 1, 0)


def test_a_forgotten_subjects_cached_state_is_dropped_in_a_slice_about_somebody_else(
        fx: Fixture) -> None:
    # the worker's key cache notices the forget (in the store's record) in a slice without
    # the subject: every state the partition's cache holds is checked then (once), and the
    # forgotten one is dropped
    fx.counted.recorded = True
    ann, bo = f"{fx.prefix}-acc-ann", f"{fx.prefix}-acc-bo"
    name, email = "Ann Quillfeather", "ann.quillfeather@example.com"
    end = fx.send((ann, OPEN(ann, name, email)), (bo, OPEN(bo, "Bo Brightwater", "bo@example.com")))
    assert fx.run(0, end).accepted == 2

    assert forget_subject(fx.cfg, app, ann) is True
    time.sleep(KEY_CACHE_S + 0.2)
    end2 = fx.send((bo, DEPOSIT(5)))
    stats = fx.run(end, end2)
    assert (stats.accepted, stats.cache_hits, stats.state_reads) == (1, 1, 0)  # Bo: cached
    assert fx.worker.cache.entries(fx.worker.part(fx.topics.commands, 0)).keys() == {
        ("pd-bank.Account", bo)}  # Ann's state, in clear, is gone

    end3 = fx.send((ann, DEPOSIT(7)))
    later = fx.run(end2, end3)
    assert (later.accepted, later.cache_hits, later.state_reads) == (1, 0, 1)  # her row
    events = read_to_end(fx.cfg, [fx.topics.events])
    assert all(name.encode() not in e.value and email.encode() not in e.value for e in events)
    reading = app.codec_for(fx.client_codec.store, key_store=KeyCache(fx.counted.store))
    last = reading.decode([e for e in events if e.key == ann.encode()][-1].value)  # hers
    assert (last.amount, last.holder, last.email) == (7, FORGOTTEN, FORGOTTEN)


@pytest.mark.parametrize("fx", [(KEY_CACHE_S, "kafka")], indirect=True)
def test_with_the_changelog_a_forgotten_subjects_held_state_is_read_as_forgotten(
        fx: Fixture) -> None:
    """With the states in a changelog the worker holds them all: the decoded state of a
    forgotten subject becomes its row as written (sealed under the old key) again, which
    decodes as forgotten; nothing is read from Cassandra and no clear value is sealed again."""
    from cqrs.processor.changelog import ChangelogView, changelog_topic

    fx.counted.recorded = True
    acc = f"{fx.prefix}-acc-ann"
    name, email = "Ann Quillfeather", "ann.quillfeather@example.com"
    end = fx.send((acc, OPEN(acc, name, email)), (acc, DEPOSIT(5)))
    assert fx.run(0, end).accepted == 2
    assert forget_subject(fx.cfg, app, acc) is True
    time.sleep(KEY_CACHE_S + 0.2)
    end2 = fx.send((acc, DEPOSIT(7)))
    stats = fx.run(end, end2)
    assert (stats.accepted, stats.stale_states, stats.state_reads, stats.cache_hits) == (1, 1, 0, 0)
    events = read_to_end(fx.cfg, [fx.topics.events])
    assert all(name.encode() not in e.value and email.encode() not in e.value for e in events)
    reading = app.codec_for(fx.client_codec.store, key_store=KeyCache(fx.counted.store))
    last = reading.decode(events[-1].value)
    assert (last.amount, last.holder, last.email) == (7, FORGOTTEN, FORGOTTEN)
    with StateReader(app, fx.cfg, topics=fx.topics) as reader:
        state = reader.get(acc)
    assert state is not None and state.version == 3
    assert (state.state.holder, state.state.email, state.state.balance) == (FORGOTTEN, FORGOTTEN, 12)
    rows = ChangelogView(fx.cfg, changelog_topic(fx.topics.base, fx.worker.generation)).get(acc)
    assert len(rows) == 1 and name.encode() not in rows[0].record
    assert fx.worker.table.read(fx.worker.generation, [acc]) == {}  # none in Cassandra
