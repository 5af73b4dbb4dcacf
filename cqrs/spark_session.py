"""The one place a SparkSession is built: local mode by default, a cluster by configuration.

Defaults suit the 2-core development machine: ``local[2]``, few shuffle (= state) partitions,
and the Kafka connector jars from the dev
cache (``cqrs dev install``) so nothing is downloaded when a job starts. Every option can be
overridden through ``[spark] conf`` in the configuration file.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cqrs.config import CqrsConfig
from cqrs.devstack.artifacts import require_installed
from cqrs.devstack.class_archive import driver_java_options
from cqrs.errors import CqrsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["QueryStartError", "connector_jars", "past_initialising", "spark_conf", "spark_session",
           "start_query", "stop_between_batches", "wait_until_started", "with_trigger"]

POOLS_FILE = Path(__file__).with_name("spark_pools.xml")  # the processor's scheduler pool
FS_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager")


def _is_local_path(location: str) -> bool:
    """Whether a checkpoint location is on the local disk (a path or a file: URL)."""
    return "://" not in location or location.startswith("file:")


def connector_jars(cfg: CqrsConfig) -> list[str]:
    """The Kafka connector jars from the dev cache (a clear error if not installed)."""
    return sorted(str(p) for p in require_installed(cfg.dev, "spark").glob("*.jar"))


def spark_conf(cfg: CqrsConfig) -> dict[str, str]:
    """The Spark options the framework sets, after the user's ``[spark] conf`` overrides."""
    conf = {
        "spark.master": cfg.spark.master,
        "spark.driver.memory": cfg.spark.driver_memory,
        "spark.sql.shuffle.partitions": str(cfg.spark.shuffle_partitions),
        "spark.default.parallelism": str(cfg.spark.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.python.worker.reuse": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.adaptive.enabled": "false",  # micro-batches are small: no re-planning per stage
        # queries of one driver share its cores by pools (the processor's has its own, see
        # cqrs.processor.job.start_processor): a freed core goes to the pool running fewest
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(POOLS_FILE),
        # how long a streaming query waits before asking its source again while nothing new
        # came (Spark's default 10 ms): an idle `cqrs run app` of the bank example, its queries
        # asking 100 times a second, kept 0.43 of a core of the 2-core machine busy between the
        # app, Kafka and Cassandra; at 50 ms (and the processor source's one request a poll,
        # see OffsetReader.ends) 0.16. A stream with data never waits; the first command after a
        # quiet spell (no serving task or bridge left, see [processor] serve_seconds) and a
        # projector's first event after one wait up to 40 ms more
        "spark.sql.streaming.pollingDelay": "50ms",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    if cfg.spark.master.startswith("local"):
        # stay on loopback: no other host needs to reach a local-mode driver
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    if cfg.spark.use_local_jars:
        conf["spark.jars"] = ",".join(connector_jars(cfg))
    if _is_local_path(cfg.spark.checkpoint_dir):
        # Spark's default (FileContext) renames each checkpoint file through Hadoop's local
        # file system, which forks `readlink` for every rename when the native Hadoop library
        # is absent: hundreds of forks of the driver JVM a minute. The FileSystem-based manager
        # renames with java.io.File; both are atomic on a local disk.
        conf["spark.sql.streaming.checkpointFileManagerClass"] = FS_CHECKPOINT_MANAGER
    conf.update(cfg.spark.conf)
    # after the options of [spark.conf], added to theirs: the [spark] java_options, then the
    # class archive's
    added = " ".join(o for o in (cfg.spark.java_options.strip(), driver_java_options(cfg)) if o)
    if added:
        # and the executors' (a master other than local[...]): those on this machine map the
        # archive too, those on another host miss the file and start as without it
        # (docs/operations.md)
        roles = ("driver",) if cfg.spark.master.startswith("local") else ("driver", "executor")
        for role in roles:
            key = f"spark.{role}.extraJavaOptions"
            conf[key] = " ".join(o for o in (conf.get(key, ""), added) if o)
    return conf


def spark_session(cfg: CqrsConfig, app_name: str, *, log_file: str | Path | None = None) -> SparkSession:
    """Get or create the SparkSession for ``app_name`` with the framework's options.

    ``log_file``: send the Spark JVM's output (its log and what the Python workers print) to
    this file instead of this process's terminal; it takes effect when this call starts the JVM.
    """
    from pyspark.sql import SparkSession

    # The workers must run the same interpreter as the driver (the one with our packages).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    for key, value in spark_conf(cfg).items():
        builder = builder.config(key, value)
    with _jvm_output_to(log_file):
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


@contextlib.contextmanager
def _jvm_output_to(log_file: str | Path | None) -> Iterator[None]:
    """The JVM inherits file descriptors 1 and 2 when it starts: point them at ``log_file``
    while it does, then give them back to this process."""
    if log_file is None:
        yield
        return
    path = Path(log_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def with_trigger(writer: Any, *, available_now: bool = False, interval: str | None = None) -> Any:
    """``writer`` (a DataStreamWriter) with the framework's trigger choice: everything available
    now and stop, or a micro-batch every ``interval`` (e.g. "500 milliseconds"), or by default
    micro-batches back to back."""
    if available_now:
        return writer.trigger(availableNow=True)
    if interval:
        return writer.trigger(processingTime=interval)
    return writer


def wait_until_started(query: Any, timeout_s: float = 180.0) -> bool:
    """Wait until a just-started streaming query is past initialising its sources (it read
    offsets once: it waits for data or processed a batch); False when it stopped or the time
    ran out.

    Start the next query only then. Initialising a Python data source (the processor's) spawns
    a Python worker that Spark allows 10 s to connect back, a limit it does not let anyone
    change; several queries initialising at once on a busy small machine miss it and fail."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not query.isActive:
            return False
        if past_initialising(query):
            return True
        time.sleep(0.2)
    return False


class QueryStartError(CqrsError, RuntimeError):
    """A streaming query stopped (or did not get past initialising its sources in time) as it
    started."""


# what Spark says when a Python worker it spawned did not connect back within its 10 s
CONNECT_BACK = "Python worker failed to connect back"


def start_query(start: Callable[[], Any], *, timeout_s: float = 180.0, attempts: int = 3) -> Any:
    """``start()`` a streaming query (or a job with the same ``isActive``, ``status``,
    ``lastProgress``, ``exception()``) and wait until it is past initialising its sources
    (:func:`wait_until_started`); the query.

    One that stopped there because a Spark Python worker did not connect back in time (a busy
    machine: see :func:`wait_until_started`) is started again, up to ``attempts`` starts in
    all: it failed before its first micro-batch, so its checkpoint is as it was. Any other
    failure, the last attempt's too, or the time running out raises :class:`QueryStartError`."""
    attempt = 1
    while True:
        query = start()
        if wait_until_started(query, timeout_s):
            return query
        error = query.exception() if not query.isActive else None
        name = getattr(query, "name", None) or "a query"
        if error is None:
            query.stop()
            raise QueryStartError(f"{name} was not past initialising its sources after "
                                  f"{timeout_s:g} s: see Spark's log")
        if CONNECT_BACK not in str(error) or attempt >= attempts:
            raise QueryStartError(f"{name} did not start (attempt {attempt} of {attempts}): {error}")
        attempt += 1


def past_initialising(query: Any) -> bool:
    """Whether a running streaming query is past initialising its sources, now: it made
    progress once (Spark keeps an idle trigger's progress as ``lastProgress`` though it posts
    no progress event for it), or its status says something other than "Initializing ..."
    (waiting for data, getting offsets, processing)."""
    if not query.isActive:
        return False
    if query.lastProgress is not None:
        return True
    message = str((query.status or {}).get("message", ""))
    return bool(message) and not message.startswith("Initializing")


STOP_GRACE_S = 30.0


def stop_between_batches(queries: Sequence[tuple[Any, Callable[[], object] | None]],
                         grace_s: float = STOP_GRACE_S) -> None:
    """Stop streaming queries between their micro-batches, each given with its ``drain`` or None.

    ``query.stop()`` alone interrupts the running micro-batch: its tasks are killed half-way
    (harmless for what they write, a re-run rewrites it, but the log then shows a query that
    failed and Python workers that crashed), and a serving processor always has one running.
    So a query with a ``drain`` (the processor's: touching its stop file, see
    :func:`cqrs.processor.job.start_processor`) is drained first and stopped once its running
    batch ended and none followed; any other once no batch of it runs. After ``grace_s``,
    whatever still runs is stopped as it is."""
    import time

    for query, drain in queries:
        if drain is not None and query.isActive:
            drain()
    waiting = list(queries)
    deadline = time.monotonic() + grace_s
    while waiting:
        late = time.monotonic() > deadline
        still = []
        for query, drain in waiting:
            status = query.status if query.isActive else None
            idle = status is None or (not status.get("isTriggerActive") and
                                      (drain is None or not status.get("isDataAvailable")))
            if idle or late:
                query.stop()
            else:
                still.append((query, drain))
        waiting = still
        if waiting:
            time.sleep(0.05)
