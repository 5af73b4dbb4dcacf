"""``cqrs dev up --cluster``: a small real cluster on loopback, apart from the single stack.

Three Kafka brokers (KRaft, each broker and controller; replication factor 3 and
min.insync.replicas 2), Cassandra nodes on their own loopback addresses (127.0.0.2, 127.0.0.3),
and a Spark standalone master with one-core workers started from the installed pyspark. Ports
and folders (``dev.cluster_*`` settings, ``<CQRS_HOME>/cluster``) differ from the single
stack's, so both run side by side. :func:`cluster_config` is the configuration that points the
framework at it; ``up`` also writes it as a TOML file (:func:`cluster_toml_path`).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from cqrs.config import CqrsConfig
from cqrs.devstack import services
from cqrs.devstack.process import ServiceProcess
from cqrs.devstack.services import CassandraNode, KafkaNode
from cqrs.devstack.stack import Service
from cqrs.errors import DevStackError

__all__ = [
    "KAFKA_BROKERS",
    "cassandra_nodes",
    "cluster_config",
    "cluster_services",
    "cluster_toml",
    "cluster_toml_path",
    "crash_service",
    "kafka_nodes",
    "spark_home",
    "spark_master_url",
]

KAFKA_BROKERS = 3
_REPLICATION, _MIN_INSYNC = 3, 2
_CONTROLLER_OFFSET = 100  # controller port = broker port + 100
_UI_OFFSET = 1000  # Spark master web UI = master port + 1000, workers' after it
_SPARK_DAEMON_HEAP = "256m"
# each worker offers two (virtual) cores, so that two applications (a processor and a
# projector) each get two one-core executors; a standalone app takes every free core otherwise
_WORKER_CORES = 2


def kafka_nodes(cfg: CqrsConfig) -> list[KafkaNode]:
    d = cfg.dev
    ports = [d.cluster_kafka_port + i for i in range(KAFKA_BROKERS)]
    voters = ",".join(f"{i + 1}@127.0.0.1:{p + _CONTROLLER_OFFSET}" for i, p in enumerate(ports))
    return [
        KafkaNode(f"cluster-kafka-{i + 1}", d.cluster_path / f"kafka-{i + 1}", i + 1, port,
                  port + _CONTROLLER_OFFSET, voters, d.cluster_kafka_heap,
                  replication=_REPLICATION, min_insync=_MIN_INSYNC)
        for i, port in enumerate(ports)
    ]


def cassandra_nodes(cfg: CqrsConfig) -> list[CassandraNode]:
    """One node per ``dev.cluster_cassandra_addresses``, every node a seed, tokens spread evenly
    (so that the nodes start together without bootstrapping from each other)."""
    d = cfg.dev
    addresses = [a.strip() for a in d.cluster_cassandra_addresses.split(",") if a.strip()]
    if not addresses:
        raise DevStackError("dev.cluster_cassandra_addresses is empty; name at least one address "
                            "such as 127.0.0.2")
    seeds = ",".join(f"{a}:{d.cluster_cassandra_storage_port}" for a in addresses)
    step = 2**64 // len(addresses)
    return [
        CassandraNode(f"cluster-cassandra-{i + 1}", d.cluster_path / f"cassandra-{i + 1}", address,
                      d.cluster_cassandra_port, d.cluster_cassandra_storage_port, seeds,
                      d.cluster_cassandra_heap, cluster_name="cqrs-dev-cluster",
                      initial_token=str(-(2**63) + i * step), ring_delay_ms=10_000)
        for i, address in enumerate(addresses)
    ]


def spark_home() -> Path:
    """The installed pyspark's folder: its ``jars`` run the standalone master and workers."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "jars").is_dir():
        raise DevStackError(f"pyspark at {home} has no jars folder; reinstall pyspark")
    return home


