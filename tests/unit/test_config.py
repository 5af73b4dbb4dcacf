"""Configuration: one declaration per setting; defaults < file < environment < overrides."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from cqrs.config import CqrsConfig, load_config, settings_reference
from cqrs.errors import ConfigError, CqrsError


def test_defaults_suit_the_local_stack() -> None:
    cfg = load_config(env={})
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert cfg.cassandra.port == 19042
    assert cfg.spark.master == "local[2]"


def test_file_then_environment_then_overrides(tmp_path: Path) -> None:
    file = tmp_path / "cqrs.toml"
    file.write_text(
        '[kafka]\nbootstrap_servers = "file:1"\ndefault_partitions = 8\n'
        '[spark]\nmaster = "spark://x:7077"\n[spark.conf]\n"spark.executor.memory" = "4g"\n'
    )
    cfg = load_config(file, env={"CQRS_KAFKA_BOOTSTRAP": "env:2", "CQRS_CASSANDRA_PORT": "9042"},
                      spark={"shuffle_partitions": 16})
    assert cfg.kafka.bootstrap_servers == "env:2"  # environment beats file
    assert cfg.kafka.default_partitions == 8  # file beats default
    assert cfg.cassandra.port == 9042  # coerced from the environment's text
    assert cfg.spark.master == "spark://x:7077"
    assert cfg.spark.conf == {"spark.executor.memory": "4g"}
    assert cfg.spark.shuffle_partitions == 16


def test_config_file_named_by_environment(tmp_path: Path) -> None:
    file = tmp_path / "other.toml"
    file.write_text('[cassandra]\nkeyspace = "shop"\n')
    assert load_config(env={"CQRS_CONFIG": str(file)}).cassandra.keyspace == "shop"


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"CQRS_CASSANDRA_PORT": "ninety"}, "cassandra.port = 'ninety'"),
        ({"CQRS_SPARK_USE_LOCAL_JARS": "maybe"}, "spark.use_local_jars = 'maybe'"),
    ],
)
def test_bad_environment_value_is_named(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as err:
        load_config(env=env)
    assert "environment" in str(err.value)
    assert isinstance(err.value, (CqrsError, ValueError))


def test_unknown_settings_and_sections_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "cqrs.toml"
    file.write_text("[kafka]\nbootstrap = 'x'\n")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['bootstrap'\]"):
        load_config(file, env={})
    file.write_text("[kakfa]\nbootstrap_servers = 'x'\n")
    with pytest.raises(ConfigError, match=r"unknown section\(s\) \['kakfa'\]"):
        load_config(file, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})
    file.write_text("[kafka\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(file, env={})


def test_security_options_pass_through_to_both_clients() -> None:
    cfg = load_config(env={
        "CQRS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "CQRS_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "CQRS_KAFKA_SASL_USERNAME": "u", "CQRS_KAFKA_SASL_PASSWORD": "p",
        "CQRS_KAFKA_SSL_CA": "/ca.pem",
    }, kafka={"extra": {"client.id": "me"}})
    librdkafka = cfg.kafka.client_options()
    assert librdkafka["security.protocol"] == "SASL_SSL"
    assert librdkafka["sasl.username"] == "u" and librdkafka["ssl.ca.location"] == "/ca.pem"
    assert librdkafka["client.id"] == "me"
    spark = cfg.kafka.spark_options()
    assert spark["kafka.security.protocol"] == "SASL_SSL"
    assert "ScramLoginModule" in spark["kafka.sasl.jaas.config"]
    assert spark["kafka.ssl.truststore.location"] == "/ca.pem"
    assert spark["kafka.client.id"] == "me"


def test_reference_documents_every_setting() -> None:
    reference = settings_reference()
    for section in attrs.fields(attrs.resolve_types(CqrsConfig)):
        for field in attrs.fields(section.type):
            assert f"`{field.name}`" in reference
            if field.metadata.get("env"):
                assert f"`{field.metadata['env']}`" in reference


def test_generated_reference_in_docs_is_current() -> None:
    docs = Path(__file__).parents[2] / "docs" / "configuration.md"
    assert docs.read_text() == settings_reference() + "\n", (
        "docs/configuration.md is stale: regenerate it with `cqrs config docs > docs/configuration.md`"
    )


def test_checkpoint_location_expands_home_only_for_local_paths() -> None:
    local = load_config(env={"CQRS_SPARK_CHECKPOINT_DIR": "~/ck"})
    assert local.spark.checkpoint_location("q1") == str(Path.home() / "ck" / "q1")
    remote = load_config(env={"CQRS_SPARK_CHECKPOINT_DIR": "s3a://bucket/ck/"})
    assert remote.spark.checkpoint_location("app", "q1") == "s3a://bucket/ck/app/q1"


def test_cache_keys_tell_configurations_apart_by_their_secrets_too() -> None:
    from cqrs.config import cache_key

    a = load_config(env={"CQRS_CASSANDRA_PASSWORD": "one"})
    b = load_config(env={"CQRS_CASSANDRA_PASSWORD": "two"})
    assert repr(a) == repr(b)  # the repr masks them ...
    assert cache_key(a.cassandra) != cache_key(b.cassandra)  # ... the cache key does not
    assert cache_key(a.cassandra) == cache_key(load_config(env={"CQRS_CASSANDRA_PASSWORD": "one"}).cassandra)
    assert "one" not in cache_key(a.cassandra)


def test_the_record_limit_follows_the_producers_message_max_bytes() -> None:
    from cqrs.config import DEFAULT_MAX_RECORD_BYTES, RECORD_MARGIN_BYTES

    assert load_config(env={}).kafka.max_record_bytes() == DEFAULT_MAX_RECORD_BYTES == 998_976
    raised = load_config(env={}, kafka={"extra": {"message.max.bytes": "5000000"}})
    assert raised.kafka.max_record_bytes() == 5_000_000 - RECORD_MARGIN_BYTES
    for bad, words in (("lots", "not an integer"), ("1000", "too small")):
        cfg = load_config(env={}, kafka={"extra": {"message.max.bytes": bad}})
        with pytest.raises(ConfigError, match=words):
            cfg.kafka.max_record_bytes()
