"""A processor worker of the example bank on fresh topics and a fresh state generation, for
tests that drive the processor's tasks on the real Kafka and Cassandra without Spark."""

from __future__ import annotations

from cqrs.app import App
from cqrs.config import CqrsConfig
from cqrs.processor.job import prepare_processor
from cqrs.processor.workers import ProcessorOptions
from cqrs.testing.example_app import app
from cqrs.topics import topics_for

__all__ = ["bank_options", "processor_options"]


def processor_options(cfg: CqrsConfig, prefix: str, of: App, app_ref: str) -> ProcessorOptions:
    """Options of a processor of ``of`` (imported as ``app_ref``) on topics under ``prefix``
    (created, schemas published) and the state table's current generation."""
    return prepare_processor(cfg, ProcessorOptions(app_ref, topics=topics_for(of.name, prefix + "-")))


def bank_options(cfg: CqrsConfig, prefix: str) -> ProcessorOptions:
    """:func:`processor_options` of the example bank."""
    return processor_options(cfg, prefix, app, "cqrs.testing.example_app:app")
