"""The projector on the real stack: Kafka events -> Spark -> Cassandra views, rebuilds,
kill-and-restart, dead letters. The oracle is the clean fold of the same log on SQLite."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cqrs.cli.main import main
from cqrs.config import CqrsConfig
from cqrs.kafka_io import read_to_end
from cqrs.testing.example import AccountClosed, AccountOpened, Deposited, Withdrawn
from cqrs.topics import AppTopics, ensure_topics, topics_for
from projections import ProjectionReader, SqliteStore
from projections.dlq import dead_letter_topic, read_dead_letters
from projections.job import ProjectorOptions, apply_frame, event_frame
from projections.local import LocalProjector
from projections.model import CategoryProjection, projections_of
from projections.records import EventRecord, event_record
from projections.rebuild import rebuild_projection
from projections.runner import run_projectors
from projections.store import ProjectionStore, table_base
from projections.stores import cached_store
from projections.testing import POISON_FILE, app, produce_events, publish_schemas
from waiting import micro_batches_begun, wait_for

APP_REF = "projections.testing:app"


class Log:
    """A test's own topics, keyspace and config, and a random bank history written to them."""

    def __init__(self, base_cfg: CqrsConfig, prefix: str, keyspace: str, tmp: Path) -> None:
        self.cfg = base_cfg.with_overrides(kafka={"topic_prefix": prefix},
                                           cassandra={"keyspace": keyspace},
                                           spark={"checkpoint_dir": str(tmp / "ck")},
                                           projections={"drop_grace_s": 1.0})
        self.topics: AppTopics = topics_for(app.name, prefix)
        ensure_topics(self.cfg, self.topics)
        publish_schemas(self.cfg, self.topics, app)
        self.versions: dict[str, int] = {}
        self.balances: dict[str, int] = {}
        self.rng = random.Random(prefix)

    def write(self, events: list[tuple[str, object]]) -> None:
        produce_events(self.cfg, self.topics.events, app, events, versions=self.versions)

    def history(self, accounts: int, moves: int, owners: int = 5, close: int = 0) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        new = [f"acc-{len(self.balances) + i}" for i in range(accounts)]
        for acc in new:
            out.append((acc, AccountOpened(f"owner-{self.rng.randrange(owners)}")))
            self.balances[acc] = 0
        live = list(self.balances)
        for _ in range(moves):
            acc = self.rng.choice(live)
            if self.balances[acc] > 5 and self.rng.random() < 0.3:
                out.append((acc, Withdrawn(5)))
                self.balances[acc] -= 5
            else:
                amount = self.rng.randint(1, 50)
                out.append((acc, Deposited(amount)))
                self.balances[acc] += amount
        for acc in self.rng.sample(live, close):
            out.append((acc, AccountClosed(self.balances.pop(acc))))
        return out

    def records(self) -> list[EventRecord]:
        return [event_record(r.key, r.value, r.headers, r.partition, r.offset)
                for r in read_to_end(self.cfg, [self.topics.events])]

    def clean_fold(self) -> SqliteStore:
        oracle = SqliteStore(":memory:")
        LocalProjector(app, oracle, collect_dead_letters=True).apply(self.records())
        return oracle

    def store(self) -> ProjectionStore:
        return cached_store(self.cfg)

    def project(self, spark: Any) -> None:
        run_projectors(spark, self.cfg, APP_REF, available_now=True, report=lambda m: None,
                       poll_s=0.5)


def tables(store: ProjectionStore, generation: int | None = None) -> dict[str, Any]:
    """Every row of every projection (current generation unless given), comparable."""
    out: dict[str, Any] = {}
    for name, p in projections_of(app).items():
        base = table_base(app.name, name)
        gen = generation or store.generations(base).current
        assert gen is not None
        out[name] = [(k, v.values, v.version, v.deleted, v.parked_at)
                     for k, v in store.scan_views(p, base, gen)]
        if isinstance(p, CategoryProjection):
            out[name + ":category"] = ProjectionReaderGroups(store, p, base, gen)
    return out


