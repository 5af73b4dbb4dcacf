"""The command processor on the real stack: Kafka source, Spark keyed state, Kafka sink."""

from __future__ import annotations

import collections
import datetime as dt
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from cqrs.cli.main import main
from cqrs.client import encode_command
from cqrs.config import CqrsConfig
from cqrs.envelope import from_kafka, to_kafka
from cqrs.kafka_io import KafkaRecord, make_producer, read_to_end
from cqrs.processor.job import start_processor
from cqrs.processor.workers import ProcessorOptions
from cqrs.results import CommandResult
from cqrs.testing.example import CloseAccount, Deposit, Deposited, Explode, OpenAccount, Withdraw
from cqrs.testing.example_app import app
from cqrs.topics import ensure_topics, topics_for
from process_group import stop
from waiting import micro_batches_begun, wait_for

APP_REF = "cqrs.testing.example_app:app"
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)


class Workload:
    """Unique topics for one test, a producer, and helpers to run and read the processor."""

    def __init__(self, cfg: CqrsConfig, prefix: str, checkpoint_root: Path) -> None:
        self.cfg = cfg
        self.prefix = prefix
        self.topics = topics_for(app.name, prefix)
        ensure_topics(cfg, self.topics)
        self.producer = make_producer(cfg)
        self.checkpoint = str(checkpoint_root / "processor")
        self.sent: list[str] = []

    def send(self, aggregate_id: str, command: object, *, expected: int | None = None,
             command_id: str | None = None, reply: int | None = None) -> str:
        at = T0 + dt.timedelta(milliseconds=len(self.sent))
        cid, key, value, headers = encode_command(app, aggregate_id, command, expected_version=expected,
                                                  command_id=command_id, timestamp=at,
                                                  reply_partition=reply)
        self.producer.produce(self.topics.commands, key=key, value=value, headers=headers)
        self.sent.append(cid)
        return cid

    def send_raw(self, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        self.producer.produce(self.topics.commands, key=key, value=value, headers=headers)

    def process(self, spark: Any) -> None:
        assert self.producer.flush(30) == 0
        opts = ProcessorOptions(APP_REF, topics=self.topics, checkpoint=self.checkpoint)
        start_processor(spark, self.cfg, opts, available_now=True).awaitTermination()

    def cli(self, *extra: str) -> tuple[list[str], dict[str, str]]:
        """Argv and environment of ``cqrs run processor`` on this workload's topics and
        checkpoint, with ``extra`` options."""
        env = {**os.environ, "CQRS_KAFKA_TOPIC_PREFIX": self.prefix,
               "CQRS_KAFKA_BOOTSTRAP": self.cfg.kafka.bootstrap_servers,
               "CQRS_SPARK_CHECKPOINT_DIR": str(Path(self.checkpoint).parent / "ck")}
        return [sys.executable, "-m", "cqrs.cli.main", "run", "processor", APP_REF,
                "--checkpoint", self.checkpoint, *extra], env

    def process_available(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``cqrs run processor --available-now`` in this process, on the session's Spark (as
        a process of its own it only added a JVM's start, ~10 s): the CLI as ``cli`` runs it,
        with its environment."""
        argv, env = self.cli("--available-now")
        for name, value in env.items():
            if name.startswith("CQRS_"):
                monkeypatch.setenv(name, value)
        sigterm = signal.getsignal(signal.SIGTERM)  # the job's own handler, while it runs
        try:
            assert main(argv[argv.index("run"):]) == 0
        finally:
            signal.signal(signal.SIGTERM, sigterm)

    def results(self) -> dict[str, CommandResult]:
        return {r.command_id: r for r in
                (app.codec.decode(rec.value) for rec in read_to_end(self.cfg, [self.topics.results]))}

    def events(self) -> list[KafkaRecord]:
        return read_to_end(self.cfg, [self.topics.events])

    def dead_letters(self) -> list[KafkaRecord]:
        return read_to_end(self.cfg, [self.topics.dead_letters])


@pytest.fixture
def workload(cqrs_config: CqrsConfig, unique_name: str, tmp_path: Path) -> Workload:
    return Workload(cqrs_config, unique_name + "-", tmp_path)


def _versions_by_aggregate(events: list[KafkaRecord]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = collections.defaultdict(list)
    for rec in events:
        headers = dict(rec.headers)
        found[rec.key.decode()].append(int(headers["cqrs.version"]))
    return found


def test_accepted_and_rejected_results_with_reasons_and_versions(workload: Workload, spark: Any) -> None:
    opened = workload.send("acc-1", OpenAccount("ann"))
    deposited = workload.send("acc-1", Deposit(100), expected=1)
    too_much = workload.send("acc-1", Withdraw(500))
    stale = workload.send("acc-1", Deposit(5), expected=1)
    fresh = workload.send("acc-2", OpenAccount("bob"), expected=0, reply=3)
    not_new = workload.send("acc-1", OpenAccount("eve"), expected=0, reply=2)
    workload.process(spark)
    where = {r.key.decode(): r.partition for r in read_to_end(workload.cfg, [workload.topics.results])}
    assert (where[fresh], where[not_new]) == (3, 2)  # the reply partitions the senders asked for

    results = workload.results()
    assert (results[opened].status, results[opened].version) == ("accepted", 1)
    assert (results[deposited].status, results[deposited].version) == ("accepted", 2)
    assert results[deposited].event_ids and len(results[deposited].event_ids) == 1
    r = results[too_much]
    assert (r.status, r.code, r.version) == ("rejected", "insufficient_funds", 2)
    assert "insufficient funds" in r.reason
    r = results[stale]
    assert (r.status, r.code, r.version) == ("rejected", "wrong_expected_version", 2)
    assert (results[fresh].status, results[fresh].version) == ("accepted", 1)
    assert (results[not_new].status, results[not_new].code) == ("rejected", "wrong_expected_version")

    events = workload.events()
    assert [app.codec.decode(e.value) for e in events if e.key == b"acc-1"][1] == Deposited(100)
    assert all(dict(e.headers)["cqrs.aggregate_type"] == b"example.bank.Account" for e in events)


def test_exactly_one_of_two_racing_commands_wins(workload: Workload, spark: Any) -> None:
    workload.send("acc-r", OpenAccount("ann"))
    workload.process(spark)
    a = workload.send("acc-r", Deposit(1), expected=1)
    b = workload.send("acc-r", Deposit(2), expected=1)
    workload.process(spark)
    results = workload.results()
    assert sorted([results[a].status, results[b].status]) == ["accepted", "rejected"]
    loser = results[a] if results[a].status == "rejected" else results[b]
    assert loser.version == 2 and loser.code == "wrong_expected_version"


def test_versions_are_contiguous_per_aggregate_across_batches(workload: Workload, spark: Any) -> None:
    rng = random.Random(7)
    accounts = [f"acc-{i}" for i in range(20)]
    for acc in accounts:
        workload.send(acc, OpenAccount(acc))
    for batch in range(3):
        for _ in range(100):
            workload.send(rng.choice(accounts), rng.choice([Deposit(rng.randint(1, 50)), Withdraw(10)]))
        workload.process(spark)
    results = workload.results()
    assert set(results) == set(workload.sent)  # one result per command
    accepted = collections.Counter(r.aggregate_id for r in results.values() if r.status == "accepted")
    versions = _versions_by_aggregate(workload.events())
    for acc in accounts:
        assert sorted(versions[acc]) == list(range(1, accepted[acc] + 1)), acc
        assert len(versions[acc]) == len(set(versions[acc]))


def test_the_changelog_store_keeps_versions_contiguous_and_answers_queries(
        cqrs_config: CqrsConfig, unique_name: str, tmp_path: Path, spark: Any) -> None:
    """``[processor] state_store = "kafka"`` through Spark: the states in a changelog topic,
    none in Cassandra; each worker restores the partitions it serves from that topic."""
    from cqrs.processor.changelog import ChangelogView, changelog_topic
    from cqrs.processor.state import StateReader
    from cqrs.processor.state_table import open_state_table

    cfg = cqrs_config.with_overrides(processor={"state_store": "kafka"})
    workload = Workload(cfg, unique_name + "-", tmp_path)
    rng = random.Random(11)
    accounts = [f"acc-{i}" for i in range(30)]
    for acc in accounts:
        workload.send(acc, OpenAccount(acc))
    for _ in range(2):
        for _ in range(120):
            workload.send(rng.choice(accounts), rng.choice([Deposit(rng.randint(1, 50)), Withdraw(10)]))
        workload.process(spark)
    results = workload.results()
    assert set(results) == set(workload.sent)
    accepted = collections.Counter(r.aggregate_id for r in results.values() if r.status == "accepted")
    versions = _versions_by_aggregate(workload.events())
    for acc in accounts:
        assert sorted(versions[acc]) == list(range(1, accepted[acc] + 1)), acc
    table = open_state_table(cfg, workload.topics)
    try:
        generation = table.current_generation()
        assert generation is not None and table.get(generation, "acc-3") == []
    finally:
        table.close()
    rows = list(ChangelogView(cfg, changelog_topic(workload.topics.base, generation)).scan())
    assert sorted(r.aggregate_id for r in rows) == sorted(accounts)
    with StateReader(app, cfg, topics=workload.topics) as states:
        for acc in ("acc-0", "acc-17"):
            got = states.get(acc)
            assert got is not None and got.version == accepted[acc]


def test_duplicate_command_ids_are_answered_once_and_not_rerun(workload: Workload, spark: Any) -> None:
    workload.send("acc-d", OpenAccount("ann"), command_id="open-1")
    workload.send("acc-d", Deposit(10), command_id="dep-1")
    workload.send("acc-d", Deposit(10), command_id="dep-1")  # a client retry, same batch
    workload.process(spark)
    workload.send("acc-d", Deposit(10), command_id="dep-1")  # and in a later batch
    workload.process(spark)
    events = [e for e in workload.events() if e.key == b"acc-d"]
    assert len(events) == 2  # opened + one deposit
    copies = [r for r in read_to_end(workload.cfg, [workload.topics.results]) if r.key == b"dep-1"]
    assert len(copies) == 3
    assert len({c.value for c in copies}) == 1  # the first result, byte for byte


def test_poison_records_are_dead_lettered_and_the_aggregate_keeps_working(
    workload: Workload, spark: Any
) -> None:
    workload.send("acc-p", OpenAccount("ann"))
    _, key, value, headers = encode_command(app, "acc-p", Deposit(3), timestamp=T0)
    env, payload = from_kafka(key, value, headers)

    def with_payload(cid: str, broken: bytes) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
        """A command record whose envelope is fine and whose command is not."""
        return to_kafka(attrs.evolve(env, message_id=cid, command_id=cid), broken)

    workload.send_raw(*with_payload("trunc", payload[:7]))  # truncated Avro
    workload.send_raw(*with_payload("unknown", b"\xc3\x01" + b"\x00" * 8 + b"\x02"))  # unknown fingerprint
    workload.send_raw(key, value[:20], [])  # a garbled command record
    workload.send_raw(b"acc-p", b"not avro at all", [("cqrs.aggregate_type", b"example.bank.Account")])
    workload.send_raw(None, value, [])  # no key
    crash = workload.send("acc-p", Explode("poison"))
    ok = workload.send("acc-p", Deposit(4))
    workload.process(spark)

    dead = workload.dead_letters()
    stages = sorted(dict(d.headers)["cqrs.dlq.stage"].decode() for d in dead)
    assert stages == ["decode", "decode", "envelope", "envelope", "envelope", "handler"]
    for d in dead:
        h = dict(d.headers)
        assert h["cqrs.dlq.topic"] == workload.topics.commands.encode()
        assert int(h["cqrs.dlq.offset"]) >= 0 and h["cqrs.dlq.error"]
    assert {d.value for d in dead} >= {value[:20], b"not avro at all"}  # original bytes kept
    results = workload.results()
    assert results["trunc"].status == results["unknown"].status == "failed"  # the senders hear
    results = workload.results()
    assert results[crash].status == "failed" and results[crash].error_type == "RuntimeError"
    assert (results[ok].status, results[ok].version) == ("accepted", 2)


def test_sigterm_stops_the_processor_between_micro_batches(
    cqrs_config: CqrsConfig, unique_name: str, tmp_path: Path, spark: Any,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM to ``cqrs run processor`` while a micro-batch serves a burst: the running batch
    ends, no other starts, the query stops cleanly (exit 0, no failed query, no crashed
    worker); every command sent before is answered once, by that run or the next."""
    work = Workload(cqrs_config, unique_name + "-", tmp_path)
    argv, env = work.cli()
    log = tmp_path / "processor.log"
    opened = work.send("acc-1", OpenAccount("ann"))
    work.producer.flush(30)
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while opened not in work.results():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.25)
        for n in range(3000):  # a burst: a batch serves it when the signal comes
            work.send("acc-1", Deposit(1 + n % 9))
        work.producer.flush(30)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)  # the driver only, as Kubernetes or `kill` would
        assert proc.wait(90) == 0, log.read_text()[-3000:]
    finally:
        stop(proc, signal.SIGKILL)  # nothing left of it, whatever happened
    text = log.read_text(errors="replace")
    assert "stopping after the running micro-batch" in text
    for sign in ("terminated with error", "exited unexpectedly", "Traceback", "ERROR"):
        assert sign not in text, text[-3000:]
    work.process_available(monkeypatch)  # whatever the stopped run left: all answered once
    results = work.results()
    assert set(results) == set(work.sent)
    assert sorted(r.version for r in results.values()) == list(range(1, len(work.sent) + 1))


