"""The one configuration object, read from a TOML file and the environment, passed down.

Every setting is declared once below, with its type, default, environment variable and doc;
``docs/configuration.md`` is generated from these declarations (``cqrs config docs``).

Precedence, lowest to highest: defaults, the file (``cqrs.toml`` in the working directory, or
the path in ``CQRS_CONFIG``), environment variables, explicit overrides.

Nothing deep inside the framework reads ``os.environ``: components receive a :class:`CqrsConfig`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_type_hints

import attrs

from cqrs.errors import ConfigError

__all__ = [
    "CassandraSettings",
    "ClientSettings",
    "CqrsConfig",
    "DEFAULT_MAX_RECORD_BYTES",
    "DevSettings",
    "KafkaSettings",
    "LIBRDKAFKA_MESSAGE_MAX_BYTES",
    "MetricsSettings",
    "PersonalDataSettings",
    "ProcessorSettings",
    "ProjectionSettings",
    "RECORD_MARGIN_BYTES",
    "RetrierSettings",
    "SchedulerSettings",
    "SparkSettings",
    "cache_key",
    "load_config",
    "settings_reference",
]

_ENV = "env"
_DOC = "doc"

LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``: a producer refuses a bigger record (see
:func:`cqrs.envelope.record_size` for how it counts). Kafka's own defaults are above it (a
topic's ``max.message.bytes`` 1,048,588, the Java producer's ``max.request.size`` 1,048,576)."""

RECORD_MARGIN_BYTES = 1_024
"""What :meth:`KafkaSettings.max_record_bytes` keeps below the producers' ``message.max.bytes``:
room for the 61 bytes of a record batch that a broker counts against a topic's
``max.message.bytes`` (when both are set to the same figure), for the headers the retry job adds
to a command it delivers again, and for a difference in how a client counts headers."""

DEFAULT_MAX_RECORD_BYTES = LIBRDKAFKA_MESSAGE_MAX_BYTES - RECORD_MARGIN_BYTES
""":meth:`KafkaSettings.max_record_bytes` of the default configuration (998,976 bytes): the
default of the code that takes a limit without a configuration (a step in a unit test)."""


def setting(default: Any, env: str | None, doc: str, *, secret: bool = False) -> Any:
    """Declare one setting: its default, the environment variable that overrides it, its doc;
    a ``secret`` one (a password) shows as ``'***'`` in every repr, so never in a log."""
    if isinstance(default, dict):
        return attrs.field(factory=lambda: dict(default), metadata={_ENV: env, _DOC: doc})
    return attrs.field(default=default, metadata={_ENV: env, _DOC: doc},
                       repr=_masked if secret else True)


def _masked(value: Any) -> str:
    return "'***'" if value else "''"


def cache_key(*parts: Any) -> str:
    """A key for a per-process cache of things built from configuration (a store, a worker):
    equal for equal settings, secrets included (a repr masks them, so two configurations that
    differ only in a password would share an entry), and shows no secret itself."""
    import hashlib
    import pickle

    return hashlib.sha256(pickle.dumps(parts)).hexdigest()