def ProjectionReaderGroups(store: ProjectionStore, p: CategoryProjection, base: str, gen: int) -> Any:  # noqa: N802
    """What readers see of each group: the newest ``keep`` items, deleted ones left out."""
    groups: dict[str, list[Any]] = {}
    for group, row in store.scan_category(p, base, gen):
        groups.setdefault(group, []).append(row)
    return {g: [(r.aggregate_id, r.values, r.version) for r in rows[:p.keep] if not r.deleted]
            for g, rows in sorted(groups.items())}


@pytest.fixture
def log(cqrs_config: CqrsConfig, unique_name: str, unique_keyspace: str, tmp_path: Path) -> Log:
    return Log(cqrs_config, unique_name + "-", unique_keyspace, tmp_path)


def test_views_equal_the_clean_fold_and_replays_change_nothing(log: Log, spark: Any) -> None:
    log.write(log.history(accounts=40, moves=400, close=5))
    log.project(spark)
    log.write(log.history(accounts=10, moves=200, close=3))  # a second batch on top
    log.project(spark)
    live = tables(log.store())
    assert live == tables(log.clean_fold())
    reader = ProjectionReader(app, log.store())
    some = next(a for a in log.balances)
    assert reader.get("balances", some)["balance"] == log.balances[some]  # type: ignore[index]
    page = reader.category("accounts_by_owner", "owner-0", page_size=2)
    assert 1 <= len(page.items) <= 2

    # replay the whole log twice more into the same tables, as Spark batch jobs
    base = table_base(app.name, "balances")
    gen = log.store().generations(base).current
    assert gen is not None
    for _ in range(2):
        for name in projections_of(app):
            frame = event_frame(spark.read.format("kafka").options(**log.cfg.kafka.spark_options())
                                .option("subscribe", log.topics.events)
                                .option("includeHeaders", "true").load())
            stats = apply_frame(frame, log.cfg, ProjectorOptions(APP_REF, name),
                                table_base(app.name, name), gen)
            assert stats.events == len(log.records())
    assert tables(log.store()) == live


def test_rebuild_equals_live_and_readers_never_fail(log: Log, spark: Any) -> None:
    log.write(log.history(accounts=60, moves=600, close=4))
    log.project(spark)
    store = log.store()
    live = tables(store)
    reader = ProjectionReader(app, store, generation_ttl=0.2)
    accounts = list(log.balances)
    stop = threading.Event()
    answers: list[Any] = []
    errors: list[BaseException] = []

    def query() -> None:
        while not stop.is_set():
            try:
                acc = random.choice(accounts)
                answers.append(reader.get("balances", acc))
                answers.append(reader.category("accounts_by_owner", "owner-1").items)
            except BaseException as exc:  # noqa: BLE001 - every failure is the finding
                errors.append(exc)

    thread = threading.Thread(target=query, daemon=True)
    thread.start()
    try:
        for name in ("balances", "accounts_by_owner"):
            report = rebuild_projection(spark, log.cfg, APP_REF, name, report=lambda m: None)
            assert (report.old_generation, report.new_generation) == (1, 2)
            assert report.dropped_old
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join(10)
    assert errors == []
    assert len(answers) > 20 and all(a is not None for a in answers)
    assert tables(store) == live  # generation 2 row for row
    for name in projections_of(app):
        assert store.generations(table_base(app.name, name)).current == 2


def _cli_env(log: Log) -> dict[str, str]:
    c = log.cfg
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "CQRS_KAFKA_TOPIC_PREFIX": c.kafka.topic_prefix,
            "CQRS_KAFKA_BOOTSTRAP": c.kafka.bootstrap_servers,
            "CQRS_CASSANDRA_KEYSPACE": c.cassandra.keyspace,
            "CQRS_CASSANDRA_HOSTS": c.cassandra.hosts, "CQRS_CASSANDRA_PORT": str(c.cassandra.port),
            "CQRS_SPARK_CHECKPOINT_DIR": c.spark.checkpoint_dir,
            "CQRS_PROJECTIONS_MAX_EVENTS_PER_TRIGGER": "300"}


