"""Personal data on the real stack (#26): ``cqrs run app`` of the ticketing example (personal
name and e-mail, data subject the customer) on topics and a keyspace of its own, two customers'
orders sent through ``CommandClient``, then ``cqrs forget`` one of them.

Checked: the raw bytes of the commands and events topics and every row of every table of the
keyspace (aggregate state, history, read model, keys) hold no plaintext name or e-mail; the
state reader, the history reader and a codec from ``key_store_for`` read the plaintext; after
``cqrs forget`` (run twice: the second says there was nothing to do) the forgotten customer's
fields read as the replacement there, everything else of their order is intact, and the other
customer reads back unchanged. One Spark driver (the subprocess) for the whole module.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest

from cqrs.client import CommandClient, HistoryReader, StateReader
from cqrs.config import CqrsConfig
from cqrs.domain import FORGOTTEN
from cqrs.envelope import from_kafka
from cqrs.kafka_io import read_to_end
from cqrs.personal.stack import close_key_stores, key_store_for
from cqrs.topics import AppTopics, topics_for
from domain_examples.ticketing import PlaceTicketOrder, TicketOrderPlaced, app
from process_group import stop

APP_REF = "domain_examples.ticketing:app"
START_WAIT = 300.0  # a Spark driver and three queries on a shared 2-core box
WAIT = 60.0
ERIN = ("c-erin", "Erin Quillfeather", "erin.quillfeather@example.com")
ANN = ("c-ann", "Ann Marlowe", "ann.marlowe@example.com")
CONSOLE_SCRIPT = "import sys; from cqrs.cli import main; sys.exit(main())"
T = TypeVar("T")


@attrs.frozen
class Running:
    cfg: CqrsConfig
    topics: AppTopics
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path
    session: Any  # a driver session on Cassandra, for the raw rows

    def until(self, what: str, probe: Callable[[], T | None], timeout: float = WAIT) -> T:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"cqrs run app exited:\n{self.tail()}"
            last = probe()
            if last:
                return last
            time.sleep(0.5)
        pytest.fail(f"{what}: not within {timeout:.0f} s (last: {last!r})\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``cqrs ARGS`` as the console script runs it."""
        return subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, *args], env=self.env,
                              capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def running(cqrs_config: CqrsConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    from cqrs.cassandra_io import cql_cluster

    token = uuid.uuid4().hex[:8]
    prefix, keyspace = f"t-pd-{token}-", f"t_pd_{token}"
    folder = tmp_path_factory.mktemp("personal")
    master = base64.b64encode(os.urandom(32)).decode()
    cfg = cqrs_config.with_overrides(
        kafka={"topic_prefix": prefix}, cassandra={"keyspace": keyspace},
        spark={"checkpoint_dir": str(folder / "checkpoints")},
        # a forget by another process shows here within a second
        personal_data={"master_key": master, "key_cache_seconds": 1.0})
    cluster = cql_cluster(cfg.cassandra.contact_points(), cfg.cassandra.port)
    session = cluster.connect()
    session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = {cfg.cassandra.replication}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "CQRS_CASSANDRA_KEYSPACE": keyspace, "CQRS_KAFKA_TOPIC_PREFIX": prefix,
           "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers,
           "CQRS_SPARK_CHECKPOINT_DIR": cfg.spark.checkpoint_dir, "CQRS_METRICS_PORT": "0",
           "CQRS_PERSONAL_DATA_MASTER_KEY": master,
           "CQRS_PERSONAL_DATA_KEY_CACHE_SECONDS": "1"}
    log = folder / "run_app.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cqrs.cli.main", "run", "app", APP_REF, "--trigger",
             "500 milliseconds", "--no-retrier", "--no-scheduler", "--no-process-managers"],
            env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True)
    try:
        yield Running(cfg, topics_for(app.name, prefix), env, proc, log, session)
    finally:
        stop(proc, signal.SIGKILL)  # the whole group at once: nothing of it is kept
        close_key_stores()
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        cluster.shutdown()


def _plaintexts() -> list[bytes]:
    return [t.encode() for who in (ERIN, ANN) for t in who[1:]]


def _rows_holding(session: Any, keyspace: str, texts: list[bytes]) -> tuple[int, list[str]]:
    """How many rows the keyspace's tables hold, and where one of ``texts`` is in them."""
    tables = [r.table_name for r in session.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,))]
    rows, hits = 0, []
    for table in tables:
        for row in session.execute(f'SELECT * FROM {keyspace}."{table}"', timeout=60):
            rows += 1
            raw = b"".join(v if isinstance(v, bytes) else str(v).encode() for v in row)
            hits += [f"{table}: {t!r}" for t in texts if t in raw]
    return rows, hits


