"""The framework, unchanged, on the local cluster (`cqrs dev up --cluster`): three Kafka brokers
(replication 3, min.insync.replicas 2), two Cassandra nodes on 127.0.0.2/.3 and a Spark
standalone master with two workers. Only configuration differs: the processor and the projector
of the bank run as `cqrs run ...` processes with ``CQRS_CONFIG`` pointing at the file `up` wrote.

The cluster uses its own ports and folder, so it runs beside the shared single-node stack; the
package's conftest starts it once for this module and the fault suite, and stops it after them
(unless it was already running).
"""

from __future__ import annotations

import time
import pytest

from cluster_harness import WAIT, Cluster, eventually, fresh_names, job_report, spark_apps, start_job
from cqrs.client import CommandClient, StateReader
from cqrs.config import CqrsConfig
from cqrs.topics import topics_for
from domain_examples.bank import Deposit, OpenAccount, Withdraw, app
from projections import ProjectionReader
from projections.stores import cached_store
from process_group import stop

APP_REF = "domain_examples.bank:app"
# the first result waits for two Spark applications to start on 2 shared cores: executors,
# Python workers, topics with 3 replicas and tables on 2 Cassandra nodes (140-200 s measured)
FIRST = 300.0


@pytest.fixture(scope="module")
def cluster(local_cluster: CqrsConfig, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return fresh_names(local_cluster, tmp_path_factory.mktemp("cluster"), "cluster")


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


def test_bank_on_the_cluster(cluster: Cluster) -> None:
    cfg = cluster.cfg
    assert cfg.spark.master.startswith("spark://")
    assert len(cfg.kafka.bootstrap_servers.split(",")) == 3
    assert cfg.cassandra.contact_points() == ["127.0.0.2", "127.0.0.3"]
    processor = start_job(cluster, "run", "processor", APP_REF)
    projector = start_job(cluster, "run", "projector", APP_REF)

    def jobs() -> str:  # what a failure message ends with: each job's state and log
        try:
            apps: object = spark_apps(cfg, states=True)
        except OSError as exc:
            apps = f"(the master did not answer: {exc})"
        return (f"\nSpark applications: {apps}" + job_report(cluster, processor, "processor")
                + job_report(cluster, projector, "projector"))

    try:
        started = time.monotonic()
        with CommandClient(app, cfg) as client:
            opened = client.send_and_wait("acc-ann", OpenAccount("ann"), expected_version=0,
                                          timeout=FIRST)
            assert (opened.status, opened.version) == ("accepted", 1), f"{opened}{jobs()}"
            print(f"first result {time.monotonic() - started:.1f} s after the processor's start")
            # both jobs are Spark applications on the standalone master, each on two executors
            apps = spark_apps(cfg)
            assert apps.get(f"cqrs-processor-{app.name}") == 2, jobs()
            assert eventually(lambda: spark_apps(cfg).get(f"cqrs-projector-{APP_REF}") == 2), \
                jobs()
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
        row = eventually(lambda: (r := reader.get("balances", "acc-ann")) and
                          r["balance_cents"] == 70_00 and r)
        assert row and row["owner"] == "ann" and row["is_open"] is True, f"{row}{jobs()}"
        bob = eventually(lambda: reader.get("balances", "acc-bob"))
        assert bob is not None and bob["balance_cents"] == 0 and bob["owner"] == "bob", \
            f"{bob}{jobs()}"

        # the framework's topics follow the cluster's configuration: 3 replicas, 2 in sync
        topics = topics_for(app.name, cfg.kafka.topic_prefix)
        for topic in (topics.commands, topics.events, topics.results, topics.dead_letters):
            assert _topic_settings(cfg, topic) == (3, "2"), topic
        # and the keyspace is replicated on both Cassandra nodes
        assert _keyspace_replication(cfg)["replication_factor"] == "2"
        assert processor.poll() is None and projector.poll() is None, jobs()
    except Exception as exc:  # a time-out or failed check says how the jobs were doing
        if "the end of its log" not in str(exc):
            exc.add_note(jobs())
        raise
    finally:
        stop(processor)
        stop(projector)
    for name in ("processor", "projector"):
        text = (cluster.logs / f"{name}.log").read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]
