"""The command processor: commands joined to per-aggregate state in Spark, events out."""

from __future__ import annotations

from cqrs.processor.step import AggregateStep, DedupPolicy, InputRecord, OutputRecord

__all__ = ["AggregateStep", "DedupPolicy", "InputRecord", "OutputRecord"]