def test_personal_fields_are_ciphertext_on_the_stack_and_forget_shreds_one_customer(
        running: Running) -> None:
    cfg, topics = running.cfg, running.topics
    # the runner opens the key store (and makes its tables, the forget record last) before
    # Spark starts: let it be the one that creates them, not this process at the same moment
    running.until("the runner's key tables", lambda: list(running.session.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s AND "
        "table_name = 'cqrs_forgotten_subjects'", (cfg.cassandra.keyspace,))), START_WAIT)
    with CommandClient(app, cfg) as client:
        futures = [client.send(f"order-{cid}", PlaceTicketOrder(cid, name, email, "Hamlet", 2),
                               expected_version=0) for cid, name, email in (ERIN, ANN)]
        results = [f.result(START_WAIT) for f in futures]
    assert [r.status for r in results] == ["accepted", "accepted"], results

    with StateReader(app, cfg) as states, HistoryReader(app, cfg) as history:
        erin, ann = (states.get(f"order-{c}", min_version=1, timeout=WAIT) for c in ("c-erin", "c-ann"))
        assert erin is not None and ann is not None
        assert (erin.state.customer_name, erin.state.email) == ERIN[1:]  # decoded: plaintext
        assert (ann.state.customer_name, ann.state.email, ann.state.tickets) == (*ANN[1:], 2)
        def both_in_history() -> list[Any] | None:
            pages = [history.events(f"order-{c}") for c in ("c-erin", "c-ann")]
            return [p.events[0].event for p in pages] if all(p.events for p in pages) else None

        placed = running.until("the history job wrote both orders", both_in_history)
        assert placed == [TicketOrderPlaced(*ERIN, "Hamlet", 2), TicketOrderPlaced(*ANN, "Hamlet", 2)]

        # raw: the topics' bytes and every row of the keyspace (state, history, read model, keys)
        def projected() -> tuple[int, list[str]] | None:
            rows, hits = _rows_holding(running.session, cfg.cassandra.keyspace,
                                       [b"order-c-erin", b"order-c-ann"])
            return (rows, hits) if len([h for h in hits if "ticket_orders" in h]) >= 2 else None

        running.until("the read model holds both orders", projected)
        rows, hits = _rows_holding(running.session, cfg.cassandra.keyspace, _plaintexts())
        assert rows >= 8 and hits == []  # 2 states, 2 history rows, 2 views, 2 keys at least
        _, subjects = _rows_holding(running.session, cfg.cassandra.keyspace, [b"c-erin"])
        assert {h.split(":")[0] for h in subjects} >= {"cqrs_subject_keys", "cqrs_history"}, subjects
        records = read_to_end(cfg, [topics.commands, topics.events])
        assert len(records) >= 4
        raw = b"".join((r.value or b"") + b"".join(v or b"" for _, v in r.headers) for r in records)
        assert [t for t in _plaintexts() if t in raw] == []
        assert b"c-erin" in raw and b"Hamlet" in raw  # what is not personal is written as it is
        events = [r for r in records if r.topic == topics.events]
        codec = app.codec_for(app.codec.store, key_store=key_store_for(cfg, app))
        assert sorted(codec.decode(from_kafka(r.key, r.value, r.headers)[1]).email
                      for r in events) == [ANN[2], ERIN[2]]

        forgotten = running.cli("forget", APP_REF, "c-erin")
        assert (forgotten.returncode, forgotten.stderr) == (0, ""), forgotten
        assert forgotten.stdout.splitlines()[-1].startswith(
            "forgot data subject 'c-erin' of app 'ticketing'")
        again = running.cli("forget", APP_REF, "c-erin")
        assert again.returncode == 0 and "has no key: forgotten before" in again.stdout, again

        def erin_forgotten() -> Any:
            state = states.get("order-c-erin")
            return state if state is not None and state.state.email == FORGOTTEN else None

        erin = running.until("erin's state reads as forgotten", erin_forgotten, timeout=10)
        assert (erin.state.customer_id, erin.state.customer_name, erin.state.show,
                erin.state.tickets, erin.state.status) == ("c-erin", FORGOTTEN, "Hamlet", 2, "placed")
        assert history.events("order-c-erin").events[0].event == TicketOrderPlaced(
            "c-erin", FORGOTTEN, FORGOTTEN, "Hamlet", 2)
        assert sorted(codec.decode(from_kafka(r.key, r.value, r.headers)[1]).email
                      for r in events) == [FORGOTTEN, ANN[2]]
        ann_now = states.get("order-c-ann")
        assert ann_now is not None and ann_now.state == ann.state  # unchanged
        assert history.events("order-c-ann").events[0].event == TicketOrderPlaced(*ANN, "Hamlet", 2)
    rows, hits = _rows_holding(running.session, cfg.cassandra.keyspace, _plaintexts())
    assert hits == []