def test_sigkill_and_restart_keeps_every_invariant(
    cqrs_config: CqrsConfig, unique_name: str, tmp_path: Path
) -> None:
    """Kill the processor (and its Python workers) with SIGKILL at random moments while
    commands flow; after restarts every command has exactly one answer, versions are
    contiguous, and anything written twice is byte-identical."""
    work = Workload(cqrs_config, unique_name + "-", tmp_path)
    argv, env = work.cli("--max-offsets-per-trigger", "200")

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    rng = random.Random(11)
    accounts = [f"acc-{i}" for i in range(30)]
    for acc in accounts:
        work.send(acc, OpenAccount(acc))
    work.producer.flush(30)
    checkpoints = Path(work.checkpoint)
    begun = micro_batches_begun(checkpoints)
    proc = start()
    kills = 0
    sent: list[tuple[str, object, str]] = []
    try:
        for round_ in range(2):  # a kill a round: once a restart is checked, more add only time
            for _ in range(500):
                acc = rng.choice(accounts)
                command = rng.choice([Deposit(rng.randint(1, 9)), Withdraw(5)])
                sent.append((acc, command, work.send(acc, command)))
                if rng.random() < 0.05:  # a client retry: the same command, same id, resent
                    again_acc, again_command, again_id = rng.choice(sent)
                    work.send(again_acc, again_command, command_id=again_id)
            work.producer.flush(30)
            # the (re)started processor at work (its start takes 5-20 s, by the machine's load),
            # then the kill at a random moment of the ~530 commands' batches of 200: sometimes
            # mid-batch, sometimes between batches
            wait_for("the processor to begin a micro-batch",
                     lambda since=begun: micro_batches_begun(checkpoints) > since, timeout=180)
            time.sleep(rng.uniform(0, 6))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            begun = micro_batches_begun(checkpoints)
            proc = start()
        work.send("acc-0", CloseAccount())
        work.producer.flush(30)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if set(work.results()) >= set(work.sent):
                break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert kills == 2

    raw_results = read_to_end(cqrs_config, [work.topics.results])
    by_command: dict[bytes, set[bytes]] = collections.defaultdict(set)
    for r in raw_results:
        by_command[r.key].add(r.value)
    assert {k.decode() for k in by_command} == set(work.sent)  # no command lost
    # a command answered twice (re-run batch or client retry) got the same answer both times
    assert all(len(values) == 1 for values in by_command.values())

    copies: dict[tuple[bytes, bytes], set[tuple[bytes, tuple[Any, ...]]]] = collections.defaultdict(set)
    for e in work.events():
        copies[(e.key, dict(e.headers)["cqrs.version"])].add((e.value, tuple(e.headers)))
    assert all(len(c) == 1 for c in copies.values())  # rewrites are byte-identical
    versions = _versions_by_aggregate(work.events())
    results = [app.codec.decode(next(iter(v))) for v in by_command.values()]
    for acc in accounts:
        top = max((r.version for r in results if r.aggregate_id == acc and r.status == "accepted"), default=0)
        assert sorted(set(versions[acc])) == list(range(1, top + 1)), acc


