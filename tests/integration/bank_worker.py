"""A processor worker of the example bank on fresh topics and a fresh state generation, for
tests that drive the processor's tasks on the real Kafka and Cassandra without Spark."""

from __future__ import annotations

from cqrs.config import CqrsConfig
from cqrs.processor.job import ProcessorOptions, publish_app_schemas
from cqrs.processor.state_table import open_state_table
from cqrs.testing.example_app import app
from cqrs.topics import ensure_topics, topics_for

__all__ = ["bank_options"]


def bank_options(cfg: CqrsConfig, prefix: str) -> ProcessorOptions:
    """Options of a bank processor on topics under ``prefix`` (created, schemas published) and
    the state table's current generation."""
    topics = topics_for(app.name, prefix + "-")
    ensure_topics(cfg, topics)
    publish_app_schemas(cfg, topics, app)
    table = open_state_table(cfg, topics)
    try:
        generation = table.ensure_current()
    finally:
        table.close()
    return ProcessorOptions("cqrs.testing.example_app:app", topics=topics, results_partitions=4,
                            state_generation=generation)
