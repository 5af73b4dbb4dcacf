"""The launcher itself, on a second stack with its own ports and data folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from cqrs.config import CqrsConfig
from cqrs.devstack.stack import DevStack
from cqrs.devstack.nodetool import compactions_pending, flush_and_compact, nodetool
from cqrs.errors import DevStackError, ServiceNotReady


def _second_stack(cfg: CqrsConfig, home: Path, **dev: object) -> CqrsConfig:
    """A stack beside the session's: same cached jars, other ports, its own data."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "artifacts").symlink_to(cfg.dev.artifacts_path)
    return cfg.with_overrides(
        dev={"home": str(home), "kafka_port": 19192, "kafka_controller_port": 19193,
             "cassandra_port": 19142, "cassandra_storage_port": 17100,
             "cassandra_jmx_port": 17299, **dev},
        kafka={"bootstrap_servers": "127.0.0.1:19192"},
        cassandra={"port": 19142},
    )


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_up_twice_is_harmless_data_survives_and_down_leaves_nothing(
    cqrs_config: CqrsConfig, tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    cfg = _second_stack(cqrs_config, tmp_path / "home")
    stack = DevStack(cfg)
    try:
        first = stack.up(say=lambda _: None)
        assert all(s.healthy for s in first), first
        assert all(s.started_in_s is not None and s.started_in_s > 0 for s in first)
        again = stack.up(say=lambda _: None)
        assert [s.pid for s in again] == [s.pid for s in first]  # nothing restarted
        assert all(s.started_in_s is None for s in again)

        admin = AdminClient({"bootstrap.servers": cfg.kafka.bootstrap_servers})
        for f in admin.create_topics([NewTopic("survivor", 1, 1)]).values():
            f.result(timeout=30)
        stack.down(say=lambda _: None)
        assert not any(_alive(s.pid) for s in first if s.pid)
        assert not any(s.running for s in stack.status())

        stack.up(say=lambda _: None)
        admin = AdminClient({"bootstrap.servers": cfg.kafka.bootstrap_servers})
        assert "survivor" in admin.list_topics(timeout=10).topics  # data kept across down/up
    finally:
        stack.down(say=lambda _: None)
    assert not any(s.running for s in stack.status())


def test_a_service_that_cannot_start_names_its_log(cqrs_config: CqrsConfig, tmp_path: Path) -> None:
    cfg = _second_stack(cqrs_config, tmp_path / "home", kafka_heap="1k", start_timeout_s=60.0)
    stack = DevStack(cfg)
    with pytest.raises(ServiceNotReady) as failure:
        stack.up(say=lambda _: None)
    assert "kafka" in str(failure.value)
    assert str(cfg.dev.data_path / "kafka" / "kafka.log") in str(failure.value)
    assert not any(s.running for s in stack.status())  # the other service was stopped again


def test_nodetool_flushes_the_node_and_sees_its_compactions_end(cqrs_config: CqrsConfig) -> None:
    from cqrs.cassandra_io import cql_cluster

    keyspace = "t_nodetool"
    cluster = cql_cluster(cqrs_config.cassandra.contact_points(), cqrs_config.cassandra.port)
    session = cluster.connect()
    try:
        session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute(f"CREATE TABLE IF NOT EXISTS {keyspace}.rows (k int PRIMARY KEY, v text)")
        for k in range(200):
            session.execute(f"INSERT INTO {keyspace}.rows (k, v) VALUES (%s, 'x')", (k,))
        before = nodetool(cqrs_config, "tablestats", f"{keyspace}.rows")
        assert "SSTable count: 0" in before, before  # written to the memtable only
        assert flush_and_compact(cqrs_config, timeout_s=120) < 120
        after = nodetool(cqrs_config, "tablestats", f"{keyspace}.rows")
        assert "SSTable count: 1" in after, after
        assert compactions_pending(cqrs_config) == 0
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        cluster.shutdown()


def test_nodetool_without_a_jmx_port_says_which_setting(cqrs_config: CqrsConfig) -> None:
    cfg = cqrs_config.with_overrides(dev={"cassandra_jmx_port": 0})
    with pytest.raises(DevStackError, match=r"cassandra_jmx_port is 0.*cqrs dev down"):
        nodetool(cfg, "flush")


@pytest.mark.skipif(not Path("/proc/self/timerslack_ns").exists(), reason="Linux timer slack")
def test_the_cassandra_node_runs_with_the_configured_timer_slack(cqrs_config: CqrsConfig) -> None:
    from cqrs.devstack.process import ServiceProcess
    from cqrs.devstack.services import cassandra_node

    node = cassandra_node(cqrs_config)
    pid = ServiceProcess("cassandra", node.workdir, node.marker).pid()
    if pid is None:
        pytest.skip("the tests' Cassandra was not started by `cqrs dev up`")
    want = str(cqrs_config.dev.cassandra_timer_slack_us * 1000)
    threads = list(Path(f"/proc/{pid}/task").iterdir())
    slacks = {Path(f"/proc/{t.name}/timerslack_ns").read_text().strip() for t in threads}
    assert slacks == {want}, f"{len(threads)} threads of Cassandra (pid {pid}) have {slacks}"
