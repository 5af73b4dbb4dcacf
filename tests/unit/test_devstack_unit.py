"""Pure parts of the dev stack: pinned versions, process tracking by PID, Spark options."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from cqrs.config import load_config
from cqrs.devstack.artifacts import component_dir, is_installed, pinned_versions, require_installed
from cqrs.devstack.process import ServiceProcess
from cqrs.devstack.services import with_timer_slack
from cqrs.errors import DevStackError
from cqrs.spark_session import FS_CHECKPOINT_MANAGER, spark_conf


def test_versions_are_pinned_in_the_pom_and_match_pyspark() -> None:
    import pyspark

    versions = pinned_versions()
    assert versions["kafka"].startswith("4.")
    assert versions["cassandra"].startswith("5.0.")
    assert versions["spark"] == pyspark.__version__


def test_missing_artifacts_say_how_to_install(tmp_path: Path) -> None:
    cfg = load_config(env={"CQRS_HOME": str(tmp_path)})
    assert not is_installed(cfg.dev, "kafka")
    assert component_dir(cfg.dev, "kafka") == tmp_path / "artifacts" / f"kafka-{pinned_versions()['kafka']}"
    with pytest.raises(DevStackError, match="run `cqrs dev install`"):
        require_installed(cfg.dev, "cassandra")
    with pytest.raises(DevStackError, match="unknown component 'zookeeper'"):
        component_dir(cfg.dev, "zookeeper")


def test_spark_options_rocksdb_changelog_and_user_overrides(tmp_path: Path) -> None:
    cfg = load_config(env={"CQRS_HOME": str(tmp_path), "CQRS_SPARK_USE_LOCAL_JARS": "false"},
                      spark={"conf": {"spark.sql.shuffle.partitions": "7", "spark.ui.enabled": "true"}})
    conf = spark_conf(cfg)
    assert conf["spark.sql.shuffle.partitions"] == "7"  # user's conf wins
    assert conf["spark.ui.enabled"] == "true"
    assert "spark.jars" not in conf  # a cluster that has the connector needs no local jars
    with pytest.raises(DevStackError, match="cqrs dev install"):
        spark_conf(load_config(env={"CQRS_HOME": str(tmp_path)}))


def test_an_idle_query_asks_its_source_every_50_ms_unless_the_user_says_otherwise(tmp_path: Path) -> None:
    env = {"CQRS_HOME": str(tmp_path), "CQRS_SPARK_USE_LOCAL_JARS": "false"}
    key = "spark.sql.streaming.pollingDelay"
    assert spark_conf(load_config(env=env))[key] == "50ms"
    assert spark_conf(load_config(env=env, spark={"conf": {key: "10ms"}}))[key] == "10ms"


def test_local_checkpoints_use_the_file_system_checkpoint_manager(tmp_path: Path) -> None:
    def conf(checkpoint_dir: str) -> dict[str, str]:
        return spark_conf(load_config(env={"CQRS_SPARK_USE_LOCAL_JARS": "false",
                                           "CQRS_SPARK_CHECKPOINT_DIR": checkpoint_dir}))

    key = "spark.sql.streaming.checkpointFileManagerClass"
    assert conf(str(tmp_path))[key] == FS_CHECKPOINT_MANAGER
    assert conf(f"file://{tmp_path}")[key] == FS_CHECKPOINT_MANAGER
    assert key not in conf("hdfs://namenode/cqrs")  # Spark's default elsewhere
    assert key not in conf("s3a://bucket/cqrs")


def test_process_is_tracked_and_stopped_by_pid_only(tmp_path: Path) -> None:
    marker = f"cqrs-test-marker-{time.monotonic_ns()}"
    proc = ServiceProcess("sleeper", tmp_path, marker)
    pid = proc.start([sys.executable, "-c", "import time, sys; time.sleep(60)", marker])
    assert proc.pid() == pid
    assert proc.resident_mib() is not None
    # an unrelated process with the same name is never touched
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "sleeper"])
    try:
        assert proc.stop(timeout_s=5)
        assert proc.pid() is None and not proc.pid_file.exists()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    assert not proc.stop()  # nothing left to stop


def test_stale_pid_file_of_a_reused_pid_is_ignored(tmp_path: Path) -> None:
    proc = ServiceProcess("ghost", tmp_path, "a-marker-no-process-has")
    other = subprocess.Popen(["sleep", "30"])
    try:
        cmdline = Path(f"/proc/{other.pid}/cmdline")
        while not cmdline.read_bytes().startswith(b"sleep"):  # until it has exec'd
            time.sleep(0.01)
        proc.pid_file.write_text(str(other.pid))
        assert proc.pid() is None  # the PID runs something else: not ours
        assert not proc.pid_file.exists()
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(not Path("/proc/self/timerslack_ns").exists(), reason="Linux timer slack")
def test_a_service_started_with_a_timer_slack_runs_its_own_command_with_it(tmp_path: Path) -> None:
    marker = f"cqrs-test-marker-{time.monotonic_ns()}"
    script = ("import sys, threading; out = []; t = threading.Thread(target=lambda: out.append("
              "open(f'/proc/{threading.get_native_id()}/timerslack_ns').read())); t.start(); t.join(); "
              "print(open('/proc/self/timerslack_ns').read().strip(), out[0].strip(), sys.argv[1])")
    argv = with_timer_slack([sys.executable, "-c", script, marker], 1500)
    assert argv[-4:] == [sys.executable, "-c", script, marker]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    # the command itself (not a launcher left around it) and a thread it started have the slack
    assert done.stdout.split() == ["1500000", "1500000", marker]
    assert with_timer_slack(["java"], 0) == ["java"]


def test_a_new_kraft_cluster_id_is_never_read_as_an_option() -> None:
    from cqrs.devstack.services import new_cluster_id

    ids = [new_cluster_id() for _ in range(5000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)


def _conf_with_driver_option(home: Path, **env: str) -> dict[str, str]:
    """spark_conf under ``home`` with ``env``, the user's [spark.conf] giving the driver -Dmine=1."""
    return spark_conf(load_config(env={"CQRS_HOME": str(home), "CQRS_SPARK_USE_LOCAL_JARS": "false", **env},
                                  spark={"conf": {"spark.driver.extraJavaOptions": "-Dmine=1"}}))


