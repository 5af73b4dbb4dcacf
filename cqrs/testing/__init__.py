"""The test kit: given / when / then on aggregates, and hypothesis strategies.

``cqrs.testing.strategies`` (hypothesis) is imported on demand, so the kit works without it.
"""

from __future__ import annotations

from cqrs.testing.scenario import AggregateTest, Given, When

__all__ = ["AggregateTest", "Given", "When"]
