"""How the local Kafka broker (KRaft) and Cassandra node are configured, launched and checked."""

from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import uuid
from functools import cache
from pathlib import Path

import attrs

from cqrs.config import CqrsConfig
from cqrs.devstack.artifacts import require_installed
from cqrs.errors import DevStackError

__all__ = [
    "CASSANDRA_JDK17_FLAGS",
    "CassandraNode",
    "KafkaNode",
    "cassandra_argv",
    "cassandra_healthy",
    "cassandra_node",
    "find_java",
    "format_kafka_storage",
    "kafka_argv",
    "kafka_healthy",
    "kafka_node",
    "new_cluster_id",
    "service_java",
    "with_timer_slack",
]

_LOG4J2 = """\
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
      - name: kafka.server.BrokerServer
        level: INFO
"""

_CASSANDRA_LOGBACK = """\
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="STDOUT" /></root>
  <logger name="org.apache.cassandra.service.CassandraDaemon" level="INFO"/>
  <logger name="org.apache.cassandra.transport.Server" level="INFO"/>
</configuration>
"""

# Module access Cassandra 5.0 needs on JDK 17 (as in its jvm17-server.options).
CASSANDRA_JDK17_FLAGS = [
    "-Djdk.attach.allowAttachSelf=true",
    *(f"--add-exports={m}=ALL-UNNAMED" for m in (
        "java.base/jdk.internal.misc", "java.base/jdk.internal.ref", "java.base/sun.nio.ch",
        "java.management.rmi/com.sun.jmx.remote.internal.rmi", "java.rmi/sun.rmi.registry",
        "java.rmi/sun.rmi.server", "java.sql/java.sql", "java.base/java.lang.ref",
        "jdk.unsupported/sun.misc", "jdk.attach/sun.tools.attach",
    )),
    *(f"--add-opens={m}=ALL-UNNAMED" for m in (
        "java.base/java.lang.module", "java.base/jdk.internal.loader", "java.base/jdk.internal.ref",
        "java.base/jdk.internal.reflect", "java.base/jdk.internal.math",
        "java.base/jdk.internal.module", "java.base/jdk.internal.util.jar",
        "jdk.management/com.sun.management.internal", "java.base/sun.nio.ch", "java.base/java.io",
        "java.base/java.nio", "java.base/java.lang.reflect", "java.base/java.lang",
        "java.base/java.util", "java.base/java.util.concurrent",
        "java.base/java.util.concurrent.atomic", "java.base/java.math", "java.base/java.net",
    )),
    "-Dio.netty.tryReflectionSetAccessible=true",
]


