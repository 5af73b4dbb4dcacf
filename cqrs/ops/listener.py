"""A Spark ``StreamingQueryListener`` that hands every query's progress to a :class:`StatusBoard`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from cqrs.ops.board import StatusBoard

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["attach_listener"]


def attach_listener(spark: SparkSession, board: StatusBoard) -> Any:
    """Register a listener on ``spark`` feeding ``board``; returns it (for
    ``spark.streams.removeListener``)."""
    from pyspark.sql.streaming import StreamingQueryListener

    class BoardListener(StreamingQueryListener):  # type: ignore[misc]
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            progress = event.progress
            board.on_progress(str(progress.id), json.loads(progress.json))

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            pass  # the supervisor sees it and says why (it restarts or stops the query)

    listener = BoardListener()
    spark.streams.addListener(listener)
    return listener
