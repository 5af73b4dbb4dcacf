"""The framework on Kafka with SASL/SCRAM over TLS and Cassandra with password authentication
(`cqrs dev up --secure`), configured from its configuration file only: strangers are refused,
the processor and the clients work, and no password reaches a log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from cqrs.cassandra_io import CassandraSession, CassandraUnavailableError
from cqrs.client import CommandClient, StateReader
from cqrs.config import CqrsConfig, load_config
from cqrs.devstack import artifacts
from cqrs.devstack.secure import secure_toml_path
from cqrs.devstack.stack import DevStack
from cqrs.testing.example import Deposit, OpenAccount
from cqrs.testing.example_app import app

APP_REF = "cqrs.testing.example_app:app"


@attrs.frozen
class Secure:
    cfg: CqrsConfig
    env: dict[str, str]
    tmp: Path


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    base = load_config()
    if not all(artifacts.is_installed(base.dev, c) for c in artifacts.COMPONENTS):
        artifacts.install(base.dev)
    stack = DevStack(base, secure=True)
    already = any(s.running for s in stack.status())
    assert all(s.healthy for s in stack.up(say=lambda m: None))
    tmp = tmp_path_factory.mktemp("secure")
    path = secure_toml_path(base)
    assert oct(path.stat().st_mode & 0o777) == "0o600"  # it holds the passwords
    env = {**os.environ, "CQRS_CONFIG": str(path),
           "CQRS_KAFKA_TOPIC_PREFIX": f"t-secure-{uuid.uuid4().hex[:8]}-",
           "CQRS_CASSANDRA_KEYSPACE": f"t_secure_{uuid.uuid4().hex[:8]}",
           "CQRS_SPARK_CHECKPOINT_DIR": str(tmp / "ck")}
    try:
        yield Secure(load_config(env=env), env, tmp)
    finally:
        if not already:
            stack.down(say=lambda m: None)


def _lists_topics(cfg: CqrsConfig) -> bool:
    from confluent_kafka import KafkaException

    from cqrs.kafka_io import make_admin

    try:
        return bool(make_admin(cfg).list_topics(timeout=8).brokers)
    except KafkaException:
        return False


def test_strangers_are_refused(secure: Secure) -> None:
    cfg = secure.cfg
    assert cfg.kafka.security_protocol == "SASL_SSL" and cfg.kafka.sasl_password
    assert _lists_topics(cfg)
    assert not _lists_topics(cfg.with_overrides(kafka={"security_protocol": "PLAINTEXT"}))
    assert not _lists_topics(cfg.with_overrides(kafka={"sasl_password": "wrong-password"}))
    assert not _lists_topics(cfg.with_overrides(kafka={"ssl_ca_location": ""}))  # unknown CA

    for wrong in ({"username": "", "password": ""}, {"password": "wrong-password"}):
        with pytest.raises(CassandraUnavailableError) as err:
            CassandraSession(cfg.cassandra.__class__(**{**attrs.asdict(cfg.cassandra), **wrong}))
        assert cfg.cassandra.password not in str(err.value)
    CassandraSession(cfg.cassandra).close()  # the right credentials work


def test_processor_and_clients_over_sasl_ssl_and_passwords(secure: Secure) -> None:
    log = secure.tmp / "processor.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", "run", "processor", APP_REF],
                                env=secure.env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        with CommandClient(app, secure.cfg) as client:
            opened = client.send_and_wait("acc-s", OpenAccount("ann"), expected_version=0,
                                          timeout=180)
            assert (opened.status, opened.version) == ("accepted", 1), opened
            dep = client.send_and_wait("acc-s", Deposit(5), timeout=60)
            assert (dep.status, dep.version) == ("accepted", 2), dep
        with StateReader(app, secure.cfg) as states:
            acc = states.get("acc-s", min_version=2, timeout=30)
            assert acc is not None and acc.state.balance == 5
        assert proc.poll() is None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    text = log.read_text(errors="replace")
    assert "batch" in text  # the log was written
    for secret in (secure.cfg.kafka.sasl_password, secure.cfg.cassandra.password):
        assert secret not in text