def test_the_spark_jvms_map_the_class_archive_once_it_is_built(tmp_path: Path) -> None:
    from cqrs.devstack.class_archive import archive_path, driver_java_options

    def conf(**env: str) -> dict[str, str]:
        return _conf_with_driver_option(tmp_path, **env)

    cfg = load_config(env={"CQRS_HOME": str(tmp_path)})
    path = archive_path(cfg.dev)
    assert path is not None and path.parent == tmp_path / "artifacts" / "jvm"
    assert driver_java_options(cfg) is None  # not built: Spark starts as it always did
    assert conf()["spark.driver.extraJavaOptions"] == "-Dmine=1"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"an archive")  # the JVM itself ignores one that does not match
    assert conf()["spark.driver.extraJavaOptions"] == (
        f"-Dmine=1 -XX:SharedArchiveFile={path} -Xlog:cds=off,cds+dynamic=off")  # added to theirs
    assert conf(CQRS_SPARK_CLASS_DATA_SHARING="false")["spark.driver.extraJavaOptions"] == "-Dmine=1"
    # local[...]: the executors are the driver; on a cluster they map it too
    assert "spark.executor.extraJavaOptions" not in conf()
    assert conf(CQRS_SPARK_MASTER="spark://127.0.0.1:7077")["spark.executor.extraJavaOptions"] == (
        f"-XX:SharedArchiveFile={path} -Xlog:cds=off,cds+dynamic=off")


def test_java_options_go_to_the_spark_jvms_and_the_services(tmp_path: Path) -> None:
    from cqrs.devstack.class_archive import archive_path
    from cqrs.devstack.services import find_java, service_java

    def conf(**env: str) -> dict[str, str]:
        return _conf_with_driver_option(tmp_path, **env)

    quick = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    assert conf(CQRS_SPARK_JAVA_OPTIONS=quick)["spark.driver.extraJavaOptions"] == f"-Dmine=1 {quick}"
    assert "spark.executor.extraJavaOptions" not in conf(CQRS_SPARK_JAVA_OPTIONS=quick)
    path = archive_path(load_config(env={"CQRS_HOME": str(tmp_path)}).dev)
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"an archive")
    archive = f"-XX:SharedArchiveFile={path} -Xlog:cds=off,cds+dynamic=off"
    # after [spark.conf]'s, before the archive's; a cluster's executors get both
    on_cluster = conf(CQRS_SPARK_JAVA_OPTIONS=quick, CQRS_SPARK_MASTER="spark://127.0.0.1:7077")
    assert on_cluster["spark.driver.extraJavaOptions"] == f"-Dmine=1 {quick} {archive}"
    assert on_cluster["spark.executor.extraJavaOptions"] == f"{quick} {archive}"
    # the services': after the java binary, split as a shell would
    try:
        java = find_java(load_config(env={}))
    except DevStackError:
        pytest.skip("no JDK 17 here")
    cfg = load_config(env={"CQRS_DEV_JAVA_OPTIONS": "-XX:TieredStopAtLevel=1  '-Dx=a b'"})
    assert service_java(cfg) == [java, "-XX:TieredStopAtLevel=1", "-Dx=a b"]
    assert service_java(load_config(env={})) == [java]


def test_drivers_schedule_fair_with_the_processors_pool_configured(tmp_path: Path) -> None:
    from cqrs.processor.job import PROCESSOR_POOL

    conf = spark_conf(load_config(env={"CQRS_HOME": str(tmp_path), "CQRS_SPARK_USE_LOCAL_JARS": "false"}))
    assert conf["spark.scheduler.mode"] == "FAIR"
    pools = Path(conf["spark.scheduler.allocation.file"]).read_text()
    assert f'<pool name="{PROCESSOR_POOL}">' in pools and "<minShare>1</minShare>" in pools
