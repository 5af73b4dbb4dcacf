"""``cqrs dev up --secure``: one Kafka broker that takes clients only over SASL_SSL
(SCRAM-SHA-512, TLS with a CA of its own) and one Cassandra node with password authentication.

Everything is generated on first ``up`` into ``<CQRS_HOME>/secure``: a CA and the broker's
certificate (openssl, IP 127.0.0.1 in its SAN), the SCRAM user of the framework (created when
the broker's storage is formatted), a Cassandra role, and their random passwords
(``secrets.json``, mode 0600). :func:`secure_config` is the framework's configuration for it;
``up`` also writes it as ``cqrs.toml`` there (mode 0600, it holds the passwords).
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

from cqrs.config import CqrsConfig
from cqrs.devstack import services
from cqrs.devstack.process import ServiceProcess
from cqrs.devstack.services import CassandraNode, KafkaNode
from cqrs.devstack.stack import Service
from cqrs.errors import DevStackError

__all__ = ["KAFKA_USER", "CASSANDRA_ROLE", "create_role", "secure_config", "secure_services",
           "secure_toml_path", "write_secure_toml"]

KAFKA_USER = "cqrs"
CASSANDRA_ROLE = "cqrs"
_MECHANISM = "SCRAM-SHA-512"


def _secrets(cfg: CqrsConfig) -> dict[str, str]:
    """The generated passwords (hex: safe in a JAAS line and a CQL literal), made once."""
    path = cfg.dev.secure_path / "secrets.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(json.dumps({k: secrets.token_hex(16) for k in
                                    ("kafka_password", "cassandra_password", "keystore_password")}))
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _tls(cfg: CqrsConfig) -> tuple[Path, Path]:
    """The CA certificate (PEM) and the broker's PKCS12 keystore, made once with openssl."""
    d = cfg.dev.secure_path / "tls"
    ca, store = d / "ca.pem", d / "broker.p12"
    if ca.is_file() and store.is_file():
        return ca, store
    d.mkdir(parents=True, exist_ok=True)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    password = _secrets(cfg)["keystore_password"]
    for argv in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
         "-days", "30", "-subj", "/CN=cqrs-dev-ca"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
         "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "broker.pem", "-days", "30", "-extfile", "san.ext"],
        ["pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key", "-certfile", "ca.pem",
         "-out", "broker.p12", "-passout", f"pass:{password}"],
    ):
        done = subprocess.run(["openssl", *argv], cwd=d, capture_output=True, text=True)
        if done.returncode != 0:
            raise DevStackError(f"openssl {argv[0]} failed in {d}: {done.stderr.strip()}")
    return ca, store


def _kafka_node(cfg: CqrsConfig) -> KafkaNode:
    d = cfg.dev
    s = _secrets(cfg)
    _, store = _tls(cfg)
    port = d.secure_kafka_port
    jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    return KafkaNode(
        "secure-kafka", d.secure_path / "kafka", 1, port, port + 1, f"1@127.0.0.1:{port + 1}",
        d.cluster_kafka_heap, client_protocol="SASL_SSL",
        client_settings=(
            f"sasl.enabled.mechanisms={_MECHANISM}",
            f"listener.name.sasl_ssl.{_MECHANISM.lower()}.sasl.jaas.config={jaas}",
            "ssl.keystore.type=PKCS12",
            f"ssl.keystore.location={store}",
            f"ssl.keystore.password={s['keystore_password']}",
            f"ssl.key.password={s['keystore_password']}",
            "ssl.client.auth=none",
        ),
        scram_users=(f"{_MECHANISM}=[name={KAFKA_USER},password={s['kafka_password']}]",),
    )


def _cassandra_node(cfg: CqrsConfig) -> CassandraNode:
    d = cfg.dev
    return CassandraNode(
        "secure-cassandra", d.secure_path / "cassandra", "127.0.0.1", d.secure_cassandra_port,
        d.secure_cassandra_storage_port, f"127.0.0.1:{d.secure_cassandra_storage_port}",
        d.cluster_cassandra_heap, cluster_name="cqrs-dev-secure",
        authenticator="PasswordAuthenticator")


def secure_services(cfg: CqrsConfig) -> list[Service]:
    kafka, cassandra = _kafka_node(cfg), _cassandra_node(cfg)
    on = secure_config(cfg)

    def kafka_argv() -> list[str]:
        services.format_kafka_storage(cfg, kafka)
        return services.kafka_argv(cfg, kafka)

    return [
        Service(kafka.name, ServiceProcess(kafka.name, kafka.workdir, kafka.marker), kafka_argv,
                lambda: services.kafka_healthy(on, kafka.endpoint), f"{kafka.endpoint} (SASL_SSL)"),
        Service(cassandra.name, ServiceProcess(cassandra.name, cassandra.workdir, cassandra.marker),
                lambda: services.cassandra_argv(cfg, cassandra),
                # the default superuser answers once the node has set up its roles
                lambda: services.cassandra_healthy(cfg, cassandra.address, cassandra.port,
                                                   auth=("cassandra", "cassandra")),
                f"{cassandra.endpoint} (password)"),
    ]


def create_role(cfg: CqrsConfig) -> None:
    """The framework's Cassandra role (a superuser: it creates keyspaces), made once."""
    from cassandra.auth import PlainTextAuthProvider

    from cqrs.cassandra_io import cql_cluster

    password = _secrets(cfg)["cassandra_password"]
    if not all(c in "0123456789abcdef" for c in password):  # it goes into CQL as a literal
        raise DevStackError("secrets.json holds a Cassandra password that is not hex; delete "
                            f"{cfg.dev.secure_path} and run `cqrs dev up --secure` again")
    cluster = cql_cluster(["127.0.0.1"], cfg.dev.secure_cassandra_port,
                          auth_provider=PlainTextAuthProvider("cassandra", "cassandra"))
    try:
        cluster.connect().execute(
            f"CREATE ROLE IF NOT EXISTS {CASSANDRA_ROLE} WITH PASSWORD = '{password}' "
            "AND LOGIN = true AND SUPERUSER = true")
    finally:
        cluster.shutdown()


def secure_config(cfg: CqrsConfig) -> CqrsConfig:
    """``cfg`` pointed at the secure stack, credentials included."""
    return cfg.with_overrides(**_secure_settings(cfg))


def _secure_settings(cfg: CqrsConfig) -> dict[str, dict[str, Any]]:
    s = _secrets(cfg)
    ca, _ = _tls(cfg)
    return {
        "kafka": {
            "bootstrap_servers": f"127.0.0.1:{cfg.dev.secure_kafka_port}",
            "security_protocol": "SASL_SSL", "sasl_mechanism": _MECHANISM,
            "sasl_username": KAFKA_USER, "sasl_password": s["kafka_password"],
            "ssl_ca_location": str(ca),
        },
        "cassandra": {
            "hosts": "127.0.0.1", "port": cfg.dev.secure_cassandra_port,
            "username": CASSANDRA_ROLE, "password": s["cassandra_password"],
        },
    }


def secure_toml_path(cfg: CqrsConfig) -> Path:
    return cfg.dev.secure_path / "cqrs.toml"


def write_secure_toml(cfg: CqrsConfig) -> Path:
    """The configuration file of the secure stack (mode 0600: it holds the passwords)."""
    path = secure_toml_path(cfg)
    lines = ["# written by `cqrs dev up --secure`; holds passwords: keep it private", ""]
    for section, values in _secure_settings(cfg).items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        lines.append("")
    path.touch(mode=0o600)
    path.write_text("\n".join(lines))
    return path