def _scala_version(home: Path) -> str:
    """The Scala binary version of pyspark's jars (``spark-core_2.13-...``): a worker's launcher
    needs it (SPARK_SCALA_VERSION) to build its executors' class path outside a Spark build."""
    core = sorted(home.glob("jars/spark-core_*.jar"))
    if not core:
        raise DevStackError(f"no spark-core jar in {home / 'jars'}; reinstall pyspark")
    return core[0].name.split("_", 1)[1].split("-", 1)[0]


def spark_master_url(cfg: CqrsConfig) -> str:
    return f"spark://127.0.0.1:{cfg.dev.cluster_spark_port}"


def _spark_argv(cfg: CqrsConfig, marker: str, main: str, *args: str) -> list[str]:
    home = spark_home()
    return [*services.service_java(cfg), f"-Xmx{_SPARK_DAEMON_HEAP}", "-XX:ActiveProcessorCount=2",
            marker, "-cp", f"{home / 'conf'}:{home / 'jars'}/*", main, *args]


def _spark_status(cfg: CqrsConfig) -> dict[str, Any]:
    url = f"http://127.0.0.1:{cfg.dev.cluster_spark_port + _UI_OFFSET}/json/"
    with urllib.request.urlopen(url, timeout=2) as reply:  # noqa: S310 (loopback only)
        return json.loads(reply.read())  # type: ignore[no-any-return]


def _worker_alive(cfg: CqrsConfig, ui_port: int) -> bool:
    return any(w.get("state") == "ALIVE" and str(w.get("webuiaddress", "")).endswith(f":{ui_port}")
               for w in _spark_status(cfg).get("workers", []))


def _kafka_service(cfg: CqrsConfig, node: KafkaNode) -> Service:
    def argv() -> list[str]:
        services.format_kafka_storage(cfg, node, _kafka_cluster_id(cfg))
        return services.kafka_argv(cfg, node)

    return Service(node.name, ServiceProcess(node.name, node.workdir, node.marker), argv,
                   lambda: services.kafka_healthy(cfg, node.endpoint, brokers=KAFKA_BROKERS),
                   node.endpoint)


def _kafka_cluster_id(cfg: CqrsConfig) -> str:
    """The KRaft cluster id all brokers are formatted with, made once and kept in the folder."""
    path = cfg.dev.cluster_path / "kafka-cluster-id"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(services.new_cluster_id())
    return path.read_text().strip()


def cluster_services(cfg: CqrsConfig) -> list[Service]:
    """Every process of the cluster, in start order (``down`` stops them in reverse)."""
    out = [_kafka_service(cfg, node) for node in kafka_nodes(cfg)]
    cass = cassandra_nodes(cfg)
    for node in cass:
        out.append(Service(
            node.name, ServiceProcess(node.name, node.workdir, node.marker),
            lambda node=node: services.cassandra_argv(cfg, node),  # type: ignore[misc]
            lambda node=node: services.cassandra_healthy(  # type: ignore[misc]
                cfg, node.address, node.port, peers=len(cass) - 1),
            node.endpoint))
    d = cfg.dev
    root = d.cluster_path
    home = spark_home()
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_SCALA_VERSION": _scala_version(home),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    master_marker = "-Dcqrs.devstack=cluster-spark-master"
    out.append(Service(
        "cluster-spark-master", ServiceProcess("cluster-spark-master", root / "spark-master",
                                               master_marker),
        lambda: _spark_argv(cfg, master_marker, "org.apache.spark.deploy.master.Master",
                            "--host", "127.0.0.1", "--port", str(d.cluster_spark_port),
                            "--webui-port", str(d.cluster_spark_port + _UI_OFFSET)),
        lambda: _spark_status(cfg).get("status") == "ALIVE",
        spark_master_url(cfg), wave=0, env=env))
    for i in range(d.cluster_spark_workers):
        name = f"cluster-spark-worker-{i + 1}"
        ui = d.cluster_spark_port + _UI_OFFSET + 1 + i
        work = root / name
        marker = f"-Dcqrs.devstack={name}"
        out.append(Service(
            name, ServiceProcess(name, work, marker),
            lambda marker=marker, ui=ui, work=work: _spark_argv(  # type: ignore[misc]
                cfg, marker, "org.apache.spark.deploy.worker.Worker", spark_master_url(cfg),
                "--host", "127.0.0.1", "--webui-port", str(ui), "--cores", str(_WORKER_CORES),
                "--memory", d.cluster_spark_worker_memory, "--work-dir", str(work / "work")),
            lambda ui=ui: _worker_alive(cfg, ui),  # type: ignore[misc]
            # a worker started before its master keeps retrying to register: no need to wait
            f"127.0.0.1:{ui} (web UI)", wave=0, env={**env, "SPARK_LOCAL_DIRS": str(work / "tmp")}))
    return out


