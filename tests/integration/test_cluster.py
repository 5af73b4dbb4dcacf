"""The framework, unchanged, on the local cluster (`cqrs dev up --cluster`): three Kafka brokers
(replication 3, min.insync.replicas 2), two Cassandra nodes on 127.0.0.2/.3 and a Spark
standalone master with two workers. Only configuration differs: the processor and the projector
of the bank run as `cqrs run ...` processes with ``CQRS_CONFIG`` pointing at the file `up` wrote.

The cluster uses its own ports and folder, so it runs beside the shared single-node stack; this
module starts it and stops it again (unless it was already running).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from cqrs.client import CommandClient, StateReader
from cqrs.config import CqrsConfig, load_config
from cqrs.devstack import artifacts
from cqrs.devstack.cluster import cluster_toml_path, spark_master_url
from cqrs.devstack.stack import DevStack
from cqrs.topics import topics_for
from domain_examples.bank import Deposit, OpenAccount, Withdraw, app
from projections import ProjectionReader
from projections.stores import cached_store
from process_group import stop

APP_REF = "domain_examples.bank:app"
WAIT = 150.0
# the first result waits for two Spark applications to start on 2 shared cores: executors,
# Python workers, topics with 3 replicas and tables on 2 Cassandra nodes (140-200 s measured)
FIRST = 300.0


@attrs.frozen
class Cluster:
    cfg: CqrsConfig
    env: dict[str, str]
    logs: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = load_config()
    if not all(artifacts.is_installed(base.dev, c) for c in artifacts.COMPONENTS):
        artifacts.install(base.dev)
    stack = DevStack(base, cluster=True)
    already = any(s.running for s in stack.status())
    started = time.monotonic()
    statuses = stack.up(say=lambda m: None)
    took = time.monotonic() - started
    assert all(s.healthy for s in statuses), statuses
    print(f"cluster up in {took:.1f} s; resident MiB: "
          + ", ".join(f"{s.name} {s.resident_mib:.0f}" for s in statuses if s.resident_mib))
    tmp = tmp_path_factory.mktemp("cluster")
    env = {
        **os.environ,
        "CQRS_CONFIG": str(cluster_toml_path(base)),  # the file `cqrs dev up --cluster` wrote
        "CQRS_KAFKA_TOPIC_PREFIX": f"t-cluster-{uuid.uuid4().hex[:8]}-",
        "CQRS_CASSANDRA_KEYSPACE": f"t_cluster_{uuid.uuid4().hex[:8]}",
        "CQRS_SPARK_CHECKPOINT_DIR": str(tmp / "checkpoints"),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    try:
        yield Cluster(load_config(env=env), env, tmp)
    finally:
        if not already:
            stack.down(say=lambda m: None)


def _start(cluster: Cluster, *argv: str) -> subprocess.Popen[bytes]:
    log = (cluster.logs / f"{argv[1]}.log").open("wb")
    return subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", *argv], env=cluster.env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _eventually(check: Any, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(1.0)


def _topic_settings(cfg: CqrsConfig, topic: str) -> tuple[int, str]:
    from confluent_kafka.admin import ConfigResource

    from cqrs.kafka_io import make_admin

    admin = make_admin(cfg)
    meta = admin.list_topics(topic, timeout=30).topics[topic]
    replicas = {len(p.replicas) for p in meta.partitions.values()}
    assert len(replicas) == 1, replicas
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    conf = admin.describe_configs([res])[res].result(timeout=30)
    return replicas.pop(), conf["min.insync.replicas"].value


def _keyspace_replication(cfg: CqrsConfig) -> dict[str, str]:
    from cassandra.cluster import Cluster as CassandraCluster

    c = CassandraCluster(cfg.cassandra.contact_points(), port=cfg.cassandra.port)
    try:
        row = c.connect().execute("SELECT replication FROM system_schema.keyspaces WHERE "
                                  "keyspace_name = %s", [cfg.cassandra.keyspace]).one()
        return dict(row.replication)
    finally:
        c.shutdown()


def _spark_apps(cfg: CqrsConfig) -> dict[str, int]:
    """Running applications on the standalone master: name -> cores they hold."""
    import json
    import urllib.request

    port = int(spark_master_url(cfg).rsplit(":", 1)[1]) + 1000
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=5) as reply:  # noqa: S310
        return {a["name"]: a["cores"] for a in json.loads(reply.read())["activeapps"]}


def test_bank_on_the_cluster(cluster: Cluster) -> None:
    cfg = cluster.cfg
    assert cfg.spark.master.startswith("spark://")
    assert len(cfg.kafka.bootstrap_servers.split(",")) == 3
    assert cfg.cassandra.contact_points() == ["127.0.0.2", "127.0.0.3"]
    processor = _start(cluster, "run", "processor", APP_REF)
    projector = _start(cluster, "run", "projector", APP_REF)
    try:
        started = time.monotonic()
        with CommandClient(app, cfg) as client:
            opened = client.send_and_wait("acc-ann", OpenAccount("ann"), expected_version=0,
                                          timeout=FIRST)
            assert (opened.status, opened.version) == ("accepted", 1), opened
            print(f"first result {time.monotonic() - started:.1f} s after the processor's start")
            # both jobs are Spark applications on the standalone master, each on two executors
            apps = _spark_apps(cfg)
            assert apps.get(f"cqrs-processor-{app.name}") == 2, apps
            assert _eventually(lambda: _spark_apps(cfg).get(f"cqrs-projector-{APP_REF}") == 2), \
                _spark_apps(cfg)
            sent = [client.send("acc-ann", Deposit(100_00)), client.send("acc-bob", OpenAccount("bob")),
                    client.send("acc-ann", Withdraw(30_00)), client.send("acc-bob", Withdraw(5_00))]
            got = [f.result(timeout=WAIT) for f in sent]
        assert [(r.status, r.version) for r in got] == [
            ("accepted", 2), ("accepted", 1), ("accepted", 3), ("rejected", 1)], got
        assert got[3].reason is not None and "insufficient funds" in got[3].reason

        with StateReader(app, cfg) as states:
            ann = states.get("acc-ann", min_version=3, timeout=30)
            assert ann is not None and ann.state.balance_cents == 70_00

        reader = ProjectionReader(app, cached_store(cfg))
        row = _eventually(lambda: (r := reader.get("balances", "acc-ann")) and
                          r["balance_cents"] == 70_00 and r)
        assert row and row["owner"] == "ann" and row["is_open"] is True, row
        bob = _eventually(lambda: reader.get("balances", "acc-bob"))
        assert bob is not None and bob["balance_cents"] == 0 and bob["owner"] == "bob"

        # the framework's topics follow the cluster's configuration: 3 replicas, 2 in sync
        topics = topics_for(app.name, cfg.kafka.topic_prefix)
        for topic in (topics.commands, topics.events, topics.results, topics.dead_letters):
            assert _topic_settings(cfg, topic) == (3, "2"), topic
        # and the keyspace is replicated on both Cassandra nodes
        assert _keyspace_replication(cfg)["replication_factor"] == "2"
        assert processor.poll() is None and projector.poll() is None
    finally:
        stop(processor)
        stop(projector)
    for name in ("processor", "projector"):
        text = (cluster.logs / f"{name}.log").read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]
