"""Each real piece end to end: Kafka, Cassandra, and Spark's official Kafka source and sink."""

from __future__ import annotations

from cqrs.config import CqrsConfig
from cqrs.devstack import smoke


def test_kafka_produce_and_consume(cqrs_config: CqrsConfig) -> None:
    result = smoke.kafka_roundtrip(cqrs_config, n=2000)
    assert result.records == 2000


def test_cassandra_keyspace_table_write_read(cqrs_config: CqrsConfig) -> None:
    result = smoke.cassandra_roundtrip(cqrs_config, n=2000)
    assert result.records == 2000


def test_spark_streaming_kafka_source_to_kafka_sink(cqrs_config: CqrsConfig, spark: object) -> None:
    result = smoke.spark_kafka_pipeline(cqrs_config, n=2000)
    assert result.records == 2000
