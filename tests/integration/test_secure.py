"""The framework on Kafka with SASL/SCRAM over TLS and Cassandra with password authentication
(`cqrs dev up --secure`), configured from its configuration file only: strangers are refused,
the processor and the clients work, and no password reaches a log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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
from domain_examples.bank import Deposit, OpenAccount, app
from projections import ProjectionReader
from projections.stores import cached_store
from cluster_harness import down_in_background
from process_group import stop

APP_REF = "domain_examples.bank:app"


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
            down_in_background(stack, "secure stack")  # (~5 s that no test waits for)


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
    # each stranger is refused for its own reason, and lists nothing before that
    said = _refused(cfg.with_overrides(kafka={"security_protocol": "PLAINTEXT"}))
    assert said.startswith(("_ALL_BROKERS_DOWN", "_TRANSPORT")), said  # no TLS: dropped
    said = _refused(cfg.with_overrides(kafka={"sasl_password": "wrong-password"}))
    assert said.startswith("_AUTHENTICATION") and "invalid credentials" in said, said
    said = _refused(cfg.with_overrides(kafka={"ssl_ca_location": ""}))  # unknown CA
    assert "certificate verify failed" in said, said

    for wrong in ({"username": "", "password": ""}, {"password": "wrong-password"}):
        with pytest.raises(CassandraUnavailableError) as err:
            CassandraSession(cfg.cassandra.__class__(**{**attrs.asdict(cfg.cassandra), **wrong}))
        assert cfg.cassandra.password not in str(err.value)
    CassandraSession(cfg.cassandra).close()  # the right credentials work


def _refused(cfg: CqrsConfig, timeout: float = 8.0) -> str:
    """How the broker refuses a client with ``cfg``'s settings: the first error librdkafka
    reports for it ("NAME: text"), as soon as it does (a refused client otherwise lists
    nothing until its timeout: 8 s a stranger). Fails when the client lists the brokers, or
    when nothing is reported within ``timeout`` seconds."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[KafkaError] = []
    admin = AdminClient({"bootstrap.servers": cfg.kafka.bootstrap_servers, "log_level": 3,
                         **cfg.kafka.client_options(), "error_cb": errors.append})
    deadline = time.monotonic() + timeout
    while not errors:
        assert time.monotonic() < deadline, f"no refusal reported within {timeout:.0f} s"
        try:
            assert not admin.list_topics(timeout=0.5).brokers, "a stranger lists the brokers"
        except KafkaException:
            pass
        admin.poll(0.1)  # (serves the error callback)
    return f"{errors[0].name()}: {errors[0].str()}"


def _start(secure: Secure, job: str) -> subprocess.Popen[bytes]:
    with (secure.tmp / f"{job}.log").open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", "run", job, APP_REF],
                                env=secure.env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def test_processor_projector_and_clients_over_sasl_ssl_and_passwords(secure: Secure) -> None:
    # the processor reads and writes Kafka from Python (librdkafka), the projector through
    # Spark's Kafka source (the Java client: JAAS line and PEM truststore)
    jobs = [_start(secure, "processor"), _start(secure, "projector")]
    try:
        with CommandClient(app, secure.cfg) as client:
            opened = client.send_and_wait("acc-s", OpenAccount("ann"), expected_version=0,
                                          timeout=240)
            assert (opened.status, opened.version) == ("accepted", 1), opened
            dep = client.send_and_wait("acc-s", Deposit(5_00), timeout=60)
            assert (dep.status, dep.version) == ("accepted", 2), dep
        with StateReader(app, secure.cfg) as states:
            acc = states.get("acc-s", min_version=2, timeout=30)
            assert acc is not None and acc.state.balance_cents == 5_00
        reader = ProjectionReader(app, cached_store(secure.cfg))
        deadline = time.monotonic() + 180
        row = None
        while time.monotonic() < deadline:
            row = reader.get("balances", "acc-s")
            if row is not None and row["balance_cents"] == 5_00:
                break
            assert all(j.poll() is None for j in jobs), "a job exited; see its log"
            time.sleep(0.5)
        assert row is not None and row["balance_cents"] == 5_00 and row["owner"] == "ann", row
        assert all(j.poll() is None for j in jobs)
    finally:
        for j in jobs:
            stop(j)
    for job in ("processor", "projector"):
        text = (secure.tmp / f"{job}.log").read_text(errors="replace")
        assert "running" in text, text[-3000:]  # the log was written
        for secret in (secure.cfg.kafka.sasl_password, secure.cfg.cassandra.password):
            assert secret not in text, job
