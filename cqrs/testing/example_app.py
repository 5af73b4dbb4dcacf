"""The example bank as an importable App: ``cqrs.testing.example_app:app`` (Spark executors
import apps by reference, so tests and demos need one at module level)."""

from __future__ import annotations

from cqrs.testing.example import make_app

__all__ = ["app"]

app = make_app("example-bank")
