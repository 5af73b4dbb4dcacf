"""``StateReader``: an aggregate's current state and version, read from the processor checkpoint.

A thin, thread-safe front to :func:`cqrs.processor.state.read_state` that owns (lazily starts)
the Spark session it needs. Each read scans the checkpoint's state: fine for operations, tests
and the occasional API call; serve frequent reads from projections.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from cqrs.app import App
from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.processor.state import StateReadError
from cqrs.topics import AppTopics

if TYPE_CHECKING:
    from cqrs.processor.state import AggregateState

__all__ = ["StateReader"]


class StateReader:
    """Reads aggregate states of ``app`` from its processor checkpoint (default location
    ``<checkpoint_dir>/<app>/processor``). Pass ``spark`` to reuse a session."""

    def __init__(self, app: App, cfg: CqrsConfig, *, checkpoint: str | None = None,
                 spark: Any = None, topics: AppTopics | None = None) -> None:
        from cqrs.processor.job import checkpoint_for

        self.app = app
        self.cfg = cfg
        self.checkpoint = checkpoint or checkpoint_for(cfg, app.name)
        self.topics = topics
        self._spark = spark
        self._owns_spark = spark is None
        self._lock = threading.Lock()

    def _session(self) -> Any:
        with self._lock:
            if self._spark is None:
                from cqrs.spark_session import spark_session

                self._spark = spark_session(self.cfg, f"cqrs-query-{self.app.name}")
            return self._spark

    def get(self, aggregate_id: str, aggregate_type: str | None = None) -> AggregateState | None:
        """The aggregate's state (version, decoded state, recent command ids) or ``None``."""
        from cqrs.processor.state import read_state

        spark = self._session()
        try:
            return read_state(spark, self.cfg, self.app, self.checkpoint, aggregate_id,
                              aggregate_type, topics=self.topics)
        except CqrsError:
            raise
        except Exception as exc:  # Py4JJavaError & co: one line, not a Java stack trace
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StateReadError(
                f"cannot read the state of {aggregate_id!r} from {self.checkpoint!r}: {first}"
            ) from exc

    def close(self) -> None:
        """Stop the Spark session if this reader started it."""
        with self._lock:
            if self._spark is not None and self._owns_spark:
                self._spark.stop()
            self._spark = None
