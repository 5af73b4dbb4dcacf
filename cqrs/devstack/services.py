"""How the local Kafka broker (KRaft) and Cassandra node are configured, launched and checked."""

from __future__ import annotations

import base64
import os
import re
import shutil
import socket
import subprocess
import uuid
from functools import cache
from pathlib import Path

from cqrs.config import CqrsConfig
from cqrs.devstack.artifacts import require_installed
from cqrs.errors import DevStackError

__all__ = [
    "cassandra_argv",
    "cassandra_healthy",
    "find_java",
    "format_kafka_storage",
    "kafka_argv",
    "kafka_healthy",
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
_CASSANDRA_JDK17_FLAGS = [
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


def _classpath(cfg: CqrsConfig, component: str) -> str:
    return str(require_installed(cfg.dev, component) / "*")


# ---------------------------------------------------------------- Kafka (KRaft, one node)

def _kafka_dir(cfg: CqrsConfig) -> Path:
    return cfg.dev.data_path / "kafka"


def _kafka_properties(cfg: CqrsConfig) -> Path:
    d = cfg.dev
    data = _kafka_dir(cfg) / "data"
    props = _kafka_dir(cfg) / "server.properties"
    props.parent.mkdir(parents=True, exist_ok=True)
    props.write_text("\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{d.kafka_controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{d.kafka_port},CONTROLLER://127.0.0.1:{d.kafka_controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{d.kafka_port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={data}",
        f"num.partitions={cfg.kafka.default_partitions}",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=4",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "num.network.threads=2",
        "num.io.threads=4",
        "log.segment.bytes=268435456",
        "",
    ]))
    (_kafka_dir(cfg) / "log4j2.yaml").write_text(_LOG4J2)
    return props


def format_kafka_storage(cfg: CqrsConfig) -> bool:
    """Format KRaft storage unless already formatted; True if it formatted."""
    props = _kafka_properties(cfg)
    if (_kafka_dir(cfg) / "data" / "meta.properties").is_file():
        return False
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    proc = subprocess.run(
        [find_java(cfg), f"-Dlog4j2.configurationFile={_kafka_dir(cfg) / 'log4j2.yaml'}",
         "-cp", _classpath(cfg, "kafka"), "kafka.tools.StorageTool", "format",
         "-t", cluster_id, "-c", str(props)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise DevStackError(
            f"formatting Kafka storage in {_kafka_dir(cfg) / 'data'} failed:\n{proc.stdout}{proc.stderr}"
        )
    return True


def kafka_argv(cfg: CqrsConfig) -> list[str]:
    heap = cfg.dev.kafka_heap
    return [
        find_java(cfg), f"-Xmx{heap}", f"-Xms{heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
        "-XX:ActiveProcessorCount=2", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={_kafka_dir(cfg) / 'log4j2.yaml'}",
        "-Dcqrs.devstack=kafka",
        "-cp", _classpath(cfg, "kafka"), "kafka.Kafka", str(_kafka_properties(cfg)),
    ]


def _port_open(host_port: str) -> bool:
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1):
            return True
    except OSError:
        return False


def kafka_healthy(cfg: CqrsConfig) -> bool:
    """True when the broker answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    if not _port_open(cfg.kafka.bootstrap_servers.split(",")[0]):
        return False
    admin = AdminClient({"bootstrap.servers": cfg.kafka.bootstrap_servers,
                         **cfg.kafka.client_options()})
    return bool(admin.list_topics(timeout=2).brokers)


# ---------------------------------------------------------------- Cassandra (one node)

def _cassandra_dir(cfg: CqrsConfig) -> Path:
    return cfg.dev.data_path / "cassandra"


def _cassandra_yaml(cfg: CqrsConfig) -> Path:
    home = _cassandra_dir(cfg)
    d = cfg.dev
    yaml = home / "cassandra.yaml"
    home.mkdir(parents=True, exist_ok=True)
    yaml.write_text(f"""\
cluster_name: cqrs-dev
num_tokens: 4
allocate_tokens_for_local_replication_factor: 1
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
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
      - seeds: "127.0.0.1:{d.cassandra_storage_port}"
listen_address: 127.0.0.1
rpc_address: 127.0.0.1
storage_port: {d.cassandra_storage_port}
native_transport_port: {d.cassandra_port}
start_native_transport: true
endpoint_snitch: SimpleSnitch
authenticator: AllowAllAuthenticator
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
""")
    (home / "logback.xml").write_text(_CASSANDRA_LOGBACK)
    return yaml


def cassandra_argv(cfg: CqrsConfig) -> list[str]:
    home = _cassandra_dir(cfg)
    jars = require_installed(cfg.dev, "cassandra")
    heap = cfg.dev.cassandra_heap
    agent = sorted(jars.glob("jamm-*.jar"))
    return [
        find_java(cfg), f"-Xmx{heap}", f"-Xms{heap}", "-Xss512k",
        "-XX:+UseG1GC", "-XX:+ParallelRefProcEnabled", "-XX:MaxGCPauseMillis=300",
        "-XX:ActiveProcessorCount=2", "-XX:+PerfDisableSharedMem", "-XX:+ExitOnOutOfMemoryError",
        *_CASSANDRA_JDK17_FLAGS,
        *([f"-javaagent:{agent[-1]}"] if agent else []),
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.config=file://{_cassandra_yaml(cfg)}",
        f"-Dcassandra.storagedir={home}",
        f"-Dcassandra.logdir={home}",
        f"-Dlogback.configurationFile={home / 'logback.xml'}",
        "-Dcassandra.skip_wait_for_gossip_to_settle=0",
        "-Dcassandra.ring_delay_ms=0",
        "-Dcassandra.superuser_setup_delay_ms=0",
        "-Dcassandra.initial_token=",
        "-Dcqrs.devstack=cassandra",
        "-cp", str(jars / "*"), "org.apache.cassandra.service.CassandraDaemon",
    ]


def cassandra_healthy(cfg: CqrsConfig) -> bool:
    """True when the node answers ``SELECT release_version FROM system.local``."""
    from cassandra.cluster import Cluster

    if not _port_open(f"{cfg.cassandra.contact_points()[0]}:{cfg.cassandra.port}"):
        return False
    cluster = Cluster(cfg.cassandra.contact_points(), port=cfg.cassandra.port,
                      connect_timeout=2, control_connection_timeout=2)
    try:
        row = cluster.connect().execute("SELECT release_version FROM system.local").one()
        return bool(row and row.release_version)
    finally:
        cluster.shutdown()