def crash_service(cfg: CqrsConfig, name: str, timeout_s: float = 30.0) -> int:
    """SIGKILL the process group of the cluster's service ``name`` (a broker, a Cassandra node,
    a Spark worker with its executors, ...), as a crash of its machine would, and wait until it
    is gone; its PID. For fault tests: ``DevStack(cfg, cluster=True).up()`` starts it again on
    the same data (``up`` starts whatever is not running)."""
    known = {s.name: s for s in cluster_services(cfg)}
    if name not in known:
        raise DevStackError(f"unknown cluster service {name!r}; known: {', '.join(known)}")
    pid = known[name].process.pid()
    if pid is None:
        raise DevStackError(f"{name} is not running: nothing to crash")
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists():
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if this process started it
        except ChildProcessError:
            pass
        if time.monotonic() > deadline:
            raise DevStackError(f"{name} (pid {pid}) still exists {timeout_s:.0f} s after SIGKILL")
        time.sleep(0.05)
    return pid


def cluster_config(cfg: CqrsConfig) -> CqrsConfig:
    """``cfg`` pointed at the cluster: only Kafka, Cassandra, Spark and processor settings
    change (the same values :func:`cluster_toml` writes)."""
    return cfg.with_overrides(**_cluster_settings(cfg))


def _cluster_settings(cfg: CqrsConfig) -> dict[str, dict[str, Any]]:
    d = cfg.dev
    cass = cassandra_nodes(cfg)
    workers = d.cluster_spark_workers  # an app gets one one-core executor per worker
    return {
        "kafka": {
            "bootstrap_servers": ",".join(n.endpoint for n in kafka_nodes(cfg)),
            "replication_factor": _REPLICATION,
            "min_insync_replicas": _MIN_INSYNC,
        },
        "cassandra": {
            "hosts": ",".join(n.address for n in cass),
            "port": d.cluster_cassandra_port,
            "replication": f"{{'class': 'SimpleStrategy', 'replication_factor': {len(cass)}}}",
        },
        "spark": {
            "master": spark_master_url(cfg),
            "driver_memory": "1g",
            "conf": {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.cores": "1",
                "spark.cores.max": str(workers),
                "spark.executor.memory": "512m",
            },
        },
        "processor": {"tasks": workers},
    }


def cluster_toml_path(cfg: CqrsConfig) -> Path:
    return cfg.dev.cluster_path / "cqrs.toml"


def cluster_toml(cfg: CqrsConfig) -> str:
    """The configuration file of the cluster (``CQRS_CONFIG=<cluster>/cqrs.toml``)."""
    lines = ["# written by `cqrs dev up --cluster`: the framework on the local cluster", ""]
    for section, values in _cluster_settings(cfg).items():
        nested = {k: v for k, v in values.items() if isinstance(v, dict)}
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml(v)}" for k, v in values.items() if k not in nested]
        for key, table in nested.items():
            lines += ["", f"[{section}.{key}]"]
            lines += [f"{_toml(k)} = {_toml(v)}" for k, v in table.items()]
        lines.append("")
    return "\n".join(lines)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))
