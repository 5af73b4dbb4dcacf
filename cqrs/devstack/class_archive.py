"""A class-data-sharing archive for the Spark driver's JVM, so that a job starts sooner.

``cqrs dev install`` runs a small Spark driver once with ``-XX:ArchiveClassesAtExit`` (a batch
job, a Python function over Arrow batches, a streaming query): the JVM writes the classes it
loaded, parsed and verified into ``<artifacts>/jvm/spark-driver-<identity>.jsa``. Every Spark
session the framework starts then maps them from that file (``-XX:SharedArchiveFile``) instead
of loading them again: on the 2-core dev machine a session is ready in about 3 s instead of 5,
and its first job takes 1 s instead of 2 (measured 2026-11-26, Java 17, Spark 4.2). Every
``cqrs run ...``, ``cqrs rebuild``, ``cqrs sql`` and test that starts Spark gains it.

The archive only holds for the Java build and the class path it was written with: the file name
carries an identity of both (the ``java`` binary Spark will run, and the name, size and time of
every jar of the installed pyspark), so another Java, another pyspark or a re-created virtual
environment looks for another file, and finds none until ``cqrs dev install`` writes it. The JVM
checks again as it starts and ignores an archive that does not match (the driver then starts
as without one). ``[spark] class_data_sharing = false`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cqrs.config import CqrsConfig, DevSettings

__all__ = ["archive_path", "build_archive", "driver_java_options"]

KEEP = 3  # archives of other identities kept (another venv or Java on the same cache)
_QUIET = "-Xlog:cds=off,cds+dynamic=off"  # a mismatching archive is ignored without a word


def _java() -> Path | None:
    """The ``java`` binary Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the PATH's."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _identity() -> str | None:
    """A digest of the Java build and of the driver's class path (pyspark's jars), or None
    when there is no Java or no pyspark."""
    import importlib.util

    java = _java()
    spec = importlib.util.find_spec("pyspark")
    if java is None or spec is None or spec.origin is None:
        return None
    jars = Path(spec.origin).parent / "jars"
    digest = hashlib.sha256()
    for path in [java, *sorted(jars.glob("*.jar"))]:
        st = path.stat()
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def archive_path(dev: DevSettings) -> Path | None:
    """Where the archive of this Java and pyspark is (or would be); None without either."""
    identity = _identity()
    return None if identity is None else dev.artifacts_path / "jvm" / f"spark-driver-{identity}.jsa"


def driver_java_options(cfg: CqrsConfig) -> str | None:
    """The driver's JVM options that map the archive, when it is on and built; else None."""
    if not cfg.spark.class_data_sharing:
        return None
    path = archive_path(cfg.dev)
    if path is None or not path.is_file():
        return None
    return f"-XX:SharedArchiveFile={path} {_QUIET}"


def build_archive(cfg: CqrsConfig, say: Callable[[str], None] = print,
                  timeout_s: float = 600.0) -> Path | None:
    """Write the archive of this Java and pyspark unless it is there (or turned off, or there
    is no Java); keep the :data:`KEEP` newest of other identities. Its path, or None."""
    if not cfg.spark.class_data_sharing:
        return None
    path = archive_path(cfg.dev)
    if path is None:
        say("spark driver class archive: no java or pyspark found, skipped")
        return None
    if path.is_file():
        say(f"spark driver class archive: already built in {path}")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    say(f"spark driver class archive: recording a Spark driver's classes into {path} ...")
    started = time.monotonic()
    log = path.with_suffix(".log")
    with log.open("w") as out:
        rc = subprocess.call([sys.executable, "-m", "cqrs.devstack.class_archive", str(partial)],
                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             timeout=timeout_s)
    if rc != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        say(f"spark driver class archive: not written (exit {rc}; log {log}); Spark starts "
            "without it")
        return None
    partial.replace(path)
    for old in sorted(path.parent.glob("spark-driver-*.jsa"), key=lambda p: p.stat().st_mtime,
                      reverse=True)[KEEP + 1:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".log").unlink(missing_ok=True)
    for stale in path.parent.glob("spark-driver-*.partial"):  # of an install that was killed
        if time.time() - stale.stat().st_mtime > 3600:
            stale.unlink(missing_ok=True)
    say(f"spark driver class archive: {path.stat().st_size / 2**20:.0f} MiB in "
        f"{time.monotonic() - started:.0f} s")
    return path


def _record(target: str) -> None:
    """Run a small Spark driver whose JVM writes the classes it loaded to ``target`` as it
    exits; return once it has exited (and so written them)."""
    from pyspark import SparkContext

    from cqrs.config import load_config
    from cqrs.spark_session import spark_session

    cfg = load_config()
    cfg = cfg.with_overrides(spark={
        "class_data_sharing": False, "use_local_jars": False,
        "conf": {**cfg.spark.conf, "spark.driver.extraJavaOptions":
                 f"-XX:ArchiveClassesAtExit={target} {_QUIET}"}})
    spark = spark_session(cfg, "cqrs-class-archive")
    frame = spark.range(1000).selectExpr("id", "id % 7 AS k")
    frame.groupBy("k").count().collect()

    def double(batches):  # type: ignore[no-untyped-def]
        for batch in batches:
            yield batch

    frame.mapInArrow(double, frame.schema).count()
    query = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
             .writeStream.format("memory").queryName("cqrs_class_archive")
             .trigger(processingTime="200 milliseconds").start())
    deadline = time.monotonic() + 60
    while query.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.2)
    query.stop()
    gateway = SparkContext._gateway  # noqa: SLF001 - the JVM must exit for the archive to be written
    proc = gateway.proc
    spark.stop()
    gateway.shutdown()
    proc.stdin.close()  # the gateway JVM exits at the end of its input
    proc.wait(timeout=300)


if __name__ == "__main__":
    _record(sys.argv[1])