@cache
def _java_major(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        raise DevStackError(f"cannot read the version of {java!r}: {out.strip()!r}")
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def find_java(cfg: CqrsConfig) -> str:
    """A JDK 17 ``java`` binary: the configured one, else JAVA_HOME, else PATH, else the system's."""
    candidates = []
    if cfg.dev.java_home:
        candidates.append(Path(cfg.dev.java_home) / "bin" / "java")
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    if shutil.which("java"):
        candidates.append(Path(shutil.which("java")))  # type: ignore[arg-type]
    candidates += sorted(Path("/usr/lib/jvm").glob("*17*/bin/java"))
    seen = []
    for java in candidates:
        if java.is_file() and os.access(java, os.X_OK):
            major = _java_major(str(java))
            seen.append(f"{java} ({major})")
            if major == 17:
                return str(java)
    raise DevStackError(
        "the dev stack needs JDK 17 (Cassandra 5.0 runs on 11 or 17, Kafka 4 on 17+); found: "
        f"{', '.join(seen) or 'no java'}. Install openjdk-17 or set CQRS_JAVA_HOME"
    )


def service_java(cfg: CqrsConfig) -> list[str]:
    """The start of a service JVM's command line: :func:`find_java`'s binary and the
    ``[dev] java_options``."""
    return [find_java(cfg), *shlex.split(cfg.dev.java_options)]


def _classpath(cfg: CqrsConfig, component: str) -> str:
    return str(require_installed(cfg.dev, component) / "*")


# ---------------------------------------------------------------- Kafka (KRaft)

@attrs.frozen
class KafkaNode:
    """One combined broker + controller: its folder, ports and the quorum it belongs to."""

    name: str  # also the PID/log file name and the marker on its command line
    workdir: Path
    node_id: int
    port: int
    controller_port: int
    voters: str  # controller.quorum.voters, e.g. "1@127.0.0.1:19093"
    heap: str
    replication: int = 1  # of the internal topics and the default of new topics
    min_insync: int = 1
    # the clients' listener, when not plain: (protocol, lines added to server.properties),
    # e.g. ("SASL_SSL", ("sasl.enabled.mechanisms=SCRAM-SHA-512", ...)); the broker then talks
    # to itself on a PLAINTEXT listener at port + 2
    client_protocol: str = "PLAINTEXT"
    client_settings: tuple[str, ...] = ()
    scram_users: tuple[str, ...] = ()  # "SCRAM-SHA-512=[name=...,password=...]", at format time

    @property
    def marker(self) -> str:
        return f"-Dcqrs.devstack={self.name}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


def kafka_node(cfg: CqrsConfig) -> KafkaNode:
    """The single broker of ``cqrs dev up``."""
    d = cfg.dev
    return KafkaNode("kafka", d.data_path / "kafka", 1, d.kafka_port, d.kafka_controller_port,
                     f"1@127.0.0.1:{d.kafka_controller_port}", d.kafka_heap)


def _kafka_properties(cfg: CqrsConfig, node: KafkaNode) -> Path:
    props = node.workdir / "server.properties"
    props.parent.mkdir(parents=True, exist_ok=True)
    rf, isr = node.replication, node.min_insync
    if node.client_protocol == "PLAINTEXT":
        listeners = [
            f"listeners=PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{node.port}",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
        ]
    else:
        proto, internal = node.client_protocol, node.port + 2
        listeners = [
            f"listeners={proto}://127.0.0.1:{node.port},INTERNAL://127.0.0.1:{internal},"
            f"CONTROLLER://127.0.0.1:{node.controller_port}",
            f"advertised.listeners={proto}://127.0.0.1:{node.port},INTERNAL://127.0.0.1:{internal}",
            f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,{proto}:{proto}",
            "inter.broker.listener.name=INTERNAL",
            *node.client_settings,
        ]
    props.write_text("\n".join([
        "process.roles=broker,controller",
        f"node.id={node.node_id}",
        f"controller.quorum.voters={node.voters}",
        *listeners,
        "controller.listener.names=CONTROLLER",
        f"log.dirs={node.workdir / 'data'}",
        f"num.partitions={cfg.kafka.default_partitions}",
        f"default.replication.factor={rf}",
        f"min.insync.replicas={isr}",
        f"offsets.topic.replication.factor={rf}",
        "offsets.topic.num.partitions=4",
        f"transaction.state.log.replication.factor={rf}",
        f"transaction.state.log.min.isr={isr}",
        "transaction.state.log.num.partitions=4",
        f"share.coordinator.state.topic.replication.factor={rf}",
        f"share.coordinator.state.topic.min.isr={isr}",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "num.network.threads=2",
        "num.io.threads=4",
        "log.segment.bytes=268435456",
        # A broker of a cluster stops without a controlled shutdown, which first asks the active
        # controller to move its leaderships away and waits up to 5 minutes for the answer:
        # `down` stops every broker at once, and a broker whose request came after the other
        # two had taken the controller quorum with them waited for an answer that never came,
        # until `down`'s SIGKILL a minute later (the CI's cluster teardown took 75 s instead
        # of ~14 s so). Measured: the last of the three brokers, signalled once the other two
        # had stopped, still ran 45 s later; without a controlled shutdown it ended in 5 s.
        # Nobody is left to take the leaderships anyway; the logs are still closed cleanly.
        *(["controlled.shutdown.enable=false"] if _quorum_size(node) > 1 else []),
        "",
    ]))
    (node.workdir / "log4j2.yaml").write_text(_LOG4J2)
    return props


def _quorum_size(node: KafkaNode) -> int:
    return len(node.voters.split(","))


def new_cluster_id() -> str:
    """A KRaft cluster id (what ``kafka-storage random-uuid`` prints). Like Kafka's own
    ``Uuid.randomUuid``, it never starts with ``-``: the storage tool would read such an id
    as an option (one id in 64 did, and formatting failed with "expected one argument")."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def format_kafka_storage(cfg: CqrsConfig, node: KafkaNode | None = None,
                         cluster_id: str | None = None) -> bool:
    """Format KRaft storage unless already formatted; True if it formatted. The nodes of one
    cluster are formatted with the same ``cluster_id``."""
    node = node or kafka_node(cfg)
    props = _kafka_properties(cfg, node)
    if (node.workdir / "data" / "meta.properties").is_file():
        return False
    proc = subprocess.run(
        [*service_java(cfg), f"-Dlog4j2.configurationFile={node.workdir / 'log4j2.yaml'}",
         "-cp", _classpath(cfg, "kafka"), "kafka.tools.StorageTool", "format",
         "-t", cluster_id or new_cluster_id(), "-c", str(props),
         *(arg for user in node.scram_users for arg in ("--add-scram", user))],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise DevStackError(
            f"formatting Kafka storage in {node.workdir / 'data'} failed:\n{proc.stdout}{proc.stderr}"
        )
    return True


def kafka_argv(cfg: CqrsConfig, node: KafkaNode | None = None) -> list[str]:
    node = node or kafka_node(cfg)
    return [
        *service_java(cfg), f"-Xmx{node.heap}", f"-Xms{node.heap}", "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20", "-XX:ActiveProcessorCount=2", "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={node.workdir / 'log4j2.yaml'}",
        node.marker,
        "-cp", _classpath(cfg, "kafka"), "kafka.Kafka", str(_kafka_properties(cfg, node)),
    ]


def _port_open(host_port: str) -> bool:
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1):
            return True
    except OSError:
        return False


def kafka_healthy(cfg: CqrsConfig, endpoint: str | None = None, brokers: int = 1) -> bool:
    """True when the broker at ``endpoint`` (default: the configured bootstrap servers) answers
    a metadata request that lists at least ``brokers`` brokers."""
    from confluent_kafka.admin import AdminClient

    endpoint = endpoint or cfg.kafka.bootstrap_servers
    if not _port_open(endpoint.split(",")[0]):
        return False
    admin = AdminClient({"bootstrap.servers": endpoint, **cfg.kafka.client_options()})
    return len(admin.list_topics(timeout=2).brokers) >= brokers


# ---------------------------------------------------------------- Cassandra

@attrs.frozen
class CassandraNode:
    """One Cassandra node: its folder, address, ports and the seeds it gossips with."""

    name: str
    workdir: Path
    address: str
    port: int
    storage_port: int
    seeds: str  # "address:port[,address:port]"
    heap: str
    cluster_name: str = "cqrs-dev"
    initial_token: str = ""  # "" lets the node pick its tokens (num_tokens 4)
    authenticator: str = "AllowAllAuthenticator"  # PasswordAuthenticator: role cassandra/cassandra
    # 0 suits a lone node; with peers it must not be: gossip drops a peer that is not yet
    # NORMAL after ring_delay / 2 ("Seeds list is now empty!" and the nodes never meet)
    ring_delay_ms: int = 0
    jmx_port: int = 0  # local-only JMX for nodetool (cqrs.devstack.nodetool); 0: none

    @property
    def marker(self) -> str:
        return f"-Dcqrs.devstack={self.name}"

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"


def cassandra_node(cfg: CqrsConfig) -> CassandraNode:
    """The single node of ``cqrs dev up``."""
    d = cfg.dev
    return CassandraNode("cassandra", d.data_path / "cassandra", "127.0.0.1", d.cassandra_port,
                         d.cassandra_storage_port, f"127.0.0.1:{d.cassandra_storage_port}",
                         d.cassandra_heap, jmx_port=d.cassandra_jmx_port)


def _cassandra_yaml(cfg: CqrsConfig, node: CassandraNode) -> Path:
    home = node.workdir
    yaml = home / "cassandra.yaml"
    home.mkdir(parents=True, exist_ok=True)
    # the token itself goes on the command line (-Dcassandra.initial_token wins over the yaml)
    tokens = ("num_tokens: 1\n" if node.initial_token else
              "num_tokens: 4\nallocate_tokens_for_local_replication_factor: 1\n")
    # auto_snapshot off: a dev stack's tables come and go (every test and bench run makes and
    # drops its own), and each DROP or TRUNCATE would first flush the table and keep a snapshot
    # of it on disk (a short test run left 100 snapshot folders)
    yaml.write_text(f"""\
cluster_name: {node.cluster_name}
{tokens}partitioner: org.apache.cassandra.dht.Murmur3Partitioner
auto_bootstrap: false
data_file_directories: [{home / 'data'}]
commitlog_directory: {home / 'commitlog'}
saved_caches_directory: {home / 'saved_caches'}
hints_directory: {home / 'hints'}
cdc_raw_directory: {home / 'cdc_raw'}
commitlog_sync: periodic
commitlog_sync_period: 10000ms
commitlog_segment_size: 32MiB
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{node.seeds}"
listen_address: {node.address}
rpc_address: {node.address}
storage_port: {node.storage_port}
native_transport_port: {node.port}
start_native_transport: true
endpoint_snitch: SimpleSnitch
authenticator: {node.authenticator}
authorizer: AllowAllAuthorizer
concurrent_reads: 8
concurrent_writes: 16
concurrent_compactors: 1
memtable_heap_space: 256MiB
memtable_offheap_space: 256MiB
key_cache_size: 32MiB
disk_access_mode: mmap_index_only
batch_size_warn_threshold: 64KiB
batch_size_fail_threshold: 640KiB
write_request_timeout: 5000ms
read_request_timeout: 10000ms
auto_snapshot: false
""")
    (home / "logback.xml").write_text(_CASSANDRA_LOGBACK)
    return yaml


# Sets the calling thread's timer slack (Linux prctl PR_SET_TIMERSLACK), then becomes the
# command after it: the slack is kept across exec and every thread the JVM starts inherits it.
_WITH_TIMER_SLACK = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(29, int(sys.argv[1]), 0, 0, 0); "
                     "os.execv(sys.argv[2], sys.argv[2:])")


def with_timer_slack(argv: list[str], slack_us: int) -> list[str]:
    """``argv`` started with a timer slack of ``slack_us`` microseconds on all its threads
    (Linux; ``argv`` unchanged elsewhere or for 0). A thread's timed waits may then end up to
    that much late, so the kernel wakes it less often.

    Cassandra's request threads (its shared executor pool) wait for work by parking 10 us at a
    time, for up to ~10 ms after each request: at light load they woke ~100,000 times a second
    (see docs/operations.md and docs/benchmarks.md for what a 1-ms slack saved)."""
    if slack_us <= 0 or not os.path.exists("/proc/self/timerslack_ns"):
        return argv
    return [sys.executable, "-c", _WITH_TIMER_SLACK, str(slack_us * 1000), *argv]


def cassandra_argv(cfg: CqrsConfig, node: CassandraNode | None = None) -> list[str]:
    node = node or cassandra_node(cfg)
    home = node.workdir
    jars = require_installed(cfg.dev, "cassandra")
    agent = sorted(jars.glob("jamm-*.jar"))
    return with_timer_slack([
        *service_java(cfg), f"-Xmx{node.heap}", f"-Xms{node.heap}", "-Xss512k",
        # a 20-ms pause target (Kafka's here), not Cassandra's default 300: under a stream of
        # 1,000-row history reads its young pauses went 15-18 -> 2.5-7 ms, and the reads they
        # held up past 20 ms 25 -> 10 in 4,000
        "-XX:+UseG1GC", "-XX:+ParallelRefProcEnabled", "-XX:MaxGCPauseMillis=20",
        "-XX:ActiveProcessorCount=2", "-XX:+PerfDisableSharedMem", "-XX:+ExitOnOutOfMemoryError",
        *CASSANDRA_JDK17_FLAGS,
        *([f"-javaagent:{agent[-1]}"] if agent else []),
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.config=file://{_cassandra_yaml(cfg, node)}",
        f"-Dcassandra.storagedir={home}",
        f"-Dcassandra.logdir={home}",
        f"-Dlogback.configurationFile={home / 'logback.xml'}",
        "-Dcassandra.skip_wait_for_gossip_to_settle=0",
        f"-Dcassandra.ring_delay_ms={node.ring_delay_ms}",
        "-Dcassandra.superuser_setup_delay_ms=0",
        f"-Dcassandra.initial_token={node.initial_token}",
        *([f"-Dcassandra.jmx.local.port={node.jmx_port}"] if node.jmx_port else []),
        node.marker,
        "-cp", str(jars / "*"), "org.apache.cassandra.service.CassandraDaemon",
    ], cfg.dev.cassandra_timer_slack_us)


def cassandra_healthy(cfg: CqrsConfig, address: str | None = None, port: int | None = None,
                      peers: int = 0, auth: tuple[str, str] | None = None) -> bool:
    """True when the node answers ``SELECT release_version FROM system.local`` and knows at
    least ``peers`` other nodes that are up (default: the configured contact point)."""
    from cassandra.policies import WhiteListRoundRobinPolicy

    from cqrs.cassandra_io import cql_cluster

    address = address or cfg.cassandra.contact_points()[0]
    port = port or cfg.cassandra.port
    if not _port_open(f"{address}:{port}"):
        return False
    extra: dict[str, object] = {}
    if auth is not None:
        from cassandra.auth import PlainTextAuthProvider

        extra["auth_provider"] = PlainTextAuthProvider(*auth)
    cluster = cql_cluster([address], port, connect_timeout=2, control_connection_timeout=2,
                          load_balancing_policy=WhiteListRoundRobinPolicy([address]), **extra)
    try:
        session = cluster.connect()
        row = session.execute("SELECT release_version FROM system.local").one()
        if not (row and row.release_version):
            return False
        return peers == 0 or len(list(session.execute("SELECT peer FROM system.peers"))) >= peers
    finally:
        cluster.shutdown()
