"""Each real piece end to end: Kafka, Cassandra, and Spark's official Kafka source and sink."""

from __future__ import annotations

from cqrs.config import CqrsConfig
from cqrs.devstack import smoke
from cqrs.kafka_io import OffsetReader, make_producer
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


def test_a_topics_ends_in_one_request_are_its_high_watermarks(cqrs_config: CqrsConfig,
                                                              unique_name: str) -> None:
    topics = topics_for("ends", unique_name + "-")
    created = ensure_topics(cqrs_config, topics)
    producer = make_producer(cqrs_config)
    reader = OffsetReader(cqrs_config, topics.commands)
    try:
        assert reader.ends() == {p: 0 for p in reader.watermarks()}  # empty, the first call too
        for partition, n in ((0, 3), (2, 1)):
            for i in range(n):
                producer.produce(topics.commands, key=b"k", value=str(i).encode(), partition=partition)
        assert producer.flush(30) == 0
        highs = {p: high for p, (_, high) in reader.watermarks().items()}
        assert highs[0] == 3 and highs[2] == 1 and sum(highs.values()) == 4
        assert reader.ends() == highs
    finally:
        reader.close()
        delete_topics(cqrs_config, created)