def _cli(log: Log, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cqrs.cli.main", *args], env=_cli_env(log),
                          capture_output=True, text=True, timeout=timeout)


def test_sigkill_and_restart_converges_to_the_same_tables(
        log: Log, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = [sys.executable, "-m", "cqrs.cli.main", "run", "projector", APP_REF]
    log.write(log.history(accounts=50, moves=300))
    checkpoints = Path(log.cfg.spark.checkpoint_dir)
    begun = micro_batches_begun(checkpoints)
    proc = subprocess.Popen(argv, env=_cli_env(log), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for round_ in range(2):  # a kill a round: once a restart is checked, more add only time
            log.write(log.history(accounts=5, moves=600, close=1))
            # the (re)started projector at work (its start takes 5-20 s, by the machine's load),
            # then the kill at a random moment of its batches of 300 events: sometimes
            # mid-batch, sometimes between batches
            wait_for("the projector to begin a micro-batch",
                     lambda since=begun: micro_batches_begun(checkpoints) > since, timeout=180)
            time.sleep(log.rng.uniform(0, 4))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            begun = micro_batches_begun(checkpoints)
            proc = subprocess.Popen(argv, env=_cli_env(log), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
    finally:
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # the last run catches up from the killed runs' checkpoints: `cqrs run projector
    # --available-now` in this process, on the session's Spark (the kills were of processes of
    # their own; one more would only add a JVM's start, ~12 s)
    for name, value in _cli_env(log).items():
        if name.startswith("CQRS_"):
            monkeypatch.setenv(name, value)
    assert main(["run", "projector", APP_REF, "--available-now"]) == 0
    assert tables(log.store()) == tables(log.clean_fold())
    status = _cli(log, "projections", "status", APP_REF)
    assert status.returncode == 0 and "balances: generation 1, lag 0 events" in status.stdout


def test_poisoned_event_holds_back_only_its_aggregate(log: Log, spark: Any) -> None:
    poison = 100_000 + random.randrange(100_000)
    log.write(log.history(accounts=20, moves=100))
    b3, b4, v3 = log.balances["acc-3"], log.balances["acc-4"], log.versions["acc-3"]
    log.write([("acc-3", Deposited(poison)), ("acc-3", Deposited(1)), ("acc-4", Deposited(2))])
    POISON_FILE.write_text(f"{poison}\n")
    try:
        log.project(spark)
        reader = ProjectionReader(app, log.store())
        held = reader.get("balances", "acc-3")
        assert held is not None and held["balance"] == b3  # the view stops before the hole
        assert reader.version("balances", "acc-3") == v3
        assert reader.get("balances", "acc-4")["balance"] == b4 + 2  # type: ignore[index]
        letters = read_dead_letters(log.cfg, dead_letter_topic(app.name, log.cfg.kafka.topic_prefix))
        mine = [(e.letter.record.aggregate_id, e.letter.reason) for e in letters if e.projection == "balances"]
        assert mine == [("acc-3", "handler"), ("acc-3", "parked")]
        listed = _cli(log, "projections", "dlq", APP_REF, "list")
        assert listed.returncode == 0 and "poisoned deposit amount" in listed.stdout
        log.write([("acc-3", Withdrawn(1))])  # keeps waiting behind the poisoned event
        log.project(spark)
        assert reader.version("balances", "acc-3") == v3
    finally:
        POISON_FILE.unlink()
    replayed = _cli(log, "projections", "dlq", APP_REF, "replay")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr[-2000:]
    assert "0 still parked" in replayed.stdout
    assert tables(log.store()) == tables(log.clean_fold())
