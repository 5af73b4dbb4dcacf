"""The command processor: a Spark job joining commands to per-aggregate state (a Cassandra
table) and writing events and results."""

from __future__ import annotations

from cqrs.processor.step import AggregateStep, DedupPolicy, InputRecord, OutputRecord

__all__ = ["AggregateStep", "DedupPolicy", "InputRecord", "OutputRecord"]
