"""The cluster mode's layout and configuration, without starting anything."""

from __future__ import annotations

from pathlib import Path

from cqrs.config import load_config
from cqrs.devstack.cluster import cassandra_nodes, cluster_config, cluster_toml, kafka_nodes
from cqrs.devstack.services import cassandra_node, kafka_node
from cqrs.topics import topic_settings, topics_for


def test_cluster_ports_and_folders_differ_from_the_single_stack(tmp_path: Path) -> None:
    cfg = load_config(env={"CQRS_HOME": str(tmp_path)})
    brokers, nodes = kafka_nodes(cfg), cassandra_nodes(cfg)
    single_ports = {kafka_node(cfg).port, kafka_node(cfg).controller_port,
                    cassandra_node(cfg).port, cassandra_node(cfg).storage_port}
    cluster_ports = {p for b in brokers for p in (b.port, b.controller_port)}
    assert len(cluster_ports) == 6 and not cluster_ports & single_ports
    assert [n.address for n in nodes] == ["127.0.0.2", "127.0.0.3"]
    assert len({n.initial_token for n in nodes}) == 2 and all(n.ring_delay_ms > 0 for n in nodes)
    assert {b.voters for b in brokers} == {"1@127.0.0.1:29192,2@127.0.0.1:29193,3@127.0.0.1:29194"}
    folders = {b.workdir for b in brokers} | {n.workdir for n in nodes}
    assert all(cfg.dev.cluster_path in f.parents for f in folders)
    assert cfg.dev.data_path not in cfg.dev.cluster_path.parents


def test_the_written_file_is_the_cluster_configuration(tmp_path: Path) -> None:
    cfg = load_config(env={"CQRS_HOME": str(tmp_path)})
    file = tmp_path / "cqrs.toml"
    file.write_text(cluster_toml(cfg))
    from_file = load_config(file, env={"CQRS_HOME": str(tmp_path)})
    assert from_file == cluster_config(cfg)
    assert from_file.kafka.replication_factor == 3 and from_file.kafka.min_insync_replicas == 2
    assert from_file.spark.master == "spark://127.0.0.1:27077"
    assert from_file.cassandra.contact_points() == ["127.0.0.2", "127.0.0.3"]
    # only the settings that point at the cluster change
    assert from_file.projections == cfg.projections and from_file.client == cfg.client


def test_min_insync_replicas_reaches_every_topic_only_when_set() -> None:
    topics = topics_for("bank")
    plain = topic_settings(load_config(env={}), topics)
    assert all("min.insync.replicas" not in conf for conf in plain.values())
    strict = topic_settings(load_config(env={"CQRS_KAFKA_MIN_INSYNC_REPLICAS": "2"}), topics)
    assert {conf["min.insync.replicas"] for conf in strict.values()} == {"2"}
    assert strict[topics.events]["retention.ms"] == "-1"


def test_the_secure_stack_configuration_file_is_private_and_complete(tmp_path: Path) -> None:
    from cqrs.devstack.secure import secure_config, write_secure_toml

    cfg = load_config(env={"CQRS_HOME": str(tmp_path)})
    path = write_secure_toml(cfg)  # generates the CA, the broker's keystore and the passwords
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "secure" / "secrets.json").stat().st_mode & 0o777) == "0o600"
    from_file = load_config(path, env={"CQRS_HOME": str(tmp_path)})
    assert from_file == secure_config(cfg)
    assert from_file.kafka.client_options()["security.protocol"] == "SASL_SSL"
    assert Path(from_file.kafka.ssl_ca_location).read_text().startswith("-----BEGIN CERTIFICATE")
    assert from_file.cassandra.password and from_file.cassandra.password not in repr(from_file)
    assert from_file.kafka.bootstrap_servers.endswith(":23092")
