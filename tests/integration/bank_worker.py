"""A processor worker of the example bank on fresh topics and a fresh state generation, for
tests that drive the processor's tasks on the real Kafka and Cassandra without Spark."""

from __future__ import annotations

import datetime as dt

import attrs

from cqrs.app import App
from cqrs.client import encode_command
from cqrs.config import CqrsConfig
from cqrs.processor.job import prepare_processor
from cqrs.processor.partition import SliceStats, Worker, process_slice
from cqrs.processor.workers import ProcessorOptions
from cqrs.testing.example_app import app
from cqrs.topics import AppTopics, topics_for

__all__ = ["BankSlices", "Message", "bank_options", "processor_options"]

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
Message = tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]


@attrs.define
class BankSlices:
    """Slices of the example bank's commands at consecutive offsets of partition 0, and a
    worker to run them on (as a Spark task would, without Spark)."""

    cfg: CqrsConfig
    topics: AppTopics
    worker: Worker
    offset: int = 0

    def slice(self, *commands: tuple[str, object]) -> list[Message]:
        out: list[Message] = []
        for agg, cmd in commands:
            _, key, value, headers = encode_command(
                app, agg, cmd, command_id=f"c{self.offset}",
                timestamp=T0 + dt.timedelta(seconds=self.offset))
            out.append((key, value, headers, self.offset))
            self.offset += 1
        return out

    def run(self, messages: list[Message], worker: Worker | None = None) -> SliceStats:
        return process_slice(worker or self.worker, self.topics.commands, 0, messages)


def processor_options(cfg: CqrsConfig, prefix: str, of: App, app_ref: str) -> ProcessorOptions:
    """Options of a processor of ``of`` (imported as ``app_ref``) on topics under ``prefix``
    (created, schemas published) and the state table's current generation."""
    return prepare_processor(cfg, ProcessorOptions(app_ref, topics=topics_for(of.name, prefix + "-")))


def bank_options(cfg: CqrsConfig, prefix: str) -> ProcessorOptions:
    """:func:`processor_options` of the example bank."""
    return processor_options(cfg, prefix, app, "cqrs.testing.example_app:app")
