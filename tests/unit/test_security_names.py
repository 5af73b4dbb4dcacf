"""Credentials stay out of reprs and output; every name a user controls that reaches CQL or a
topic name is checked, and a bad one is a typed error naming it (no escaping, no injection)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cqrs.app import App
from cqrs.cassandra_io import CassandraSession, InvalidIdentifierError, identifier, replication_map
from cqrs.config import CassandraSettings, load_config
from cqrs.errors import CqrsError
from cqrs.testing.example import Account, AccountHandler, AccountOpened
from cqrs.topics import InvalidTopicNameError, topics_for

SECRETS = {"CQRS_KAFKA_SASL_PASSWORD": "kafka-pw-5f3a9", "CQRS_CASSANDRA_PASSWORD": "cass-pw-81c2e",
           "CQRS_KAFKA_SASL_USERNAME": "app", "CQRS_CASSANDRA_USERNAME": "app"}
INJECTIONS = ['x"; DROP KEYSPACE cqrs; --', "x'); DROP TABLE t; --", "a b", "x\"y", "", "é"]


def test_passwords_are_not_in_any_repr_of_the_configuration() -> None:
    cfg = load_config(env=SECRETS)
    assert cfg.kafka.sasl_password == SECRETS["CQRS_KAFKA_SASL_PASSWORD"]  # still there to use
    shown = " ".join([repr(cfg), str(cfg), repr(cfg.kafka), repr(cfg.cassandra), f"{cfg!r}"])
    for name in ("CQRS_KAFKA_SASL_PASSWORD", "CQRS_CASSANDRA_PASSWORD"):
        assert SECRETS[name] not in shown
    assert "sasl_password='***'" in shown and "password='***'" in shown
    assert "sasl_password=''" in repr(load_config(env={}).kafka)  # unset shows as unset


def test_cqrs_config_show_hides_passwords() -> None:
    env = {"PATH": "/usr/bin:/bin", **SECRETS}
    out = subprocess.run([sys.executable, "-m", "cqrs.cli.main", "config", "show"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["kafka"]["sasl_username"] == "app"
    assert all(SECRETS[n] not in out for n in ("CQRS_KAFKA_SASL_PASSWORD", "CQRS_CASSANDRA_PASSWORD"))


@pytest.mark.parametrize("bad", INJECTIONS)
def test_keyspace_injection_is_refused_before_connecting(bad: str) -> None:
    with pytest.raises(InvalidIdentifierError, match="keyspace") as err:
        CassandraSession(CassandraSettings(keyspace=bad, port=1))  # nothing listens on port 1
    assert repr(bad) in str(err.value) and isinstance(err.value, CqrsError)


@pytest.mark.parametrize("bad", ["{'class': 'SimpleStrategy'}; DROP KEYSPACE cqrs",
                                 "{'class': 'SimpleStrategy', 'replication_factor': 1} AND x",
                                 "{'class': 'Simple\\'Strategy'}"])
def test_replication_injection_is_refused(bad: str) -> None:
    with pytest.raises(InvalidIdentifierError) as err:
        replication_map(bad)
    assert repr(bad) in str(err.value)
    with pytest.raises(InvalidIdentifierError):
        CassandraSession(CassandraSettings(replication=bad, port=1))


def test_plain_identifiers_and_maps_pass() -> None:
    assert identifier("state_bank_g1") == "state_bank_g1"
    plain = "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 2}"
    assert replication_map(f"  {plain} ") == plain


@pytest.mark.parametrize("bad", INJECTIONS[:4] + ["x/y", "x" * 300])
def test_topic_prefix_injection_is_refused(bad: str) -> None:
    with pytest.raises(InvalidTopicNameError) as err:
        topics_for("bank", bad)
    assert isinstance(err.value, CqrsError)
    assert repr(bad) in str(err.value) or "longer than" in str(err.value)
    assert topics_for("bank", "staging.").commands == "staging.bank.commands"


@pytest.mark.parametrize("bad", INJECTIONS)
def test_app_name_injection_is_refused(bad: str) -> None:
    with pytest.raises(CqrsError) as err:
        App(bad, aggregates=[Account], handlers=[AccountHandler])
    assert repr(bad) in str(err.value)


@pytest.mark.parametrize("bad", INJECTIONS)
def test_projection_name_and_column_injection_is_refused(bad: str) -> None:
    from projections import Projection

    with pytest.raises(CqrsError) as err:
        type("Named", (Projection,), {"name": bad, "aggregate": Account, "key": "account_id",
                                      "columns": {"owner": str}})
    assert repr(bad) in str(err.value)
    with pytest.raises(CqrsError) as err:
        type("Columned", (Projection,), {"name": "owners", "aggregate": Account,
                                         "key": "account_id", "columns": {bad: str}})
    assert repr(bad) in str(err.value)
    with pytest.raises(CqrsError) as err:
        type("Keyed", (Projection,), {"name": "owners", "aggregate": Account, "key": bad,
                                      "columns": {"owner": str}})
    assert repr(bad) in str(err.value)


def test_names_are_fine_when_plain() -> None:
    assert AccountOpened  # the example's classes build an app under a plain name
    assert App("bank-2", aggregates=[Account], handlers=[AccountHandler]).name == "bank-2"