def test_dead_letters_are_listed_and_a_retry_runs_once(workload: Workload, spark: Any) -> None:
    from cqrs.deadletters import list_dead_letters, retry_dead_letters, retry_id

    workload.send("acc-x", OpenAccount("ann"))
    boom = workload.send("acc-x", Explode("first"), command_id="boom-1")
    workload.process(spark)
    (dead,) = list_dead_letters(workload.cfg, workload.topics)
    assert (dead.stage, dead.error_type, dead.command_id) == ("handler", "RuntimeError", boom)
    assert (dead.aggregate_id, dead.message_type) == ("acc-x", "example.bank.Explode")
    assert dead.source_topic == workload.topics.commands and dead.source_offset >= 0

    sent = retry_dead_letters(workload.cfg, workload.topics, [dead], [dead.position])
    again = retry_dead_letters(workload.cfg, workload.topics, [dead], [dead.position])  # twice
    assert sent == again == [retry_id(dead)]
    workload.process(spark)

    results = [app.codec.decode(r.value) for r in read_to_end(workload.cfg, [workload.topics.results])]
    retried = [r for r in results if r.command_id == sent[0]]
    assert [r.status for r in retried] == ["failed", "failed"]  # the handler still crashes ...
    assert retried[0] == retried[1]  # ... and the second retry is answered, not run again
    letters = list_dead_letters(workload.cfg, workload.topics)
    assert len(letters) == 2
    assert letters[1].command_id == sent[0]
    assert letters[1].envelope is not None and letters[1].envelope.causation_id == boom
