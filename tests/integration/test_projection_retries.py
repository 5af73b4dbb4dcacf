"""Automatic retries of parked projection views on the real stack: ``cqrs run app`` (its
projector query and the timer of its driver) over topics and a keyspace of their own; the
flaky projection app's handler asks a stand-in service that fails while a flag file says so.
Events are written straight to the events topic (the projection is what is tested)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from cqrs.config import CqrsConfig
from cqrs.kafka_io import read_to_end
from cqrs.retrier.store import RetryStore
from cqrs.topics import AppTopics, ensure_topics, topics_for
from projections import SqliteStore
from projections.dlq_retry import episode_id, retry_table_app
from projections.errors import ProjectionStoreError
from projections.local import LocalProjector
from projections.records import event_record
from projections.store import ProjectionStore, table_base, table_names
from projections.stores import open_store
from projections.testing import produce_events, publish_schemas

APPS = Path(__file__).parent / "apps"
sys.path.insert(0, str(APPS))
import flaky_projection_app  # noqa: E402
from flaky_projection_app import Counted  # noqa: E402
from process_group import stop  # noqa: E402
from waiting import table_exists, wait_for  # noqa: E402

APP_REF = "flaky_projection_app:app"
app = flaky_projection_app.app
PROJECTION = app.projections[0]


@attrs.define
class Stack:
    cfg: CqrsConfig
    topics: AppTopics
    tmp: Path
    env: dict[str, str]
    store: ProjectionStore
    versions: dict[str, int] = attrs.Factory(dict)
    procs: dict[str, subprocess.Popen[bytes]] = attrs.Factory(dict)

    def start(self) -> None:
        with (self.tmp / "app.log").open("ab") as out:
            self.procs["app"] = subprocess.Popen(
                [sys.executable, "-m", "cqrs.cli.main", "run", "app", APP_REF, "--trigger",
                 "300 milliseconds"],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return (self.tmp / "app.log").read_text(errors="replace")[-4000:]

    def write(self, events: list[tuple[str, object]]) -> None:
        produce_events(self.cfg, self.topics.events, app, events, versions=self.versions)

    def flag(self, failures: int) -> str:
        path = self.tmp / f"flag-{uuid.uuid4().hex[:8]}"
        path.write_text(str(failures))
        return str(path)

    def view(self, key: str) -> Any:
        base = table_base(app.name, PROJECTION.name)
        return self.store.read_views(PROJECTION, base, 1, [key]).get(key)

    def retry_store(self) -> RetryStore:
        return RetryStore(self.cfg, retry_table_app(self.topics.base, PROJECTION.name, 1))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cqrs.cli.main", *args], env=self.env,
                              capture_output=True, text=True, timeout=180)

    def parkings(self) -> list[dict[str, Any]]:
        done = self.cli("projections", "dlq", APP_REF, "list", "--json")
        assert done.returncode == 0, done.stderr[-3000:]
        return list(json.loads(done.stdout)["parkings"])

    def clean_fold(self) -> SqliteStore:
        """The oracle: the whole events topic folded by the local projector."""
        oracle = SqliteStore(":memory:")
        records = [event_record(r.key, r.value, r.headers, r.partition, r.offset)
                   for r in read_to_end(self.cfg, [self.topics.events])]
        LocalProjector(app, oracle, collect_dead_letters=True).apply(records)
        return oracle


def calls(flag: str) -> list[float]:
    path = Path(flag).with_suffix(".calls")
    return [float(x) for x in path.read_text().split()] if path.exists() else []


def same_views(a: ProjectionStore, b: ProjectionStore, keys: list[str]) -> bool:
    base = table_base(app.name, PROJECTION.name)
    mine = a.read_views(PROJECTION, base, 1, keys)
    theirs = b.read_views(PROJECTION, base, 1, keys)
    as_tuple = {k: (v.values, v.version, v.deleted, v.parked_at) for k, v in mine.items()}
    return as_tuple == {k: (v.values, v.version, v.deleted, v.parked_at)
                        for k, v in theirs.items()}


@pytest.fixture(scope="module")
def stack(cqrs_config: CqrsConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("projection-retries")
    run = uuid.uuid4().hex[:8]
    prefix, keyspace = f"t-projretry-{run}-", f"t_projretry_{run}"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix},
                                     cassandra={"keyspace": keyspace},
                                     spark={"checkpoint_dir": str(tmp / "ck")})
    topics = topics_for(app.name, prefix)
    ensure_topics(cfg, topics)
    publish_schemas(cfg, topics, app)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APPS), *sys.path]),
           "CQRS_KAFKA_TOPIC_PREFIX": prefix, "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers,
           "CQRS_CASSANDRA_KEYSPACE": keyspace, "CQRS_SPARK_CHECKPOINT_DIR": str(tmp / "ck"),
           "CQRS_RETRIER_INTERVAL": "0.5", "CQRS_METRICS_PORT": "0"}
    store = open_store(cfg)
    s = Stack(cfg, topics, tmp, env, store)
    s.start()
    try:
        s.write([("warm-up", Counted(1, ""))])

        views_table = table_names(table_base(app.name, PROJECTION.name), 1)[0]

        def warm() -> Any:
            # read only once the app's driver has created the table: a read prepared while
            # another process creates it can be left with a table id Cassandra never opened
            # ("Unknown CF" for the rest of the module, seen once in CI)
            if not table_exists(cfg, views_table):
                return None
            try:
                return s.view("warm-up")
            except ProjectionStoreError:  # not readable yet
                return None

        wait_for("the projector's first view", warm, timeout=600, log=s.log)
        yield s
    finally:
        for proc in s.procs.values():
            stop(proc, signal.SIGTERM)
        store.close()
        from cqrs.cassandra_io import cql_cluster

        cluster = cql_cluster(cfg.cassandra.contact_points(), cfg.cassandra.port)
        try:
            cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        finally:
            cluster.shutdown()


def test_a_view_parked_by_a_failing_handler_is_released_by_its_retries(stack: Stack) -> None:
    flag = stack.flag(2)  # the projector's run fails, the first retry fails, the second applies
    stack.write([("t-1", Counted(1, "")), ("t-1", Counted(2, flag)), ("t-1", Counted(3, ""))])
    view = wait_for("t-1 released with every event applied", lambda: (
        (v := stack.view("t-1")) is not None and v.parked_at is None and v.version == 3 and v),
        timeout=120, log=stack.log)
    assert view.values == {"total": 6, "events": 3}
    assert len(calls(flag)) == 3  # two failures, one success
    assert same_views(stack.store, stack.clean_fold(), ["warm-up", "t-1"])

    retries = stack.retry_store()
    try:
        eid = episode_id("t-1", 2)
        history = retries.attempts(eid)
        letter = retries.letter(eid)
    finally:
        retries.close()
    # the projector's run failed (a task Spark re-ran may have used up the second failure too),
    # each attempt after it is a replay, the last one released the view
    assert 2 <= len(history) <= 3, history
    assert [(a.attempt, a.stage, a.error_type, a.state) for a in history] == [
        (1, "handler", "TallyUnavailable", "replayed"),
        *((n, "replay", "TallyUnavailable", "replayed") for n in range(2, len(history) + 1))]
    assert [a.outcome for a in history] == ["failed again"] * (len(history) - 1) + ["released"]
    backoff = flaky_projection_app.BACKOFF
    for a in history:  # each retry waited its backoff (+-jitter), and ran once it was due
        base = backoff.initial_s * backoff.multiplier ** (a.attempt - 1) * 1000
        assert a.due_ms is not None and a.failed_ms is not None and a.delivered_ms is not None
        assert base * 0.8 - 1 <= a.due_ms - a.failed_ms <= base * 1.2 + 1, a
        assert a.delivered_ms >= a.due_ms, a
    assert letter is not None and letter.state == "done" and letter.attempts == len(history)
    assert not [k for k in stack.parkings() if k["key"] == "t-1"]

    stack.write([("t-1", Counted(4, ""))])  # the released view keeps flowing
    wait_for("t-1 at version 4", lambda: (v := stack.view("t-1")) is not None and v.version == 4)


def test_a_view_failing_every_attempt_ends_parked_for_an_operator(stack: Stack) -> None:
    flag = stack.flag(999)
    stack.write([("t-2", Counted(1, "")), ("t-2", Counted(5, flag)), ("t-2", Counted(1, ""))])

    def parked() -> Any:
        return next((k for k in stack.parkings() if k["key"] == "t-2" and k["state"] == "parked"),
                    None)

    found = wait_for("t-2 parked for an operator", parked, timeout=120, log=stack.log)
    attempts = flaky_projection_app.BACKOFF.max_attempts
    assert found["attempts"] == attempts and "tally service down" in found["error"]
    assert [(a["attempt"], a["stage"], a["state"]) for a in found["history"]] == [
        (1, "handler", "replayed"), *((n, "replay", "replayed") for n in range(2, attempts)),
        (attempts, "replay", "parked")]
    assert all(a["error_type"] == "TallyUnavailable" for a in found["history"])
    tried = len(calls(flag))
    assert tried >= attempts  # (more when Spark re-ran the projector's task)
    time.sleep(3)
    assert len(calls(flag)) == tried  # no attempt after the last one
    view = stack.view("t-2")
    assert view.version == 1 and view.parked_at == 2 and view.values == {"total": 1, "events": 1}
    listed = stack.cli("projections", "dlq", APP_REF, "list")
    assert f"parked for an operator after {attempts} attempts" in listed.stdout, listed.stdout
    assert same_views(stack.store, stack.clean_fold(), ["t-2"])  # parked where the fold parks

    # the cause fixed, an operator's replay releases it and closes its letter
    Path(flag).write_text("0")
    replayed = stack.cli("projections", "dlq", APP_REF, "replay")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr[-3000:]
    assert "1 parked views released" in replayed.stdout, replayed.stdout
    view = stack.view("t-2")
    assert view.parked_at is None and view.version == 3 and view.values == {"total": 7, "events": 3}
    assert not [k for k in stack.parkings() if k["key"] == "t-2"]
