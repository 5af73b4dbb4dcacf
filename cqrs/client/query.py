"""``StateReader``: an aggregate's current state and version, read from the aggregate-state table.

The processor's own reader (:class:`cqrs.processor.state.StateReader`), exported with the client:
a single-partition Cassandra read and a decode, no Spark; ``min_version`` waits for
read-your-writes after a command's result. ``HistoryReader``: an aggregate's events and its state
at a version or a time, from the history table (see :mod:`cqrs.history`).
"""

from __future__ import annotations

from cqrs.history.reader import HistoryReader
from cqrs.processor.state import StateReader

__all__ = ["HistoryReader", "StateReader"]
