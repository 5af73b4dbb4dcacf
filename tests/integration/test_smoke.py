"""Each real piece end to end: Kafka, Cassandra, and Spark's official Kafka source and sink."""

from __future__ import annotations

from cqrs.config import CqrsConfig
from cqrs.devstack import smoke
from cqrs.topics import delete_topics, ensure_topics, list_topics, topics_for


def test_kafka_produce_and_consume(cqrs_config: CqrsConfig) -> None:
    result = smoke.kafka_roundtrip(cqrs_config, n=2000)
    assert result.records == 2000


def test_cassandra_keyspace_table_write_read(cqrs_config: CqrsConfig) -> None:
    result = smoke.cassandra_roundtrip(cqrs_config, n=2000)
    assert result.records == 2000


def test_spark_streaming_kafka_source_to_kafka_sink(cqrs_config: CqrsConfig, spark: object) -> None:
    result = smoke.spark_kafka_pipeline(cqrs_config, n=2000)
    assert result.records == 2000


def test_throwaway_topics_are_deleted_and_missing_ones_count_as_deleted(
        cqrs_config: CqrsConfig, unique_name: str) -> None:
    topics = topics_for("throwaway", unique_name + "-")
    created = ensure_topics(cqrs_config, topics)
    assert set(created) == list_topics(cqrs_config, unique_name)
    assert delete_topics(cqrs_config, [*created, unique_name + "-never-made"]) == []
    assert list_topics(cqrs_config, unique_name) == set()