@attrs.frozen
class KafkaSettings:
    bootstrap_servers: str = setting(
        "127.0.0.1:19092", "CQRS_KAFKA_BOOTSTRAP", "Kafka bootstrap servers, host:port[,host:port]."
    )
    security_protocol: str = setting(
        "PLAINTEXT", "CQRS_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    )
    sasl_mechanism: str = setting("", "CQRS_KAFKA_SASL_MECHANISM", "e.g. PLAIN, SCRAM-SHA-512.")
    sasl_username: str = setting("", "CQRS_KAFKA_SASL_USERNAME", "SASL user name.")
    sasl_password: str = setting("", "CQRS_KAFKA_SASL_PASSWORD", "SASL password.", secret=True)
    ssl_ca_location: str = setting("", "CQRS_KAFKA_SSL_CA", "CA certificate file (PEM) for TLS.")
    topic_prefix: str = setting(
        "", "CQRS_KAFKA_TOPIC_PREFIX",
        "Prefix of every topic name, for environments or test runs sharing a cluster.",
    )
    default_partitions: int = setting(
        4, "CQRS_KAFKA_PARTITIONS", "Partitions of topics the framework creates."
    )
    replication_factor: int = setting(
        1, "CQRS_KAFKA_REPLICATION", "Replication factor of topics the framework creates."
    )
    min_insync_replicas: int = setting(
        0, "CQRS_KAFKA_MIN_INSYNC_REPLICAS",
        "min.insync.replicas of topics the framework creates (0: the broker's default); with "
        "acks=all a write fails rather than land on fewer replicas.",
    )
    extra: dict[str, str] = setting(
        {}, None, "Any other librdkafka / Java client property, passed through as is. "
        "`message.max.bytes` (librdkafka's default 1,000,000) also sets the largest record the "
        "framework writes: that less 1,024 bytes (a bigger command is refused by the client, "
        "a decision with a bigger event or result is failed); raise it with the topics' "
        "`max.message.bytes`.",
    )

    def client_options(self) -> dict[str, str]:
        """Security and extra options for confluent-kafka (librdkafka names), without bootstrap."""
        opts: dict[str, str] = {"security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            opts["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            opts["sasl.username"] = self.sasl_username
            opts["sasl.password"] = self.sasl_password
        if self.ssl_ca_location:
            opts["ssl.ca.location"] = self.ssl_ca_location
        opts.update(self.extra)
        return opts

    def max_record_bytes(self) -> int:
        """The largest Kafka record the framework writes, counted as librdkafka counts it
        (:func:`cqrs.envelope.record_size`): the producers' ``message.max.bytes`` (from
        ``kafka.extra``, else librdkafka's default 1,000,000) less :data:`RECORD_MARGIN_BYTES`.
        The client refuses a command over it; the processor fails a decision whose events or
        result would be over it, and cuts a dead letter to fit. Raise it with
        ``message.max.bytes`` in ``kafka.extra`` only together with the topics'
        ``max.message.bytes`` (and the brokers' ``message.max.bytes``)."""
        raw = self.extra.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES)
        try:
            producer_limit = int(raw)
        except ValueError:
            raise ConfigError(
                f"kafka.extra message.max.bytes = {raw!r} is not an integer: give the producers' "
                f"record limit in bytes (librdkafka's default is {LIBRDKAFKA_MESSAGE_MAX_BYTES:,})"
            ) from None
        if producer_limit < 16 * RECORD_MARGIN_BYTES:
            raise ConfigError(
                f"kafka.extra message.max.bytes = {producer_limit:,} is too small for the "
                f"framework's records (results, dead letters): use at least "
                f"{16 * RECORD_MARGIN_BYTES:,} (librdkafka's default is "
                f"{LIBRDKAFKA_MESSAGE_MAX_BYTES:,})")
        return producer_limit - RECORD_MARGIN_BYTES

    def spark_options(self) -> dict[str, str]:
        """The same settings as options of Spark's Kafka source and sink (``kafka.`` prefix)."""
        opts = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "kafka.security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            opts["kafka.sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if self.sasl_mechanism in ("", "PLAIN")
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            opts["kafka.sasl.jaas.config"] = (
                f'{module} required username="{self.sasl_username}" '
                f'password="{self.sasl_password}";'
            )
        if self.ssl_ca_location:
            opts["kafka.ssl.truststore.type"] = "PEM"
            opts["kafka.ssl.truststore.location"] = self.ssl_ca_location
        opts.update({f"kafka.{k}": v for k, v in self.extra.items()})
        return opts


@attrs.frozen
class CassandraSettings:
    hosts: str = setting("127.0.0.1", "CQRS_CASSANDRA_HOSTS", "Contact points, comma separated.")
    port: int = setting(19042, "CQRS_CASSANDRA_PORT", "CQL native transport port.")
    keyspace: str = setting("cqrs", "CQRS_CASSANDRA_KEYSPACE", "Keyspace of the read models and the aggregate-state tables.")
    replication: str = setting(
        "{'class': 'SimpleStrategy', 'replication_factor': 1}",
        "CQRS_CASSANDRA_REPLICATION",
        "Replication map used when the framework creates the keyspace.",
    )
    username: str = setting("", "CQRS_CASSANDRA_USERNAME", "Authentication user name.")
    password: str = setting("", "CQRS_CASSANDRA_PASSWORD", "Authentication password.",
                            secret=True)
    ssl_ca_location: str = setting("", "CQRS_CASSANDRA_SSL_CA", "CA certificate (PEM) for TLS.")
    local_dc: str = setting("datacenter1", "CQRS_CASSANDRA_LOCAL_DC", "Local data center name.")

    def contact_points(self) -> list[str]:
        return [h.strip() for h in self.hosts.split(",") if h.strip()]


@attrs.frozen
class SparkSettings:
    master: str = setting("local[2]", "CQRS_SPARK_MASTER", "Spark master URL.")
    shuffle_partitions: int = setting(
        4, "CQRS_SPARK_SHUFFLE_PARTITIONS", "spark.sql.shuffle.partitions (shuffles of re-keyed projections and rebuilds)."
    )
    checkpoint_dir: str = setting(
        "~/.cache/cqrs/checkpoints",
        "CQRS_SPARK_CHECKPOINT_DIR",
        "Root of streaming checkpoints (a shared file system or HDFS/S3 URL on a cluster).",
    )
    driver_memory: str = setting("2g", "CQRS_SPARK_DRIVER_MEMORY", "spark.driver.memory.")
    use_local_jars: bool = setting(
        True,
        "CQRS_SPARK_USE_LOCAL_JARS",
        "Hand Spark the Kafka connector jars from the dev cache (false on a cluster that has them).",
    )
    class_data_sharing: bool = setting(
        True,
        "CQRS_SPARK_CLASS_DATA_SHARING",
        "Start the driver's JVM from the class archive `cqrs dev install` writes (a session "
        "ready about 2 s sooner), and a cluster's executors on this machine; false: never.",
    )
    java_options: str = setting(
        "", "CQRS_SPARK_JAVA_OPTIONS",
        "Extra JVM options of the driver and a cluster's executors (before the class "
        "archive's), e.g. `-XX:TieredStopAtLevel=1 -XX:+UseSerialGC` for a test suite's "
        "short-lived sessions (.ci/run sets them, see docs/operations.md); none for a "
        "long-running job, whose JIT pays off.",
    )
    conf: dict[str, str] = setting({}, None, "Any other Spark option, passed through as is (over the framework's own: see cqrs.spark_session.spark_conf, e.g. spark.sql.streaming.pollingDelay 50ms).")

    def checkpoint_location(self, *parts: str) -> str:
        """Checkpoint folder of one query: ``<checkpoint_dir>/<parts...>`` (``~`` expanded)."""
        root = self.checkpoint_dir
        if root.startswith("~"):
            root = str(Path(root).expanduser())
        return "/".join([root.rstrip("/"), *parts])


@attrs.frozen
class DevSettings:
    home: str = setting(
        "~/.cache/cqrs", "CQRS_HOME", "Cache of the Maven artifacts and the dev stack's data."
    )
    kafka_port: int = setting(19092, "CQRS_DEV_KAFKA_PORT", "Port of the local Kafka broker.")
    kafka_controller_port: int = setting(
        19093, "CQRS_DEV_KAFKA_CONTROLLER_PORT", "Port of the local KRaft controller listener."
    )
    kafka_heap: str = setting("768m", "CQRS_DEV_KAFKA_HEAP", "Heap of the local Kafka broker.")
    cassandra_port: int = setting(
        19042, "CQRS_DEV_CASSANDRA_PORT", "CQL port of the local Cassandra node."
    )
    cassandra_storage_port: int = setting(
        17000, "CQRS_DEV_CASSANDRA_STORAGE_PORT", "Internode port of the local Cassandra node."
    )
    cassandra_heap: str = setting(
        "1536m", "CQRS_DEV_CASSANDRA_HEAP", "Heap of the local Cassandra node."
    )
    cassandra_timer_slack_us: int = setting(
        1000, "CQRS_DEV_CASSANDRA_TIMER_SLACK_US",
        "Timer slack of the local Cassandra nodes' threads, in microseconds (Linux): how late "
        "a thread's timed wait may wake. Cassandra's request threads wait for work in 10-us "
        "naps, which at the default (50 us) cost a 2-core machine about half a core at a "
        "hundred small writes a second; 1,000 us cut that 3-4x. 0: the kernel's default.",
    )
    cassandra_jmx_port: int = setting(
        17199, "CQRS_DEV_CASSANDRA_JMX_PORT",
        "JMX port of the local Cassandra node, on 127.0.0.1 only (what `nodetool` talks to: "
        "the benches flush its memtables before a timed run; 0: no JMX).",
    )
    java_home: str = setting(
        "", "CQRS_JAVA_HOME", "JDK 17 used for the services (default: JAVA_HOME, then PATH)."
    )
    java_options: str = setting(
        "", "CQRS_DEV_JAVA_OPTIONS",
        "Extra JVM options of every service JVM `cqrs dev` starts (Kafka, Cassandra, the "
        "cluster's Spark daemons), before the services' own, e.g. `-XX:TieredStopAtLevel=1` "
        "for a test run's stack (.ci/run sets it, see docs/operations.md). Not a garbage "
        "collector: the services choose theirs.",
    )
    start_timeout_s: float = setting(
        180.0, "CQRS_DEV_START_TIMEOUT", "Seconds to wait for a service to become healthy."
    )
    cluster_kafka_port: int = setting(
        29092, "CQRS_DEV_CLUSTER_KAFKA_PORT",
        "`dev up --cluster`: port of the first of three Kafka brokers (the others follow; their "
        "controllers listen 100 above).",
    )
    cluster_kafka_heap: str = setting(
        "512m", "CQRS_DEV_CLUSTER_KAFKA_HEAP", "`dev up --cluster`: heap of each Kafka broker."
    )
    cluster_cassandra_addresses: str = setting(
        "127.0.0.2,127.0.0.3", "CQRS_DEV_CLUSTER_CASSANDRA_ADDRESSES",
        "`dev up --cluster`: loopback address of each Cassandra node (one node per address).",
    )
    cluster_cassandra_port: int = setting(
        29042, "CQRS_DEV_CLUSTER_CASSANDRA_PORT", "`dev up --cluster`: CQL port of the nodes."
    )
    cluster_cassandra_storage_port: int = setting(
        27000, "CQRS_DEV_CLUSTER_CASSANDRA_STORAGE_PORT",
        "`dev up --cluster`: internode port of the nodes.",
    )
    cluster_cassandra_heap: str = setting(
        "1g", "CQRS_DEV_CLUSTER_CASSANDRA_HEAP", "`dev up --cluster`: heap of each Cassandra node."
    )
    cluster_spark_port: int = setting(
        27077, "CQRS_DEV_CLUSTER_SPARK_PORT",
        "`dev up --cluster`: port of the Spark standalone master (its web UI and JSON status "
        "listen 1000 above, the workers' UIs after it).",
    )
    cluster_spark_workers: int = setting(
        2, "CQRS_DEV_CLUSTER_SPARK_WORKERS",
        "`dev up --cluster`: Spark workers (two cores each; an app gets one core of each)."
    )
    secure_kafka_port: int = setting(
        23092, "CQRS_DEV_SECURE_KAFKA_PORT",
        "`dev up --secure`: SASL_SSL port of the broker (its controller listens on +1, its "
        "own PLAINTEXT listener for itself on +2). Keep the dev ports below the kernel's "
        "ephemeral range (32768 and up here): a client's outgoing connection can hold such a "
        "port and the broker then fails to bind it.",
    )
    secure_cassandra_port: int = setting(
        23042, "CQRS_DEV_SECURE_CASSANDRA_PORT",
        "`dev up --secure`: CQL port of the password-protected Cassandra node.",
    )
    secure_cassandra_storage_port: int = setting(
        23000, "CQRS_DEV_SECURE_CASSANDRA_STORAGE_PORT",
        "`dev up --secure`: internode port of that node.",
    )
    cluster_spark_worker_memory: str = setting(
        "2g", "CQRS_DEV_CLUSTER_SPARK_WORKER_MEMORY",
        "`dev up --cluster`: memory each Spark worker offers its executors.",
    )

    @property
    def home_path(self) -> Path:
        return Path(self.home).expanduser()

    @property
    def artifacts_path(self) -> Path:
        return self.home_path / "artifacts"

    @property
    def data_path(self) -> Path:
        return self.home_path / "dev"

    @property
    def secure_path(self) -> Path:
        """Data, certificates and generated credentials of ``cqrs dev up --secure``."""
        return self.home_path / "secure"

    @property
    def cluster_path(self) -> Path:
        """Data, logs and PID files of ``cqrs dev up --cluster`` (apart from the single stack's)."""
        return self.home_path / "cluster"


@attrs.frozen
class ClientSettings:
    client_id: str = setting(
        "", "CQRS_CLIENT_ID",
        "Name of this command client (default: a random one); picks its reply partition.",
    )
    reply_partition: int = setting(
        -1, "CQRS_CLIENT_REPLY_PARTITION",
        "Partition of the command-results topic the processor answers this client on "
        "(-1: derived from the client id).",
    )
    reply_routing: bool = setting(
        True, "CQRS_CLIENT_REPLY_ROUTING",
        "Ask for results on the reply partition; false: read every results partition "
        "(for processors without reply routing).",
    )
    timeout_s: float = setting(
        30.0, "CQRS_CLIENT_TIMEOUT", "Default seconds to wait for a command's result."
    )
    http_host: str = setting("127.0.0.1", "CQRS_HTTP_HOST", "Address `cqrs serve` listens on.")
    http_port: int = setting(8080, "CQRS_HTTP_PORT", "Port `cqrs serve` listens on.")


@attrs.frozen
class ProjectionSettings:
    store: str = setting(
        "cassandra", "CQRS_PROJECTIONS_STORE",
        "Read-model store: 'cassandra' (the [cassandra] section) or 'sqlite' (single machine).",
    )
    sqlite_path: str = setting(
        "~/.cache/cqrs/projections.sqlite", "CQRS_PROJECTIONS_SQLITE_PATH",
        "Database file of the SQLite store.",
    )
    read_consistency: str = setting(
        "LOCAL_QUORUM", "CQRS_PROJECTIONS_READ_CONSISTENCY", "Cassandra consistency of reads.",
    )
    write_consistency: str = setting(
        "LOCAL_QUORUM", "CQRS_PROJECTIONS_WRITE_CONSISTENCY", "Cassandra consistency of writes.",
    )
    concurrency: int = setting(
        128, "CQRS_PROJECTIONS_CONCURRENCY", "Cassandra requests in flight per Spark task.",
    )
    rows_per_request: int = setting(
        32, "CQRS_PROJECTIONS_ROWS_PER_REQUEST",
        "View rows per Cassandra request: reads use IN on keys, writes unlogged batches, both "
        "grouped by replica; 1: one request per row.",
    )
    max_events_per_trigger: int = setting(
        200000, "CQRS_PROJECTIONS_MAX_EVENTS_PER_TRIGGER", "Cap on events per projector micro-batch.",
    )
    rebuild_chunk_events: int = setting(
        2000000, "CQRS_PROJECTIONS_REBUILD_CHUNK",
        "Events per batch job of a rebuild (its progress lines come every 2 s, within a job too).",
    )
    drop_old_generation: bool = setting(
        True, "CQRS_PROJECTIONS_DROP_OLD", "Drop the previous generation's tables after a rebuild.",
    )
    drop_grace_s: float = setting(
        5.0, "CQRS_PROJECTIONS_DROP_GRACE", "Seconds between the switch and dropping the old tables.",
    )


@attrs.frozen
class ProcessorSettings:
    state_cache_aggregates: int = setting(
        100000, "CQRS_PROCESSOR_STATE_CACHE",
        "Aggregates whose state each Python worker keeps between micro-batches (0: none); a "
        "cached state is used only while the worker saw its partition's previous commands.",
    )
    state_store_mib: int = setting(
        512, "CQRS_PROCESSOR_STATE_STORE_MIB",
        "Megabytes of states each Python worker keeps packed (as it wrote them to the state "
        "table, a few hundred bytes each) once they leave its decoded cache, so that a large "
        "key space is served from memory instead of read back from Cassandra; valid under the "
        "same rule as the cache (0: none).",
    )
    state_store: str = setting(
        "cassandra", "CQRS_PROCESSOR_STATE_STORE",
        "Where the processor keeps aggregate states: `cassandra` (a row per aggregate in the "
        "aggregate-state table, read back for aggregates a worker does not hold) or `kafka` (a "
        "compacted changelog topic per state generation, as Kafka Streams does: each worker "
        "holds every state of the partitions it serves and restores a partition it takes over "
        "from the changelog; no read or write of Cassandra per aggregate). See docs/processor.md.",
    )
    read_consistency: str = setting(
        "LOCAL_QUORUM", "CQRS_PROCESSOR_READ_CONSISTENCY",
        "Cassandra consistency of aggregate-state reads.",
    )
    write_consistency: str = setting(
        "LOCAL_QUORUM", "CQRS_PROCESSOR_WRITE_CONSISTENCY",
        "Cassandra consistency of aggregate-state writes.",
    )
    concurrency: int = setting(
        64, "CQRS_PROCESSOR_CONCURRENCY", "Cassandra requests in flight per Spark task.",
    )
    tasks: int = setting(
        0, "CQRS_PROCESSOR_TASKS",
        "Spark tasks per micro-batch at most, each taking whole commands partitions (0: the "
        "cores of a local[N] master, else spark.default.parallelism).",
    )
    rows_per_request: int = setting(
        500, "CQRS_PROCESSOR_ROWS_PER_REQUEST",
        "Aggregate-state rows per Cassandra request (IN reads, unlogged batches), all of one "
        "bucket; 1: a request per row. A batch also stays under 40 KB. Reads cost Cassandra "
        "per request: 100 ids an IN cost it ~11 us of CPU per row read, 400 ~6.",
    )
    state_buckets: int = setting(
        64, "CQRS_PROCESSOR_STATE_BUCKETS",
        "Cassandra partitions a new generation of the aggregate-state table spreads its rows "
        "over (a generation keeps its count; `cqrs rebuild-state` makes a new one).",
    )
    serve_seconds: float = setting(
        2.0, "CQRS_PROCESSOR_SERVE_SECONDS",
        "How long, counted from when Spark planned a micro-batch, its tasks go on processing "
        "new commands of their partitions as they arrive, after the planned ones: commands "
        "then wait for a poll, not for the next micro-batch. The next batch starts where the "
        "tasks got to; under `cqrs run processor` it follows at once, also when nothing new "
        "arrived. 0: tasks stop at their planned end, and batches come only for new commands.",
    )
    bridge_seconds: float = setting(
        3.0, "CQRS_PROCESSOR_BRIDGE_SECONDS",
        "After a serving task's time is up, its Python worker goes on serving the task's "
        "partitions for at most this long, until a task of the next micro-batch takes them "
        "over in the same worker: commands arriving between two micro-batches are then "
        "decided at once, not after the next batch is planned and started. A task of another "
        "worker waits for the bridge to end (at most this long, plus half a second). Between two "
        "micro-batches Spark spends 0.2-0.9 s on the 2-core development machine. 0: off.",
    )
    quiet_tasks: int = setting(
        0, "CQRS_PROCESSOR_QUIET_TASKS",
        "Tasks that serve the commands topic while fewer than 2,000 commands per extra task "
        "wait (at most [processor] tasks; 0: one per core under `cqrs run processor`, ready "
        "for a burst; 1 where the processor shares its Spark driver, as in `cqrs run app`, "
        "leaving the other cores to the other queries).",
    )
    slow_decision_s: float = setting(
        0.25, "CQRS_PROCESSOR_SLOW_DECISION",
        "Seconds an aggregate's decision may run before the serving task sets that aggregate "
        "aside: its decision goes on in a lane of its own (its later commands queue behind it, "
        "in order) while the task decides every other aggregate. 0: never (a slow handler "
        "then holds up every aggregate of its task).",
    )
    decision_budget_s: float = setting(
        30.0, "CQRS_PROCESSOR_DECISION_BUDGET",
        "Seconds a command's decision (its handler and the appliers of its events), a process "
        "manager's reaction or a projection's handler of an event may run: past it the command "
        "is answered failed (DecisionTimeoutError) and dead-lettered, and its aggregate goes on "
        "with the next command; the reaction or the projection's handler fails as one that "
        "raised (the event dead-lettered; the view parked) and the others go on. 0: no budget.",
    )
    max_commands_per_batch: int = setting(
        100000, "CQRS_PROCESSOR_MAX_COMMANDS_PER_BATCH",
        "Commands a micro-batch takes at most when more wait (0: all of them): bounds the "
        "Python workers' memory, which holds a batch's commands and records, whatever the "
        "backlog; `cqrs run processor --max-offsets-per-trigger` overrides it.",
    )


@attrs.frozen
class RetrierSettings:
    interval_s: float = setting(
        1.0, "CQRS_RETRIER_INTERVAL",
        "Seconds between two reads of the due retries by `cqrs run retrier` (the timer's "
        "resolution: a retry runs up to this late).",
    )
    bucket_s: int = setting(
        60, "CQRS_RETRIER_BUCKET",
        "Width in seconds of a Cassandra partition of the retry table (entries are partitioned "
        "by app and due-time bucket, sorted by due time inside).",
    )
    max_due_per_trigger: int = setting(
        1000, "CQRS_RETRIER_MAX_DUE",
        "Due retries delivered per round at most (more wait for the next round).",
    )
    max_letters_per_trigger: int = setting(
        10000, "CQRS_RETRIER_MAX_LETTERS",
        "Dead letters read per micro-batch of the retry job at most.",
    )
    trigger: str = setting(
        "1 second", "CQRS_RETRIER_TRIGGER",
        "Micro-batch interval of the retry job's dead-letter query ('': back to back).",
    )


@attrs.frozen
class SchedulerSettings:
    interval_s: float = setting(
        0.2, "CQRS_SCHEDULER_INTERVAL",
        "Seconds between two reads of the due deadlines (the timer's resolution: a deadline's "
        "command is sent up to this late). Each read is a slice of one bucket: idle, it costs "
        "next to nothing.",
    )
    bucket_s: int = setting(
        60, "CQRS_SCHEDULER_BUCKET",
        "Width in seconds of a Cassandra partition of the deadlines' due table (entries are "
        "partitioned by app and due-time bucket, sorted by due time inside).",
    )
    max_due_per_round: int = setting(
        5000, "CQRS_SCHEDULER_MAX_DUE",
        "Due deadlines sent per round at most (more are sent in the next round, at once).",
    )


@attrs.frozen
class MetricsSettings:
    host: str = setting(
        "127.0.0.1", "CQRS_METRICS_HOST",
        "Address `cqrs run app` serves /metrics, /status.json and its status page on.",
    )
    port: int = setting(
        9464, "CQRS_METRICS_PORT",
        "Port of that server (0: none); `cqrs serve` and `cqrs top` read the runner's status there.",
    )
    runner_url: str = setting(
        "", "CQRS_METRICS_RUNNER_URL",
        "Where `cqrs serve` and `cqrs top` fetch the app runner's /status.json (default: "
        "http://<host>:<port> above; 'none': do not ask, show Kafka and Cassandra figures only).",
    )
    refresh_s: float = setting(
        2.0, "CQRS_METRICS_REFRESH",
        "Seconds between reads of Kafka offsets, dead letters and projection positions.",
    )
    restart_backoff_s: float = setting(
        5.0, "CQRS_METRICS_RESTART_BACKOFF",
        "First wait before `cqrs run app` restarts a failed query; doubled per failure in a row, "
        "up to 5 minutes.",
    )

    def status_url(self) -> str | None:
        """The runner's base URL as seen by `cqrs serve` / `cqrs top`, or None."""
        if self.runner_url.strip().lower() == "none" or (not self.runner_url and self.port == 0):
            return None
        return (self.runner_url or f"http://{self.host}:{self.port}").rstrip("/")


@attrs.frozen
class PersonalDataSettings:
    master_key: str = setting(
        "", "CQRS_PERSONAL_DATA_MASTER_KEY",
        "Base64 of 32 random bytes: the key that wraps every data subject's key in the key "
        "table (an app with personal() fields needs it; make one with `python -c \"import os, "
        "base64; print(base64.b64encode(os.urandom(32)).decode())\"`). Losing it loses every "
        "personal value; keep it in a secret store, never in the repository.",
        secret=True,
    )
    key_cache_size: int = setting(
        100000, "CQRS_PERSONAL_DATA_KEY_CACHE",
        "Data subjects whose key each process keeps in memory (least recently used out first).",
    )
    key_cache_seconds: float = setting(
        300.0, "CQRS_PERSONAL_DATA_KEY_CACHE_SECONDS",
        "How long a process uses a cached key before reading it again: a subject forgotten by "
        "another process is forgotten in this one at most this much later.",
    )

    def master_key_bytes(self) -> bytes:
        """The master key's 32 bytes, or :class:`ConfigError` saying how to set it."""
        import base64
        import binascii

        make = ("make one with `python -c \"import os, base64; "
                "print(base64.b64encode(os.urandom(32)).decode())\"`")
        if not self.master_key:
            raise ConfigError(
                "personal_data.master_key is not set (the key that wraps the data subjects' "
                "keys): set CQRS_PERSONAL_DATA_MASTER_KEY (or [personal_data] master_key) to the "
                f"base64 of 32 random bytes; {make}")
        try:
            key = base64.b64decode(self.master_key, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(
                f"personal_data.master_key is not base64 ({len(self.master_key)} characters): "
                f"give the base64 of 32 random bytes; {make}") from None
        if len(key) != 32:
            raise ConfigError(
                f"personal_data.master_key is {len(key)} bytes once decoded: an AES-256 key is "
                f"32 bytes; {make}")
        return key


@attrs.frozen
class CqrsConfig:
    kafka: KafkaSettings = attrs.field(factory=KafkaSettings)
    cassandra: CassandraSettings = attrs.field(factory=CassandraSettings)
    spark: SparkSettings = attrs.field(factory=SparkSettings)
    dev: DevSettings = attrs.field(factory=DevSettings)
    client: ClientSettings = attrs.field(factory=ClientSettings)
    projections: ProjectionSettings = attrs.field(factory=ProjectionSettings)
    processor: ProcessorSettings = attrs.field(factory=ProcessorSettings)
    metrics: MetricsSettings = attrs.field(factory=MetricsSettings)
    retrier: RetrierSettings = attrs.field(factory=RetrierSettings)
    scheduler: SchedulerSettings = attrs.field(factory=SchedulerSettings)
    personal_data: PersonalDataSettings = attrs.field(factory=PersonalDataSettings)

    def with_overrides(self, **sections: Mapping[str, Any]) -> CqrsConfig:
        """A copy with some settings replaced: ``cfg.with_overrides(kafka={"bootstrap_servers": ...})``."""
        changes = {}
        for name, values in sections.items():
            if name not in _SECTIONS:
                raise ConfigError(
                    f"unknown configuration section {name!r}; known: {sorted(_SECTIONS)}"
                )
            changes[name] = _build(_SECTIONS[name], values, base=getattr(self, name))
        return attrs.evolve(self, **changes)


_SECTIONS: dict[str, type] = {
    "kafka": KafkaSettings,
    "cassandra": CassandraSettings,
    "spark": SparkSettings,
    "dev": DevSettings,
    "client": ClientSettings,
    "projections": ProjectionSettings,
    "processor": ProcessorSettings,
    "metrics": MetricsSettings,
    "retrier": RetrierSettings,
    "scheduler": SchedulerSettings,
    "personal_data": PersonalDataSettings,
}


def _coerce(section: str, name: str, kind: Any, raw: Any, origin: str) -> Any:
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind is int:
            if isinstance(raw, bool):
                raise ValueError(raw)
            return int(raw)
        if kind is float:
            return float(raw)
        if kind is str:
            if not isinstance(raw, (str, int, float)):
                raise ValueError(raw)
            return str(raw)
        if getattr(kind, "__origin__", None) is dict:
            if not isinstance(raw, Mapping):
                raise ValueError(raw)
            return {str(k): str(v) for k, v in raw.items()}
    except ValueError:
        expected = getattr(kind, "__name__", str(kind))
        raise ConfigError(
            f"{section}.{name} = {raw!r} (from {origin}) is not a valid {expected}; "
            f"fix the value or remove it to use the default"
        ) from None
    raise ConfigError(f"{section}.{name}: unsupported setting type {kind!r}")


def _build(cls: type, values: Mapping[str, Any], base: Any = None, origin: str = "overrides") -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in attrs.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {sorted(unknown)} in section {_name_of(cls)!r} ({origin}); "
            f"known: {sorted(known)}"
        )
    coerced = {
        k: _coerce(_name_of(cls), k, hints[k], v, origin) for k, v in values.items()
    }
    return attrs.evolve(base, **coerced) if base is not None else cls(**coerced)


def _name_of(cls: type) -> str:
    return next(k for k, v in _SECTIONS.items() if v is cls)


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Mapping[str, Any],
) -> CqrsConfig:
    """Build the configuration: defaults < file < environment < ``overrides``.

    ``path`` defaults to ``$CQRS_CONFIG``, else ``./cqrs.toml`` when it exists.
    ``env`` defaults to ``os.environ``; tests pass a dict instead of editing the process env.
    """
    env = os.environ if env is None else env
    file_values: dict[str, Any] = {}
    chosen = path if path is not None else env.get("CQRS_CONFIG")
    if chosen is None and Path("cqrs.toml").is_file():
        chosen = "cqrs.toml"
    if chosen is not None:
        file = Path(chosen).expanduser()
        if not file.is_file():
            raise ConfigError(f"configuration file {str(file)!r} does not exist")
        try:
            file_values = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"configuration file {str(file)!r} is not valid TOML: {exc}") from exc
        unknown = set(file_values) - set(_SECTIONS)
        if unknown:
            raise ConfigError(
                f"unknown section(s) {sorted(unknown)} in {str(file)!r}; known: {sorted(_SECTIONS)}"
            )
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        section = _build(cls, file_values.get(name, {}), origin=str(chosen))
        from_env = {
            f.name: env[f.metadata[_ENV]]
            for f in attrs.fields(cls)
            if f.metadata.get(_ENV) and f.metadata[_ENV] in env
        }
        if from_env:
            section = _build(cls, from_env, base=section, origin="environment")
        if name in overrides:
            section = _build(cls, overrides[name], base=section)
        sections[name] = section
    return CqrsConfig(**sections)


def settings_reference() -> str:
    """The configuration reference as Markdown, generated from the declarations above."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `cqrs/config.py` by `cqrs config docs`; do not edit by hand.",
        "",
        "Settings are read, lowest precedence first, from the defaults, the TOML file "
        "(`$CQRS_CONFIG` or `./cqrs.toml`), the environment, and explicit overrides.",
        "",
    ]
    for name, cls in _SECTIONS.items():
        hints = get_type_hints(cls)
        lines += [f"## [{name}]", "", "| setting | type | default | environment | meaning |",
                  "| --- | --- | --- | --- | --- |"]
        for f in attrs.fields(cls):
            kind = getattr(hints[f.name], "__name__", str(hints[f.name]))
            default = f.default.factory() if isinstance(f.default, attrs.Factory) else f.default  # type: ignore[misc]
            env_name = f"`{f.metadata[_ENV]}`" if f.metadata.get(_ENV) else "(file only)"
            doc = str(f.metadata[_DOC]).replace("|", "\\|")
            default_text = str(default).replace("|", "\\|")
            lines.append(f"| `{f.name}` | {kind} | `{default_text}` | {env_name} | {doc} |")
        lines.append("")
    return "\n".join(lines)
